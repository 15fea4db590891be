"""HMM state tracking (Paper I task B): belief transport with a fresh random HMM in every sequence.

Each sequence carries its own transition matrix T and emission matrix E, written into the prompt as probability
tokens (hundredths), followed by the observations (methods.md §1.3):

    [TRANS] T00 .. T44 [EMIT] E00 .. E44 [SEP] [OBS] o1 [OBS] o2 .. [OBS] oK

The target at observation t (the position of o_t) is the filtering posterior p(s_t | o_1..o_t) under the very
matrices shown, by a batched log-space forward algorithm. State tokens s0..s4 exist only as read-out tokens: the
model's next-token logits restricted to them are its belief.

Matrix families (``transitions=`` / ``emissions=``), each row discretised to hundredths that sum to exactly 1:

- ``"dirichlet"`` (the paper's): rows Dirichlet(1), floored at 0.05, renormalised, discretised by the authors'
  greedy repair (``discretize_and_renormalize``). Such chains mix in about 3 steps, so the last few observations
  carry nearly all the evidence.
- ``"sticky"`` (transitions): each state keeps itself with probability ``stay`` cents drawn uniformly per row
  from ``stay_cents`` (default 0.90..0.98); the rest is spread over the other states (``spread``: ``"even"``, as
  equal as whole cents allow, or ``"dirichlet"``, a Dirichlet(1) draw; both rounded to whole cents by largest
  remainders). Slow mixing: evidence from far back still matters.
- ``"peaked"`` (emissions, near-deterministic at the default ``peak_cents`` 0.80..0.95): each state emits its own
  symbol with probability drawn from ``peak_cents``, the rest spread as above; the state-to-symbol map is a fresh
  random one-to-one map per sequence (``symbol_map="random"``, needs n_obs >= n_states) or state s -> symbol s
  (``"identity"``).

The paper's family floors every entry at 0.05, so its probability tokens are 0.05..1.00 (ids unchanged from
earlier versions); the other families can put 0.00 on an entry, and their tokens run 0.00..1.00 (``min_cents=0``
gives the paper's family that token range too, so that a curriculum can move between families).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.errors import ConfigError
from .base import TaskBatch, as_rng

MIN_CENTS = 5  # the 0.05 floor of the paper's Dirichlet rows, in hundredths
TRANSITIONS = ("dirichlet", "sticky")
EMISSIONS = ("dirichlet", "peaked")
SPREADS = ("even", "dirichlet")
SYMBOL_MAPS = ("random", "identity")


def discretize_rows(p: np.ndarray) -> np.ndarray:
    """Round stochastic rows to integer hundredths >= 5 that sum to exactly 100.

    Vectorised version of the authors' greedy repair: a row short of 100 gets +1 on its smallest entries first, a
    row over 100 gets -1 on its largest entry, repeatedly. ``p``: [..., C] rows summing to 1; returns int64 cents.
    """
    cents = np.maximum(np.rint(np.round(p, 2) * 100.0), MIN_CENTS).astype(np.int64)
    diff = 100 - cents.sum(-1, keepdims=True)  # [..., 1]
    if diff.max() >= cents.shape[-1]:
        raise ValueError("discretisation repair needs more than one cent per entry; rows are not normalised.")
    asc_rank = np.argsort(np.argsort(cents, axis=-1, kind="stable"), axis=-1, kind="stable")  # 0 = smallest
    cents = cents + (asc_rank < diff)
    while (over := cents.sum(-1, keepdims=True) > 100).any():  # at most a few passes: floors add < 5 cents a row
        largest = np.argmax(cents, axis=-1)[..., None]
        np.put_along_axis(cents, largest, np.take_along_axis(cents, largest, -1) - over, axis=-1)
    return cents


def random_stochastic_cents(rng: np.random.Generator, shape: tuple[int, ...], n_cols: int) -> np.ndarray:
    """Rows ~ Dirichlet(1), floored at 0.05, renormalised, discretised: int cents of shape [*shape, n_cols]."""
    raw = np.maximum(rng.dirichlet(np.ones(n_cols), size=shape), MIN_CENTS / 100.0)
    return discretize_rows(raw / raw.sum(-1, keepdims=True))


def split_cents(rng: np.random.Generator, total: np.ndarray, n_parts: int, spread: str = "dirichlet") -> np.ndarray:
    """Split ``total`` cents (int array [...]) into ``n_parts`` whole-cent parts: in Dirichlet(1) proportions, or
    ``spread="even"``: as equal as whole cents allow (the leftover cents on randomly chosen parts).

    Largest-remainder rounding, so the parts sum to ``total`` exactly; parts may be 0. Returns [..., n_parts].
    """
    if spread not in SPREADS:
        raise ConfigError(f"Unknown spread '{spread}'; choose one of {', '.join(SPREADS)}.")
    weights = rng.dirichlet(np.ones(n_parts), size=total.shape) if spread == "dirichlet" else \
        np.full((*total.shape, n_parts), 1.0 / n_parts) + 1e-9 * rng.random((*total.shape, n_parts))  # ties broken
    share = weights / weights.sum(-1, keepdims=True) * total[..., None]  # [..., n_parts] fractional cents
    parts = np.floor(share).astype(np.int64)
    short = total - parts.sum(-1)  # [...] cents still to place, < n_parts
    rank = np.argsort(np.argsort(parts - share, axis=-1, kind="stable"), axis=-1, kind="stable")  # 0 = largest rest
    return parts + (rank < short[..., None])


def dominant_cents(rng: np.random.Generator, n: int, n_rows: int, n_cols: int, cents_range: tuple[int, int],
                   columns: np.ndarray, spread: str = "even") -> np.ndarray:
    """[n, n_rows, n_cols] int cents: row r puts a uniform draw from ``cents_range`` (inclusive) on column
    ``columns[:, r]`` and spreads the rest over the other columns (``split_cents`` with ``spread``)."""
    lo, hi = cents_range
    if not 0 <= lo <= hi <= 100:
        raise ConfigError(f"A cents range must satisfy 0 <= low <= high <= 100; got {cents_range}.")
    top = rng.integers(lo, hi + 1, size=(n, n_rows))  # [n, rows]
    rest = split_cents(rng, 100 - top, n_cols - 1, spread)  # [n, rows, cols - 1]
    out = np.empty((n, n_rows, n_cols), dtype=np.int64)
    others = np.ones((n, n_rows, n_cols), dtype=bool)
    np.put_along_axis(others, columns[..., None], False, axis=-1)
    out[others] = rest.reshape(-1)
    np.put_along_axis(out, columns[..., None], top[..., None], axis=-1)
    return out


def hmm_filter(
    trans: torch.Tensor, emit: torch.Tensor, obs: torch.Tensor, init: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact filtering posteriors p(s_t | o_1..o_t) by the forward algorithm in log space, batched.

    ``trans``: [n, S, S] rows T[s_prev, s_next]; ``emit``: [n, S, O]; ``obs``: [n, K] int; ``init``: [n, S], the
    distribution of the first state, or None (uniform). Zero entries are allowed (log 0 = -inf). Returns [n, K, S]
    in float64.
    """
    log_t, log_e = trans.double().log(), emit.double().log()
    n, S = trans.shape[0], trans.shape[1]
    log_init = torch.full((n, S), -np.log(S), dtype=torch.float64) if init is None else init.double().log()
    log_obs = torch.gather(log_e, 2, obs[:, None, :].expand(n, S, obs.shape[1])).transpose(1, 2)  # [n, K, S]
    out, log_alpha = [], log_init
    for t in range(obs.shape[1]):
        prior = log_init if t == 0 else torch.logsumexp(log_alpha[:, :, None] + log_t, dim=1)  # [n, S]
        log_alpha = prior + log_obs[:, t]
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-1, keepdim=True)
        out.append(log_alpha)
    return torch.stack(out, dim=1).exp()


