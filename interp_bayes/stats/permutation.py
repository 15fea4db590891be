"""Permutation nulls within strata, and a p-value computed against the null as drawn.

A null that keeps a confound (shuffling only within strata) is not centred at zero, so the p-value never assumes it
is: it is two-sided and equal-tailed, p = 2 min(1 + #{d >= obs}, 1 + #{d <= obs}) / (1 + n), capped at 1 (Davison
and Hinkley's +1 keeps it valid). It agrees with the null's central 95% range shown beside it: an observed value
inside that range has p > 0.05, always; one outside has p < 0.05 up to the granularity of the draws (p can exceed
0.05 by at most 4 / (1 + n) when the value lies just outside). ``tests/stats/test_stats.py`` proves both.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import ConfigError
from .arrays import as_float64
from .resample import CI_LEVEL

TIE_TOL = 1e-12  # draws this close (relative) to the observed value count as ties: on both sides


def permutations(n: int, n_perm: int, seed, strata=None) -> np.ndarray:
    """[n_perm, n] row indices, each a permutation of the rows within every stratum (``strata`` None: of all
    rows). ``seed``: an int or a generator shared with other draws."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_perm, n), dtype=np.int64)
    members = [np.arange(n)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    for g in members:  # one draw per stratum for all permutations at once
        out[:, g] = rng.permuted(np.broadcast_to(g, (n_perm, len(g))), axis=1)
    return out


def donors_within(strata, seed) -> np.ndarray:
    """[n] for every row another row of its stratum (a resample ablation's donor, as in causal scrubbing): each
    stratum's rows in a seeded random cycle, each giving to the next, so no row is its own donor and every row
    donates once. A stratum of one row cannot donate and is refused."""
    strata = np.asarray(strata)
    rng = np.random.default_rng(seed)
    out = np.empty(len(strata), dtype=np.int64)
    for s in np.unique(strata):
        members = rng.permutation(np.flatnonzero(strata == s))
        if len(members) < 2:
            raise ConfigError(f"Stratum {s.item()!r} holds one prompt, which has no donor of its own stratum; use more "
                              "prompts per stratum (at least two on the evaluation side).")
        out[members] = np.roll(members, -1)
    return out


def group_permutations(groups, n_perm: int, seed) -> np.ndarray | None:
    """[n_perm, n] row indices that move whole groups, each row keeping its place within its group: what a
    shuffled-target null needs when a group is a sequence and the place is a position (the null keeps whatever
    position alone explains). Needs groups of one size laid out group after group; None otherwise."""
    g = np.asarray(groups)
    ids, inverse = np.unique(g, return_inverse=True)
    sizes = np.bincount(inverse)
    size = int(sizes[0])
    if not ((sizes == size).all() and (inverse == np.repeat(np.arange(len(ids)), size)).all()):
        return None
    out = np.empty((n_perm, len(g)), dtype=np.int64)
    for p in range(n_perm):
        order = np.random.default_rng([*np.atleast_1d(seed), p]).permutation(len(ids))
        out[p] = (order[:, None] * size + np.arange(size)[None, :]).reshape(-1)
    return out


def p_value(obs: float, draws) -> float:
    """Two-sided permutation p-value of ``obs`` against ``draws`` as drawn (see the module docstring); NaN draws
    are left out, and NaN is returned when ``obs`` or every draw is NaN."""
    d = as_float64(draws).reshape(-1)
    d = d[np.isfinite(d)]
    if not np.isfinite(obs) or not len(d):
        return float("nan")
    tol = TIE_TOL * max(1.0, abs(obs))
    tail = min(np.sum(d >= obs - tol), np.sum(d <= obs + tol))
    return float(min(1.0, 2 * (1 + tail) / (1 + len(d))))


def holm(p, alpha: float = round(1 - CI_LEVEL, 12)) -> np.ndarray:
    """Which of a family of p-values survive Holm's step-down at family-wise level ``alpha``: the i-th smallest
    (from 0) is held to alpha / (m - i) while all before it cleared theirs. One decision per claim tested over several
    cells (k, layers, the partial and within readings of one correlation): the chance that any true null survives is
    at most ``alpha``. NaN p-values (untestable cells) never survive and do not count in m."""
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = len(order)
    passed = p[order] < alpha / (m - np.arange(m))
    out = np.zeros(len(p), dtype=bool)
    out[order[:int(np.argmin(passed)) if not passed.all() else m]] = True
    return out


def significant(p: float, level: float = CI_LEVEL) -> bool:
    """Whether ``p`` clears the level every interval of the toolkit is drawn at (p < 1 - level; NaN never does)."""
    return bool(p < 1 - level)

