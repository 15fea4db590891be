"""The readout claim's decision: the paired excess of the true ablation over the mean matched ablation, its
two-level bootstrap interval (prompts' groups and control draws) settled against the claim's delta. Planted per-prompt
errors, no model: a false-positive rate at most alpha, power at 3 delta, "holds" with enough prompts, and one
verdict at every seed of the draws.

The false-positive and replication tests fail with the rule it replaced (the true effect against the central 95%
range of the matched draws, ``ledger.not_beyond_null(row, delta=0.01)``), checked by hand: a true axis that is one
more matched axis lies beyond that range of 10 draws in 21 of the 200 planted nulls (10.5%), and at 3 of the 5
seeds of the replication case."""

import numpy as np
import pytest

from interp_bayes.analyses.interventions import readout_excess
from interp_bayes.stats.ledger import BORDERLINE, FAILS, HOLDS, below_margin
from interp_bayes.stats.sequential import ALPHA

DELTA = 0.01  # the readout claim's (kinds.interventions.READOUT_DELTA_BITS)


def planted_errors(rng, harm: float, *, n_groups: int = 40, per_group: int = 5, m: int = 10, noise: float = 1.0):
    """Per-prompt |entropy - Bayes| under m + 1 exchangeable ablations of matched random axes (each axis its own
    small offset, each sequence a shared noise under each axis, each prompt its own; all scaled by ``noise``): the
    first is the "true" axis, with ``harm`` bits added to every prompt. Returns (true [n], controls [m, n],
    groups [n])."""
    n = n_groups * per_group
    groups = np.repeat(np.arange(n_groups), per_group)
    base = rng.gamma(2.0, 0.1, n)
    err = base + noise * (rng.normal(0, 0.002, (m + 1, 1)) + rng.normal(0, 0.02, (m + 1, n_groups))[:, groups]
                          + rng.normal(0, 0.03, (m + 1, n)))
    return err[0] + harm, err[1:], groups


def verdict(true, controls, groups, seed=0):
    return below_margin(readout_excess(true, controls, groups, delta=DELTA, seed=seed), DELTA)


def test_a_matched_axis_as_the_true_one_reads_does_not_hold_at_most_alpha_of_the_time():
    """200 planted nulls (harm 0): "does not hold" in at most alpha of them (the range rule: 21, 10.5%), and the
    no-harm case seen as such in at least 90% (measured: 186; 190 or more before the control-draw margin, which
    leaves undecided a decision that another set of controls could move across delta)."""
    rng = np.random.default_rng(0)
    verdicts = [verdict(*planted_errors(rng, 0.0, noise=0.5), seed=i) for i in range(200)]
    assert sum(v == FAILS for v in verdicts) <= ALPHA * 200
    assert sum(v == HOLDS for v in verdicts) >= 0.9 * 200


@pytest.mark.parametrize("n_groups, per_group", [(40, 5), (400, 1)])
def test_a_harm_of_exactly_delta_is_misread_either_way_at_most_alpha_of_the_time(n_groups, per_group):
    """The hardest null of both decisions: a harm of exactly delta. "holds" (a harm of delta excluded) and "does not
    hold" (a harm beyond delta shown) are each wrong there; each tail of the two-sided decision has alpha / 2, so
    over 200 planted cases each wrong verdict stays within alpha (measured: 2 "holds", 4 "does not hold" over 40
    sequences of 5; over 400 independent prompts, SULA's 100 evaluation prompts and 300 beside them: 2 "holds",
    none "does not hold")."""
    rng = np.random.default_rng(7)
    verdicts = [verdict(*planted_errors(rng, DELTA, n_groups=n_groups, per_group=per_group, noise=0.5), seed=i)
                for i in range(200)]
    assert sum(v == HOLDS for v in verdicts) <= ALPHA * 200
    assert sum(v == FAILS for v in verdicts) <= ALPHA * 200


def test_a_harm_of_three_deltas_reads_does_not_hold_and_records_its_interval_and_draws():
    true, controls, groups = planted_errors(np.random.default_rng(1), 3 * DELTA)
    row = readout_excess(true, controls, groups, delta=DELTA, seed=0, scope=dict(op="cut"))
    assert below_margin(row, DELTA) == FAILS
    assert row.metric == "readout_excess" and row.scope == dict(op="cut") and row.n == len(true)
    assert row.value == pytest.approx(true.mean() - controls.mean())
    assert DELTA < row.low < row.value < row.high and row.interval == "two-level bootstrap 95%"
    assert row.test["decision"] == "reject" and 0 < row.test["draws"] < 10_000  # a clear case stops early


