"""Is it uncertainty, or position? Correlations with entropy, raw and deconfounded, each against a null that keeps
the confound.

Predictive entropy moves with things that are not uncertainty: the final token's position, the prompt's length, k
(the number of in-context examples). For a reading x (a PC1 score, an axis projection) and an entropy y,
``deconfounded_correlation`` reports three numbers:

- ``raw``: the plain correlation;
- ``partial``: the correlation of x and y after both are regressed (OLS, with an intercept) on the nuisance
  covariates;
- ``within``: the pooled within-stratum correlation: x and y centred on their stratum's means (a stratum is one
  value of k, one query position, one length bin), then correlated; strata of one prompt add nothing.

Each comes with a permutation null that **keeps the confound**: y is shuffled only within strata, so whatever the
stratum variable explains survives every permutation, and only the association within strata is broken. A number
that clears this null says more than the confound alone; one that does not, does not.

Pearson and Spearman are both given (Spearman: the same on ranks, covariates included).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from .errors import ConfigError
from .geometry import CONSTANT_RTOL, as_float64

CI_LEVEL = 0.95
KINDS = ("raw", "partial", "within")


def covariate_matrix(columns: dict[str, np.ndarray]) -> np.ndarray:
    """[n, c] float64 from named columns, dropping ones that are constant or duplicate an earlier column exactly
    (e.g. the final token's position equals the prompt length minus one)."""
    kept: list[np.ndarray] = []
    for values in columns.values():
        v = as_float64(values)
        if np.ptp(v) <= CONSTANT_RTOL * max(np.abs(v).max(), 1.0):
            continue
        if any(np.allclose(v - v.mean(), k - k.mean()) for k in kept):
            continue
        kept.append(v)  # (indicators of every level are collinear with the intercept: lstsq takes the minimum norm)
    n = len(next(iter(columns.values()))) if columns else 0
    return np.stack(kept, axis=1) if kept else np.zeros((n, 0))


def nuisance_columns(token_lengths, k=None, position=None, extra: dict | None = None, *,
                     k_levels: bool = False) -> dict[str, np.ndarray]:
    """The standard nuisance covariates by name: ``length`` (prompt length in tokens; the final token's position is
    length - 1, the same column), ``k`` and ``log_k`` = log(1 + k) where a k exists (``k_levels`` adds one
    indicator ``k=<value>`` per value of k, which removes any function of k, not only a linear one in k and log k),
    a within-sequence ``position`` where given (wind tunnels), plus any a probe declares."""
    out = {"length": as_float64(token_lengths)}
    if k is not None:
        k = as_float64(k)
        out["k"], out["log_k"] = k, np.log1p(k)
        if k_levels:
            out.update({f"k={level:g}": (k == level).astype(np.float64) for level in np.unique(k)})
    if position is not None:
        out["position"] = as_float64(position)
    out.update({name: as_float64(v) for name, v in (extra or {}).items()})
    return out


def select_covariates(columns: dict[str, np.ndarray], names) -> np.ndarray:
    """The covariate matrix of the named columns (a probe's declared ``covariates``)."""
    unknown = sorted(set(names) - set(columns))
    if unknown:
        raise ConfigError(f"Unknown covariate(s) {', '.join(unknown)}; available here: {', '.join(columns)}.")
    return covariate_matrix({name: columns[name] for name in names})


def length_strata(lengths, n_bins: int = 5) -> np.ndarray:
    """Stratum labels of prompt lengths: quantile bins (ties kept together), for pools whose lengths all differ."""
    lengths = as_float64(lengths)
    edges = np.unique(np.quantile(lengths, np.linspace(0, 1, n_bins + 1))[1:-1])
    return np.searchsorted(edges, lengths, side="right")


def _design(cov: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(cov)), cov])


