"""The statistics package on planted data whose answer is known: folds that respect the unit of independence, a
p-value that agrees with the null interval beside it (proved over planted nulls and over every row of a real run),
the sign-reversal verdict, covariates that remove any function of a discrete confound, fine strata against a strong
continuous one, bootstraps over groups against brute force, and every row's unit following its metric."""

import numpy as np
import pytest
import torch
import yaml
from scipy.linalg import hadamard

from conftest import confounded_null
from interp_bayes import stats
from interp_bayes.analyses.axis import cross_fitted_projections, fit_entropy_axis
from interp_bayes.stats.confounds import covariate_matrix
from interp_bayes.stats import deconfounded_correlation, fine_strata
from interp_bayes.analyses.decoding import cross_fitted_decoding, decoding_curve
from interp_bayes.core.errors import ConfigError
from interp_bayes.model.read import Activations
from interp_bayes.stats.probe import held_out_r2

torch.set_num_threads(1)
ALPHA = 1 - stats.CI_LEVEL


@pytest.fixture(autouse=True)
def one_blas_thread():
    """BLAS follows torch's one thread here: two BLAS threads on two shared cores make each SVD 10x slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


def acts_of(x, y, layer=0):
    meta = dict(layers=[layer], n_layers=layer + 1, model={"name": "planted"}, prompt_digest="x")
    return Activations({"v": {layer: torch.tensor(x)}}, torch.tensor(y), [[0]] * len(y), meta)


def sequence_constant(seed=0, n_seq=40, per=10, d=64):
    """A target constant within a sequence and random across sequences; each row carries its sequence's random
    fingerprint (plus noise) and nothing about the target that a new sequence would share."""
    rng = np.random.default_rng(seed)
    seq = np.repeat(np.arange(n_seq), per)
    x = rng.standard_normal((n_seq, d))[seq] + 0.1 * rng.standard_normal((n_seq * per, d))
    y = rng.standard_normal(n_seq)[seq]
    return x, y, seq


def test_a_target_constant_within_a_sequence_is_not_decodable_once_folds_hold_whole_sequences():
    """Rows of one sequence on both sides of a fold (what KFold did in decoding, axis and kalman) let the probe
    read the target off the sequence's fingerprint; grouped folds measure what carries to new sequences: nothing."""
    x, y, seq = sequence_constant()
    grouped = stats.r2(y, stats.cross_fitted_ridge(x, [y], seq, seed=0)[0])[0]
    rows = stats.r2(y, stats.cross_fitted_ridge(x, [y], None, seed=0)[0])[0]
    assert grouped < 0.1 and rows > 0.5
    for groups, low in ((seq, True), (None, False)):  # every analysis path: decoding, axis, kalman
        dec = cross_fitted_decoding(x, y, groups=groups, n_null=2, seed=0)
        dec_r2 = stats.r2(dec["y"], dec["ridge"])[0]
        proj, target, _ = cross_fitted_projections(x, y, "ridge", folds=5, seed=0, groups=groups)
        axis_r = np.corrcoef(proj, target)[0, 1]
        kal = held_out_r2(x, y[:, None], 5, 0, groups)[0]
        if low:
            assert dec_r2 < 0.1 and axis_r < 0.3 and kal < 0.1, (dec_r2, axis_r, kal)
        else:
            assert dec_r2 > 0.5 and axis_r > 0.7 and kal > 0.5, (dec_r2, axis_r, kal)
    curve = decoding_curve(acts_of(x, y, 1).with_groups(seq), n_null=2, n_boot=50)  # groups from the activations
    assert curve.points[0]["ridge_r2"] < 0.1
    axis = fit_entropy_axis(acts_of(x, y).with_groups(seq), 0, "ridge", folds=5)
    assert axis.held_out["pearson"] < 0.3


def test_folds_never_split_a_group_and_too_few_groups_are_refused():
    seq = np.repeat(np.arange(7), 3)
    folds = stats.group_folds(seq, 3, seed=1)
    assert sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(21))
    for train, test in folds:
        assert not set(seq[train]) & set(seq[test])
    with pytest.raises(ConfigError, match="folds"):
        stats.group_folds(np.repeat([0, 1], 4), 3, seed=0)


