"""Belief-state probes: the ridge against sklearn and brute-force leave-one-out, cross-fitting by sequence, the
bootstrap and the shuffled null, query-position readings against a full run_with_cache, and the wind-tunnel
controls on a tiny model."""

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from interp_bayes.stats.probe import belief_probe, simplex_belief
from interp_bayes.model.collect import query_readings
from interp_bayes.stats import ALPHAS, bootstrap_r2, cross_fitted_ridge, fit_ridge, r2
from interp_bayes.core.errors import ConfigError
from interp_bayes.model.loading import load_model
from interp_bayes.windtunnel.configs import build_transformer, make_config, make_task
from interp_bayes.windtunnel.train import save_folder

torch.set_num_threads(1)


def linear_data(n=300, d=8, h=3, noise=0.1, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, d) + rng.normal(size=d)
    y = x @ rng.normal(size=(d, h)) + noise * rng.normal(size=(n, h))
    return x, y


def test_ridge_equals_sklearn_at_the_chosen_penalty():
    x, y = linear_data()
    fit = fit_ridge(x, y)
    z = (x - x.mean(0)) / x.std(0)
    ref = Ridge(alpha=fit.alpha[0]).fit(z, y)  # one penalty for the whole posterior vector
    np.testing.assert_allclose(fit.predict(x), ref.predict(z), atol=1e-10)


def test_leave_one_out_error_matches_refitting_without_each_row():
    x, y = linear_data(n=40, d=5, noise=1.0)
    alpha = 3.0
    fit = fit_ridge(x, y, alphas=np.array([alpha]))
    z = (x - x.mean(0)) / x.std(0)  # the standardisation is fixed across the refits, as in the closed form
    errs = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        ref = Ridge(alpha=alpha).fit(z[keep], y[keep])
        errs.append(((ref.predict(z[i : i + 1]) - y[i]) ** 2).mean())
    assert fit.loo_mse.mean() == pytest.approx(np.mean(errs), rel=1e-10)  # per column, pooled over the columns


def test_penalty_follows_the_noise():
    x, y = linear_data(noise=0.01)
    _, y_noisy = linear_data(noise=30.0)
    assert fit_ridge(x, y).alpha[0] < fit_ridge(x, y_noisy).alpha[0]


def test_cross_fitting_keeps_each_sequence_in_one_fold():
    # a target that is a per-sequence constant and an input that memorises the sequence: a row-level split would
    # read the constant off the sequence's other rows; grouped folds cannot
    rng = np.random.default_rng(1)
    seqs, per = 60, 5
    groups = np.repeat(np.arange(seqs), per)
    y = np.repeat(rng.normal(size=(seqs, 1)), per, axis=0)
    x = np.eye(seqs)[groups] + 1e-3 * rng.normal(size=(seqs * per, seqs))
    grouped = cross_fitted_ridge(x, [y], groups)[0]
    rows = cross_fitted_ridge(x, [y], np.arange(len(y)))[0]
    assert r2(y, grouped, pooled=True) < 0.05 < 0.9 < r2(y, rows, pooled=True)


def test_bootstrap_r2_equals_resampling_rows_of_whole_groups():
    x, y = linear_data(n=120, noise=1.0)
    y_hat = y + np.random.default_rng(2).normal(size=y.shape)
    group = np.repeat(np.arange(30), 4)
    got = bootstrap_r2(y, y_hat, group, n_boot=4, seed=7)
    rng = np.random.default_rng(7)
    for value in got:
        rows = np.concatenate([np.flatnonzero(group == g) for g in rng.integers(0, 30, 30)])
        assert value == pytest.approx(r2(y[rows], y_hat[rows], pooled=True), rel=1e-12)


def test_probe_recovers_a_linear_belief_and_the_null_does_not():
    rng = np.random.default_rng(3)
    seqs, per, H = 80, 6, 4
    logits = rng.normal(size=(seqs * per, H))
    belief = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    acts = np.concatenate([belief @ rng.normal(size=(H, 10)), rng.normal(size=(seqs * per, 6))], axis=1)
    r = belief_probe(acts, belief, groups=np.repeat(np.arange(seqs), per), n_shuffles=1000, n_boot=200)
    assert r["r2"] > 0.999 and r["r2_ci"][0] > 0.99 and r["kl_bits"] < 1e-3
    assert r["shuffled"]["range"][1] < 0.05 and r["n_sequences"] == seqs
    # the shuffles are drawn until the R² is settled against them, well before the cap, and recorded
    assert r["shuffled"]["test"]["decision"] == "reject" and r["shuffled"]["n"] == r["shuffled"]["test"]["draws"] < 1000


