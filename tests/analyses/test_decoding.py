"""Per-layer decoding curve: the cross-fitted ridge equals sklearn's own cross-validation, a planted signal gives its
known R^2, the one-axis share separates a high-variance from a low-variance entropy direction, deconfounding removes
an effect carried by k alone, and a real model runs end to end."""

import numpy as np
import torch
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import KFold, cross_val_predict
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from interp_bayes.stats.confounds import covariate_matrix, nuisance_columns
from interp_bayes.stats import ALPHAS
from interp_bayes.analyses.decoding import cross_fitted_decoding, decoding_curve
from interp_bayes.model.read import Activations


def fake_acts(by_layer: dict[int, np.ndarray], entropy: np.ndarray) -> Activations:
    readings = {"v": {layer: torch.tensor(x, dtype=torch.float32) for layer, x in by_layer.items()}}
    meta = dict(layers=sorted(by_layer), n_layers=max(by_layer) + 1)
    return Activations(readings, torch.tensor(entropy, dtype=torch.float32), [[0]] * len(entropy), meta)


def test_cross_fitted_ridge_equals_sklearn_cross_val_predict():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 30))
    y = x[:, :4] @ rng.normal(size=4) + rng.normal(size=120)
    fit = cross_fitted_decoding(x, y, folds=5, n_null=3, seed=7)
    # rows that are their own groups: sklearn's GroupKFold makes the folds KFold makes
    ref = cross_val_predict(make_pipeline(StandardScaler(), RidgeCV(alphas=ALPHAS)), x, y,
                            cv=KFold(5, shuffle=True, random_state=7))
    np.testing.assert_allclose(fit["ridge"], ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(fit["y"], y)
    assert fit["null_r2"](3).shape == (3,) and fit["test"].draws == 3  # a cap under one batch: one batch


def test_planted_signal_gives_its_r2_and_the_axis_share_tracks_variance():
    rng = np.random.default_rng(1)
    n, d = 400, 20
    factor = rng.normal(size=n)
    x = rng.normal(size=(n, d))
    x[:, :-1] += 2 * factor[:, None]  # a shared factor: PC1 of the standardised values; the last coordinate is apart
    noise = rng.normal(size=n)
    y_pc1 = 2 * x[:, :-1].mean(1) / np.sqrt(4 + 1 / (d - 1)) + noise  # along PC1; signal variance 4, noise 1
    y_low = 2 * x[:, -1] + noise  # the same signal along a direction PC1 does not contain
    acts = fake_acts({1: x}, y_pc1)
    high = decoding_curve(acts, n_null=1000, n_boot=200).points[0]  # a share needs the null rejected: ~550 draws
    low = decoding_curve(acts, y_low, n_null=1000, n_boot=200).points[0]
    for p in (high, low):
        assert abs(p["ridge_r2"] - 0.8) < 0.06 and p["ridge_r2_ci"][0] < p["ridge_r2"] < p["ridge_r2_ci"][1]
        assert p["null_r2_range"][1] < 0.05
    assert high["axis_share"] > 0.9  # PC1 is the entropy direction: one axis carries all that is decodable
    assert low["axis_share"] < 0.1  # entropy on a direction PC1 misses: decodable, but not by the axis


def test_deconfounding_removes_what_k_alone_explains():
    rng = np.random.default_rng(2)
    k = np.repeat([1, 2, 4, 8], 60)
    lengths = 6 * k + rng.integers(0, 3, size=len(k))
    x = rng.normal(size=(len(k), 10))
    x[:, 0] += 2 * np.log1p(k)  # the reading encodes k
    cov = covariate_matrix(nuisance_columns(lengths, k=k))
    y_k = np.log1p(k) + 0.1 * rng.normal(size=len(k))  # entropy set by k alone
    y_beyond = np.log1p(k) + x[:, 1]  # plus something the reading carries beyond k
    for y, expect_after in ((y_k, False), (y_beyond, True)):
        pts = {p["adjust"]: p for p in decoding_curve(fake_acts({3: x}, y), covariates=cov, n_null=10,
                                                      n_boot=100).points}
        assert pts["raw"]["ridge_r2"] > 0.5
        after = pts["deconfounded"]
        if expect_after:
            assert after["ridge_r2"] > 0.5
        else:
            assert after["ridge_r2"] < after["null_r2_range"][1] + 0.05


def test_constant_reading_is_nan_with_a_reason_and_rows_are_tidy():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 6))
    rounding = 1.0 + 1e-7 * np.random.default_rng(4).normal(size=(40, 6))  # one vector up to float32 rounding
    curve = decoding_curve(fake_acts({0: rounding, 1: x}, x[:, 0]), n_null=2, n_boot=20)
    first, second = curve.points
    assert np.isnan(first["ridge_r2"]) and "same for every prompt" in first["reason"]
    assert np.isfinite(second["ridge_r2"])
    rows = curve.rows()
    assert {r.metric for r in rows} == {"decoding_r2", "axis_r", "axis_share_of_decodable", "decoding_r2_best"}
    assert all(set(r.scope) == {"reading", "layer", "adjust", "target"} for r in rows)
    best = next(r for r in rows if r.metric == "decoding_r2_best")  # the one finite cell is the family's
    assert best.scope["layer"] == 1 and best.test["draws"] == 2
    assert any(r.note and "same for every prompt" in r.note for r in rows if r.metric == "decoding_r2")
    assert curve.figure().data  # plotly figure with traces