def test_r2_of_a_constant_target_is_nan_and_otherwise_the_textbook_value():
    y = np.array([1.0, 2.0, 4.0, 3.0])
    pred = np.array([1.5, 2.0, 3.0, 3.0])
    assert stats.r2(y, pred)[0] == pytest.approx(1 - 1.25 / 5.0, abs=1e-15)
    assert np.isnan(stats.r2(np.full(4, 2.5), pred)[0]) and np.isnan(stats.r2(np.full(4, 2.5), pred, pooled=True))
    assert np.isnan(stats.bootstrap_r2(np.full(6, 1.0), np.arange(6.0), n_boot=3, seed=0)).all()


@pytest.mark.parametrize("n", [99, 200, 999, 1000])
def test_the_p_value_agrees_with_the_null_interval_up_to_the_granularity_of_the_draws(n):
    """Planted nulls far from zero (shifted, skewed, narrow): a value inside the central 95% range has p > 0.05,
    always; one outside has p < 0.05 + 4 / (1 + n). The old |draw| >= |obs| rule fails this on every one."""
    rng = np.random.default_rng(n)
    nulls = {"shifted": 0.6 + 0.05 * rng.standard_normal(n), "skewed": 0.1 + rng.gamma(1.5, 0.05, n),
             "issue example": rng.uniform(-0.048, 0.217, n)}
    old_disagrees = 0
    for name, draws in nulls.items():
        lo, hi = stats.interval(draws)
        for obs in np.linspace(draws.min() - 0.2, draws.max() + 0.2, 801):
            p = stats.p_value(obs, draws)
            if lo <= obs <= hi:
                assert p > ALPHA, (name, obs, p)
            else:
                assert p < ALPHA + 4 / (1 + n), (name, obs, p)
            old = (1 + np.sum(np.abs(draws) >= abs(obs) - 1e-12)) / (1 + n)
            old_disagrees += (old < ALPHA) != (p < ALPHA)
    assert old_disagrees > 0
    assert stats.p_value(-0.106, nulls["issue example"]) < ALPHA  # the row: old p 0.378


def test_an_off_centre_confound_keeping_null_gives_a_consistent_p_value():
    """y and x both follow the stratum, and within strata x runs against y: the raw correlation is below what the
    strata alone give, so it lies below its (off-centre) null, and its p-value says so."""
    rng = np.random.default_rng(5)
    k = np.repeat([0, 1, 2, 4, 8], 40).astype(float)
    u = rng.standard_normal(len(k))
    y = np.log1p(k) + 0.3 * rng.standard_normal(len(k)) + 0.3 * u
    x = np.log1p(k) - 0.3 * u + 0.3 * rng.standard_normal(len(k))
    dec = deconfounded_correlation(x, y, covariate_matrix({"k": k}), k, n_perm=500, seed=0)
    lo, hi = dec.null["raw"]["pearson"]
    assert lo > 0.3 and dec.values["raw"]["pearson"] < lo  # an off-centre null, and the value below it
    assert dec.p["raw"]["pearson"] < ALPHA


def simpson(seed):
    """Between strata x and y rise together; within every stratum y falls as x rises."""
    rng = np.random.default_rng(seed)
    s = np.repeat(np.arange(5), 40).astype(float)
    u = rng.standard_normal(len(s))
    return s + u, s - 0.5 * u + 0.3 * rng.standard_normal(len(s)), s


def test_a_sign_reversal_within_strata_gets_its_own_verdict_in_20_of_20_draws():
    verdicts = []
    for seed in range(20):
        x, y, s = simpson(seed)
        dec = deconfounded_correlation(x, y, covariate_matrix({"k": s}), s, n_perm=1000, seed=seed)
        assert dec.values["raw"]["spearman"] > 0.5 and dec.values["within"]["spearman"] < -0.3
        verdicts.append(dec.verdict())
    assert verdicts == ["reverses within strata"] * 20
    assert set(stats.VERDICTS) >= set(verdicts)


