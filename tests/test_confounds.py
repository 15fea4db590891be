"""Residualisation on nuisance covariates: equal to a least-squares fit on the training rows alone (no leakage),
collinear covariates handled, and the partial correlation with its within-stratum null."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from interp_bayes.confounds import nuisance_covariates, partial_correlation, residualize


def test_residualize_applies_the_training_fit_to_the_test_rows():
    rng = np.random.default_rng(0)
    cov = rng.normal(size=(60, 3))
    x = cov @ rng.normal(size=(3, 5)) + rng.normal(size=(60, 5))
    train, test = np.arange(40), np.arange(40, 60)
    r_train, r_test = residualize(x[train], x[test], cov[train], cov[test])
    ref = LinearRegression().fit(cov[train], x[train])  # the independent reference: sklearn's OLS with intercept
    np.testing.assert_allclose(r_train, x[train] - ref.predict(cov[train]), atol=1e-10)
    np.testing.assert_allclose(r_test, x[test] - ref.predict(cov[test]), atol=1e-10)
    # the test rows do not influence the fit: changing them changes only their own residuals
    x2 = x.copy()
    x2[test] += 100.0
    r_train2, r_test2 = residualize(x2[train], x2[test], cov[train], cov[test])
    np.testing.assert_allclose(r_train2, r_train, atol=1e-10)
    np.testing.assert_allclose(r_test2, r_test + 100.0, atol=1e-9)


def test_nuisance_covariates_are_collinear_but_residualise_exactly():
    lengths = np.array([5, 7, 9, 9, 12, 15, 18, 20])
    k = np.array([0, 1, 2, 2, 4, 4, 8, 8])
    cov = nuisance_covariates(lengths, k)
    assert cov.shape == (8, 4)
    np.testing.assert_array_equal(cov[:, 0], lengths - 1)
    np.testing.assert_allclose(cov[:, 3], np.log1p(k))
    y = 2.0 * lengths - 3.0 * np.log1p(k) + 1.0  # an exact function of the covariates
    res, _ = residualize(y, y, cov, cov)
    np.testing.assert_allclose(res, 0.0, atol=1e-9)


def test_partial_correlation_removes_a_shared_confound_and_keeps_a_real_link():
    rng = np.random.default_rng(1)
    k = np.repeat([1, 2, 4, 8], 50)
    conf = np.log1p(k)
    x = conf + 0.3 * rng.normal(size=200)
    y_confounded = conf + 0.3 * rng.normal(size=200)  # related to x only through k
    raw = np.corrcoef(x, y_confounded)[0, 1]
    part = partial_correlation(x, y_confounded, conf[:, None], strata=k, n_perm=300)
    assert raw > 0.7 and abs(part["pearson"]) < 0.2
    assert part["null_range"][0] < part["pearson"] < part["null_range"][1] and part["p_value"] > 0.01
    # with k in every stratum the null keeps what k explains: its centre is the confounded part, not 0
    kept = partial_correlation(x, y_confounded, np.ones((200, 1)), strata=k, n_perm=300)
    assert kept["null_median"] > 0.5 and kept["p_value"] > 0.01
    y_linked = x + 0.3 * rng.normal(size=200)
    linked = partial_correlation(x, y_linked, conf[:, None], strata=k, n_perm=300)
    assert linked["pearson"] > 0.5 and linked["p_value"] < 0.01 and linked["pearson"] > linked["null_range"][1]


def test_partial_correlation_of_a_constant_is_nan_with_a_reason():
    cov = np.arange(10.0)[:, None]
    out = partial_correlation(2 * np.arange(10.0), np.random.default_rng(0).normal(size=10), cov, n_perm=10)
    assert np.isnan(out["pearson"]) and "constant" in out["reason"]
    with pytest.raises(KeyError):
        out["null_range"]
