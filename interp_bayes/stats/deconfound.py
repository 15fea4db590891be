"""Is it uncertainty, or position? A correlation raw and deconfounded, each against a null that keeps the confound.

For a reading x (a PC1 score, an axis projection) and an entropy y, ``deconfounded_correlation`` reports:

- ``raw``: the plain correlation;
- ``partial``: the correlation of x and y after both are residualised (OLS with an intercept) on the covariates'
  basis (``regression.covariate_basis``: one indicator per level of a discrete covariate, a spline of a
  continuous one);
- ``within``: the pooled within-stratum correlation: x and y centred on their stratum's means (a stratum is one
  value of k, one query position, a fine bin of length), then correlated; strata of one row add nothing.

Each comes with a permutation null that **keeps the confound**: y is shuffled only within strata, so whatever the
stratum variable explains survives every permutation. Its p-value is computed against the null as drawn
(``permutation.p_value``), and the claim comes from ``verdicts.claim``. Each kind also reports its residual
confounding: the share of its (residualised) x's or y's variance, whichever is larger, that lies between strata.

Pearson and Spearman are both given (Spearman: the same on the ranks of x and y; the covariate basis is already
flexible, so it is not ranked).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError
from .arrays import CONSTANT_RTOL, as_float64, ranks, snap
from .permutation import p_value, permutations
from .regression import centre_within, residual_confounding, residualize
from .resample import interval
from .verdicts import claim

KINDS = ("raw", "partial", "within")


def corr_columns(x: np.ndarray, ys: np.ndarray, scale_x: float, scale_y: float) -> np.ndarray:
    """Pearson r of x [n] with every column of ys [n, m]; NaN where x or a column varies by no more than rounding
    noise relative to the scale of the data it was derived from (a residual of a constant is noise, not signal)."""
    xc = x - x.mean()
    yc = ys - ys.mean(axis=0)
    flat_x = np.abs(xc).max() <= CONSTANT_RTOL * max(scale_x, 1e-300)
    flat_y = np.abs(yc).max(axis=0) <= CONSTANT_RTOL * max(scale_y, 1e-300)
    denom = np.sqrt((xc**2).sum() * (yc**2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = xc @ yc / np.where(denom > 0, denom, 1.0)
    return np.where(flat_x | flat_y | (denom <= 0), np.nan, r)


@dataclass
class Deconfounded:
    """One reading against one entropy: per kind (raw, partial, within) and statistic (pearson, spearman), the
    value, the null's 95% range, the p-value against the within-stratum null, the residual confounding, and a
    verdict."""

    values: dict[str, dict[str, float]]  # kind -> stat -> value
    null: dict[str, dict[str, list[float]]]  # kind -> stat -> [low, high]
    p: dict[str, dict[str, float]]  # kind -> stat -> p-value against the within-stratum null
    p_plain: dict[str, float]  # stat -> p-value of the raw correlation against a plain (unrestricted) permutation
    n: int
    n_strata: int
    n_perm: int
    covariates: list[str]
    strata: str
    residual_confounding: dict[str, dict[str, float]]  # kind -> stat -> share of variance between strata

    def verdict(self, stat: str = "spearman") -> str:
        """``verdicts.claim`` of this reading's ``stat``: one of ``verdicts.VERDICTS``."""
        return claim(self.values["raw"][stat], self.p_plain[stat], {k: self.values[k][stat] for k in KINDS},
                     {k: self.p[k][stat] for k in KINDS})


def deconfounded_correlation(x, y, covariates: np.ndarray, strata, *, covariate_names=(), strata_name: str = "",
                             n_perm: int = 1000, seed: int = 0) -> Deconfounded:
    """Raw, partial and within-stratum correlations of ``x`` with ``y`` given the covariate design ``covariates``
    ([n, c], e.g. ``covariate_basis``) and ``strata`` labels (see the module docstring), each with a within-stratum
    permutation null of ``n_perm`` draws."""
    x, y = snap(as_float64(x)), snap(as_float64(y))
    cov = as_float64(covariates).reshape(len(x), -1)
    strata = np.asarray(strata)
    if not (len(x) == len(y) == len(cov) == len(strata)):
        raise ConfigError(f"x, y, covariates and strata need one row per prompt; got {len(x)}, {len(y)}, {len(cov)} "
                          f"and {len(strata)}.")
    rng = np.random.default_rng(seed)
    perms = permutations(len(x), n_perm, rng, strata)
    plain = permutations(len(x), n_perm, rng)
    values, null, p, p_plain, between = {}, {}, {}, {}, {}
    for stat in ("pearson", "spearman"):
        xs = ranks(x) if stat == "spearman" else x
        ys = ranks(y) if stat == "spearman" else y
        y_all = np.column_stack([ys, ys[perms].T])  # [n, 1 + n_perm]: observed, then permuted within strata
        x_partial, y_partial = residualize(xs, cov_train=cov), residualize(y_all, cov_train=cov)
        within = centre_within(np.column_stack([xs, y_all]), strata)
        sx, sy = np.abs(xs).max(), np.abs(ys).max()
        r = dict(raw=corr_columns(xs, y_all, sx, sy), partial=corr_columns(x_partial, y_partial, sx, sy),
                 within=corr_columns(within[:, 0], within[:, 1:], sx, sy))
        readings = dict(raw=(xs, ys), partial=(x_partial, y_partial[:, 0]), within=(within[:, 0], within[:, 1]))
        for kind, rs in r.items():
            values.setdefault(kind, {})[stat] = float(rs[0])
            null.setdefault(kind, {})[stat] = interval(rs[1:])
            p.setdefault(kind, {})[stat] = p_value(rs[0], rs[1:])
            shares = [residual_confounding(v, strata) for v in readings[kind]]
            between.setdefault(kind, {})[stat] = float(np.nanmax(shares)) if np.isfinite(shares).any() else \
                float("nan")
        p_plain[stat] = p_value(r["raw"][0], corr_columns(xs, ys[plain].T, sx, sy))
    return Deconfounded(values, null, p, p_plain, len(x), int(len(np.unique(strata))), n_perm,
                        list(covariate_names), strata_name, between)