def test_decoding_curve_on_a_tiny_model(tiny_dirs):
    from interp_bayes.model.collect import collect
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["llama3"])
    texts = [f"the cat sat on the mat {i} " * (1 + i % 3) for i in range(30)]
    acts = collect(model, texts, layers=[0, 1], readings=("resid", "v", "z"), progress=False)
    curve = decoding_curve(acts, folds=3, n_null=2, n_boot=20)
    assert {(p["reading"], p["layer"]) for p in curve.points} == {(r, l) for r in ("resid", "v", "z") for l in (0, 1)}
    assert all(np.isfinite(p["ridge_r2"]) or "reason" in p for p in curve.points)


def test_a_target_that_is_a_function_of_the_covariates_has_nothing_left_to_decode():
    rng = np.random.default_rng(5)
    k = np.repeat(np.arange(1, 11), 12)
    x = rng.normal(size=(len(k), 8))
    x[:, 0] = np.log2(21 - k)  # the bijection's exact entropy: a function of position, hence of k
    y = np.log2(21 - k)
    linear = np.column_stack([2 * k - 1, k, np.log1p(k)])  # linear terms (the old design): a nonlinear remainder is left
    levels = covariate_matrix(nuisance_columns(2 * k - 1, k=k))  # one indicator per k: nothing is left
    lin = {p["adjust"]: p for p in decoding_curve(fake_acts({1: x}, y), covariates=linear, n_null=2, n_boot=20).points}
    lev = {p["adjust"]: p for p in decoding_curve(fake_acts({1: x}, y), covariates=levels, n_null=2, n_boot=20).points}
    assert lin["deconfounded"]["ridge_r2"] > 0.9  # the reading carries the remainder: linear removal is not enough
    assert np.isnan(lev["deconfounded"]["ridge_r2"]) and "function of the covariates" in lev["deconfounded"]["reason"]
    assert lev["raw"]["ridge_r2"] > 0.99


