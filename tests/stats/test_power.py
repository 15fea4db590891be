"""The ledger's rules for decisions with draws and power (issue 36, items 1-3): "borderline" when the draws reach
their cap undecided, "not testable here" when a non-rejection could not have seen the claim's delta, decodability
only with an interval above 0, and one family-wise decision over a claim's cells. Planted data."""

import numpy as np
from scipy import stats as sps

from interp_bayes.core.results import Row, to_csv
from interp_bayes.stats import bootstrap_mean_draws, interval, ledger as L, sequential_test


def with_test(value: float, draw, **kw) -> Row:
    """A row of ``value`` against the null ``draw`` gives: its 95% range and the sequential test, as a kind
    writes it."""
    test = sequential_test(draw, value, **kw)
    return Row("stat", value, null_low=test.null[0], null_high=test.null[1], null="planted", test=test.as_dict())


def test_undecided_at_the_cap_reads_borderline_and_clear_cases_do_not():
    edge = sps.norm.isf(0.025)  # exact two-sided p = 0.05: no number of draws settles it
    rng = np.random.default_rng(0)
    row = with_test(edge, lambda b: rng.standard_normal(b), cap=2000)
    assert row.test["decision"] == "undecided" and row.test["low"] < 0.05 < row.test["high"]
    assert L.beyond_null(row) == L.BORDERLINE and L.not_beyond_null(row) == L.BORDERLINE
    assert "after 2000 draws" in L.fmt(row)
    assert L.beyond_null(with_test(4.0, lambda b: rng.standard_normal(b))) == L.HOLDS
    assert L.beyond_null(with_test(0.5, lambda b: rng.standard_normal(b))) == L.FAILS
    assert L.beyond_null(with_test(-4.0, lambda b: rng.standard_normal(b))) == L.FAILS  # rejected, on the other side
    assert L.worst([L.HOLDS, L.BORDERLINE, L.WEAK]) == L.BORDERLINE


def test_a_non_rejection_holds_only_where_the_test_could_see_the_claims_delta():
    """A planted martingale gap (mean exactly 0, sd 0.2 bits per context) against its recentred bootstrap: with 8 contexts
    the null is about +-0.14 bits and a gap of 0.05 bits would pass unseen ("not testable here"); with 2,000 it is
    about +-0.009 and the claim holds."""
    for n, expected in ((8, L.UNTESTABLE), (2000, L.HOLDS)):
        x = np.random.default_rng(n).normal(0.0, 0.2, n)
        x -= x.mean()  # a gap of exactly 0: the claim is true, only the power differs
        rng = np.random.default_rng(1)
        row = with_test(x.mean(), lambda b: bootstrap_mean_draws(x, n_boot=b, seed=rng) - x.mean())
        assert row.test["decision"] == "accept"
        assert L.not_beyond_null(row) == L.HOLDS  # without a delta: today's reading, whatever the power
        assert L.not_beyond_null(row, delta=0.05) == expected, (n, L.detectable(row))
    wide = Row("gap", 0.01, null_low=-0.171, null_high=0.171)  # the tiny-model martingale null
    assert L.detectable(wide) > 0.171 and L.not_beyond_null(wide, delta=0.05) == L.UNTESTABLE


def test_decodable_needs_the_r2_interval_above_zero_not_only_a_negative_null():
    weak = Row("decoding_r2", 0.005, low=-0.01, high=0.02, null_low=-0.05, null_high=-0.01)  # the HMM tunnel's case
    assert L.beyond_null(weak) == L.HOLDS and L.decodable(weak) == L.FAILS
    clear = Row("decoding_r2", 0.3, low=0.2, high=0.4, null_low=-0.05, null_high=0.02)
    assert L.decodable(clear) == L.HOLDS
    assert L.decodable(Row("decoding_r2", 0.01, low=0.001, high=0.02, null_low=-0.05, null_high=0.02)) == L.FAILS


def test_a_family_names_only_the_cells_that_survive_holm():
    def cell(k, p, value=1.0, decision="reject"):
        return Row("gap", value, scope=dict(k=k), null_low=-0.5, null_high=0.5,
                   test=dict(decision=decision, p=p, low=0.0, high=1.0, draws=100, alpha=0.05, epsilon=1e-3))
    cells = [cell(1, 0.001), cell(2, 0.03), cell(4, 0.04), cell(8, 0.6, 0.1, "accept"), cell(16, 0.0001, -1.0)]
    survive, undecided = L.family(cells)
    assert [r.scope["k"] for r in survive] == [1]  # k = 2, 4 clear 5% alone, not after Holm; k = 16 is below
    assert undecided == []
    survive, undecided = L.family([cell(1, 0.04, decision="undecided"), cell(2, 0.6, 0.1, "accept")])
    assert survive == [] and [r.scope["k"] for r in undecided] == [1]


def test_rows_record_the_draws_used_in_the_csv():
    rng = np.random.default_rng(2)
    row = with_test(4.0, lambda b: rng.standard_normal(b))
    header, line = to_csv([row]).splitlines()
    record = dict(zip(header.split(","), line.split(",")))
    assert int(record["draws"]) == row.test["draws"] < 1000 and float(record["p"]) == row.test["p"]
    assert row.null_low == interval(np.random.default_rng(2).standard_normal(row.test["draws"]))[0]


def test_readout_and_order_invariance_hold_only_where_their_delta_could_be_seen():
    """The readout claim (delta READOUT_DELTA_BITS of MAE) and order invariance (ORDER_DELTA_BITS of JS per k):
    no harm beyond matched controls holds only when the excess' interval excludes the claim's delta; errors as noisy
    as +-0.06 bits per prompt over 10 prompts leave it straddling delta: "borderline", never "holds"."""
    from interp_bayes.analyses.interventions import readout_excess
    from interp_bayes.kinds.interventions import READOUT_DELTA_BITS, readout_claim
    from interp_bayes.kinds.martingale import ORDER_DELTA_BITS

    def cut(noise, n, harm=0.0):
        rng = np.random.default_rng(0)
        err = 0.1 + noise * rng.standard_normal((11, n))
        scope = dict(op="cut", measure="mae_k_ge_1", layer_set="3")
        return [Row("effect", harm, scope=dict(scope, family="true")),
                readout_excess(err[0] + harm, err[1:], delta=READOUT_DELTA_BITS, scope=dict(scope, family="matched"))]

    narrow, wide = readout_claim(cut(0.005, 200)), readout_claim(cut(0.06, 10))
    assert narrow.verdict == L.HOLDS and cut(0.005, 200)[1].high < READOUT_DELTA_BITS
    assert wide.verdict == L.BORDERLINE and cut(0.06, 10)[1].low < READOUT_DELTA_BITS < cut(0.06, 10)[1].high
    assert readout_claim(cut(0.005, 200, harm=0.05)).verdict == L.FAILS  # a harm well beyond delta

    def ks(half):
        return [Row("js", 1e-5, scope=dict(k=k), null_low=0.0, null_high=2 * half) for k in (1, 2, 4)]
    assert L.none_beyond(ks(5e-5), delta=ORDER_DELTA_BITS) == L.HOLDS  # the float32 floor: 1e-4 bits
    assert L.none_beyond(ks(5e-3), delta=ORDER_DELTA_BITS) == L.UNTESTABLE
    assert L.none_beyond(ks(5e-3)) == L.HOLDS  # without a delta: the old reading, whatever the power
