"""Deconfounded statistics and the conditional axis, on planted data whose answer is known."""

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard

from interp_bayes.analyses.axis import cross_fitted_projections, fit_entropy_axis
from interp_bayes.stats.confounds import covariate_matrix, nuisance_columns, select_covariates
from interp_bayes.stats import deconfounded_correlation, fine_strata, residualize
from interp_bayes.core.errors import ConfigError
from interp_bayes.model.read import Activations


def acts_of(x, y):
    meta = dict(layers=[0], n_layers=1, model={"name": "planted"}, prompt_digest="x")
    return Activations({"v": {0: torch.tensor(x, dtype=torch.float64)}}, torch.tensor(y, dtype=torch.float64),
                       [[0]] * len(y), meta)


def planted(seed=0, n_per=60, positions=10, d=32):
    """A strong nuisance-driven direction u1 (values move with position) and a weaker entropy-driven one u2 (values
    move with the part of entropy that position does not explain); entropy itself also rises with position."""
    rng = np.random.default_rng(seed)
    h = hadamard(d).astype(float) / np.sqrt(d)  # orthogonal, equal-magnitude entries: equal column variances
    u1, u2 = h[1], h[2]
    pos = np.repeat(np.arange(positions), n_per).astype(float)
    p = (pos - pos.mean()) / pos.std()
    z = rng.standard_normal(len(pos))  # uncertainty beyond position
    y = 0.8 * p + 0.6 * z
    x = np.outer(3.0 * p, u1) + np.outer(z, u2) + 0.3 * rng.standard_normal((len(pos), d))
    return x, y, pos, u1, u2


def test_conditional_axis_finds_the_planted_entropy_direction_and_the_statistics_call_the_other_a_confound():
    x, y, pos, u1, u2 = planted()
    acts = acts_of(x, y)
    plain = fit_entropy_axis(acts, 0, "pc1", folds=5, seed=0)
    cond = fit_entropy_axis(acts, 0, "pc1", folds=5, seed=0, control={"position": pos})
    assert abs(float(plain.direction.double() @ torch.tensor(u1))) > 0.95  # follows the nuisance
    assert abs(float(cond.direction.double() @ torch.tensor(u2))) > 0.95  # follows the planted signal
    assert cond.provenance["control"] == ["position"] and cond.held_out["pearson"] > 0.7
    for method in ("pc1", "ridge"):
        ridge = fit_entropy_axis(acts, 0, method, folds=5, seed=0, control={"position": pos})
        assert abs(float(ridge.direction.double() @ torch.tensor(u2))) > 0.95, method

    cov = covariate_matrix({"position": pos})
    confound = deconfounded_correlation(x @ u1, y, cov, pos, covariate_names=["position"], strata_name="position",
                                        n_perm=1000, seed=1)
    assert confound.values["raw"]["spearman"] > 0.6 and confound.p_plain["spearman"] < 0.01
    assert confound.p["raw"]["spearman"] > 0.05  # the confound-keeping null reproduces the raw correlation
    for kind in ("partial", "within"):
        lo, hi = confound.null[kind]["spearman"]
        assert lo <= confound.values[kind]["spearman"] <= hi, kind  # nothing left once position is held fixed
    assert confound.verdict() == "vanishes"
    signal = deconfounded_correlation(x @ u2, y, cov, pos, n_perm=1000, seed=1)
    assert signal.verdict() == "survives" and signal.values["within"]["pearson"] > 0.5


def test_the_null_keeps_the_confound():
    """Entropy that depends on the stratum alone: the raw correlation is large, yet within its null, because the
    null shuffles only within strata."""
    rng = np.random.default_rng(2)
    k = np.repeat([1, 2, 4, 8], 50)
    y = np.log1p(k) + 0.01 * rng.standard_normal(len(k))
    x = -k + rng.standard_normal(len(k))
    dec = deconfounded_correlation(x, y, covariate_matrix(nuisance_columns(np.full(len(k), 9), k=k)), k,
                                   n_perm=1000, seed=0)
    assert dec.values["raw"]["spearman"] < -0.8
    assert dec.p["raw"]["spearman"] > 0.05  # the raw correlation is what the strata alone give
    assert dec.verdict() == "vanishes"
    fresh = np.random.default_rng(11)
    independent = deconfounded_correlation(fresh.standard_normal(200), fresh.standard_normal(200),
                                           np.zeros((200, 0)), np.zeros(200), n_perm=1000, seed=0)
    assert all(independent.p[kind]["pearson"] > 0.01 for kind in ("raw", "partial", "within"))
    assert independent.verdict("pearson") == "no raw effect"


