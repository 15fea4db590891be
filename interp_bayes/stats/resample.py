"""Bootstraps over the unit of independence and percentile intervals, at one confidence level.

A bootstrap resamples the groups that were sampled independently (a wind-tunnel sequence, whose prefixes are not
independent; a prompt in a pool or in SULA), never their rows one by one: ``groups`` gives each row's group, and
None means every row is its own. Statistics that are functions of sums (means, R², Pearson r, ratios) are
bootstrapped from per-group sums in one matrix product (``resampled_sums``); any other statistic goes through
``scipy.stats.bootstrap`` over the group ids (``bootstrap``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import stats

from ..core.errors import ConfigError
from .arrays import as_float64

CI_LEVEL = 0.95  # every interval and null range of the toolkit: the central 95%


def _tails(level: float) -> tuple[float, float]:
    return (1 - level) / 2, (1 + level) / 2


def interval(samples, level: float = CI_LEVEL) -> list[float]:
    """[low, high]: the central ``level`` range of ``samples`` (percentiles, linear interpolation), NaNs ignored;
    [NaN, NaN] when no sample is finite."""
    s = as_float64(samples).reshape(-1)
    if not np.isfinite(s).any():
        return [float("nan")] * 2
    return [float(q) for q in np.nanquantile(s, _tails(level))]


def bounds(samples, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """``interval`` along the first axis of ``samples`` [n_draws, ...]: (lows, highs), each of the trailing shape."""
    low, high = np.nanquantile(as_float64(samples), _tails(level), axis=0)
    return low, high


def percentile_of(value: float, draws) -> float:
    """The fraction of ``draws`` at or below ``value`` (a draw that is NaN counts as not below)."""
    return float(np.mean(as_float64(draws) <= value))


def group_ids(groups, n: int) -> np.ndarray:
    """0..G-1 per row from any labels (None: every row its own group), checked to give one label per row."""
    if groups is None:
        return np.arange(n)
    g = np.asarray(groups)
    if g.shape != (n,):
        raise ConfigError(f"groups need one label per row: got shape {g.shape} for {n} rows; pass the sequence or "
                          "prompt of each row.")
    return np.unique(g, return_inverse=True)[1].reshape(-1)


def resample_counts(groups: np.ndarray, n_boot: int, seed) -> np.ndarray:
    """[n_boot, G] how often each group is drawn in each resample of G groups with replacement (``seed``: an int
    or a generator shared with other draws)."""
    G = int(groups.max()) + 1
    draws = np.random.default_rng(seed).integers(0, G, (n_boot, G))
    flat = (draws + G * np.arange(n_boot)[:, None]).reshape(-1)
    return np.bincount(flat, minlength=n_boot * G).reshape(n_boot, G).astype(np.float64)


def resampled_sums(columns, groups=None, *, n_boot: int, seed) -> np.ndarray:
    """Sums of ``columns`` ([n, ...]) over each bootstrap resample of whole groups: [n_boot, ...]. A resample's
    sum is its group counts times the groups' sums (one matrix product, however many resamples)."""
    x = as_float64(columns)
    g = group_ids(groups, len(x))
    flat = x.reshape(len(x), -1)
    sums = np.zeros((int(g.max()) + 1, flat.shape[1]))
    np.add.at(sums, g, flat)
    return (resample_counts(g, n_boot, seed) @ sums).reshape((n_boot,) + x.shape[1:])


def bootstrap_mean_draws(x, groups=None, *, n_boot: int, seed) -> np.ndarray:
    """[n_boot, ...] the means of ``x`` [n, ...] over bootstrap resamples of whole groups (the draws behind
    ``bootstrap_means``, for a p-value against them). With groups of unequal size a resample's mean is over the rows
    it holds."""
    x = as_float64(x)
    both = resampled_sums(np.concatenate([x.reshape(len(x), -1), np.ones((len(x), 1))], axis=1), groups,
                          n_boot=n_boot, seed=seed)
    return (both[:, :-1] / both[:, -1:]).reshape((n_boot,) + x.shape[1:])


