"""Sequential Monte-Carlo decisions (stats.sequential), on planted exceedance rates with a known exact p-value."""

import numpy as np
import pytest
from scipy import stats as sps

from interp_bayes.core.errors import ConfigError
from interp_bayes.stats import interval, p_value
from interp_bayes.stats.sequential import (ACCEPT, EPSILON, REJECT, UNDECIDED, beyond, excluded, rate_interval,
                                           sequential_rate, sequential_test, sequential_tests, status)

ALPHA = 0.05


def _near_alpha(seed: int = 1, n: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.02, 0.08, n)


def _wrong(decisions, p: np.ndarray) -> tuple[int, float]:
    words = np.array([d.decision for d in decisions])
    truth = np.where(p < ALPHA, REJECT, ACCEPT)
    return int(((words != truth) & (words != UNDECIDED)).sum()), float((words == UNDECIDED).mean())


def test_near_alpha_decisions_agree_with_the_exact_p_within_epsilon():
    """1,000 cases with exact p in [0.02, 0.08]: the sequential decision differs from the exact p's at most at rate
    epsilon (undecided at the cap counted apart); a fixed count of 1,000 draws (today's n_perm) differs ~9%."""
    p = _near_alpha()
    rng = np.random.default_rng(0)
    decisions = sequential_rate(lambda b: rng.random((b, len(p))) < p, ALPHA, cap=10_000)
    wrong, undecided = _wrong(decisions, p)
    assert wrong / len(p) <= EPSILON
    assert undecided < 0.5  # the cap leaves only the cases closest to alpha open
    fixed = (1 + rng.binomial(1000, p)) / 1001  # the fixed-count p-value at 1,000 draws
    assert ((fixed < ALPHA) != (p < ALPHA)).mean() > 0.05


def test_a_risk_far_too_large_breaks_the_bound():
    """The same cases with epsilon = 0.5 and a look every 10 draws: more wrong decisions than the bound allows (the
    boundary is what keeps the rate at epsilon)."""
    p = _near_alpha()
    rng = np.random.default_rng(0)
    wrong, _ = _wrong(sequential_rate(lambda b: rng.random((b, len(p))) < p, ALPHA, epsilon=0.5, batch=10, cap=2000),
                      p)
    assert wrong / len(p) > 5 * EPSILON


@pytest.mark.parametrize("p, most", [(0.0, 600), (0.001, 700), (0.5, 100)])
def test_clear_cases_stop_early(p, most):
    """Two-sided tests at exact p 0, 0.001 and 0.5 (a normal null): decided correctly, in far fewer draws than the
    recipes' fixed 1,000 (mean over 20 seeds)."""
    obs = sps.norm.isf(p / 2) if p > 0 else 50.0
    used = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        d = sequential_test(lambda b: rng.standard_normal(b), obs)
        assert d.decision == (REJECT if p < ALPHA else ACCEPT)
        used.append(d.draws)
    assert np.mean(used) <= most


def test_the_p_value_and_null_match_the_fixed_count_functions_at_the_draws_used():
    """The decision's p is ``permutation.p_value`` of the draws it used, its null their central 95% range, its
    interval holds that p; columns stop on their own."""
    rng = np.random.default_rng(3)
    seen = []

    def draw(b):
        seen.append(rng.standard_normal((b, 2)))
        return seen[-1]

    observed = [10.0, 0.1]
    d_far, d_mid = sequential_tests(draw, observed)
    used = np.concatenate(seen)
    assert d_far.decision == REJECT and d_mid.decision == ACCEPT and d_far.draws > d_mid.draws
    for j, d in enumerate((d_far, d_mid)):
        assert d.p == pytest.approx(p_value(observed[j], used[:d.draws, j]))
        assert d.null == tuple(interval(used[:d.draws, j]))
        assert d.low <= d.p <= d.high


def test_undecided_at_the_cap_reports_an_interval_that_holds_alpha():
    rng = np.random.default_rng(4)
    d = sequential_rate(lambda b: rng.random(b) < ALPHA, ALPHA, cap=500)[0]
    assert d.decision == UNDECIDED and d.draws == 500 and d.low < ALPHA < d.high


def test_confidence_sequence_interval_covers_and_status_matches_it():
    """The interval keeps exactly the rates the boundary has not excluded, and covers the true rate."""
    n, s = np.array([100, 1000, 1000]), np.array([0, 30, 500])
    low, high = rate_interval(n, s)
    step = 1e-7
    assert not excluded(n, s, low + step, 0.05).any() and not excluded(n, s, high - step, 0.05).any()
    assert excluded(n[1:], s[1:], low[1:] - step, 0.05).all() and excluded(n, s, high + step, 0.05).all()
    assert (status(n, s, low + step, 0.05) == 0).all()
    assert (low <= s / n).all() and (s / n <= high).all()
    assert low[0] == 0.0 and 0.01 < low[1] < 0.03 < high[1] < 0.06  # wider than Clopper-Pearson: valid at any n
    rng = np.random.default_rng(5)
    k = rng.binomial(400, 0.2, 2000)
    lo, hi = rate_interval(np.full(2000, 400), k)
    assert ((lo <= 0.2) & (0.2 <= hi)).mean() >= 0.95


