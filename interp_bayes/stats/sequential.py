"""Monte-Carlo decisions with bounded resampling risk: draw in batches until the decision is settled.

A decision that places an observed value against random draws (a permutation or shuffled null, a bootstrap
interval against a threshold, the true edit among random control axes) depends on the draws: with a fixed count of
draws and an exact p-value near the level, another seed gives another verdict. Here the draws come in batches, and
after each batch the exceedance count is checked against the confidence sequence of Ding, Gandy and Hahn (2020, "A
simple method for implementing Monte Carlo tests", Computational Statistics 35; after Robbins 1970): with n draws of
which s are at least as extreme as the observation,

    the level q is excluded once (n + 1) * Binomial(s; n, q) <= epsilon,

and then the decision is the side of q that s / n lies on. For any exact exceedance rate, the chance that this ever
decides on the wrong side of q is at most epsilon (the *resampling risk*, uniformly bounded in the sense of Gandy
2009, "Sequential implementation of Monte Carlo tests with uniformly bounded resampling risk", JASA 104: 1504-1511).
Checking only after each batch, and stopping at a cap, keep that bound (the sequence is valid at every n, hence at
any subset of them). Undecided at the cap is its own outcome ("undecided": a borderline verdict), reported with the
p-value's interval from the same sequence at ``CI_LEVEL`` (valid at whatever n the draws stopped).

Gandy's SIMCTEST reaches the same bound with boundaries computed recursively from a spending function (R package
``simctest``); no maintained Python implementation exists, and the confidence sequence needs no precomputation
and gives the interval directly, at an expected number of draws comparable to SIMCTEST's (Ding, Gandy and Hahn
compare the two).

One machinery for every use: the exceedance rate of a Bernoulli stream against a level (``sequential_rate``):

- a p-value against draws of the null (``sequential_test``): one tail, or two tails at half the level each (the
  toolkit's equal-tailed p = 2 min(upper, lower), as ``permutation.p_value``);
- a bootstrap interval against a threshold: the threshold lies below the central ``CI_LEVEL`` interval iff the
  share of bootstrap draws at or below it is under (1 - CI_LEVEL) / 2, i.e. ``sequential_test(boot, threshold,
  alpha=1 - CI_LEVEL, alternative="less", ...)`` with a one-tailed level of (1 - CI_LEVEL) / 2 (``beyond``;
  ``beyond_each`` for several statistics of one draw, e.g. every step of a curve);
- the true edit's rank among random controls: the controls' effects are the null draws and the claim is one-tailed
  (the true edit beyond them), with the recipe's count of controls as the cap.

Draws are made by a callback ``draw(b)`` returning b new draws ([b] or [b, m] for m statistics computed from one
draw, e.g. several cells of a family); each column stops on its own, and its draws used are recorded. Where a
column's draw costs work of its own (a forward pass per control axis), ``sequential_tests(..., open_columns=True)``
calls ``draw(b, open)`` with the [m] mask of the columns still undecided, and the draw may leave the others NaN.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
from scipy import stats as sps

from ..core.errors import ConfigError
from ..core.stop import check_stop
from .arrays import as_float64
from .permutation import TIE_TOL
from .resample import CI_LEVEL, interval

EPSILON = 1e-3  # resampling risk: the chance that the draws decide otherwise than the exact p-value would
BATCH = 50  # draws between two looks at the boundary
CAP = 10_000  # draws at most (a recipe's count of draws becomes its cap)
ALPHA = round(1 - CI_LEVEL, 12)  # the level of every test: a p-value below it lies outside the null's 95% range
REJECT, ACCEPT, UNDECIDED = "reject", "accept", "undecided"
ALTERNATIVES = {"greater": ("upper",), "less": ("lower",), "two-sided": ("upper", "lower")}


@dataclass(frozen=True)
class Decision:
    """The outcome of one sequential Monte-Carlo test.

    ``decision``: "reject" (p < alpha), "accept" (p >= alpha) or "undecided" (the cap came first); ``p``: the
    Monte-Carlo p-value at the draws used ((1 + s) / (1 + n), two-sided: twice the smaller tail); ``low``, ``high``:
    the exact p-value's ``CI_LEVEL`` interval from the confidence sequence; ``draws``: draws used (finite ones);
    ``null``: the central ``CI_LEVEL`` range of those draws (NaN for a Bernoulli stream)."""

    decision: str
    p: float
    low: float
    high: float
    draws: int
    alpha: float
    epsilon: float
    null: tuple[float, float] = (float("nan"), float("nan"))

    @property
    def settled(self) -> bool:
        return self.decision != UNDECIDED

    def as_dict(self) -> dict:
        return asdict(self)


def excluded(n, s, level, epsilon: float) -> np.ndarray:
    """Whether the confidence sequence at ``n`` draws with ``s`` exceedances excludes the rate ``level``:
    (n + 1) Binomial(s; n, level) <= epsilon (elementwise; False at n = 0)."""
    n, s = np.asarray(n, dtype=np.float64), np.asarray(s, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log = np.log(n + 1) + sps.binom.logpmf(s, n, level)
    return (n > 0) & (log <= np.log(epsilon))


def status(n, s, level, epsilon: float) -> np.ndarray:
    """-1 where the exceedance rate is settled below ``level``, +1 where settled at or above it, 0 where open."""
    n, s = np.asarray(n, dtype=np.float64), np.asarray(s, dtype=np.float64)
    side = np.where(s < level * n, -1, 1)
    return np.where(excluded(n, s, level, epsilon), side, 0)


def rate_interval(n, s, level: float = CI_LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """The rates the confidence sequence keeps at ``n`` draws with ``s`` exceedances, at ``level``: (lows, highs),
    by bisection on each side of s / n (the binomial likelihood is unimodal in the rate; (n + 1) times its maximum
    is at least 1, so the set is never empty). [0, 1] at n = 0."""
    n, s = np.broadcast_arrays(np.asarray(n, dtype=np.float64), np.asarray(s, dtype=np.float64))
    mode = np.where(n > 0, s / np.maximum(n, 1), 0.5)
    tol = 1 - level

    def kept(q):
        return ~excluded(n, s, q, tol)

    ends = []
    for edge in (0.0, 1.0):
        inside, outside = mode.copy(), np.full(n.shape, edge)
        for _ in range(50):  # 2^-50: far below any rate this resolves
            mid = (inside + outside) / 2
            ok = kept(mid)
            inside, outside = np.where(ok, mid, inside), np.where(ok, outside, mid)
        ends.append(np.where(kept(np.full(n.shape, edge)), edge, inside))
    return ends[0], ends[1]


def _validate(alpha, epsilon: float, batch: int, cap: int) -> None:
    if not (np.all((0 < np.asarray(alpha)) & (np.asarray(alpha) < 1)) and 0 < epsilon < 1):
        raise ConfigError(f"alpha and epsilon must lie strictly between 0 and 1 (got {alpha} and {epsilon}).")
    if batch < 1 or cap < batch:
        raise ConfigError(f"A sequential test needs a batch of at least 1 draw and a cap of at least one batch (got "
                          f"batch {batch}, cap {cap}).")


def _run(count: Callable[[int, np.ndarray | None], tuple[np.ndarray, np.ndarray]], tails: int, alpha,
         epsilon: float, batch: int, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequential loop. ``count(b, open)`` -> ([tails, m] exceedances, [m] finite draws) among b new draws
    (``open``: the [m] mask of undecided columns, None before the first look; a decided column's counts are no
    longer read). Each
    tail is held to alpha / tails with risk epsilon / tails; a column rejects once one tail is settled below its
    level and accepts once all are settled above. Returns (decision codes [m]: -1 reject, +1 accept, 0 open,
    exceedances [tails, m] and draws [m] at each column's stop)."""
    level, risk = np.asarray(alpha, dtype=np.float64) / tails, epsilon / tails  # a level per column, or one
    s, n = count(min(batch, cap), None)
    total = min(batch, cap)
    code = np.zeros(n.shape, dtype=np.int64)
    s_stop, n_stop = s.copy(), n.copy()
    while True:
        st = status(n[None, :], s, level, risk)  # [tails, m]
        now = np.where((st == -1).any(0), -1, np.where((st == 1).all(0), 1, 0))
        newly = (code == 0) & (now != 0)
        code[newly] = now[newly]
        s_stop[:, newly], n_stop[newly] = s[:, newly], n[newly]
        if total >= cap or not (code == 0).any():
            break
        check_stop()  # between batches of draws: a stop asked during a long null ends the stage here
        b = min(batch, cap - total)
        ds, dn = count(b, code == 0)
        s, n, total = s + ds, n + dn, total + b
    still = code == 0
    s_stop[:, still], n_stop[still] = s[:, still], n[still]
    return code, s_stop, n_stop


