"""Nuisance covariates of predictive entropy, and their removal without leakage.

Entropy moves with the final token's position, the prompt's length in tokens and the number of in-context
examples k (lessons.md §6), so a reading that tracks any of them tracks entropy too. ``residualize`` removes a
linear dependence on such covariates; when a model is evaluated out of sample the regression is fitted on the
training rows only and applied unchanged to the held-out rows, so nothing about the held-out rows leaks in.
"""

from __future__ import annotations

import numpy as np

from .geometry import CONSTANT_RTOL, as_float64, correlations


def nuisance_covariates(lengths, k=None, positions=None, *, k_levels: bool = False) -> np.ndarray:
    """[n, c] covariates: the read token's position (default the final one, ``length - 1``), the prompt length in
    tokens and, with ``k`` given, k and log(1 + k) (log k would be -inf at k = 0); ``k_levels`` adds one indicator
    per value of k, which removes any function of k, not only a linear one in k and log(1 + k). Collinear columns
    (the final position is the length minus one) are harmless: ``residualize`` solves by least squares."""
    lengths = as_float64(lengths)
    positions = lengths - 1 if positions is None else as_float64(positions)
    cols = [positions, lengths]
    if k is not None:
        k = as_float64(k)
        cols += [k, np.log1p(k)]
        if k_levels:
            cols += [(k == level).astype(np.float64) for level in np.unique(k)]
    return np.column_stack(cols)


def _design(cov: np.ndarray) -> np.ndarray:
    cov = as_float64(cov)
    return np.column_stack([np.ones(len(cov)), cov.reshape(len(cov), -1)])


def residualize(train, test, cov_train, cov_test) -> tuple[np.ndarray, np.ndarray]:
    """Residuals of ``train`` and ``test`` (1-D targets or [n, d] readings) after an ordinary least-squares fit, with
    intercept, on the covariates of the training rows only; the same coefficients are applied to ``test``."""
    train, test = as_float64(train), as_float64(test)
    design_train, design_test = _design(cov_train), _design(cov_test)
    coef, *_ = np.linalg.lstsq(design_train, train, rcond=None)  # minimum-norm: collinear covariates are fine
    return train - design_train @ coef, test - design_test @ coef


def partial_correlation(x, y, covariates, *, strata=None, n_perm: int = 1000, seed: int = 0) -> dict:
    """Pearson and Spearman r of x and y after both are residualised on ``covariates`` (in sample), with a
    permutation null that shuffles x only within each stratum (e.g. each k), so the null keeps the confound:
    its 95% range and the two-sided permutation p-value of the Pearson r, measured from the null's median (a null
    that keeps the confound need not be centred on 0)."""
    rx, _ = residualize(x, x, covariates, covariates)
    ry, _ = residualize(y, y, covariates, covariates)
    explained = [name for name, raw, res in (("first", x, rx), ("second", y, ry))
                 if np.ptp(res) <= CONSTANT_RTOL * np.abs(as_float64(raw)).max()]
    if explained:  # residuals of rounding size: a correlation of them would mean nothing
        return dict(pearson=float("nan"), spearman=float("nan"),
                    reason=f"the {' and '.join(explained)} input is constant up to rounding once the covariates "
                           "are removed")
    out = correlations(rx, ry)
    if n_perm:
        rng = np.random.default_rng(seed)
        groups = [np.arange(len(rx))] if strata is None else \
            [np.flatnonzero(np.asarray(strata) == s) for s in np.unique(strata)]
        null = np.empty(n_perm)
        for i in range(n_perm):
            perm = np.arange(len(rx))
            for g in groups:
                perm[g] = rng.permutation(g)
            px, _ = residualize(as_float64(x)[perm], as_float64(x)[perm], covariates, covariates)
            null[i] = np.corrcoef(px, ry)[0, 1]
        centre = np.median(null)
        out.update(null_range=[float(np.quantile(null, 0.025)), float(np.quantile(null, 0.975))], n_perm=n_perm,
                   null_median=float(centre),
                   p_value=float((1 + np.sum(np.abs(null - centre) >= abs(out["pearson"] - centre))) / (1 + n_perm)))
    return out
