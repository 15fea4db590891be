"""Subspace ablations in a wind tunnel: the fitted subspaces, and the costs against an independent recomputation
with the axis operator."""

import numpy as np
import pytest
import torch

from interp_bayes.core.errors import ConfigError
from interp_bayes.model.edits import AxisCut, intervene
from interp_bayes.model.loading import load_model
from interp_bayes.windtunnel.configs import build_transformer, make_config, make_task
from interp_bayes.windtunnel.discrete import restricted_log_probs
from interp_bayes.analyses.subspaces import every_position, fit_subspaces, sequence_losses, subspace_rows
from interp_bayes.windtunnel.train import save_folder

torch.set_num_threads(1)


def saved(tmp_path, task_name, preset, **overrides):
    cfg = make_config(task_name, preset, **overrides)
    task = make_task(cfg)
    torch.manual_seed(0)
    save_folder(build_transformer(cfg, task).eval(), cfg, task, tmp_path, {"step": 0})
    return tmp_path, task


def test_fitted_subspaces_have_the_simplex_dimension(tmp_path):
    folder, task = saved(tmp_path, "bijection", "tiny", task_kwargs={"n_symbols": 6})
    model = load_model(folder)
    batch = task.sample(40, seed=0)
    x_all, tokens = every_position(model, batch, 0, "v")
    assert x_all.shape == (40 * batch.input_ids.shape[1], 32) and (tokens == batch.input_ids.reshape(-1).numpy()).all()
    x_query = x_all.reshape(40, -1, 32)[:, batch.query_pos].reshape(-1, 32)
    bases = fit_subspaces(x_query, batch.posterior.double().reshape(-1, 6).numpy(), x_all, tokens,
                          task.hypothesis_ids)
    assert {name: b.shape for name, b in bases.items()} == {"entropy-axis": (1, 32), "frame-belief": (5, 32),
                                                           "frame-pcs": (5, 32), "frame-tokens": (5, 32)}
    for b in bases.values():
        np.testing.assert_allclose(b @ b.T, np.eye(len(b)), atol=1e-8)
    # an HMM prompt never holds its state tokens: no token frame
    hmm_bases = fit_subspaces(x_query, batch.posterior.double().reshape(-1, 6).numpy(), x_all, tokens, [999])
    assert "frame-tokens" not in hmm_bases


def test_costs_match_a_recomputation_with_the_axis_operator(tmp_path):
    folder, task = saved(tmp_path, "bijection", "tiny", task_kwargs={"n_symbols": 6})
    model = load_model(folder)
    rows, draws = subspace_rows(model, task, layers=[0], n_fit=30, n_eval=20, n_isotropic=2, n_matched=2)
    true_cut = next(r for r in draws if (r["subspace"], r["op"], r["kind"]) == ("entropy-axis", "cut", "true"))
    # rebuild the evaluation and the axis independently: k = 1 cut is AxisCut of the same direction
    ev = task.sample(20, seed=[2024, 1])
    base_err, base_kl = sequence_losses(restricted_log_probs(model, ev, task.hypothesis_ids), ev.posterior)
    assert next(r for r in rows if r.metric == "unedited_kl_bits").value == pytest.approx(float(base_kl.mean()),
                                                                                          rel=1e-9)
    fit = task.sample(30, seed=[2024, 0])
    x_all, tokens = every_position(model, fit, 0, "v")
    x_query = x_all.reshape(30, -1, 32)[:, fit.query_pos].reshape(-1, 32)
    axis = fit_subspaces(x_query, fit.posterior.double().reshape(-1, 6).numpy(), x_all, tokens,
                         task.hypothesis_ids)["entropy-axis"][0]
    with torch.no_grad(), intervene(model, {0: AxisCut(torch.from_numpy(axis).float())}):
        err, kl = sequence_losses(restricted_log_probs(model, ev, task.hypothesis_ids), ev.posterior)
    assert true_cut["cost_kl_bits"] == pytest.approx(float(kl.mean() - base_kl.mean()), abs=1e-6)
    assert true_cut["cost_mae_bits"] == pytest.approx(float(err.mean() - base_err.mean()), abs=1e-6)
    cut = next(r for r in rows if r.metric == "cut_kl_bits" and r.scope["subspace"] == "entropy-axis")
    assert cut.value == pytest.approx(true_cut["cost_kl_bits"]) and cut.scope == dict(layer=0, subspace="entropy-axis",
                                                                                      k=1, site="v")
    # every (subspace, op, metric) has a cost row with both control families
    costs = [r for r in rows if r.metric in ("cut_kl_bits", "cut_mae_bits", "only_kl_bits", "only_mae_bits")]
    assert len(costs) == 4 * 2 * 2 and all(r.low <= r.value <= r.high for r in costs)
    controls = [r for r in rows if r.metric.endswith("_controls")]
    assert len(controls) == 2 * len(costs) and all(r.n == 2 for r in controls)


def test_unknown_edit_is_refused(tmp_path):
    folder, task = saved(tmp_path, "bijection", "tiny", task_kwargs={"n_symbols": 6})
    with pytest.raises(ConfigError, match="shift"):
        subspace_rows(load_model(folder), task, ops=("shift",))