def test_no_harm_with_enough_prompts_holds_and_too_few_straddle_the_delta():
    """Harm 0 over 200 sequences holds; over 2 sequences of 2 prompts the interval cannot exclude delta: borderline
    (never "holds" on too little data)."""
    assert verdict(*planted_errors(np.random.default_rng(2), 0.0, n_groups=200)) == HOLDS
    true, controls, groups = planted_errors(np.random.default_rng(2), 0.0, n_groups=2, per_group=2)
    assert verdict(true, controls, groups) == BORDERLINE


def test_the_verdict_replicates_across_seeds_of_the_draws():
    """A true axis at the 90th percentile of a pool of 200 matched axes, and at each seed another 10 of them as
    its matched controls and another bootstrap: one verdict ("holds": its excess is far below delta) at all 5 seeds
    (the range rule: "does not hold" at 3 of them, "holds" at 2)."""
    rng = np.random.default_rng(3)
    n_groups, per_group = 40, 5
    true, pool, groups = planted_errors(rng, 0.0, n_groups=n_groups, per_group=per_group, m=200, noise=0.2)
    true = true - true.mean() + np.quantile(pool.mean(1), 0.9)  # its mean error at the pool's 90th percentile
    verdicts = set()
    for seed in range(5):
        drawn = pool[np.random.default_rng(100 + seed).choice(len(pool), 10, replace=False)]
        verdicts.add(verdict(true, drawn, groups, seed=seed))
    assert verdicts == {HOLDS}


def test_too_few_control_draws_or_mismatched_prompts_are_refused():
    from interp_bayes.core.errors import ConfigError

    true, controls, groups = planted_errors(np.random.default_rng(4), 0.0)
    with pytest.raises(ConfigError, match="at least 2 control draws"):
        readout_excess(true, controls[:1], groups, delta=DELTA)
    with pytest.raises(ConfigError, match="at least 2 control draws"):
        readout_excess(true[:-1], controls, groups, delta=DELTA)


def test_a_decision_nearer_delta_than_another_set_of_controls_would_move_it_is_borderline():
    """Matched axes whose mean errors spread (sd 0.0032 over 10: another set moves the excess by 0.001) and a harm
    of delta - 3.5 x 0.001: the two-level interval ends below delta ("holds" by the interval alone), but nearer to it
    than 3.3 x 0.001, the shift another set of controls makes at the resampling risk: borderline. Without the
    spread, or far below delta, it holds."""
    rng = np.random.default_rng(5)
    true, controls, groups = planted_errors(rng, 0.0, n_groups=400, noise=0.05)
    offsets = np.linspace(-1, 1, len(controls))
    offsets = 0.001 * np.sqrt(len(controls)) * offsets / offsets.std(ddof=1)  # sd / sqrt(m) = 0.001 exactly
    spread = controls + offsets[:, None]
    row = readout_excess(true + DELTA - 0.0035, spread, groups, delta=DELTA)
    assert row.high < DELTA and row.test["control_shift"] == pytest.approx(0.00329, abs=2e-5)
    assert below_margin(row, DELTA) == BORDERLINE
    assert verdict(true + DELTA - 0.0035, controls, groups) == HOLDS  # the same harm, controls that agree
    assert verdict(true, spread, groups) == HOLDS  # the spread, far below delta


def test_prompts_beside_the_evaluation_set_narrow_the_interval_by_the_root_of_their_share():
    """SULA's readout excess pools the 100 evaluation prompts at k >= 1 with 300 drawn beside them, cut along the same
    10 matched axes (``readout_errors``): four times the independent prompts, so the interval is about half as wide
    (sqrt(100 / 400); over five planted cases the ratio averages 0.52, from 0.43 to 0.60), the row records the 400
    prompts and where they came from, a case of no harm that 100 prompts leave borderline holds on 400, and a harm
    of 3 delta still does not hold."""
    def pair(seed, harm=0.0):
        true, controls, _ = planted_errors(np.random.default_rng(seed), harm, n_groups=400, per_group=1)
        return (readout_excess(true[:100], controls[:, :100], delta=DELTA),
                readout_excess(true, controls, delta=DELTA, beside=300))

    ratios = [(new.high - new.low) / (old.high - old.low) for old, new in map(pair, range(5, 10))]
    assert np.mean(ratios) == pytest.approx(0.5, abs=0.05) and max(ratios) < 0.65, ratios
    old, pooled = pair(9)
    assert pooled.n == 400 and "over 400 prompts (100 evaluation, 300 drawn beside them)" in pooled.note
    assert (below_margin(old, DELTA), below_margin(pooled, DELTA)) == (BORDERLINE, HOLDS)
    _, harm = pair(9, 3 * DELTA)
    assert below_margin(harm, DELTA) == FAILS and harm.low > DELTA