def _decisions(code, s, n, alpha, epsilon: float, nulls=None) -> list[Decision]:
    tails = len(s)
    alpha = np.broadcast_to(np.asarray(alpha, dtype=np.float64), n.shape)
    low, high = rate_interval(n[None, :], s, 1 - (1 - CI_LEVEL) / tails)  # Bonferroni over the tails
    p = np.minimum(1.0, tails * (1 + s.min(0)) / (1 + n))
    words = {-1: REJECT, 1: ACCEPT, 0: UNDECIDED}
    return [Decision(words[int(c)], float(p[j]), float(min(1.0, tails * low[:, j].min())),
                     float(min(1.0, tails * high[:, j].min())), int(n[j]), float(alpha[j]), epsilon,
                     tuple(nulls[j]) if nulls is not None else (float("nan"), float("nan")))
            for j, c in enumerate(code)]


def sequential_rate(draw: Callable[[int], np.ndarray], level: float, *, epsilon: float = EPSILON, batch: int = BATCH,
                    cap: int = CAP) -> list[Decision]:
    """Is the rate of True in the Bernoulli stream ``draw(b)`` ([b] or [b, m] booleans) below ``level``? One
    ``Decision`` per column: "reject" when settled below, "accept" when settled at or above."""
    _validate(level, epsilon, batch, cap)

    def count(b, _open):
        x = np.asarray(draw(b), dtype=bool).reshape(b, -1)
        return x.sum(0)[None, :].astype(np.float64), np.full(x.shape[1], float(b))

    return _decisions(*_run(count, 1, level, epsilon, batch, cap), level, epsilon)