def paired_excess_draws(x, controls, groups=None, *, seed) -> Callable[[int], np.ndarray]:
    """Bootstrap draws of the paired excess of ``x`` [n] over ``m`` control measurements of the same units
    (``controls`` [m, n], m >= 1): D = mean over units of (x - the controls' mean), resampled at two levels at once:
    each draw resamples the units (whole ``groups``) and, independently, the m controls, so its spread carries both
    the units' noise and the spread between controls. Returns ``draw(b) -> [b]``, the next b draws from one
    generator (``seed``), for a sequential test that asks for more until it settles (``stats.sequential_test``)."""
    x, controls = as_float64(x).reshape(-1), as_float64(controls)
    m = len(controls)
    g = group_ids(groups, len(x))
    size = np.bincount(g).astype(np.float64)  # [G] units per group, and each group's sums:
    x_sum, control_sum = np.bincount(g, x), np.stack([np.bincount(g, c) for c in controls])
    rng = np.random.default_rng(seed)

    def draw(b: int) -> np.ndarray:
        w = resample_counts(g, b, rng)  # [b, G] groups
        v = resample_counts(np.arange(m), b, rng) / m  # [b, m] controls, as weights summing to 1
        control = np.einsum("bm,mg,bg->b", v, control_sum, w)
        return (w @ x_sum - control) / (w @ size)

    return draw


def bootstrap_means(x, groups=None, *, n_boot: int, seed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means over the rows of ``x`` [n, ...] with a percentile bootstrap over groups: (means, lows, highs), each
    of x's trailing shape (``bootstrap_mean_draws``)."""
    x = as_float64(x)
    low, high = bounds(bootstrap_mean_draws(x, groups, n_boot=n_boot, seed=seed))
    return x.mean(0), low, high


def bootstrap_r2(y, y_hat, groups=None, *, n_boot: int, seed) -> np.ndarray:
    """[n_boot] R² (``crossfit.r2`` pooled over coordinates: 1 - SSE / SST around the resample's mean) of
    predictions ``y_hat`` of ``y`` ([n] or [n, H]) over resamples of whole groups; NaN where a resample's target
    has no variance."""
    y, y_hat = as_float64(y).reshape(len(y), -1), as_float64(y_hat).reshape(len(y), -1)
    cols = np.column_stack([np.ones(len(y)), ((y - y_hat) ** 2).sum(1), (y**2).sum(1), y])
    s = resampled_sums(cols, groups, n_boot=n_boot, seed=seed)
    rows, sse, sq, sums = s[:, 0], s[:, 1], s[:, 2], s[:, 3:]
    total = sq - (sums**2).sum(1) / rows
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 1e-12 * sq, 1.0 - sse / total, np.nan)


def bootstrap_pearson(x, y, groups=None, *, n_boot: int, seed) -> np.ndarray:
    """[n_boot] Pearson r of ``x`` and ``y`` ([n] each) over resamples of whole groups (NaN where one is flat)."""
    x, y = as_float64(x), as_float64(y)
    x, y = x - x.mean(), y - y.mean()  # centring first keeps the sums' cancellation small
    s = resampled_sums(np.column_stack([np.ones(len(x)), x, y, x * x, y * y, x * y]), groups, n_boot=n_boot,
                       seed=seed)
    m, sx, sy, sxx, syy, sxy = s.T
    vx, vy = sxx - sx**2 / m, syy - sy**2 / m
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((vx > 0) & (vy > 0), (sxy - sx * sy / m) / np.sqrt(vx * vy), np.nan)


def bootstrap_ratio(num, den, groups=None, *, n_boot: int, seed) -> tuple[float, list[float]]:
    """sum(num) / sum(den) (e.g. a token-weighted mean over prompts) and its bootstrap interval over groups; NaN
    where a sum of ``den`` is 0."""
    num, den = as_float64(num), as_float64(den)
    s = resampled_sums(np.column_stack([num, den]), groups, n_boot=n_boot, seed=seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = np.where(s[:, 1] != 0, s[:, 0] / s[:, 1], np.nan)
    total = den.sum()
    return (float(num.sum() / total) if total != 0 else float("nan")), interval(boots)


def bootstrap(statistic, n: int, groups=None, *, n_boot: int, seed) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile bootstrap of ``statistic(row indices) -> [m] numbers`` over resamples of whole groups of the
    ``n`` rows, with ``scipy.stats.bootstrap``: (the bootstrap distribution [n_boot, m], lows [m], highs [m])."""
    g = group_ids(groups, n)
    if len(np.unique(g)) == n:  # every row its own group: the group ids are the rows
        rows_of = None
    else:
        rows_of = [np.flatnonzero(g == i) for i in range(int(g.max()) + 1)]

    def on_groups(ids: np.ndarray) -> np.ndarray:
        rows = g.argsort()[ids] if rows_of is None else np.concatenate([rows_of[i] for i in ids])
        return np.atleast_1d(statistic(rows))

    res = stats.bootstrap((np.arange(int(g.max()) + 1),), on_groups, vectorized=False, n_resamples=n_boot,
                          method="percentile", confidence_level=CI_LEVEL, rng=np.random.default_rng(seed))
    dist = np.atleast_2d(res.bootstrap_distribution).T
    return dist, np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