def residualize(train, test=None, cov_train=None, cov_test=None):
    """Residuals of ``train`` ([n] or [n, d]) after OLS on ``cov_train`` with an intercept; with ``test``, the same
    fitted coefficients applied to ``test`` / ``cov_test`` (cross-fitting without leakage: nothing about the test
    rows enters the fit). Returns the train residuals, or (train residuals, test residuals)."""
    y = as_float64(train)
    design = _design(as_float64(cov_train).reshape(len(y), -1))
    beta, *_ = np.linalg.lstsq(design, y, rcond=None)
    res_train = y - design @ beta
    if test is None:
        return res_train
    t = as_float64(test)
    return res_train, t - _design(as_float64(cov_test).reshape(len(t), -1)) @ beta


def _centre_within(x: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """x [n, m] minus its stratum means (per column)."""
    _, inv = np.unique(strata, return_inverse=True)
    sums = np.zeros((inv.max() + 1, x.shape[1]))
    np.add.at(sums, inv, x)
    counts = np.bincount(inv)[:, None]
    return x - (sums / counts)[inv]


def _corr_columns(x: np.ndarray, ys: np.ndarray, scale_x: float, scale_y: float) -> np.ndarray:
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


def _within_permutations(strata: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """[n_perm, n] index arrays, each a permutation of rows within every stratum."""
    n = len(strata)
    out = np.empty((n_perm, n), dtype=np.int64)
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for p in range(n_perm):
        for g in groups:
            out[p, g] = g[rng.permutation(len(g))]
    return out


@dataclass
class Deconfounded:
    """One reading against one entropy: per kind (raw, partial, within) and statistic (pearson, spearman), the
    value, the null's 95% range, the two-sided permutation p-value, and a verdict."""

    values: dict[str, dict[str, float]]  # kind -> stat -> value
    null: dict[str, dict[str, list[float]]]  # kind -> stat -> [low, high]
    p: dict[str, dict[str, float]]  # kind -> stat -> p-value against the within-stratum null
    p_plain: dict[str, float]  # stat -> p-value of the raw correlation against a plain (unrestricted) permutation
    n: int
    n_strata: int
    n_perm: int
    covariates: list[str]
    strata: str

    def verdict(self, stat: str = "spearman") -> str:
        """What survives of a raw correlation: "no raw effect" (the raw number is within a plain permutation null),
        "survives" (the partial and the within-stratum numbers both clear their confound-keeping nulls, with the raw
        sign and at least half its magnitude), "weakens" (one of them clears, or both at under half the raw
        magnitude), "vanishes" (neither clears: the raw correlation is what the confound gives), "appears only within
        strata" (no raw effect, but a deconfounded number clears its null: the confound was hiding it),
        "inseparable" (nothing varies once the confound is held fixed, e.g. the bijection's exact entropy within a
        position: the data cannot tell the two apart)."""
        if not self.p_plain[stat] < 1 - CI_LEVEL:
            hidden = [k for k in ("partial", "within") if self.p[k][stat] < 1 - CI_LEVEL]
            return "appears only within strata" if hidden else "no raw effect"
        if not any(np.isfinite(self.values[k][stat]) for k in ("partial", "within")):
            return "inseparable"  # y (or x) does not vary once the confound is held fixed: nothing can be said
        clears = {k: self.p[k][stat] < 1 - CI_LEVEL and np.sign(self.values[k][stat]) == np.sign(
            self.values["raw"][stat]) for k in ("partial", "within")}
        deconf = [k for k in ("partial", "within") if clears[k]]
        if not deconf:
            return "vanishes"
        raw = abs(self.values["raw"][stat])
        if len(deconf) == 2 and all(abs(self.values[k][stat]) >= 0.5 * raw for k in deconf):
            return "survives"
        return "weakens"


def deconfounded_correlation(x, y, covariates: np.ndarray, strata, *, covariate_names=(), strata_name: str = "",
                             n_perm: int = 1000, seed: int = 0) -> Deconfounded:
    """Raw, partial and within-stratum correlations of ``x`` with ``y`` (see the module docstring), each with a
    within-stratum permutation null of ``n_perm`` draws."""
    x, y = _snap(as_float64(x)), _snap(as_float64(y))
    cov = as_float64(covariates).reshape(len(x), -1)
    strata = np.asarray(strata)
    if not (len(x) == len(y) == len(cov) == len(strata)):
        raise ConfigError(f"x, y, covariates and strata need one row per prompt; got {len(x)}, {len(y)}, {len(cov)} "
                          f"and {len(strata)}.")
    rng = np.random.default_rng(seed)
    perms = _within_permutations(strata, n_perm, rng)
    plain = np.stack([rng.permutation(len(x)) for _ in range(n_perm)])
    values, null, p, p_plain = {}, {}, {}, {}
    for stat in ("pearson", "spearman"):
        xs = sps.rankdata(x) if stat == "spearman" else x
        ys = sps.rankdata(y) if stat == "spearman" else y
        cs = np.column_stack([sps.rankdata(c) for c in cov.T]) if stat == "spearman" and cov.shape[1] else cov
        y_all = np.column_stack([ys, ys[perms].T])  # [n, 1 + n_perm]: observed, then permuted within strata
        x_partial, y_partial = residualize(xs, cov_train=cs), residualize(y_all, cov_train=cs)
        within = _centre_within(np.column_stack([xs, y_all]), strata)
        sx, sy = np.abs(xs).max(), np.abs(ys).max()
        r = dict(raw=_corr_columns(xs, y_all, sx, sy), partial=_corr_columns(x_partial, y_partial, sx, sy),
                 within=_corr_columns(within[:, 0], within[:, 1:], sx, sy))
        for kind, rs in r.items():
            obs, draws = rs[0], rs[1:]
            values.setdefault(kind, {})[stat] = float(obs)
            a = (1 - CI_LEVEL) / 2
            null.setdefault(kind, {})[stat] = ([float(np.nanquantile(draws, a)), float(np.nanquantile(draws, 1 - a))]
                                               if np.isfinite(draws).any() else [float("nan")] * 2)
            p.setdefault(kind, {})[stat] = _p_value(obs, draws)
        p_plain[stat] = _p_value(r["raw"][0], _corr_columns(xs, ys[plain].T, sx, sy))
    return Deconfounded(values, null, p, p_plain, len(x), int(len(np.unique(strata))), n_perm,
                        list(covariate_names), strata_name)


def _snap(v: np.ndarray) -> np.ndarray:
    """Values equal up to rounding made exactly equal (12 significant digits of the largest magnitude), so that
    ties stay ties: ranks, and centring within strata, would otherwise turn 1e-16 noise into variation."""
    scale = np.abs(v).max() if v.size else 0.0
    return np.round(v / scale, 12) * scale if scale > 0 else v


def _p_value(obs: float, draws: np.ndarray) -> float:
    """Two-sided permutation p-value, (1 + #|draw| >= |obs|) / (1 + #draws)."""
    if not np.isfinite(obs):
        return float("nan")
    return float((1 + np.sum(np.abs(draws) >= abs(obs) - 1e-12)) / (1 + len(draws)))


def deconfounded_rows(dec: Deconfounded, metric: str, scope: dict, *, stat: str = "spearman") -> list:
    """Tidy rows of a ``Deconfounded``: one per kind (raw, partial, within), each with its null's range and the
    verdict of the claim in the note."""
    from .results import Row

    unit = "rho" if stat == "spearman" else "r"
    verdict = dec.verdict(stat)
    detail = {"raw": "plain correlation", "partial": f"given {', '.join(dec.covariates) or 'no covariate'}",
              "within": f"within {dec.n_strata} strata of {dec.strata}"}
    return [Row(metric, dec.values[kind][stat], unit, dict(scope, deconfounded=kind), null_low=dec.null[kind][stat][0],
                null_high=dec.null[kind][stat][1], null=f"within-{dec.strata} permutation ({dec.n_perm})", n=dec.n,
                note=f"{detail[kind]}; p = {dec.p[kind][stat]:.3g}; claim {verdict}") for kind in KINDS]