def sequential_tests(draw: Callable[[int], np.ndarray], observed, *, alpha=ALPHA,
                     alternative: str = "two-sided", epsilon: float = EPSILON, batch: int = BATCH,
                     cap: int = CAP, open_columns: bool = False) -> list[Decision]:
    """Monte-Carlo tests of ``observed`` ([m] or a number) against null statistics from ``draw(b)`` ([b, m] or
    [b]): one ``Decision`` per column, each stopped on its own at its ``alpha`` (one level, or one per column).
    ``alternative``: "greater" (the observation in the
    upper tail), "less", or "two-sided" (equal-tailed, each tail at alpha / 2, as ``permutation.p_value``). Draws
    within ``TIE_TOL`` of the observation count as at least as extreme on both sides; NaN draws are left out.
    ``open_columns``: ``draw(b, open)`` is told which columns are still undecided ([m] bool, all True at first)."""
    if alternative not in ALTERNATIVES:
        raise ConfigError(f"Unknown alternative {alternative!r}; choose one of {', '.join(ALTERNATIVES)}.")
    _validate(alpha, epsilon, batch, cap)
    obs = as_float64(observed).reshape(-1)
    m, tails = len(obs), ALTERNATIVES[alternative]
    tol = TIE_TOL * np.maximum(1.0, np.abs(obs))
    kept: list[np.ndarray] = []

    def count(b, open_):
        if open_columns:
            d = draw(b, np.ones(m, dtype=bool) if open_ is None else open_)
        else:
            d = draw(b)
        d = as_float64(d).reshape(b, m)
        kept.append(d)
        finite = np.isfinite(d)
        hits = {"upper": (d >= obs - tol) & finite, "lower": (d <= obs + tol) & finite}
        return np.stack([hits[t].sum(0) for t in tails]).astype(np.float64), finite.sum(0).astype(np.float64)

    code, s, n = _run(count, len(tails), alpha, epsilon, batch, cap)
    draws = np.concatenate(kept) if kept else np.zeros((0, m))
    nulls = [interval(draws[:, j][np.isfinite(draws[:, j])][:int(n[j])]) for j in range(m)]
    # a non-finite observation cannot be placed: undecided at p NaN
    out = _decisions(np.where(np.isfinite(obs), code, 0), s, n, alpha, epsilon, nulls)
    return [d if np.isfinite(o) else Decision(UNDECIDED, float("nan"), float("nan"), float("nan"), d.draws, d.alpha,
                                              epsilon, d.null) for d, o in zip(out, obs)]