def mixing_times(trans: torch.Tensor, eps: float = 0.25, max_steps: int = 1000) -> torch.Tensor:
    """t_mix(eps) of each chain: the fewest steps t with max over start states of TV(T^t[s], pi) <= eps.

    ``trans``: [n, S, S]; ``pi`` is the stationary distribution (the limit of the rows of T^t). Returns [n] int64;
    ``max_steps`` where a chain has not mixed by then. The textbook definition (Levin & Peres, eps = 1/4).
    """
    t = trans.double()
    pi = torch.linalg.matrix_power(t, 2**20)[:, 0]  # [n, S]: rows of a high power agree for ergodic chains
    out = torch.full((t.shape[0],), max_steps, dtype=torch.int64)
    power = t.clone()
    for step in range(1, max_steps + 1):
        tv = 0.5 * (power - pi[:, None, :]).abs().sum(-1).amax(-1)  # [n]
        out = torch.where((tv <= eps) & (out == max_steps), torch.tensor(step), out)
        if (out < max_steps).all():
            break
        power = power @ t
    return out


class HMMTask:
    """Generator of HMM filtering sequences (fresh HMM per sequence) with exact posteriors."""

    name = "hmm"

    def __init__(self, n_states: int = 5, n_obs: int = 5, n_steps: int = 20, *, transitions: str = "dirichlet",
                 emissions: str = "dirichlet", stay_cents: tuple[int, int] = (90, 98),
                 peak_cents: tuple[int, int] = (80, 95), spread: str = "even", symbol_map: str = "random",
                 min_cents: int | None = None) -> None:
        if transitions not in TRANSITIONS:
            raise ConfigError(f"Unknown HMM transitions '{transitions}'; choose one of {', '.join(TRANSITIONS)}.")
        if emissions not in EMISSIONS:
            raise ConfigError(f"Unknown HMM emissions '{emissions}'; choose one of {', '.join(EMISSIONS)}.")
        if spread not in SPREADS:
            raise ConfigError(f"Unknown spread '{spread}'; choose one of {', '.join(SPREADS)}.")
        if symbol_map not in SYMBOL_MAPS:
            raise ConfigError(f"Unknown symbol map '{symbol_map}'; choose one of {', '.join(SYMBOL_MAPS)}.")
        if emissions == "peaked" and n_obs < n_states:
            raise ConfigError(f"Peaked emissions give each state its own symbol: n_obs={n_obs} must be at least "
                              f"n_states={n_states}.")
        self.n_states, self.n_obs, self.n_steps = n_states, n_obs, n_steps
        self.transitions, self.emissions = transitions, emissions
        self.stay_cents, self.peak_cents = tuple(stay_cents), tuple(peak_cents)
        self.spread, self.symbol_map = spread, symbol_map
        paper = (transitions, emissions) == ("dirichlet", "dirichlet")
        if min_cents is None:
            min_cents = MIN_CENTS if paper else 0
        if min_cents not in (0, MIN_CENTS) or (min_cents and not paper):
            raise ConfigError(f"min_cents={min_cents}: the probability tokens start at 0.00 (any family) or 0.05 (the "
                              "paper's family only, whose entries are floored there).")
        self.min_cents = min_cents
        self.n_probs = 100 - self.min_cents + 1  # probability tokens min_cents/100 .. 1.00
        self.trans_id, self.emit_id, self.sep_id, self.obs_id = range(self.n_probs, self.n_probs + 4)
        self.symbol_offset = self.n_probs + 4
        self.state_offset = self.symbol_offset + n_obs
        self.header_len = 3 + n_states * n_states + n_states * n_obs

    @property
    def vocab(self) -> list[str]:
        """Token strings in id order: probabilities, markers, observation symbols, state read-out tokens."""
        probs = [f"{(self.min_cents + i) / 100:.2f}" for i in range(self.n_probs)]
        return probs + ["[TRANS]", "[EMIT]", "[SEP]", "[OBS]"] + [f"o{i}" for i in range(self.n_obs)] + [
            f"s{i}" for i in range(self.n_states)
        ]

    @property
    def hypothesis_ids(self) -> list[int]:
        """Token ids of the hidden states (read-out only; they never occur in a prompt)."""
        return list(range(self.state_offset, self.state_offset + self.n_states))

    def seq_len(self, length: int | None = None) -> int:
        """Tokens per sequence with ``length`` observations."""
        return self.header_len + 2 * (length or self.n_steps)

    def sample_matrices(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(T, E) as int cents, [n, S, S] and [n, S, O], from this task's matrix families."""
        S, O = self.n_states, self.n_obs
        if self.transitions == "sticky":
            t_cents = dominant_cents(rng, n, S, S, self.stay_cents, np.tile(np.arange(S), (n, 1)), self.spread)
        else:
            t_cents = random_stochastic_cents(rng, (n, S), S)
        if self.emissions == "peaked":
            if self.symbol_map == "identity":
                own_symbol = np.tile(np.arange(S), (n, 1))  # state s favours symbol s
            else:
                own_symbol = np.argsort(rng.random((n, O)), axis=1)[:, :S]  # [n, S] distinct symbols
            e_cents = dominant_cents(rng, n, S, O, self.peak_cents, own_symbol, self.spread)
        else:
            e_cents = random_stochastic_cents(rng, (n, S), O)
        return t_cents, e_cents

    def matrices(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, E) as probabilities, [n, S, S] and [n, S, O] float64, read back from the prompt's header tokens."""
        S, O = self.n_states, self.n_obs
        ids = input_ids[:, : self.header_len].double()
        t = (ids[:, 1 : 1 + S * S] + self.min_cents) / 100.0
        e = (ids[:, 2 + S * S : 2 + S * S + S * O] + self.min_cents) / 100.0
        return t.reshape(-1, S, S), e.reshape(-1, S, O)

    def observations(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The observation symbols o_1..o_K of each prompt, [n, K] int64."""
        return input_ids[:, self.header_len + 1 :: 2] - self.symbol_offset

    def sample(self, n: int, *, seed: int | np.random.Generator | None = None, length: int | None = None) -> TaskBatch:
        """Draw ``n`` sequences of ``length`` observations (default ``n_steps``), each with its own HMM."""
        rng, S, O, K = as_rng(seed), self.n_states, self.n_obs, length or self.n_steps
        t_cents, e_cents = self.sample_matrices(n, rng)
        t_cum, e_cum = np.cumsum(t_cents, -1), np.cumsum(e_cents, -1)
        rows = np.arange(n)
        states = np.empty((n, K), dtype=np.int64)
        states[:, 0] = rng.integers(0, S, size=n)
        for t in range(1, K):  # exact integer-cent sampling: (cumsum <= u).sum() with u uniform on 0..99
            states[:, t] = (t_cum[rows, states[:, t - 1]] <= rng.integers(0, 100, size=(n, 1))).sum(-1)
        obs = (e_cum[rows[:, None], states] <= rng.integers(0, 100, size=(n, K, 1))).sum(-1)  # [n, K]
        tokens = np.empty((n, self.seq_len(K)), dtype=np.int64)
        tokens[:, 0] = self.trans_id
        tokens[:, 1 : 1 + S * S] = t_cents.reshape(n, -1) - self.min_cents
        tokens[:, 1 + S * S] = self.emit_id
        tokens[:, 2 + S * S : 2 + S * S + S * O] = e_cents.reshape(n, -1) - self.min_cents
        tokens[:, self.header_len - 1] = self.sep_id
        tokens[:, self.header_len :: 2] = self.obs_id
        tokens[:, self.header_len + 1 :: 2] = obs + self.symbol_offset
        obs_t = torch.from_numpy(obs)
        post = hmm_filter(torch.from_numpy(t_cents / 100.0), torch.from_numpy(e_cents / 100.0), obs_t)
        return TaskBatch(
            input_ids=torch.from_numpy(tokens),
            query_pos=torch.arange(self.header_len + 1, self.seq_len(K), 2),
            posterior=post.float(),
            labels=torch.from_numpy(states),
        )
