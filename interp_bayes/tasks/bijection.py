"""Bijection elimination (Paper I task A): belief accumulation over a latent uniform bijection of V symbols.

Sequence (sep-vocab, methods.md §1.2 format 1): ``[k1, v1+V, k2, v2+V, ..., kL]``; keys are ids 0..V-1, values
V..2V-1. Every key position is a query: the next token there is the key's value, so the model is scored on its
next-token distribution restricted to the V value tokens. Without replacement the exact posterior at the k-th key
is uniform over the V-k+1 values not yet seen (entropy log2(V-k+1)); with replacement a repeated key gives a delta.
The posterior depends only on the keys shown, not on how they were drawn, so a ``key_pool`` (keys with replacement
from a few symbols per sequence, making repeats common) is a curriculum step under the same exact target.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import TaskBatch, as_rng


class BijectionTask:
    """Generator of bijection-elimination sequences with exact posteriors."""

    name = "bijection"

    def __init__(self, n_symbols: int = 20, n_pairs: int | None = None, replacement: bool = False,
                 key_pool: int | None = None) -> None:
        """``key_pool``: with replacement, each sequence draws its keys from a random subset of this many symbols
        (None: all ``n_symbols``)."""
        n_pairs = n_symbols if n_pairs is None else n_pairs
        if not replacement and n_pairs > n_symbols:
            raise ValueError(f"n_pairs={n_pairs} > n_symbols={n_symbols} needs replacement=True.")
        if key_pool is not None and not (replacement and 1 <= key_pool <= n_symbols):
            raise ValueError(f"key_pool={key_pool} needs replacement=True and 1 <= key_pool <= n_symbols={n_symbols}.")
        self.n_symbols, self.n_pairs, self.replacement, self.key_pool = n_symbols, n_pairs, replacement, key_pool

    @property
    def vocab(self) -> list[str]:
        """Token strings in id order: keys k0.. then values v0.."""
        return [f"k{i}" for i in range(self.n_symbols)] + [f"v{i}" for i in range(self.n_symbols)]

    @property
    def hypothesis_ids(self) -> list[int]:
        """Token ids of the hypotheses (the value tokens) the posterior is over."""
        return list(range(self.n_symbols, 2 * self.n_symbols))

    def seq_len(self, length: int | None = None) -> int:
        """Tokens per sequence for ``length`` key/value pairs (the last value is never shown)."""
        return 2 * (length or self.n_pairs) - 1

    def predictive(self, pairs, query: int) -> np.ndarray:
        """Exact p(value of key ``query`` | the revealed (key, value) ``pairs``), values as indices 0..V-1: a known key's
        value with certainty, otherwise uniform over the values not yet revealed (the posterior ``sample`` gives)."""
        out = np.zeros(self.n_symbols)
        known = {key: value for key, value in pairs}
        if query in known:
            out[known[query]] = 1.0
            return out
        unseen = np.ones(self.n_symbols, dtype=bool)
        unseen[list(known.values())] = False
        out[unseen] = 1.0 / unseen.sum()
        return out

    def sample(self, n: int, *, seed: int | np.random.Generator | None = None, length: int | None = None) -> TaskBatch:
        """Draw ``n`` sequences of ``length`` pairs (default ``n_pairs``), a fresh bijection each."""
        rng, V, L = as_rng(seed), self.n_symbols, length or self.n_pairs
        perm = np.argsort(rng.random((n, V)), axis=1)  # [n, V] the latent bijection
        if self.replacement and self.key_pool is not None:
            pool = np.argsort(rng.random((n, V)), axis=1)[:, : self.key_pool]  # [n, pool] symbols per sequence
            keys = np.take_along_axis(pool, rng.integers(0, self.key_pool, size=(n, L)), axis=1)
        elif self.replacement:
            keys = rng.integers(0, V, size=(n, L))
        else:
            if L > V:
                raise ValueError(f"length={L} > n_symbols={V} needs replacement=True.")
            keys = np.argsort(rng.random((n, V)), axis=1)[:, :L]  # [n, L] distinct keys
        values = np.take_along_axis(perm, keys, axis=1)  # [n, L]
        tokens = np.empty((n, 2 * L - 1), dtype=np.int64)
        tokens[:, 0::2] = keys
        tokens[:, 1::2] = values[:, :-1] + V
        onehot = np.eye(V, dtype=np.float64)[values]  # [n, L, V]
        seen = (np.cumsum(onehot, axis=1) - onehot) > 0  # [n, L, V] values shown before query k
        unseen = ~seen
        post = unseen / np.maximum(unseen.sum(-1, keepdims=True), 1)  # all seen: only a repeated key, set below
        if self.replacement:  # a repeated key's value is known exactly
            key_oh = np.eye(V, dtype=np.float64)[keys]
            repeated = ((np.cumsum(key_oh, axis=1) - key_oh) * key_oh).sum(-1) > 0  # [n, L]
            post = np.where(repeated[..., None], onehot, post)
        return TaskBatch(
            input_ids=torch.from_numpy(tokens),
            query_pos=torch.arange(0, 2 * L - 1, 2),
            posterior=torch.from_numpy(post.astype(np.float32)),
            labels=torch.from_numpy(values),
        )
