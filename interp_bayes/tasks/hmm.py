"""HMM state tracking (Paper I task B): belief transport with a fresh random HMM in every sequence.

Each sequence carries its own transition matrix T and emission matrix E (rows Dirichlet(1), floored at 0.05,
renormalised, discretised to hundredths that sum to exactly 1, as the authors' ``discretize_and_renormalize``),
written into the prompt as probability tokens, followed by the observations (methods.md §1.3):

    [TRANS] T00 .. T44 [EMIT] E00 .. E44 [SEP] [OBS] o1 [OBS] o2 .. [OBS] oK

The target at observation t (the position of o_t) is the filtering posterior p(s_t | o_1..o_t) under the very
matrices shown, by a batched log-space forward algorithm. State tokens s0..s4 exist only as read-out tokens: the
model's next-token logits restricted to them are its belief.
"""

from __future__ import annotations

import numpy as np
import torch

from interp_bayes.tasks.base import TaskBatch, as_rng

MIN_CENTS = 5  # the 0.05 floor, in hundredths


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


def hmm_filter(
    trans: torch.Tensor, emit: torch.Tensor, obs: torch.Tensor, init: torch.Tensor | None = None
) -> torch.Tensor:
    """Exact filtering posteriors p(s_t | o_1..o_t) by the forward algorithm in log space, batched.

    ``trans``: [n, S, S] rows T[s_prev, s_next]; ``emit``: [n, S, O]; ``obs``: [n, K] int; ``init``: [n, S] or
    None (uniform). Returns [n, K, S] in float64.
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


class HMMTask:
    """Generator of HMM filtering sequences (fresh HMM per sequence) with exact posteriors."""

    name = "hmm"

    def __init__(self, n_states: int = 5, n_obs: int = 5, n_steps: int = 20) -> None:
        self.n_states, self.n_obs, self.n_steps = n_states, n_obs, n_steps
        self.n_probs = 100 - MIN_CENTS + 1  # probability tokens 0.05 .. 1.00
        self.trans_id, self.emit_id, self.sep_id, self.obs_id = range(self.n_probs, self.n_probs + 4)
        self.symbol_offset = self.n_probs + 4
        self.state_offset = self.symbol_offset + n_obs
        self.header_len = 3 + n_states * n_states + n_states * n_obs

    @property
    def vocab(self) -> list[str]:
        """Token strings in id order: probabilities, markers, observation symbols, state read-out tokens."""
        probs = [f"{(MIN_CENTS + i) / 100:.2f}" for i in range(self.n_probs)]
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

    def sample(self, n: int, *, seed: int | np.random.Generator | None = None, length: int | None = None) -> TaskBatch:
        """Draw ``n`` sequences of ``length`` observations (default ``n_steps``), each with its own HMM."""
        rng, S, O, K = as_rng(seed), self.n_states, self.n_obs, length or self.n_steps
        t_cents = random_stochastic_cents(rng, (n, S), S)  # [n, S, S]
        e_cents = random_stochastic_cents(rng, (n, S), O)  # [n, S, O]
        t_cum, e_cum = np.cumsum(t_cents, -1), np.cumsum(e_cents, -1)
        rows = np.arange(n)
        states = np.empty((n, K), dtype=np.int64)
        states[:, 0] = rng.integers(0, S, size=n)
        for t in range(1, K):  # exact integer-cent sampling: (cumsum <= u).sum() with u uniform on 0..99
            states[:, t] = (t_cum[rows, states[:, t - 1]] <= rng.integers(0, 100, size=(n, 1))).sum(-1)
        obs = (e_cum[rows[:, None], states] <= rng.integers(0, 100, size=(n, K, 1))).sum(-1)  # [n, K]
        tokens = np.empty((n, self.seq_len(K)), dtype=np.int64)
        tokens[:, 0] = self.trans_id
        tokens[:, 1 : 1 + S * S] = t_cents.reshape(n, -1) - MIN_CENTS
        tokens[:, 1 + S * S] = self.emit_id
        tokens[:, 2 + S * S : 2 + S * S + S * O] = e_cents.reshape(n, -1) - MIN_CENTS
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