def test_deconfounded_nulls_stay_near_zero_with_more_coordinates_than_prompts():
    """Residualising the readings on the training rows would let every training row be fitted exactly as the ridge
    penalty goes to 0, so the leave-one-out choice picks the smallest penalty and held-out R^2 of shuffled targets
    falls far below 0 (about -0.5 to -0.9 here); only target and axis are residualised."""
    rng = np.random.default_rng(6)
    k = np.repeat([0, 1, 2, 4, 8], 30)
    lengths = 4 * k + 3 + rng.integers(0, 4, size=len(k))
    x = rng.normal(size=(len(k), 300))
    x[:, :50] += np.sin(lengths)[:, None] * rng.normal(size=50)  # columns that follow position nonlinearly
    y = np.log1p(k) + 0.3 * rng.normal(size=len(k))
    fit = cross_fitted_decoding(x, y, covariates=covariate_matrix(nuisance_columns(lengths, k=k)), n_null=10)
    assert fit["null_r2"](10).min() > -0.2
    np.testing.assert_allclose(fit["y"].mean(), 0.0, atol=0.05)  # what the covariates leave: noise around 0


def test_a_clear_signal_rejects_its_null_early_and_noise_accepts_after_one_batch():
    """The shuffled-target null is drawn until settled (n_null the cap) and each row records the draws used."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(80, 4))
    clear = decoding_curve(fake_acts({1: x}, x[:, 0] + 0.5 * rng.normal(size=80)), n_null=1000, n_boot=20).points[0]
    noise = decoding_curve(fake_acts({1: x}, rng.normal(size=80)), n_null=1000, n_boot=20).points[0]
    assert clear["test"]["decision"] == "reject" and clear["test"]["draws"] < 1000
    assert noise["test"]["decision"] == "accept" and noise["test"]["draws"] == 50
    capped = decoding_curve(fake_acts({1: x}, x[:, 0] + 0.5 * rng.normal(size=80)), n_null=200, n_boot=20).points[0]
    assert capped["test"]["decision"] == "undecided" and capped["test"]["draws"] == 200  # too few to settle 5%


def test_one_decision_over_layers_keeps_its_false_positive_rate_where_the_best_cell_does_not():
    """Planted nulls, 200 draws of ten cells (layers x readings) whose R² and shuffled-target R² are exchangeable:
    the old rule (the cell of the largest R² above its own null's 95% range of 20 draws) fires far above the level;
    the max-statistic decision over the cells (``best_of``) stays at or below it."""
    from interp_bayes.analyses.decoding import best_of
    from interp_bayes.stats import interval

    old = new = 0
    for i in range(200):
        draws = np.random.default_rng(1000 + i).normal(size=(10, 1001))  # per cell: the R² and 1000 null draws
        points = [dict(adjust="raw", reading="v", layer=c, ridge_r2=draws[c, 0], ridge_r2_ci=[0.1, 0.2], null="n")
                  for c in range(10)]
        nulls = {id(p): (lambda stop, c=c: draws[c, 1:stop + 1]) for c, p in enumerate(points)}
        top = int(np.argmax(draws[:, 0]))
        old += draws[top, 0] > interval(draws[top, 1:21])[1]
        new += best_of(points, nulls, "raw", 1000)["test"]["decision"] == "reject"
    assert new / 200 <= 0.05 < old / 200, (new, old)


def test_the_decodable_claim_names_a_layer_only_when_the_family_survives():
    from interp_bayes.kinds.decoding import decodable_claim, summary, DecodingParams
    from interp_bayes.stats import ledger as L

    rng = np.random.default_rng(9)
    x = {layer: rng.normal(size=(80, 4)) for layer in (1, 2)}
    cov = rng.normal(size=(80, 2))
    for y, verdict, layer in ((x[2][:, 0] + 0.5 * rng.normal(size=80), L.HOLDS, 2), (rng.normal(size=80), L.FAILS,
                                                                                        None)):
        rows = decoding_curve(fake_acts(x, y), covariates=cov, n_null=1000, n_boot=100).rows()
        decided, best, evidence = decodable_claim(rows)
        assert decided == verdict and (best is None if layer is None else best.scope["layer"] == layer)
        assert "draws" in evidence
        assert summary(rows, DecodingParams())  # the summary reads the family's row
