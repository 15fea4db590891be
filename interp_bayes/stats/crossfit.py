"""Cross-fitting by group, one R², and one ridge.

Folds are made of whole groups (``sklearn.model_selection.GroupKFold``): rows of one wind-tunnel sequence, or of
one prompt, never sit on both sides of a fit, so a held-out score measures generalisation to new sequences and not
recall of the training ones (a target constant within a sequence is perfectly "decodable" from a sequence id
otherwise). The ridge is the one every probe uses: standardised inputs, an unpenalised intercept, the penalty
chosen from ``ALPHAS`` by exact leave-one-out error (what ``sklearn.linear_model.RidgeCV`` computes, here from one
SVD shared by every target and penalty).
"""

from __future__ import annotations

# sklearn is imported inside functions: it takes about a second to load, and only these functions need it
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError
from .arrays import CONSTANT_RTOL, as_float64, thin_svd
from .resample import group_ids

ALPHAS = np.logspace(-3, 6, 19)  # the penalty grid of every ridge, half a decade apart
# covariate columns beside the inputs are multiplied by this, so the penalty on their coefficients is at most
# max(ALPHAS) / COVARIATE_SCALE^2 = 1e-2 of an input's: unpenalised in practice
COVARIATE_SCALE = 1e4


def group_folds(groups, folds: int, *, seed: int, n: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train rows, held-out rows) of ``folds`` folds of whole groups, shuffled by ``seed`` (``groups`` None:
    every one of the ``n`` rows is its own group)."""
    from sklearn.model_selection import GroupKFold

    n = len(groups) if n is None else n
    g = group_ids(groups, n)
    n_groups = int(g.max()) + 1 if n else 0
    if folds < 2 or n_groups < folds:
        raise ConfigError(f"{n_groups} independent groups (sequences or prompts) cannot be split into {folds} folds; "
                          "use at least 2 folds and no more folds than groups.")
    return list(GroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros((n, 1)), groups=g))


def r2(y, pred, *, pooled: bool = False):
    """1 - SSE / SST (around the mean of ``y``), per column of ``y`` ([n] or [n, H]) or, ``pooled``, one number
    over all columns. A target with no variance (constant up to rounding) has nothing to explain: its R² is NaN,
    never a division by zero or a 0."""
    y, pred = as_float64(y).reshape(len(y), -1), as_float64(pred).reshape(len(y), -1)
    dev = y - y.mean(0)
    flat = np.abs(dev).max(0) <= CONSTANT_RTOL * np.maximum(np.abs(y).max(0), 1e-300)
    sse, sst = ((y - pred) ** 2).sum(0), (dev**2).sum(0)
    if pooled:
        return float(1 - sse.sum() / sst.sum()) if not flat.all() else float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(flat, np.nan, 1 - sse / np.where(flat, 1.0, sst))


def _standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sd = x.std(axis=0)
    return x.mean(axis=0), np.where(sd > 0, sd, 1.0)


@dataclass
class RidgeFit:
    """A ridge fit: predict(x, free) = [standardised x, COVARIATE_SCALE * standardised free] @ coef + intercept."""

    mean: np.ndarray  # [d (+ c)]
    sd: np.ndarray  # [d (+ c)]
    coef: np.ndarray  # [d (+ c), H], on the standardised (and scaled) columns
    intercept: np.ndarray  # [H]
    alpha: np.ndarray  # [H] the penalty of each target (one value repeated unless per_target)
    loo_mse: np.ndarray  # [H] leave-one-out mean squared error at that penalty
    n_free: int = 0

    def design(self, x, free=None) -> np.ndarray:
        return _design(as_float64(x), free, self.mean, self.sd, self.n_free)

    def predict(self, x, free=None) -> np.ndarray:
        return self.design(x, free) @ self.coef + self.intercept


def _design(x: np.ndarray, free, mean: np.ndarray, sd: np.ndarray, n_free: int) -> np.ndarray:
    cols = x if not n_free else np.hstack([x, as_float64(free).reshape(len(x), -1)])
    z = (cols - mean) / sd
    if n_free:
        z[:, -n_free:] *= COVARIATE_SCALE
    return z


class RidgeBasis:
    """The SVD of one training set's standardised inputs ``x`` [n, d] (and, beside them, ``free`` covariates
    [n, c] left practically unpenalised), shared by every target and penalty fitted on them."""

    def __init__(self, x, free=None) -> None:
        x = as_float64(x)
        self.n_free = 0 if free is None else as_float64(free).reshape(len(x), -1).shape[1]
        cols = x if not self.n_free else np.hstack([x, as_float64(free).reshape(len(x), -1)])
        self.mean, self.sd = _standardiser(cols)
        z = _design(x, free, self.mean, self.sd, self.n_free)
        self.u, self.s, self.vt = thin_svd(z)
        self.leverage_u2 = self.u**2

    def fit(self, y, alphas=ALPHAS, *, per_target: bool = False) -> RidgeFit:
        """Ridge of ``y`` ([n] or [n, H]) with an unpenalised intercept, the penalty among ``alphas`` chosen by the
        exact leave-one-out error ((y - y_hat) / (1 - h_ii), h the hat matrix with the intercept): one penalty for
        all columns, their errors pooled (a posterior vector is one target), or ``per_target`` one per column (a
        real target and its shuffled copies)."""
        y = as_float64(y).reshape(len(self.u), -1)
        y_mean = y.mean(axis=0)
        yc = y - y_mean
        uty = self.u.T @ yc  # [k, H]
        loo = np.empty((len(alphas), y.shape[1]))
        for i, alpha in enumerate(alphas):
            shrink = self.s**2 / (self.s**2 + alpha)  # [k]
            resid = yc - self.u @ (shrink[:, None] * uty)
            leverage = self.leverage_u2 @ shrink + 1.0 / len(y)  # [n] hat-matrix diagonal, intercept included
            loo[i] = ((resid / (1.0 - leverage)[:, None]) ** 2).mean(0)
        best = loo.argmin(0) if per_target else np.full(y.shape[1], loo.mean(1).argmin())
        alpha = np.asarray(alphas, dtype=np.float64)[best]  # [H]
        coef = self.vt.T @ ((self.s[:, None] / (self.s[:, None] ** 2 + alpha[None, :])) * uty)  # [d, H]
        return RidgeFit(self.mean, self.sd, coef, y_mean, alpha, loo[best, np.arange(y.shape[1])], self.n_free)


def fit_ridge(x, y, alphas=ALPHAS, *, free=None, per_target: bool = False) -> RidgeFit:
    """Ridge of ``y`` on standardised ``x`` (``RidgeBasis.fit``)."""
    return RidgeBasis(x, free).fit(y, alphas, per_target=per_target)


def cross_fitted_ridge(x, ys: list, groups=None, *, folds: int = 5, seed: int = 0, alphas=ALPHAS,
                       per_target: bool = False) -> list[np.ndarray]:
    """Held-out ridge predictions of each target in ``ys`` ([n] or [n, H] each) from ``x`` [n, d]: each group
    predicted by a ridge fitted on the other folds of groups (standardised on the training fold, LOO penalty)."""
    x = as_float64(x)
    ys = [as_float64(y).reshape(len(x), -1) for y in ys]
    out = [np.empty_like(y) for y in ys]
    for train, test in group_folds(groups, folds, seed=seed, n=len(x)):
        basis = RidgeBasis(x[train])
        for y, pred in zip(ys, out):
            pred[test] = basis.fit(y[train], alphas, per_target=per_target).predict(x[test])
    return out