def test_partial_and_within_equal_their_textbook_definitions():
    from scipy import stats

    rng = np.random.default_rng(3)
    n = 120
    c = rng.standard_normal((n, 2))
    g = rng.integers(0, 4, n)
    x = c @ [1.0, -0.5] + rng.standard_normal(n)
    y = 0.3 * x + c @ [0.2, 0.7] + rng.standard_normal(n)
    dec = deconfounded_correlation(x, y, c, g, n_perm=10, seed=0)
    design = np.column_stack([np.ones(n), c])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    assert dec.values["partial"]["pearson"] == pytest.approx(np.corrcoef(rx, ry)[0, 1], abs=1e-12)
    wx = x - np.array([x[g == s].mean() for s in g])
    wy = y - np.array([y[g == s].mean() for s in g])
    assert dec.values["within"]["pearson"] == pytest.approx(np.corrcoef(wx, wy)[0, 1], abs=1e-12)
    assert dec.values["raw"]["spearman"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_cross_fitted_residualisation_does_not_leak():
    """A held-out prompt changed beyond recognition moves no other held-out projection: neither the axis nor the
    residualisation coefficients of its fold saw it."""
    x, y, pos, _, _ = planted(n_per=12)
    cov = covariate_matrix({"position": pos})
    out, target, _ = cross_fitted_projections(x, y, "pc1", folds=4, seed=0, control=cov)
    from interp_bayes.stats import group_folds

    _, part = group_folds(None, 4, seed=0, n=len(x))[0]
    x2, y2 = x.copy(), y.copy()
    x2[part[0]] += 50.0 * np.random.default_rng(9).standard_normal(x.shape[1])
    y2[part[0]] += 10.0
    out2, target2, _ = cross_fitted_projections(x2, y2, "pc1", folds=4, seed=0, control=cov)
    others = part[1:]  # the rest of the changed prompt's held-out fold
    np.testing.assert_allclose(out2[others], out[others], atol=1e-10)
    np.testing.assert_allclose(target2[others], target[others], atol=1e-10)
    train, test = residualize(x[:50], x[50:60], cov[:50], cov[50:60])
    assert np.abs(train.mean(axis=0)).max() < 1e-9 and test.shape == (10, x.shape[1])


def test_covariates_remove_any_function_of_k_and_a_smooth_function_of_length_and_strata_are_fine():
    rng = np.random.default_rng(0)
    k = np.repeat([0, 1, 2, 4, 8], 40).astype(float)
    lengths = 5 + 3 * k + rng.integers(0, 25, len(k))
    cols = nuisance_columns(lengths, k=k)
    design = covariate_matrix(cols)
    levels = covariate_matrix({"k": k, "log_k": np.log1p(k)})
    assert levels.shape == (200, 5)  # one indicator per k; log k's indicators are the same columns, dropped
    assert covariate_matrix({"c": np.ones(6)}).shape == (6, 0)
    step = (k == 0).astype(float) + 0.3 * np.sqrt(k)  # no linear combination of k and log(1 + k) gives this
    assert np.abs(residualize(step, cov_train=design)).max() < 1e-10
    smooth = np.sqrt(lengths)
    linear = np.column_stack([lengths, k, np.log1p(k)])
    assert np.std(residualize(smooth, cov_train=design)) < 0.02 * np.std(residualize(smooth, cov_train=linear))
    assert list(fine_strata(np.arange(10), size=3)) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]  # a short last run joins
    assert list(fine_strata([1, 1, 1, 1, 2, 3, 3], size=3)) == [0, 0, 0, 0, 1, 1, 1]  # ties stay together


def test_an_entropy_that_is_a_function_of_position_is_inseparable():
    """The bijection without replacement: exact entropy log2(V - k + 1) depends on the position k alone, so nothing
    remains within a position; the within correlation must be NaN, not a correlation of rounding noise."""
    rng = np.random.default_rng(4)
    k = np.repeat(np.arange(1, 21), 30)
    y = np.log2(21 - k) * (1 + 1e-16 * rng.standard_normal(len(k)))  # exact but for float rounding
    x = y + 0.3 * rng.standard_normal(len(k))
    dec = deconfounded_correlation(x, y, np.zeros((len(k), 0)), k, n_perm=1000, seed=0)
    for stat in ("pearson", "spearman"):  # ranks of rounding noise are noise too
        assert np.isnan(dec.values["within"][stat]) and np.isnan(dec.null["within"][stat][0]), stat
    assert dec.values["raw"]["pearson"] > 0.9 and dec.verdict("pearson") in ("inseparable", "weakens", "vanishes")
    dec2 = deconfounded_correlation(x, y, covariate_matrix({"k": k}), k, n_perm=100, seed=0)
    assert np.isnan(dec2.values["within"]["pearson"])


def test_a_misspelled_covariate_is_refused_not_dropped():
    from interp_bayes.kinds.common import nuisance_matrix

    cov, names = nuisance_matrix([5, 6, 7], [0, 1, 2], ("length", "k"))
    columns = nuisance_columns([5, 6, 7], k=[0, 1, 2])
    np.testing.assert_array_equal(cov, select_covariates(columns, ["length", "k"]))
    assert names == ("length", "k")
    with pytest.raises(ConfigError, match="lenght"):
        nuisance_matrix([5, 6, 7], [0, 1, 2], ("lenght", "k"))
