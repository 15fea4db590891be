""""""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..core.errors import ConfigError
from . import as_float64, bootstrap_r2, cross_fitted_ridge, group_ids, group_permutations, interval, permutations, r2
from .info import kl_from_probs
from .sequential import stream_test

FLOOR = 1e-3


def simplex_belief(pred: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Rows clipped at ``floor`` and renormalised: a probability vector from a linear prediction."""
    clipped = np.maximum(pred, floor)
    return clipped / clipped.sum(axis=-1, keepdims=True)


def belief_probe(acts, posterior, *, groups=None, folds: int = 5, n_shuffles: int = 1000, n_boot: int = 1000,
                 seed: int = 0, floor: float = FLOOR, simplex: bool = True) -> dict[str, Any]:
    """Cross-fitted linear probe of ``posterior`` [n, H] from ``acts`` [n, d] (see the module docstring).

    ``groups``: the sequence of each row (rows of one sequence share a fold); default: rows are independent.
    Rows must come in equal-sized groups in sequence-major order for the position-keeping shuffle (as
    ``query_readings`` gives them); otherwise whole rows are shuffled. ``simplex=False`` skips the KL (for targets
    that are not distributions, e.g. exact minus window). Returns r2, r2_ci, kl_bits and the shuffled null: shuffles
    drawn in batches until the R²'s place against them is settled (``sequential_test``, ``n_shuffles`` the cap),
    their mean and 95% range, the draws used and the test.
    """
    x, y = as_float64(acts), as_float64(posterior)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise ConfigError(f"belief_probe needs acts [n, d] and posterior [n, H] with the same n; got {x.shape} and "
                          f"{y.shape}.")
    with threadpool_limits(limits=torch.get_num_threads()):  # BLAS follows torch's thread count (shared cores)
        return _belief_probe(x, y, groups=groups, folds=folds, n_shuffles=n_shuffles, n_boot=n_boot, seed=seed,
                             floor=floor, simplex=simplex)


def _belief_probe(x: np.ndarray, y: np.ndarray, *, groups, folds: int, n_shuffles: int, n_boot: int, seed: int,
                  floor: float, simplex: bool) -> dict[str, Any]:
    inverse = group_ids(groups, len(x))
    # permute whole sequences, each row keeping its position, where rows come sequence by sequence; else rows
    order = group_permutations(inverse, n_shuffles, [seed, 1])
    if order is None:
        order = permutations(len(y), n_shuffles, [seed, 1])
    y_hat, = cross_fitted_ridge(x, [y], inverse, folds=folds, seed=seed)
    observed = r2(y, y_hat, pooled=True)
    drawn: list[float] = []

    def null(start: int, stop: int) -> list[float]:  # the pooled R² of shuffles start .. stop - 1
        nulls = [y[o] for o in order[start:stop]]
        drawn.extend(r2(y_null, hat, pooled=True) for y_null, hat in
                     zip(nulls, cross_fitted_ridge(x, nulls, inverse, folds=folds, seed=seed)))
        return drawn[start:]

    test = stream_test(null, observed, cap=n_shuffles)
    boot = bootstrap_r2(y, y_hat, inverse, n_boot=n_boot, seed=seed)
    out = dict(r2=observed, r2_ci=interval(boot), n=int(len(y)), n_sequences=int(inverse.max()) + 1,
               dim=int(x.shape[1]), folds=folds,
               shuffled=dict(mean=float(np.mean(drawn)), range=list(test.null), n=test.draws, test=test.as_dict()))
    out["kl_bits"] = float(kl_from_probs(y, np.log(simplex_belief(y_hat, floor))).mean()) if simplex else float("nan")
    return out