def sequential_test(draw: Callable[[int], np.ndarray], observed: float, **kw) -> Decision:
    """``sequential_tests`` for one statistic."""
    return sequential_tests(draw, [observed], **kw)[0]


def stream_test(null: Callable[[int, int], np.ndarray], observed: float, *, cap: int, batch: int = BATCH,
                **kw) -> Decision:
    """``sequential_test`` of ``observed`` against an indexed stream of null draws: ``null(start, stop)`` returns
    draws start .. stop - 1 (draw i the same whatever the batches, so a larger cap extends a run), asked from 0 on
    in batches of ``batch`` (at most ``cap``)."""
    used = [0]

    def draw(b: int) -> np.ndarray:
        start = used[0]
        used[0] += b
        return null(start, used[0])

    return sequential_test(draw, observed, cap=cap, batch=min(batch, cap), **kw)


def beyond_each(draw: Callable[[int], np.ndarray], thresholds, side: str = "above", *, level: float = CI_LEVEL,
                **kw) -> list[Decision]:
    """Does the central ``level`` interval of each column of the bootstrap draws ``draw(b)`` ([b, m]) lie wholly
    ``side`` ("above" or "below") of its threshold (``thresholds``: [m] or one number)? "reject" means it does
    (the threshold is in the far tail: at most (1 - level) / 2 of the draws on its side), "accept" that it does
    not; each column stops on its own."""
    if side not in ("above", "below"):
        raise ConfigError(f"side must be 'above' or 'below' (got {side!r}).")
    return sequential_tests(draw, thresholds, alpha=(1 - level) / 2,
                            alternative="less" if side == "above" else "greater", **kw)


def beyond(draw: Callable[[int], np.ndarray], threshold: float, side: str = "above", *, level: float = CI_LEVEL,
           **kw) -> Decision:
    """``beyond_each`` for one statistic against one threshold."""
    return beyond_each(draw, [threshold], side, level=level, **kw)[0]


def beyond_redraw(test: Decision, threshold: float, means) -> tuple[Decision, float]:
    """``test`` of an interval against ``threshold`` (``sequential_test``, its interval in ``test.null``) kept only
    where that interval ends farther from ``threshold`` than a redraw of the m inputs the interval holds fixed would
    move it: the sd of their ``means`` [m] over sqrt(m) times the normal quantile at the test's resampling risk
    (two-sided); else undecided. Returns (the decision, that shift). Two runs with other draws of those inputs then
    cannot settle on opposite sides (risk epsilon each)."""
    means = as_float64(means).reshape(-1)
    shift = float(sps.norm.isf(test.epsilon / 2) * means.std(ddof=1) / np.sqrt(len(means)))
    low, high = test.null
    if test.settled and not (high + shift < threshold or low - shift > threshold):
        test = replace(test, decision=UNDECIDED)
    return test, shift