def test_beyond_is_the_percentile_interval_against_a_threshold():
    """``beyond`` decides what the central 95% interval of the same draws says about a threshold, for clear cases."""
    for centre, expected in ((0.5, REJECT), (0.0, ACCEPT), (-0.5, ACCEPT)):
        rng = np.random.default_rng(6)
        d = beyond(lambda b: centre + 0.1 * rng.standard_normal(b), 0.0, "above")
        assert d.decision == expected
        low, _ = interval(centre + 0.1 * np.random.default_rng(6).standard_normal(d.draws))
        assert (low > 0) == (expected == REJECT)
    rng = np.random.default_rng(7)
    assert beyond(lambda b: -0.5 + 0.1 * rng.standard_normal(b), 0.0, "below").decision == REJECT


def test_a_nan_observation_is_undecided_and_bad_settings_are_refused():
    rng = np.random.default_rng(8)
    assert sequential_test(lambda b: rng.standard_normal(b), float("nan"), cap=100).decision == UNDECIDED
    with pytest.raises(ConfigError, match="alternative"):
        sequential_test(lambda b: rng.standard_normal(b), 0.0, alternative="both")
    with pytest.raises(ConfigError, match="cap"):
        sequential_test(lambda b: rng.standard_normal(b), 0.0, batch=100, cap=10)


def test_open_columns_tell_the_draw_which_columns_are_still_undecided():
    """A column settled at the first look is marked closed from then on, and the NaN its draw leaves there is never
    read: its decision and draws are those of the first batch; the other column draws on to its own decision."""
    rng, masks = np.random.default_rng(0), []

    def draw(b, open_):
        masks.append(open_.copy())
        d = np.stack([rng.random(b), rng.random(b) - 5.0], axis=1)  # column 0: inside; column 1: all below
        d[:, ~open_] = np.nan
        return d

    inside, beyond = sequential_tests(draw, [0.5, 0.0], alternative="greater", cap=1000, open_columns=True)
    assert inside.decision == ACCEPT and inside.draws == 50 and beyond.decision == REJECT and beyond.draws == 250
    assert masks[0].all() and all(list(m) == [False, True] for m in masks[1:]) and len(masks) == 5


def test_stream_test_asks_an_indexed_stream_in_order_and_a_larger_cap_extends_it():
    """``stream_test`` asks draws 0, 1, ... in consecutive batches (at most the cap), so draw i is one value
    whatever the batch size, and a run to a larger cap starts with the same draws."""
    from interp_bayes.stats.sequential import stream_test

    stream = np.random.default_rng(0).normal(size=400)
    asked = []

    def null(start, stop):
        asked.append((start, stop))
        return stream[start:stop]

    small = stream_test(null, 0.05, cap=30, batch=50)  # one batch, cut to the cap
    assert asked == [(0, 30)] and small.draws == 30
    asked.clear()
    wide = stream_test(null, 0.05, cap=400, batch=100)
    assert asked[0] == (0, 100) and all(a[1] == b[0] for a, b in zip(asked, asked[1:]))
    assert wide.draws == asked[-1][1] and list(wide.null) == interval(stream[:wide.draws])


def test_a_decision_within_a_redraws_reach_of_the_threshold_is_undecided():
    """An interval (0.0, 0.0085) settled below 0.01: kept when the redrawn inputs agree (shift 0), undecided when
    their means spread so that a redraw moves it by 3.29 x 0.001 (past 0.01); an undecided test stays so."""
    from interp_bayes.stats.sequential import Decision, beyond_redraw

    below = Decision(REJECT, 0.001, 0.0, 0.004, 550, 0.05, EPSILON, (0.0, 0.0085))
    kept, shift = beyond_redraw(below, 0.01, np.full(10, 0.25))
    assert kept.decision == REJECT and shift == 0.0
    means = np.linspace(-1, 1, 10)
    means = 0.25 + 0.001 * np.sqrt(10) * means / means.std(ddof=1)  # sd / sqrt(m) = 0.001
    moved, shift = beyond_redraw(below, 0.01, means)
    assert moved.decision == UNDECIDED and shift == pytest.approx(sps.norm.isf(EPSILON / 2) * 0.001)
    assert beyond_redraw(below, 0.02, means)[0].decision == REJECT  # far enough from another threshold
    open_ = Decision(UNDECIDED, 0.05, 0.03, 0.07, 10_000, 0.05, EPSILON, (0.0, 0.012))
    assert beyond_redraw(open_, 0.01, np.full(10, 0.25))[0].decision == UNDECIDED