def test_the_verdict_vocabulary_is_fixed_and_each_case_is_reached():
    claim = stats.claim
    sig, ns = 0.001, 0.5
    neither, first, both = (dict(partial=a, within=b, either=g) for a, b, g in ((ns, ns, ns), (sig, ns, sig),
                                                                                  (sig, sig, sig)))
    nan = dict(partial=np.nan, within=np.nan, either=np.nan)
    assert claim(0.5, ns, dict(partial=0.1, within=0.1), neither) == "no raw effect"
    assert claim(0.0, ns, dict(partial=0.4, within=0.1), first) == "appears only within strata"
    assert claim(0.8, sig, dict(partial=np.nan, within=np.nan), nan) == "inseparable"
    assert claim(0.8, sig, dict(partial=-0.3, within=0.1), first) == "reverses within strata"
    assert claim(0.8, sig, dict(partial=0.1, within=0.1), neither) == "vanishes"
    assert claim(0.8, sig, dict(partial=0.6, within=0.5), both) == "survives"
    assert claim(0.8, sig, dict(partial=0.6, within=0.1), first) == "weakens"
    assert claim(0.8, sig, dict(partial=0.6, within=0.5), dict(both, either=ns)) == "vanishes"  # closed test
    # an undecided test makes the claim borderline only where its outcome would change it
    values = dict(partial=0.6, within=0.5)
    assert stats.verdicts.claim_from(0.8, True, values, dict(partial=True, within=None)) == "borderline"
    assert stats.verdicts.claim_from(0.8, None, values, dict(partial=False, within=False)) == "borderline"
    assert stats.verdicts.claim_from(0.0, False, values, dict(partial=True, within=None)) == \
        "appears only within strata"  # either way


def step_nuisance(seed=0, d=32):
    """SULA-like k in (0, 1, 2, 4, 8): the values carry a step at k = 0 (prompts without examples look different)
    along u_nuisance and the entropy beyond k along u_signal."""
    rng = np.random.default_rng(seed)
    h = hadamard(d) / np.sqrt(d)
    k = np.repeat([0, 1, 2, 4, 8], 50).astype(float)
    z = rng.standard_normal(len(k))
    y = 0.3 * np.log1p(k) + z
    x = np.outer(9.0 * (k == 0), h[1]) + np.outer(z, h[2]) + 0.3 * rng.standard_normal((len(k), d))
    return x, y, k, h[1], h[2]


def test_indicators_per_k_take_a_step_at_k_0_out_of_the_conditional_axis():
    for seed in range(3):
        x, y, k, nuisance, signal = step_nuisance(seed)
        linear = fit_entropy_axis(acts_of(x, y), 0, "pc1", folds=0, control=np.column_stack([k, np.log1p(k)]),
                                  strata=k)  # the old design: k and log(1 + k) as linear terms
        levels = fit_entropy_axis(acts_of(x, y), 0, "pc1", folds=0, control={"k": k, "log_k": np.log1p(k)}, strata=k)
        assert abs(linear.direction.double().numpy() @ nuisance) > 0.7  # still an axis of k = 0
        assert abs(levels.direction.double().numpy() @ nuisance) < 0.1
        assert abs(levels.direction.double().numpy() @ signal) > 0.9
        assert linear.residual_confounding > 0.5 > 0.1 > levels.residual_confounding


def quintiles(v):
    edges = np.unique(np.quantile(v, np.linspace(0, 1, 6))[1:-1])
    return np.searchsorted(edges, v, side="right")


