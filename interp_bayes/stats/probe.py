"""Linear probes of what a model's readings carry, cross-fitted over folds of whole groups (a wind tunnel's sequence).

- ``belief_probe``: a posterior vector [n, H] from the readings: the pooled held-out R², its bootstrap interval over
  groups, the KL from the posterior to the prediction clipped onto the simplex, and a shuffled null (whole sequences
  moved, each row keeping its position, where rows come sequence by sequence);
- ``scalar_probes``: each of several scalar targets (a Gaussian belief's mean components, its log-determinant) on
  its own: the held-out R² of a ridge with a penalty per target, raw and within strata (readings and target centred
  per stratum, the null permuted within it, so a target that moves with position is not credited to a position
  code), against permutations of the target.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..core.errors import ConfigError
from . import (as_float64, bootstrap_r2, centre_within, cross_fitted_ridge, group_ids, group_permutations, interval,
    permutations, r2)
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


def held_out_r2(x: np.ndarray, y: np.ndarray, folds: int, seed: int, groups=None) -> np.ndarray:
    """R^2 of cross-fitted predictions of each column of y [N, k] from x [N, dim]: the toolkit's ridge
    (``cross_fitted_ridge``, a penalty per column), folds of whole ``groups`` (the sequences)."""
    pred, = cross_fitted_ridge(x, [y], groups, folds=folds, seed=seed, per_target=True)
    return r2(y, pred)


def scalar_probes(x, targets: dict[str, Any], *, groups=None, strata=None, folds: int = 5, n_null: int = 1000,
                  seed: int = 0) -> dict[str, dict[str, Any]]:
    """How much of each scalar target a reading carries linearly: the held-out R^2 of a cross-fitted ridge
    regression of each of ``targets`` (name -> [N]) on ``x`` [N, dim], beside a permutation null.

    ``groups``: the unit of independence of each row (a sequence): folds hold whole groups, so no row of a held-out
    sequence is fitted on its other rows. With ``strata`` (e.g. the step) the same is also reported within stratum:
    x and target centred per stratum, null permuted within stratum. Null: permutations of the target, drawn in
    batches until the R²'s place against them is settled (``stream_test``, two-sided, ``n_null`` the cap;
    permutation i is the same whatever the batches). Returns per target ``n``, ``folds``, ``n_null`` and per variant
    (``raw``, with ``strata`` also ``within``) ``r2_held_out``, ``null`` (the 95% range of the draws used) and
    ``test`` (the decision with its draws)."""
    x = as_float64(x)
    rng = np.random.default_rng(seed)
    variants = {"raw": (x, None)}
    if strata is not None:
        strata = np.asarray(strata)
        variants["within"] = (centre_within(x, strata), strata)
    out: dict[str, dict[str, Any]] = {}
    for name, target in targets.items():
        res: dict[str, Any] = {"n": int(len(x)), "folds": folds, "n_null": n_null}
        for variant, (xv, by) in variants.items():
            y = as_float64(target) if by is None else centre_within(as_float64(target), by)
            perms = permutations(len(y), n_null, rng, by)
            observed = float(held_out_r2(xv, y[:, None], folds, seed, groups)[0])
            test = stream_test(lambda i, j: held_out_r2(xv, y[perms[i:j]].T, folds, seed, groups), observed,
                               cap=n_null)  # shuffles i .. j - 1
            res[variant] = dict(r2_held_out=observed, null=list(test.null), test=test.as_dict())
        out[name] = res
    return out