def test_simplex_projection():
    pred = np.array([[0.7, 0.4, -0.1], [0.2, 0.3, 0.5]])
    b = simplex_belief(pred, floor=0.01)
    np.testing.assert_allclose(b.sum(1), 1.0)
    assert b.min() > 0


def test_probe_refuses_mismatched_inputs():
    with pytest.raises(ConfigError, match="same n"):
        belief_probe(np.zeros((5, 3)), np.zeros((4, 2)))
    with pytest.raises(ConfigError, match="folds"):
        belief_probe(np.random.default_rng(0).normal(size=(8, 3)), np.ones((8, 2)), groups=[0, 0, 1, 1, 2, 2, 3, 3])


@pytest.fixture(scope="module")
def tiny_hmm(tmp_path_factory):
    cfg = make_config("hmm", "sticky-tiny")
    task = make_task(cfg)
    torch.manual_seed(1)
    folder = tmp_path_factory.mktemp("tiny-hmm")
    save_folder(build_transformer(cfg, task).eval(), cfg, task, folder, {"step": 0})
    return folder, task


def test_query_readings_are_the_cache_at_the_query_positions(tiny_hmm):
    folder, task = tiny_hmm
    model = load_model(folder)
    batch = task.sample(7, seed=0)
    got = query_readings(model, batch, readings=("resid", "v", "z"), batch_size=3)
    _, cache = model.run_with_cache(batch.input_ids)
    Q = len(batch.query_pos)
    for reading, hook in (("resid", "blocks.{}.hook_resid_post"), ("v", "blocks.{}.attn.hook_v"),
                          ("z", "blocks.{}.attn.hook_z")):
        for layer in range(model.cfg.n_layers):
            want = cache[hook.format(layer)][:, batch.query_pos].reshape(7 * Q, -1)
            torch.testing.assert_close(got[reading][layer], want, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="attn_entropy"):
        query_readings(model, batch, readings=("attn_entropy",))
    n = model.cfg.n_layers
    assert list(query_readings(model, batch, layers=[-1])["resid"]) == [n - 1]  # negative layers count from the end
    with pytest.raises(ConfigError, match="out of range"):  # refused, not wrapped around to layer n % n_layers
        query_readings(model, batch, layers=[n])


def test_windtunnel_probes_give_every_control(tiny_hmm):
    from interp_bayes.core.results import select
    from interp_bayes.kinds.belief import BeliefParams, figures, run

    folder, _ = tiny_hmm
    result = run(None, BeliefParams.from_dict(dict(tunnel=str(folder), n_sequences=40, readings=["resid"],
                                                   n_shuffles=3, n_boot=50)))
    rows = select(result.rows, "belief_r2")
    assert {(r.scope["weights"], r.scope["target"]) for r in rows} == {
        (m, t) for m in ("trained", "untrained") for t in ("exact", "window-4", "exact-minus-window-4")}
    assert len(rows) == 6 * 1  # one layer in the tiny model
    kl = {r.scope["target"]: r.value for r in select(result.rows, "belief_kl_bits")}
    assert np.isnan(kl["exact-minus-window-4"]) and np.isfinite(kl["exact"])
    assert all(r.low <= r.value <= r.high for r in rows)
    assert result.data["task_kwargs"] == json.loads((folder / "windtunnel.json").read_text())["config"]["task_kwargs"]

    class View:  # what the report hands a kind's figures
        name, params, data, rows = "belief", dict(tunnel=str(folder)), result.data, result.rows

        def params_object(self):
            return BeliefParams.from_dict(self.params)

    fig = figures([View()])[0].content
    assert [t.name for t in fig.data] == ["shuffled null"] + [f"{m}: {t}" for m in ("trained", "untrained")
                                                             for t in ("exact", "window-4", "exact-minus-window-4")]
    assert ALPHAS.min() > 0
