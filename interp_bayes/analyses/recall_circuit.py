"""The associative-recall circuit read from attention patterns (issue 40, item 2): which heads bind keys to values.

Binding in ``tasks/recall.py`` (``STORE k SEP v ... QUERY q``) takes a two-step lookup, as an induction circuit
does (Olsson et al. 2022): a head at each stored value reads the key two tokens back (so the value's residual
knows its key), and a head at the query key attends to the value whose key matches. Per head, over sequences:

- ``recall_key_lookback``: attention from each stored value to its own key two tokens back (the first step);
- ``recall_prefix_matching``: attention from each query key to the token after the earlier copy of that key (its
  ``SEP``): Olsson et al.'s prefix-matching score, with the "next token" of the stored key;
- ``recall_value_attention``: attention from each query key to the matching key's value (the second step);
- ``recall_value_share``: that attention over the head's attention on all N stored values: 1/N for a head that
  spreads evenly over them (the stored-values shortcut: memory without binding), 1 for a head that binds, 0 at a
  query where the head attends to no stored value.

Each is a mean over sequences (per sequence, the mean over its queries or stored pairs) with a bootstrap interval
over sequences, the unit of independence. The patterns come from ``model.read.patterns``; the kind
``recall_circuit`` reads them at each checkpoint of a run.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..core.errors import ConfigError
from ..core.results import Row
from ..stats import as_float64, bootstrap_means
from ..tasks.recall import RecallTask

METRICS = ("recall_key_lookback", "recall_prefix_matching", "recall_value_attention", "recall_value_share")


def recall_circuit_scores(patterns: Sequence[np.ndarray | torch.Tensor], input_ids: np.ndarray | torch.Tensor,
                          task: RecallTask, *, n_boot: int = 1000, seed: int = 0) -> list[Row]:
    """Rows of the four scores of the module docstring per (layer, head), from per-layer attention patterns
    [n, heads, T, T] (rows: query positions, summing to 1) of the recall sequences ``input_ids`` [n, T]."""
    ids = torch.as_tensor(input_ids)
    n, T = ids.shape
    N = task.pairs_in(ids)
    for layer, p in enumerate(patterns):
        if tuple(p.shape[:1]) + tuple(p.shape[2:]) != (n, T, T):
            raise ConfigError(f"The attention pattern of layer {layer} has shape {tuple(p.shape)}; expected "
                              f"[{n}, heads, {T}, {T}] for {n} sequences of {T} tokens.")
    slot = np.arange(N)
    key_pos, value_pos = 4 * slot + 1, 4 * slot + 3  # [N]
    query_pos = task.query_positions(N).numpy()  # [M]
    tokens = ids.numpy()
    # [n, M] the stored slot of each query's key (the keys of a sequence are distinct)
    m = (tokens[:, key_pos][:, None, :] == tokens[:, query_pos][:, :, None]).argmax(-1)
    rows_out = []
    for layer, p in enumerate(patterns):
        a = as_float64(p)  # [n, heads, T, T]
        at_query = a[:, :, query_pos]  # [n, heads, M, T]

        def take(pos: np.ndarray) -> np.ndarray:  # [n, M] positions -> [n, heads, M] attention from each query
            return np.take_along_axis(at_query, pos[:, None, :, None], axis=-1)[..., 0]

        value = take(4 * m + 3)  # [n, heads, M]
        on_values = at_query[..., value_pos].sum(-1)  # [n, heads, M]
        per_seq = {
            "recall_key_lookback": a[:, :, value_pos, key_pos].mean(-1),  # [n, heads]
            "recall_prefix_matching": take(4 * m + 2).mean(-1),
            "recall_value_attention": value.mean(-1),
            "recall_value_share": np.divide(value, on_values, out=np.zeros_like(value), where=on_values > 0).mean(-1),
        }
        for metric in METRICS:
            mean, low, high = bootstrap_means(per_seq[metric], None, n_boot=n_boot, seed=seed)
            rows_out += [Row(metric=metric, value=float(mean[h]), unit="attention", scope={"layer": layer, "head": h},
                             low=float(low[h]), high=float(high[h]), interval="bootstrap 95% over sequences", n=n)
                         for h in range(a.shape[1])]
    return rows_out

