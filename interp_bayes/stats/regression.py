"""Residualising on covariates: a flexible basis, OLS with an intercept, fine strata, and the share left between
strata.

A linear term in a covariate removes only a linear function of it. ``covariate_basis`` makes the design that removes
any function of a discrete covariate (one indicator per level: k, a query position) and a smooth function of a
continuous one (a cubic B-spline basis, ``sklearn.preprocessing.SplineTransformer``, knots at quantiles: prompt
length). ``residual_confounding`` says how well that worked for a residualised reading: the fraction of its
variance that still lies between strata (0 when the strata's means are removed exactly).
"""

from __future__ import annotations

# sklearn is imported inside functions: it takes about a second to load, and only these functions need it
from typing import Callable

import numpy as np

from .arrays import CONSTANT_RTOL, as_float64

MAX_LEVELS = 24  # a covariate with at most this many distinct values is discrete unless named continuous
SPLINE_KNOTS = 5  # knots of a continuous covariate's cubic spline basis (n_knots + 2 columns)
STRATUM_SIZE = 3  # rows per stratum of ``fine_strata``: small enough that a continuous confound barely varies


def _indicators(v: np.ndarray) -> list[np.ndarray]:
    return [(v == level).astype(np.float64) for level in np.unique(v)]


def _spline(v: np.ndarray, n_knots: int) -> list[np.ndarray]:
    from sklearn.preprocessing import SplineTransformer

    knots = np.unique(np.quantile(v, np.linspace(0, 1, n_knots)))
    if len(knots) < 2:
        return []
    basis = SplineTransformer(knots=knots[:, None], degree=3, extrapolation="linear").fit_transform(v[:, None])
    return list(basis.T)


def covariate_basis(columns: dict, *, continuous=(), n_knots: int = SPLINE_KNOTS) -> np.ndarray:
    """[n, p] float64 design of named covariate columns: one indicator per level for a discrete column, a cubic
    spline basis for a continuous one (named in ``continuous``, or with more than ``MAX_LEVELS`` values). Columns
    that are constant or repeat an earlier one (log k's indicators are k's) are dropped; the rest may be collinear
    with the intercept (a full set of indicators sums to 1), which ``residualize``'s least squares absorbs."""
    kept: list[np.ndarray] = []
    n = len(next(iter(columns.values()))) if columns else 0
    for name, values in columns.items():
        v = as_float64(values).reshape(-1)
        smooth = name in continuous or len(np.unique(v)) > MAX_LEVELS
        for col in (_spline(v, n_knots) if smooth else _indicators(v)):
            if np.ptp(col) <= CONSTANT_RTOL * max(np.abs(col).max(), 1.0):
                continue
            if any(np.allclose(col - col.mean(), k - k.mean()) for k in kept):
                continue
            kept.append(col)
    return np.stack(kept, axis=1) if kept else np.zeros((n, 0))


def _with_intercept(cov: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(cov)), cov])


def residualize(train, test=None, cov_train=None, cov_test=None):
    """Residuals of ``train`` ([n] or [n, d]) after OLS on ``cov_train`` with an intercept; with ``test``, the same
    fitted coefficients applied to ``test`` / ``cov_test`` (cross-fitting without leakage: nothing about the test
    rows enters the fit). Returns the train residuals, or (train residuals, test residuals)."""
    y = as_float64(train)
    design = _with_intercept(as_float64(cov_train).reshape(len(y), -1))
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    res_train = y - design @ beta
    if test is None:
        return res_train
    t = as_float64(test)
    return res_train, t - _with_intercept(as_float64(cov_test).reshape(len(t), -1)) @ beta


def residualizer(cov) -> Callable[[np.ndarray], np.ndarray]:
    """``residualize(y, cov_train=cov)`` as a function of y, the least-squares operator (a pseudo-inverse) computed
    once: for many targets on one design (a permutation null's batches)."""
    design = _with_intercept(as_float64(cov).reshape(len(cov), -1))
    pinv = np.linalg.pinv(design)  # the minimum-norm least squares, as lstsq; the residuals are the same projection
    return lambda y: as_float64(y) - design @ (pinv @ as_float64(y))


def centre_within(x, strata) -> np.ndarray:
    """``x`` ([n] or [n, m]) minus its stratum means (per column)."""
    x = as_float64(x)
    flat = x.reshape(len(x), -1)
    _, inv = np.unique(np.asarray(strata), return_inverse=True)
    inv = inv.reshape(-1)
    sums = np.zeros((inv.max() + 1, flat.shape[1]))
    np.add.at(sums, inv, flat)
    return (flat - (sums / np.bincount(inv)[:, None])[inv]).reshape(x.shape)


def residual_confounding(x, strata) -> float:
    """The share of the variance of ``x`` ([n] or [n, m], pooled over columns) that lies between strata: 1 - the
    within-stratum sum of squares over the total. 0 when every stratum has the same mean, 1 when ``x`` is a
    function of the stratum; NaN when ``x`` does not vary."""
    x = as_float64(x).reshape(len(x), -1)
    total = ((x - x.mean(0)) ** 2).sum()
    if total <= (CONSTANT_RTOL * max(np.abs(x).max(), 1e-300)) ** 2 * x.size:
        return float("nan")
    return float(max(0.0, 1.0 - (centre_within(x, strata) ** 2).sum() / total))


def fine_strata(values, size: int = STRATUM_SIZE) -> np.ndarray:
    """Stratum labels of a continuous variable (prompt length): consecutive runs of at least ``size`` rows in
    sorted order, ties kept together, a short last run merged into the one before. Strata this fine leave a strong
    continuous confound almost no room within a stratum (quintiles leave it most of its range)."""
    v = as_float64(values)
    _, inv, counts = np.unique(v, return_inverse=True, return_counts=True)
    label_of, label, run = np.empty(len(counts), dtype=np.int64), 0, 0
    for i, c in enumerate(counts):
        label_of[i] = label
        run += c
        if run >= size:
            label, run = label + 1, 0
    if 0 < run and label > 0:  # the last run is short: join it to the previous one
        label_of[label_of == label] = label - 1
    return label_of[inv.reshape(-1)]