def test_fine_strata_hold_the_within_test_at_its_level_under_a_strong_continuous_confound():
    """x and y both follow prompt length (r 0.9 each) and nothing else: with length in five quintiles the within
    test rejects far more often than 5% (the confound still varies within a quintile); fine strata do not."""
    fine, coarse = 0, 0
    for seed in range(200):
        x, y, length = confounded_null(seed)
        cov = covariate_matrix({"length": length})
        fine += deconfounded_correlation(x, y, cov, fine_strata(length), n_perm=200, seed=seed).p["within"][
            "pearson"] < ALPHA
        if seed < 50:  # the old strata: enough draws to show the inflation
            coarse += deconfounded_correlation(x, y, cov, quintiles(length), n_perm=200, seed=seed).p["within"][
                "pearson"] < ALPHA
    assert fine / 200 <= 0.07, fine
    assert coarse / 50 > 0.2, coarse


def test_residual_confounding_is_the_share_between_strata():
    s = np.repeat([0, 1, 2], 4)
    assert stats.residual_confounding(s.astype(float), s) == pytest.approx(1.0)
    w = np.tile([1.0, -1.0, 2.0, -2.0], 3)
    assert stats.residual_confounding(w, s) == pytest.approx(0.0, abs=1e-15)
    assert stats.residual_confounding(w + s, s) == pytest.approx(8 / (8 + 30), rel=1e-12)  # 8 between, 30 within


def test_bootstraps_over_groups_equal_resampling_whole_groups_by_hand():
    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(12), [1, 2, 3, 4] * 3)
    x, y = rng.standard_normal(len(g)), rng.standard_normal(len(g))
    draws = np.random.default_rng(9).integers(0, 12, (5, 12))
    rows = [np.concatenate([np.flatnonzero(g == i) for i in d]) for d in draws]
    np.testing.assert_allclose(stats.bootstrap_pearson(x, y, g, n_boot=5, seed=9),
                               [np.corrcoef(x[r], y[r])[0, 1] for r in rows], rtol=1e-10)
    _, lo, hi = stats.bootstrap_means(x[:, None], g, n_boot=5, seed=9)
    means = [x[r].mean() for r in rows]
    assert lo[0] == pytest.approx(np.quantile(means, 0.025)) and hi[0] == pytest.approx(np.quantile(means, 0.975))
    value, ci = stats.bootstrap_ratio(x, np.abs(y), g, n_boot=5, seed=9)
    assert value == pytest.approx(x.sum() / np.abs(y).sum())
    ratios = [x[r].sum() / np.abs(y[r]).sum() for r in rows]
    assert ci == pytest.approx([np.quantile(ratios, 0.025), np.quantile(ratios, 0.975)])
    sizes = np.bincount(g)
    dist, _, _ = stats.bootstrap(lambda idx: float((np.bincount(g[idx], minlength=12) % sizes == 0).all()), len(g), g,
                                 n_boot=50, seed=0)
    assert (dist == 1.0).all()  # every resample the statistic sees is a union of whole groups


def test_paired_excess_draws_resample_whole_groups_and_the_controls_by_hand():
    """Each draw of the two-level bootstrap is, by hand, the excess of x over the mean control on the rows of the
    groups drawn, the controls drawn independently of the groups from the same generator; draws asked for in two
    calls continue one stream."""
    rng = np.random.default_rng(4)
    g = np.repeat(np.arange(6), [1, 2, 3, 1, 2, 3])
    x, controls = rng.standard_normal(len(g)), rng.standard_normal((4, len(g)))
    draw = stats.paired_excess_draws(x, controls, g, seed=9)
    got = np.concatenate([draw(3), draw(2)])
    by_hand, stream = [], np.random.default_rng(9)
    for b in (3, 2):
        groups, picks = stream.integers(0, 6, (b, 6)), stream.integers(0, 4, (b, 4))
        for drawn, picked in zip(groups, picks):
            rows = np.concatenate([np.flatnonzero(g == i) for i in drawn])
            by_hand.append(x[rows].mean() - np.mean([controls[c, rows].mean() for c in picked]))
    np.testing.assert_allclose(got, by_hand, rtol=1e-12)
    # units without noise and three controls 0, 1, 2 apart: all the spread is the controls' (-k/3 for k picks summed)
    spread = stats.paired_excess_draws(np.zeros(5), np.arange(3.0)[:, None] * np.ones(5), seed=1)(200)
    np.testing.assert_allclose(spread * 3, np.round(spread * 3), atol=1e-12)
    assert set(np.round(-spread * 3).astype(int)) == set(range(7))


