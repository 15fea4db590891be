"""The continuous-state (Kalman) wind tunnel: exact posteriors against brute-force conditioning of the joint
Gaussian, Gaussian distances against closed forms and independent implementations, the soft-token bridge route
against the training-time module, training, and the committed checkpoints."""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from interp_bayes.core.errors import ConfigError
from interp_bayes.model.loading import load_model
from interp_bayes.tasks.kalman import (
    KalmanTask,
    gaussian_entropy_bits,
    gaussian_kl_bits,
    gaussian_w2,
    kalman_filter,
    sample_systems,
    window_filter,
)
from interp_bayes.windtunnel.configs import build_mlp, build_transformer, make_config, make_task, n_params
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.windtunnel.kalman import (
    continuous_inputs,
    gaussian_head,
    head_outputs,
    evaluate_kalman,
    kalman_loss,
    kalman_readings,
    paired_difference,
    predict_gaussian,
    target_verdict,
)
from interp_bayes.windtunnel.train import save_folder, train_main, train_windtunnel

torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
CHECKPOINTS = Path(__file__).resolve().parents[2] / "interp_bayes" / "windtunnel" / "checkpoints"
DIMS = [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)]


def joint_gaussian(sys, i: int, K: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of (x_1..x_K, y_1..y_K) of system ``i``, built from the independent noises
    (x_1 - m0, w_1..w_{K-1}, v_1..v_K) by explicit matrix powers: no recursion shared with the filter."""
    A, C, Q, R, m0, P0 = (getattr(sys, k)[i].numpy() for k in ("A", "C", "Q", "R", "m0", "P0"))
    d, m = A.shape[0], C.shape[0]
    powers = [np.linalg.matrix_power(A, k) for k in range(K)]
    mix = np.zeros((K * d, K * d))  # x = mu_x + mix @ (x_1 - m0, w_1, .., w_{K-1})
    for t in range(K):
        for s in range(t + 1):
            mix[t * d:(t + 1) * d, s * d:(s + 1) * d] = powers[t - s]
    noise = scipy.linalg.block_diag(P0, *[Q] * (K - 1))
    sxx = mix @ noise @ mix.T
    cbig = np.kron(np.eye(K), C)
    mu_x = np.concatenate([powers[t] @ m0 for t in range(K)])
    mean = np.concatenate([mu_x, cbig @ mu_x])
    cov = np.block([[sxx, sxx @ cbig.T], [cbig @ sxx, cbig @ sxx @ cbig.T + np.kron(np.eye(K), R)]])
    assert mean.shape == (K * (d + m),)
    return mean, cov


def condition(mean, cov, target, given, values) -> tuple[np.ndarray, np.ndarray]:
    """p(z[target] | z[given] = values) of a joint Gaussian."""
    s_gg = cov[np.ix_(given, given)]
    s_tg = cov[np.ix_(target, given)]
    gain = np.linalg.solve(s_gg, s_tg.T).T
    return mean[target] + gain @ (values - mean[given]), cov[np.ix_(target, target)] - gain @ s_tg.T


@pytest.mark.parametrize("d,m", DIMS)
def test_kalman_filter_equals_brute_force_conditioning_of_the_joint(d, m):
    K, n = 7, 3
    batch = KalmanTask(state_dim=d, obs_dim=m, n_steps=K).sample(n, seed=d * 10 + m)
    for i in range(n):
        mean, cov = joint_gaussian(batch.system, i, K)
        y = batch.obs[i].numpy().reshape(-1)
        for t in range(K):
            mt, pt = condition(mean, cov, np.arange(t * d, (t + 1) * d), K * d + np.arange((t + 1) * m),
                               y[: (t + 1) * m])
            np.testing.assert_allclose(batch.mean[i, t].numpy(), mt, atol=1e-9, rtol=0)
            np.testing.assert_allclose(batch.cov[i, t].numpy(), pt, atol=1e-9, rtol=0)


@pytest.mark.parametrize("d,m", DIMS)
@pytest.mark.parametrize("window", [1, 3])
def test_window_filter_equals_conditioning_on_the_window_only(d, m, window):
    K, n = 6, 2
    batch = KalmanTask(state_dim=d, obs_dim=m, n_steps=K).sample(n, seed=[d, m, window])
    w_mean, w_cov = window_filter(batch.system, batch.obs, window)
    for i in range(n):
        mean, cov = joint_gaussian(batch.system, i, K)
        y = batch.obs[i].numpy().reshape(-1)
        for t in range(K):
            first = max(0, t - window + 1)
            given = K * d + np.arange(first * m, (t + 1) * m)
            mt, pt = condition(mean, cov, np.arange(t * d, (t + 1) * d), given, y[first * m:(t + 1) * m])
            np.testing.assert_allclose(w_mean[i, t].numpy(), mt, atol=1e-9, rtol=0)
            np.testing.assert_allclose(w_cov[i, t].numpy(), pt, atol=1e-9, rtol=0)


def test_full_window_is_the_exact_filter_and_shorter_windows_lose_information():
    task = KalmanTask(n_steps=16)
    b = task.sample(400, seed=0)
    for window in (16, 40):
        mean, cov = window_filter(b.system, b.obs, window)
        torch.testing.assert_close(mean, b.mean, atol=1e-12, rtol=0)
        torch.testing.assert_close(cov, b.cov, atol=1e-12, rtol=0)
    # expected KL to the exact posterior is I(x_t; older y | window): it falls as the window grows
    kl = [gaussian_kl_bits(b.mean, b.cov, *window_filter(b.system, b.obs, w))[:, 8:].mean().item() for w in (1, 2, 4, 8)]
    assert all(a > b_ for a, b_ in zip(kl, kl[1:])) and kl[-1] > 0


def test_systems_are_stable_and_covariances_positive_definite():
    sys = sample_systems(np.random.default_rng(0), 500, 3, 2, singular_values=(0.8, 0.99), proc_scale=(0.01, 0.05),
                         obs_scale=(0.5, 2.0), prior_scale=(0.25, 1.0))
    assert torch.linalg.eigvals(sys.A).abs().max() < 0.99 + 1e-12
    assert torch.linalg.matrix_norm(sys.A, ord=2).max() < 0.99 + 1e-12
    for cov in (sys.Q, sys.R, sys.P0):
        torch.testing.assert_close(cov, cov.mT)
        assert torch.linalg.eigvalsh(cov).min() > 0
    torch.testing.assert_close(sys.C.norm(dim=-1), torch.ones(500, 2, dtype=torch.float64))


def test_features_encode_the_system_and_observations_and_sampling_is_seeded():
    task = KalmanTask(state_dim=3, obs_dim=2, n_steps=5)
    b = task.sample(4, seed=3)
    f = b.features.double()
    assert f.shape == (4, 6, task.n_features) and torch.equal(b.query_pos, torch.arange(1, 6))
    col = {tok: i for i, tok in enumerate(task.feature_tokens)}
    assert (f[:, 0, col["[SYS]"]] == 1).all() and (f[:, 1:, col["[OBS]"]] == 1).all()
    assert (f[:, 0, col["[OBS]"]] == 0).all() and (f[:, 1:, col["A00"]] == 0).all()
    for i in range(3):
        for j in range(3):
            torch.testing.assert_close(f[:, 0, col[f"A{i}{j}"]], b.system.A[:, i, j].float().double())
            if j <= i:
                torch.testing.assert_close(f[:, 0, col[f"P0_{i}{j}"]], b.system.P0[:, i, j].float().double())
                torch.testing.assert_close(f[:, 0, col[f"Q{i}{j}"]], b.system.Q[:, i, j].float().double())
    torch.testing.assert_close(f[:, 0, col["R10"]], b.system.R[:, 1, 0].float().double())
    torch.testing.assert_close(f[:, 1:, col["y1"]], b.obs[:, :, 1].float().double())
    again, other = task.sample(4, seed=3), task.sample(4, seed=4)
    assert torch.equal(again.features, b.features) and torch.equal(again.cov, b.cov)
    assert not torch.equal(other.features, b.features)


def test_realised_states_are_calibrated_under_the_exact_posterior():
    """The sampler and the filter agree: Mahalanobis distances of the realised states are chi-square(d)."""
    b = KalmanTask(state_dim=2, obs_dim=1, n_steps=12).sample(3000, seed=5)
    z = torch.linalg.solve_triangular(torch.linalg.cholesky(b.cov), (b.states - b.mean)[..., None], upper=False)
    d2 = z.pow(2).sum((-1, -2)).reshape(-1).numpy()
    assert stats.kstest(d2, stats.chi2(2).cdf).pvalue > 1e-3
    assert abs(d2.mean() - 2) < 0.05


def random_gaussians(rng, n, d):
    mean = torch.from_numpy(rng.standard_normal((n, d)))
    g = torch.from_numpy(rng.standard_normal((n, d, d)))
    return mean, g @ g.mT + 0.1 * torch.eye(d, dtype=torch.float64)


def test_w2_matches_closed_forms_and_scipy_sqrtm():
    rng = np.random.default_rng(0)
    m1, p1 = random_gaussians(rng, 50, 3)
    m2, p2 = random_gaussians(rng, 50, 3)
    w2 = gaussian_w2(m1, p1, m2, p2)
    for i in range(50):  # the textbook formula with scipy's general matrix square root
        r1 = scipy.linalg.sqrtm(p1[i].numpy())
        ref = (np.sum((m1[i] - m2[i]).numpy() ** 2) + np.trace(p1[i].numpy() + p2[i].numpy())
               - 2 * np.trace(scipy.linalg.sqrtm(r1 @ p2[i].numpy() @ r1)).real)
        assert w2[i].item() == pytest.approx(math.sqrt(ref), abs=1e-9)
    torch.testing.assert_close(w2, gaussian_w2(m2, p2, m1, p1), atol=1e-9, rtol=0)  # symmetric
    assert gaussian_w2(m1, p1, m1, p1).max() < 1e-6
    # commuting (diagonal) covariances: |m1 - m2|^2 + |sqrt(s1) - sqrt(s2)|^2
    s1, s2 = torch.rand(20, 3, dtype=torch.float64) + 0.1, torch.rand(20, 3, dtype=torch.float64) + 0.1
    ref = ((m1[:20] - m2[:20]) ** 2).sum(-1) + ((s1.sqrt() - s2.sqrt()) ** 2).sum(-1)
    torch.testing.assert_close(gaussian_w2(m1[:20], torch.diag_embed(s1), m2[:20], torch.diag_embed(s2)) ** 2, ref)


def test_w2_in_one_dimension_matches_the_sorted_sample_coupling():
    """In 1-D the optimal coupling is the quantile coupling: sorted samples give W2 by Monte Carlo."""
    rng = np.random.default_rng(1)
    a = 0.3 + 0.5 * rng.standard_normal(400_000)
    b = -0.4 + 1.7 * rng.standard_normal(400_000)
    mc = np.sqrt(np.mean((np.sort(a) - np.sort(b)) ** 2))
    f64 = dict(dtype=torch.float64)
    w2 = gaussian_w2(torch.tensor([[0.3]], **f64), torch.tensor([[[0.25]]], **f64), torch.tensor([[-0.4]], **f64),
                     torch.tensor([[[1.7**2]]], **f64))
    assert w2.item() == pytest.approx(math.sqrt(0.7**2 + 1.2**2), abs=1e-12)
    assert w2.item() == pytest.approx(mc, abs=5e-3)


def test_kl_and_entropy_match_torch_distributions_and_monte_carlo():
    rng = np.random.default_rng(2)
    m0, p0 = random_gaussians(rng, 40, 3)
    m1, p1 = random_gaussians(rng, 40, 3)
    N = torch.distributions.MultivariateNormal
    ref = torch.distributions.kl_divergence(N(m0, p0), N(m1, p1)) / math.log(2)
    torch.testing.assert_close(gaussian_kl_bits(m0, p0, m1, p1), ref, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(gaussian_entropy_bits(p0), N(m0, p0).entropy() / math.log(2), atol=1e-9, rtol=0)
    assert gaussian_kl_bits(m0, p0, m0, p0).abs().max() < 1e-9
    x = stats.multivariate_normal(m0[0].numpy(), p0[0].numpy()).rvs(400_000, random_state=3)
    mc = np.mean(stats.multivariate_normal(m0[0].numpy(), p0[0].numpy()).logpdf(x)
                 - stats.multivariate_normal(m1[0].numpy(), p1[0].numpy()).logpdf(x)) / math.log(2)
    assert gaussian_kl_bits(m0[:1], p0[:1], m1[:1], p1[:1]).item() == pytest.approx(mc, rel=0.02)


def test_soft_loss_is_the_expected_hard_loss_and_is_minimised_by_the_exact_posterior():
    b = KalmanTask(state_dim=2, obs_dim=1, n_steps=6).sample(4000, seed=6)
    exact_chol = torch.linalg.cholesky(b.cov)
    h_nats = (gaussian_entropy_bits(b.cov) * math.log(2)).mean()
    assert kalman_loss(b.mean, exact_chol, b, "soft").item() == pytest.approx(h_nats.item(), abs=1e-9)
    mean, chol = b.mean + 0.2, 1.3 * exact_chol  # some other belief: soft loss = E[hard loss] under the posterior
    soft, hard = kalman_loss(mean, chol, b, "soft").item(), kalman_loss(mean, chol, b, "hard").item()
    assert soft > h_nats.item() + 0.05 and hard == pytest.approx(soft, rel=0.03)


def tiny_kalman(tmp_path, arch="transformer", **kw):
    cfg = make_config("kalman", "tiny", arch=arch, **kw)
    task = make_task(cfg)
    torch.manual_seed(0)
    model = build_transformer(cfg, task).eval() if arch == "transformer" else build_mlp(cfg, task).eval()
    save_folder(model, cfg, task, tmp_path, {"step": 0})
    return model, cfg, task


def test_generic_evaluator_passes_the_options_on_and_baselines_can_be_left_out(tmp_path):
    tiny_kalman(tmp_path)
    full = evaluate_kalman(tmp_path, n=12, lengths=[8], batch_size=5)[8]
    assert set(full["windows"]) == {"1", "2", "4"} and "target" in full
    bare = evaluate_windtunnel(tmp_path, n=12, lengths=[8], batch_size=5, baselines=False)[8]
    assert bare["windows"] == {} and "target" not in bare
    assert {k: v for k, v in bare.items() if k != "windows"} == {k: v for k, v in full.items()
                                                                  if k not in ("windows", "target")}
    with pytest.raises(TypeError, match="position_h"):  # an option no evaluator has is refused, not ignored
        evaluate_windtunnel(tmp_path, n=12, position_h=None)


def test_bridge_on_continuous_inputs_equals_the_training_module_and_hooks_fire(tmp_path):
    hf, cfg, task = tiny_kalman(tmp_path, task_kwargs=dict(state_dim=3, obs_dim=2, n_steps=8))
    bridge = load_model(tmp_path)
    batch = task.sample(5, seed=1)
    with torch.no_grad():
        ref_mean, ref_chol = predict_gaussian(hf, task, batch)
        mean, chol = predict_gaussian(bridge, task, batch)
        torch.testing.assert_close(mean, ref_mean, atol=1e-5, rtol=0)
        torch.testing.assert_close(chol, ref_chol, atol=1e-5, rtol=0)
        assert (torch.diagonal(chol, dim1=-2, dim2=-1) > 0).all() and (chol.triu(1) == 0).all()
        with continuous_inputs(bridge, batch.features) as ids:
            logits, cache = bridge.run_with_cache(ids)
        eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
        emb = batch.features @ eager.transformer.wte.weight[: task.n_features]
        torch.testing.assert_close(logits, eager(inputs_embeds=emb).logits, atol=1e-5, rtol=0)
    T = batch.features.shape[1]
    torch.testing.assert_close(cache["hook_embed"], emb, atol=1e-6, rtol=0)
    assert cache["blocks.0.attn.hook_v"].shape == (5, T, cfg.n_heads, cfg.d_model // cfg.n_heads)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"].sum(-1), torch.ones(5, cfg.n_heads, T))
    with pytest.raises(ConfigError, match="pass the task it was trained on"):
        predict_gaussian(bridge, KalmanTask(state_dim=2, obs_dim=1), batch)
    with pytest.raises(ValueError, match="hook_embed has shape"):
        with continuous_inputs(bridge, batch.features):
            bridge(torch.zeros(5, 3, dtype=torch.long))


@pytest.mark.parametrize("preset", ["paper", "cpu", "tiny"])
def test_kalman_mlp_is_capacity_matched(preset):
    cfg = make_config("kalman", preset)
    task = make_task(cfg)
    n_tr, n_mlp = n_params(build_transformer(cfg, task)), n_params(build_mlp(cfg, task))
    assert abs(n_mlp - n_tr) <= 0.02 * n_tr


def test_mlp_sees_only_its_own_position(tmp_path):
    mlp, cfg, task = tiny_kalman(tmp_path, arch="mlp")
    b = task.sample(2, seed=0)
    edited = b.features.clone()
    edited[:, 0] += 1.0  # change the header
    with torch.no_grad():
        diff = (head_outputs(mlp, b.features) - head_outputs(mlp, edited)).abs().amax(-1)
    assert (diff[:, 0] > 0).all() and diff[:, 1:].max() == 0


def test_readings_at_each_step_equal_the_prefix_runs_final_position(tmp_path):
    _, cfg, task = tiny_kalman(tmp_path)
    bridge = load_model(tmp_path)
    acts, cols = kalman_readings(bridge, task, n_sequences=3, seed=9, batch_size=2)
    K = task.n_steps
    assert len(acts) == 3 * K and acts.values(0).shape == (3 * K, cfg.d_model)
    assert acts.reading("attn_entropy", 0).shape == (3 * K, cfg.n_heads)
    batch = task.sample(3, seed=9)
    np.testing.assert_allclose(cols["bayes_mean"], batch.mean.reshape(-1, task.state_dim).numpy())
    np.testing.assert_allclose(cols["k"], np.tile(np.arange(1, K + 1), 3))
    for row, (i, q) in enumerate([(0, 0), (1, 4), (2, K - 1)]):  # run the prefix up to step q+1 alone
        prefix = batch.features[i:i + 1, : q + 2]
        with torch.no_grad(), continuous_inputs(bridge, prefix) as ids:
            logits, cache = bridge.run_with_cache(ids)
        r = i * K + q
        torch.testing.assert_close(acts.values(0)[r], cache["blocks.0.attn.hook_v"][0, -1].reshape(-1),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(acts.reading("resid", 0)[r], cache["blocks.0.hook_resid_post"][0, -1],
                                   atol=1e-5, rtol=0)
        p = cache["blocks.0.attn.hook_pattern"][0, :, -1]
        torch.testing.assert_close(acts.reading("attn_entropy", 0)[r],
                                   -torch.special.xlogy(p, p).sum(-1) / math.log(2), atol=1e-5, rtol=0)
        _, chol = gaussian_head(logits[0, -1, task.readout_ids].double(), task.state_dim)
        assert acts.entropy[r].item() == pytest.approx(gaussian_entropy_bits(chol @ chol.mT).item(), abs=1e-4)


def test_tiny_training_reduces_the_loss_well_below_its_start(tmp_path):
    out = train_windtunnel("kalman", preset="tiny", out=tmp_path, seed=0, quiet=True, steps=200, eval_every=50,
                           checkpoints=[0])
    logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = logs[0], logs[-1]
    floor = (gaussian_entropy_bits(make_task(make_config("kalman", "tiny")).sample(4000, seed=0).cov)
             * math.log(2)).mean().item()  # the soft loss of the exact posterior
    assert last["loss"] - floor < 0.5 * (first["loss"] - floor)
    assert last["kl_bits"] < 0.5 * first["kl_bits"]
    meta = json.loads((out / "windtunnel.json").read_text())
    res = meta["eval"]["8"]
    assert set(res["windows"]) == {"1", "2", "4"} and res["target"]["best_window"] == 4
    # the folder boots in the bridge and evaluates through the generic entry point to the same numbers
    again = evaluate_windtunnel(out, n=res["n"], lengths=[8])[8]
    assert again["kl_bits"] == pytest.approx(res["kl_bits"], rel=1e-4)
    early = evaluate_kalman(out / "checkpoints" / "step_000000", n=200)[8]
    assert early["kl_bits"] > again["kl_bits"]


def test_cli_trains_the_kalman_mlp_baseline(tmp_path):
    argv = ["kalman", "--preset", "tiny", "--arch", "mlp", "--steps", "3", "--out", str(tmp_path), "--quiet"]
    assert train_main(argv) == 0
    res = evaluate_windtunnel(tmp_path, n=16, lengths=[4, 8])
    assert set(res) == {4, 8} and all(r["kl_bits"] > 0 and r["w2"] > 0 for r in res.values())


COMMITTED = sorted(p for p in CHECKPOINTS.glob("kalman-*") if (p / "windtunnel.json").exists())


@pytest.mark.parametrize("folder", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_kalman_checkpoint_reproduces_its_recorded_metrics(folder):
    meta = json.loads((folder / "windtunnel.json").read_text())
    length, recorded = next(iter(meta["eval"].items()))
    got = evaluate_kalman(folder, n=recorded["n"], lengths=[int(length)])[int(length)]
    for key in ("w2", "kl_bits", "per_sample_entropy_mae_bits"):
        assert got[key] == pytest.approx(recorded[key], rel=1e-3, abs=1e-6), key
        np.testing.assert_allclose(got["per_position"][key], recorded["per_position"][key], rtol=1e-3, atol=1e-6)
    assert got["target"]["met"] == recorded["target"]["met"]
    for w, rec in recorded["windows"].items():  # the baselines are exact computations: equal to rounding
        np.testing.assert_allclose(got["windows"][w]["per_position"]["kl_bits"], rec["per_position"]["kl_bits"],
                                   rtol=1e-9, atol=1e-12)


def test_paired_difference_draws_until_every_step_is_settled_against_zero():
    """Issue 36: each step's paired interval is drawn until settled on one side of 0 (``stats.beyond_each``,
    ``n_boot`` the cap) with its draws recorded; ``met_with_interval`` is True only when every step settled below 0,
    False once one settled not to, None (borderline) when a step stayed undecided at the cap."""
    rng = np.random.default_rng(2)
    window = {"w2": torch.zeros(300, 6), "kl_bits": torch.zeros(300, 6)}
    below = {k: torch.tensor(rng.normal(-1.0, 1.0, (300, 6))) for k in window}
    diff = paired_difference(below["w2"], window["w2"], n_boot=1000)
    assert diff["decision"] == ["reject"] * 6 and all(500 <= d < 1000 for d in diff["draws"])
    assert max(diff["high"]) < 0
    assert target_verdict(below, {2: window}, n_boot=1000)["w2"]["met_with_interval"] is True
    above = {k: v.clone() for k, v in below.items()}
    above["kl_bits"][:, 4] += 2.0  # step 5 clearly above the window: settled after one batch
    got = target_verdict(above, {2: window}, n_boot=1000)["kl_bits"]
    assert got["met_with_interval"] is False and got["difference"]["draws"][2] == 50
    assert target_verdict(below, {2: window}, n_boot=200)["w2"]["met_with_interval"] is None
