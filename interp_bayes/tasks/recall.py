"""Associative recall (Paper I's random-access binding): store key/value pairs, wait, then query stored keys.

Sequence, in the shape of the authors' generator (``repo:src/data/associative_recall.py``)::

    STORE k1 SEP v1  STORE k2 SEP v2 ... STORE kN SEP vN   FILL x F
    QUERY q1 ANS  FILL x F//2  QUERY q2 ANS  FILL x F//2 ... QUERY qM ANS

The N keys are distinct (drawn without replacement from ``n_keys``), the N values distinct (without replacement
from ``n_values``), and the M queries are distinct stored keys; ``ANS`` is the answer slot the authors leave as a
padding token. The model is scored at each query key ``q_j``: its next token is the stored value of ``q_j``, so its
next-token distribution restricted to the value tokens is compared with the exact posterior.

Exact posterior: the queried key's pair is in the context, so its value is certain: a delta on the stored value,
0 bits at every query. The authors' generator never repeats a key and never queries an unstored one, so neither
case arises here (were a key unstored, its value would be uniform over the values not yet bound; were keys to
repeat with one value each, the first binding would still fix it).

Baselines from the prompt tokens alone (an independent path from the sampler):

- ``window_posterior(ids, m)``: the exact posterior given only the last m tokens (and the position). A stored
  pair whose key lies in the window shows its value too (the value sits before the query). If the query's pair is
  shown, a delta; otherwise the key sits in one of the ``N - f`` slots not fully shown (f: pairs shown), each
  equally likely. When the window starts between a pair's key and its value, that value ``u`` is the query's with
  probability ``1 / (N - f)``; the rest is spread evenly over the values no shown pair holds.
- ``stored_values_posterior``: the belief of a predictor that knows which values are stored but not which key
  holds which (memory without binding): 1/N on each stored value. It sees the whole store, so a model that beats
  every window but not this one remembers without binding.
- ``position_only_posterior``: the best belief knowing only the position: the marginal of a query's value, uniform
  over all ``n_values`` (every value is equally likely to be bound to any key).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.errors import ConfigError
from .base import TaskBatch, as_rng

SPECIALS = ("STORE", "SEP", "FILL", "QUERY", "ANS")
STORE, SEP, FILL, QUERY, ANS = range(len(SPECIALS))


class RecallTask:
    """Generator of associative-recall sequences with exact posteriors (see module docstring)."""

    name = "recall"

    def __init__(self, n_keys: int = 16, n_values: int = 16, n_pairs: int = 6, n_queries: int = 3,
                 n_filler: int = 8) -> None:
        if not 1 <= n_queries <= n_pairs:
            raise ConfigError(f"n_queries={n_queries} must lie in 1..n_pairs={n_pairs} (queries are distinct stored "
                              "keys).")
        if n_pairs > min(n_keys, n_values):
            raise ConfigError(f"n_pairs={n_pairs} exceeds n_keys={n_keys} or n_values={n_values}; keys and values are "
                              "distinct, so raise the vocabularies or lower n_pairs.")
        if n_filler < 0:
            raise ConfigError(f"n_filler={n_filler} must be >= 0.")
        self.n_keys, self.n_values, self.n_pairs = n_keys, n_values, n_pairs
        self.n_queries, self.n_filler = n_queries, n_filler

    @property
    def key_offset(self) -> int:
        return len(SPECIALS)

    @property
    def value_offset(self) -> int:
        return len(SPECIALS) + self.n_keys

    @property
    def vocab(self) -> list[str]:
        """Token strings in id order: the five markers, keys k0.., values v0.."""
        return [*SPECIALS, *(f"k{i}" for i in range(self.n_keys)), *(f"v{i}" for i in range(self.n_values))]

    @property
    def hypothesis_ids(self) -> list[int]:
        """Token ids of the value tokens, the hypotheses of the posterior."""
        return list(range(self.value_offset, self.value_offset + self.n_values))

    @property
    def query_gap(self) -> int:
        """Tokens from one query key to the next: QUERY q ANS plus F//2 filler."""
        return 3 + self.n_filler // 2

    @property
    def tail_len(self) -> int:
        """Tokens after the stored pairs: the filler and the query section."""
        return self.n_filler + self.n_queries * 3 + (self.n_queries - 1) * (self.n_filler // 2)

    def seq_len(self, length: int | None = None) -> int:
        """Tokens per sequence with ``length`` stored pairs (default ``n_pairs``)."""
        return 4 * (length or self.n_pairs) + self.tail_len

    def query_positions(self, length: int | None = None) -> torch.Tensor:
        """Positions of the query keys [M]: the next token there is the queried value."""
        first = 4 * (length or self.n_pairs) + self.n_filler + 1
        return first + self.query_gap * torch.arange(self.n_queries)

    def pairs_in(self, input_ids: torch.Tensor) -> int:
        """The number of stored pairs of sequences of this shape, from their length."""
        n, rest = divmod(input_ids.shape[1] - self.tail_len, 4)
        if n < self.n_queries or rest:
            raise ConfigError(f"A sequence of {input_ids.shape[1]} tokens is not a recall sequence of this task "
                              f"(n_filler={self.n_filler}, n_queries={self.n_queries}).")
        return n

    def sample(self, n: int, *, seed: int | np.random.Generator | None = None, length: int | None = None) -> TaskBatch:
        """Draw ``n`` sequences of ``length`` stored pairs (default ``n_pairs``)."""
        rng, N, M = as_rng(seed), length or self.n_pairs, self.n_queries
        if not M <= N <= min(self.n_keys, self.n_values):
            raise ConfigError(f"length={N} pairs must lie in n_queries={M}..min(n_keys, n_values)="
                              f"{min(self.n_keys, self.n_values)}.")
        keys = np.argsort(rng.random((n, self.n_keys)), axis=1)[:, :N]  # [n, N] distinct keys
        values = np.argsort(rng.random((n, self.n_values)), axis=1)[:, :N]  # [n, N] distinct values
        slots = np.argsort(rng.random((n, N)), axis=1)[:, :M]  # [n, M] distinct stored slots queried
        tokens = np.full((n, self.seq_len(N)), FILL, dtype=np.int64)
        tokens[:, 0 : 4 * N : 4] = STORE
        tokens[:, 1 : 4 * N : 4] = keys + self.key_offset
        tokens[:, 2 : 4 * N : 4] = SEP
        tokens[:, 3 : 4 * N : 4] = values + self.value_offset
        pos = self.query_positions(N).numpy()
        tokens[:, pos - 1] = QUERY
        tokens[:, pos] = np.take_along_axis(keys, slots, axis=1) + self.key_offset
        tokens[:, pos + 1] = ANS
        answers = np.take_along_axis(values, slots, axis=1)  # [n, M]
        return TaskBatch(
            input_ids=torch.from_numpy(tokens),
            query_pos=torch.from_numpy(pos),
            posterior=torch.nn.functional.one_hot(torch.from_numpy(answers), self.n_values).float(),
            labels=torch.from_numpy(answers),
        )

    def window_posterior(self, input_ids: torch.Tensor, m: int) -> torch.Tensor:
        """p(value of each query key | the last ``m`` tokens up to it, its position): [n, M, V] float64 (m = 0:
        the position-only belief)."""
        if m < 0:
            raise ConfigError(f"A window holds m >= 0 tokens; got m={m}.")
        N, V = self.pairs_in(input_ids), self.n_values
        n, rows = input_ids.shape[0], torch.arange(input_ids.shape[0])
        keys = input_ids[:, 1 : 4 * N : 4]  # [n, N] stored key tokens
        values = input_ids[:, 3 : 4 * N : 4] - self.value_offset  # [n, N] stored value indices
        slot = torch.arange(N)
        out = torch.empty(n, self.n_queries, V, dtype=torch.float64)
        for j, t in enumerate(self.query_positions(N).tolist()):
            if m == 0:
                out[:, j] = 1.0 / V
                continue
            start = t - m + 1  # the first visible position
            full = 4 * slot + 1 >= start  # [N] pairs shown whole (their key is visible, so is their value)
            partial = (4 * slot + 3 >= start) & ~full  # [N] at most one: only its value is visible
            n_hidden = N - int(full.sum())
            shown = torch.zeros(n, V, dtype=torch.bool)
            shown[rows[:, None], values[:, full]] = True
            belief = (~shown).double()
            if partial.any():
                u = values[:, partial][:, 0]
                belief[rows, u] = 0.0
                belief = belief / belief.sum(-1, keepdim=True).clamp(min=1) * (1 - 1 / n_hidden)
                belief[rows, u] = 1 / n_hidden
            else:
                belief = belief / belief.sum(-1, keepdim=True)
            hit = keys[:, full] == input_ids[:, t : t + 1]  # [n, f] the query's pair among those shown
            known = torch.nn.functional.one_hot(torch.where(hit, values[:, full], 0).sum(1), V).double()
            out[:, j] = torch.where(hit.any(1)[:, None], known, belief)
        return out

    def stored_values_posterior(self, input_ids: torch.Tensor) -> torch.Tensor:
        """p(value of each query key | which values are stored, not which key holds which): 1/N on each stored
        value, [n, M, V] float64. The memory-without-binding shortcut: it sees the whole store."""
        N = self.pairs_in(input_ids)
        values = input_ids[:, 3 : 4 * N : 4] - self.value_offset  # [n, N]
        belief = torch.nn.functional.one_hot(values, self.n_values).sum(1).double() / N  # [n, V]
        return belief[:, None].expand(-1, self.n_queries, -1).clone()

    def position_only_posterior(self, batch: TaskBatch) -> torch.Tensor:
        """The best belief knowing only the position: uniform over the values, [n, M, V] float64."""
        return self.window_posterior(batch.input_ids, 0)
