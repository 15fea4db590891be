"""Belief-state probes (Shai et al. 2024): can the exact posterior be read linearly from a model's activations?

A ridge regression (``stats.RidgeBasis``: standardised inputs, penalty chosen by exact leave-one-out error inside
each training fold)
from one reading (the residual stream after a block, the concatenated value vectors or the attention output) onto
the exact posterior vector, cross-fitted over sequences: every prediction comes from a probe fitted on other
sequences, so positions of one sequence never sit on both sides (``stats.probe.belief_probe``). Rows per (weights,
target, reading, layer), ``belief_rows``:

- ``belief_r2``: 1 - SS_res / SS_tot pooled over the posterior's coordinates (the fraction of the belief's variance
  the probe recovers), with a bootstrap interval over sequences, against the same fit on posteriors permuted across
  sequences at fixed position (so the null keeps whatever the position alone explains): its 95% range and its
  sequential test;
- ``belief_kl_bits``: mean KL(exact || predicted belief), the prediction clipped at ``stats.probe.FLOOR`` and
  renormalised onto the simplex (a linear map can leave it);
- ``belief_null_mean`` (the shuffled fits' mean R²) and ``belief_dim`` (the reading's width).

The kind ``belief`` runs that on a wind-tunnel checkpoint with the two other controls: the same architecture
untrained (fresh initialisation, same seed discipline), and the window-filter posterior as the target, plus the
part of the exact posterior the window misses (exact minus window): if the model carried only the shortcut, that
part would not be readable (R² near 0).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.results import Row
from ..stats.probe import belief_probe

NULL = "posteriors shuffled across sequences at fixed position"


def belief_rows(readings: dict[str, dict[int, torch.Tensor]], targets: dict[str, tuple[np.ndarray, bool]], *,
                weights: str, groups: np.ndarray, folds: int, n_shuffles: int, n_boot: int, seed: int) -> list[Row]:
    """Rows of the belief probes of every reading and layer of ``readings`` (reading -> layer -> [n, d], the query
    positions sequence-major) onto every target (name -> ([n, H] values, whether they lie on the simplex: else no
    KL)), scoped by ``weights`` (which model read them), target, reading and layer; folds and nulls over whole
    sequences (``groups``)."""
    out = []
    for reading, by_layer in readings.items():
        for layer, x in by_layer.items():
            for target, (y, simplex) in targets.items():
                r = belief_probe(x, y, simplex=simplex, groups=groups, folds=folds, n_shuffles=n_shuffles,
                                 n_boot=n_boot, seed=seed)
                scope, shuffled = dict(weights=weights, target=target, reading=reading, layer=layer), r["shuffled"]
                out += [Row("belief_r2", r["r2"], "R^2 (cross-fitted)", dict(scope), *r["r2_ci"], "bootstrap 95%",
                            *shuffled["range"], f"{NULL} ({shuffled['n']} draws)", r["n"],
                            note=f"{r['n_sequences']} sequences", test=shuffled["test"]),
                        Row("belief_kl_bits", r["kl_bits"], "bits", dict(scope), n=r["n"],
                            note=None if simplex else "not a distribution: no KL"),
                        Row("belief_null_mean", shuffled["mean"], "R^2 (cross-fitted)", dict(scope), n=shuffled["n"]),
                        Row("belief_dim", r["dim"], "dims", dict(scope))]
    return out