def test_permutations_stay_within_strata_and_group_permutations_move_whole_groups():
    strata = np.repeat([0, 1, 2], 5)
    for perm in stats.permutations(15, 20, 0, strata):
        assert (strata[perm] == strata).all()
    order = stats.group_permutations(np.repeat(np.arange(4), 3), 10, [0, 1])
    for perm in order:
        assert (perm % 3 == np.arange(12) % 3).all()  # each row keeps its place within its group
        assert len(set((perm // 3).tolist())) == 4
    assert stats.group_permutations(np.array([0, 0, 1, 1, 1]), 2, 0) is None


SWEEP_PROBES = {  # every kind with a null interval beside a p-value, and the intervention units, at toy sizes
    "mixed.yaml": dict(kind="manifold", per_bin=4, n_boot=30, n_null=10, n_resample=5, n_perm=200),
    "icl.yaml": dict(kind="icl", per_k=6, layers=[1], n_boot=30, n_null=10, n_perm=200,
                     conditions=["main", "fixed_k"]),
    "axis.yaml": dict(kind="axis", per_k=6, layers=[1], folds=3, n_perm=200),
    "interventions.yaml": dict(kind="interventions", per_k=6, layers=[1], layer_sets=[[1]], ops=["cut", "shift+"],
                               controls={"isotropic": 10, "matched": 10, "pcs": 1}, n_perm=200),
    "windtunnel.yaml": dict(kind="windtunnel", tunnel="bijection-cpu", n_sequences=8, n_boot=30, n_null=10,
                            n_perm=200, ops=["cut"], controls={"isotropic": 10, "matched": 10, "pcs": 1}),
}


@pytest.fixture(scope="module")
def sweep_rows(tiny_dirs, tmp_path_factory):
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import run_sweep

    folder = tmp_path_factory.mktemp("stats-probes")
    paths = []
    for name, body in SWEEP_PROBES.items():
        (folder / name).write_text(yaml.safe_dump(body))
        paths.append(str(folder / name))
    run = run_sweep(SweepConfig(model=str(tiny_dirs["llama3"]), out=str(folder / "runs"), prompts="basic",
                                quiet=True, probes=paths))
    return run.rows


def test_every_p_value_of_a_real_run_agrees_with_its_null_interval(sweep_rows):
    checked = 0
    for r in sweep_rows:
        if r.null_low is None or not r.note or "p = " not in r.note or not np.isfinite(r.value):
            continue
        p = float(r.note.split("p = ")[1].split(";")[0])
        n_perm = r.test["draws"] if r.test else int(r.null.rsplit("(", 1)[1].rstrip(")"))  # the draws it used
        outside = not (r.null_low <= r.value <= r.null_high)
        if outside:
            assert p < ALPHA + 4 / (1 + n_perm), (r.probe, r.metric, r.scope, r.value, r.null_low, r.null_high, p)
        else:
            assert p > ALPHA, (r.probe, r.metric, r.scope, r.value, r.null_low, r.null_high, p)
        checked += 1
    assert checked >= 50


def test_every_row_unit_follows_its_metric(sweep_rows):
    from interp_bayes.analyses.interventions import measure_unit

    units: dict[tuple, set] = {}
    for r in sweep_rows:
        units.setdefault((r.kind, r.metric, r.scope.get("measure")), set()).add(r.unit)
        if r.metric == "effect":
            assert r.unit == measure_unit(r.scope["measure"]), (r.scope, r.unit)
        if r.scope.get("condition") == "baseline" and r.metric not in ("corr_eval_projection",):
            assert r.unit == measure_unit(r.metric), (r.metric, r.unit)
    mixed = {key: u for key, u in units.items() if len(u) > 1}
    assert not mixed, mixed
    assert any(r.metric == "effect" and r.scope.get("family") == "matched" for r in sweep_rows)
