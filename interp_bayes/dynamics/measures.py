"""Float64 measurements shared by the sticky-chain trainings and the frame-precision curves."""

from __future__ import annotations

# sklearn is imported inside cv_r2, its one user: the dynamics package's other commands do without it
from collections.abc import Sequence

import numpy as np
import torch
from scipy import stats

from ..stats import group_folds, r2
from ..stats.pca import shares, spectrum


def pc1_share(x: torch.Tensor) -> float:
    """Share of variance on the first principal component of the unstandardised rows (float64)."""
    ev = spectrum(x, standardize=False)
    return shares(ev)[0] if ev.sum() > 0 else 0.0


def cv_r2(features: torch.Tensor, target: torch.Tensor, groups, *, seed: int = 0, folds: int = 5) -> float:
    """Out-of-sample R^2 (``stats.r2``: NaN for a constant target) of a linear fit of ``target`` from ``features``,
    over folds of whole ``groups`` (``stats.group_folds``: the sequence of each row, whose positions are not
    independent; None: every row its own group; float64)."""
    from sklearn.linear_model import LinearRegression
    from sklearn.model_selection import cross_val_predict

    xf, yf = features.double().numpy(), target.double().numpy()
    pred = cross_val_predict(LinearRegression(), xf, yf, cv=group_folds(groups, folds, seed=seed, n=len(yf)))
    return float(r2(yf, pred)[0])


def geometric_mean_interval(ratios: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and t-interval of positive ratios over seeds (on the log scale)."""
    logs = np.log(np.asarray(ratios, dtype=np.float64))
    centre = float(np.exp(logs.mean()))
    if logs.size < 2 or logs.std(ddof=1) == 0:
        return centre, centre, centre
    lo, hi = stats.t.interval(level, logs.size - 1, loc=logs.mean(), scale=stats.sem(logs))
    return centre, float(np.exp(lo)), float(np.exp(hi))

