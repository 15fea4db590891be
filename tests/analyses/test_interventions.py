"""Interventions on hook_v: equal to weight edits, exact identities, GQA group locality, controls, the runner, and
the fast runner equal to the naive one on every family and on SmolLM2."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import load_hf, value_edit
from interp_bayes.model.edits import AxisCut, AxisOnly, AxisShift, intervene
from interp_bayes.analyses.controls import isotropic_axes, matched_axes, pc_axes
from interp_bayes.analyses.interventions import (EditProtocol, readout_errors, readout_excess, run_interventions,
                                                 summarize)
from interp_bayes.core.results import find, select

TEXT = "in context learning with induction heads"


def unit(dim, seed):
    u = torch.randn(dim, generator=torch.Generator().manual_seed(seed))
    return u / u.norm()


def value_dim(bridge):
    return (bridge.cfg.n_key_value_heads or bridge.cfg.n_heads) * bridge.cfg.d_head


@torch.no_grad()
def test_cut_through_hook_equals_weight_edit_at_every_layer_set(tiny):
    bridge, _, folder = tiny
    ids = torch.tensor([bridge.tokenizer(TEXT)["input_ids"]])
    dim = value_dim(bridge)
    us = {0: unit(dim, 1), 1: unit(dim, 2)}
    with intervene(bridge, {layer: AxisCut(u) for layer, u in us.items()}):
        hooked = bridge(ids)
    edited = load_hf(folder, like=bridge)
    for layer, u in us.items():
        value_edit(edited, layer, torch.eye(dim) - torch.outer(u, u))
    torch.testing.assert_close(hooked, edited(ids).logits, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_identities_are_exact_and_hooks_are_removed(tiny):
    bridge, _, _ = tiny
    ids = torch.tensor([bridge.tokenizer(TEXT)["input_ids"]])
    base = bridge(ids)
    u = unit(value_dim(bridge), 3)
    for op in (AxisCut(u, scale=1.0), AxisShift(u, sigma=2.0, delta_sigma=0.0)):
        with intervene(bridge, {-1: op}):
            out = bridge(ids)
        assert torch.equal(out, base)  # v - 0*(v.u)u and v + 0*u are bit-exact
    with pytest.raises(RuntimeError, match="inside"):
        with intervene(bridge, {-1: AxisCut(u)}):
            raise RuntimeError("inside")
    assert all(len(hp.fwd_hooks) == 0 for hp in bridge.hook_dict.values())
    with intervene(bridge, {-1: AxisOnly(u)}):
        assert (bridge(ids) - base).abs().max() > 1e-3


@torch.no_grad()
def test_cut_on_one_kv_head_touches_only_its_query_group(tiny_dirs):
    from interp_bayes.model.loading import load_model

    bridge = load_model(tiny_dirs["llama3"])  # 4 query heads, 2 kv heads of 24: group g = query heads 2g, 2g+1
    ids = torch.tensor([bridge.tokenizer(TEXT)["input_ids"]])
    u = torch.zeros(2 * 24)
    u[24:] = unit(24, 4)  # confined to kv head 1
    name = "blocks.1.attn.hook_z"
    _, base = bridge.run_with_cache(ids, names_filter=name)
    with intervene(bridge, {1: AxisCut(u)}):
        _, cut = bridge.run_with_cache(ids, names_filter=name)
    z0, z1 = base[name], cut[name]
    assert torch.equal(z0[:, :, :2], z1[:, :, :2])  # query heads of kv head 0: untouched
    assert (z0[:, :, 2:] - z1[:, :, 2:]).abs().max() > 1e-4


def test_operators_keep_dtype_device_and_decompose():
    v = torch.randn(2, 5, 3, 4, dtype=torch.bfloat16)
    u = unit(12, 5)
    for op in (AxisCut(u), AxisOnly(u), AxisShift(u, 1.5)):
        out = op(v)
        assert out.dtype == v.dtype and out.shape == v.shape and out.device == v.device
    v64 = torch.randn(7, 12, dtype=torch.float64)
    torch.testing.assert_close(AxisCut(u)(v64) + AxisOnly(u)(v64), v64)
    assert torch.allclose(AxisCut(u)(v64) @ u.double(), torch.zeros(7, dtype=torch.float64), atol=1e-6)
    shifted = AxisShift(u, sigma=2.0, delta_sigma=-1.5)(v64)
    torch.testing.assert_close((shifted - v64) @ u.double(), torch.full((7,), -3.0, dtype=torch.float64), atol=1e-6,
                               rtol=0)


def test_control_axes_are_unit_orthogonal_reproducible_and_matched():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 30)) * np.linspace(3, 0.2, 30)  # a decaying spectrum
    x[:, 0] *= 2  # with a clear top direction
    u = np.zeros(30)
    u[3] = 1.0  # the 4th strongest coordinate: directions orthogonal to it can carry its variance
    iso = isotropic_axes(u, 5, layer=2, seed=1)
    np.testing.assert_allclose(np.linalg.norm(iso, axis=1), 1.0)
    np.testing.assert_allclose(iso @ u, 0.0, atol=1e-12)
    assert np.array_equal(iso, isotropic_axes(u, 5, layer=2, seed=1))
    assert not np.allclose(iso, isotropic_axes(u, 5, layer=3, seed=1))
    assert not np.allclose(iso, isotropic_axes(u, 5, layer=-1, seed=1))  # negative layers are fine seeds too
    matched, ratio = matched_axes(x, u, 6, layer=2, seed=1)
    np.testing.assert_allclose(ratio, 1.0, rtol=1e-6)
    np.testing.assert_allclose(matched @ u, 0.0, atol=1e-12)
    top, ratio_top = matched_axes(x, np.eye(30)[0], 3, layer=2, seed=1)  # the top direction cannot be matched
    assert np.all(ratio_top < 1.0) and np.all(ratio_top > 0.1)
    assert not np.allclose(top[0], top[1])  # but its draws stay distinct
    np.testing.assert_allclose(top @ np.eye(30)[0], 0.0, atol=1e-12)
    pcs = pc_axes(x, 4)
    assert pcs.shape == (3, 30) and np.allclose(np.linalg.norm(pcs, axis=1), 1.0)


def test_runner_rows_and_summary(tiny_dirs):
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.model.collect import collect
    from interp_bayes.model.loading import load_model
    from interp_bayes.tasks.icl import SULATask

    bridge = load_model(tiny_dirs["llama3"])
    task = SULATask.for_tokenizer(bridge.tokenizer, per_k=4)
    cols = task.generate("main", seed=0)
    labels = task.label_token_ids(bridge.tokenizer)
    fit_idx, eval_idx = list(range(0, 20, 2)), list(range(1, 20, 2))
    acts = collect(bridge, cols["text"], layers=(0, 1), label_tokens=labels, progress=False)
    with pytest.raises(ValueError, match="identical for every prompt"):  # layer 0 sees only the final token
        fit_entropy_axis(acts, 0)
    axes = {1: fit_entropy_axis(acts, 1, subset=fit_idx, folds=0)}
    fit_values = {1: acts.values(1)[fit_idx]}
    ev = {key: [cols[key][i] for i in eval_idx] for key in ("k", "latent", "bayes_entropy")}
    controls = {"isotropic": 2, "matched": 2, "pcs": 1}
    res = run_interventions(bridge, [cols["text"][i] for i in eval_idx], axes, fit_values, ev,
                            EditProtocol([[1]], controls=controls), label_tokens=labels, progress=False)
    # an unperturbed run with the true edits and the PCs, another with the one batch of random controls (cap 2)
    assert len(res.rows) == 4 * (1 + 2 + 2 + 1) and res.n_forward_prompts == (2 + 24) * 10
    table = res.table()
    assert set(table.kind) == {"true", "isotropic", "matched", "pcs"}
    assert (table.kl_bits >= -1e-9).all() and table.kl_bits.max() > 0
    cut_last = table[(table.layer_set == "1") & (table.op == "cut") & (table.kind == "true")].iloc[0]
    assert np.isnan(cut_last.geom_L1)  # v.u has no spread left after the cut: no correlation to speak of
    assert res.baseline["mae"] >= 0 and len(res.baseline["entropy"]) == 10
    assert "<table" in res._repr_html_() and len(res.figure().data) == 4  # one strip per axis kind
    cut_only = run_interventions(bridge, [cols["text"][i] for i in eval_idx], axes, fit_values, ev,
                                 EditProtocol([[1]], ["cut"], controls), label_tokens=labels, progress=False)
    # an edit's numbers do not depend on which other edits share its stacked forward
    pd.testing.assert_frame_equal(cut_only.table(), table[table.op == "cut"].reset_index(drop=True), check_exact=True)
    rows = summarize(res, ev, n_boot=50)
    baseline = select(rows, condition="baseline")
    assert {r.metric: r.value for r in baseline} == {m: v for m, v in res.baseline.items() if m != "entropy"}
    # 4 ops x 3 measures (no layer after layer 1: no downstream geometry), a true row and two per family each
    assert len(rows) - len(baseline) == 4 * 3 * (1 + 2 * 3)
    at = dict(layer_set="1", op="cut", measure="mae_k_ge_1")
    true, iso = find(rows, "effect", family="true", **at), find(rows, "effect", family="isotropic", **at)
    raw = table[(table.layer_set == "1") & (table.op == "cut")]
    assert true.value == raw[raw.kind == "true"].mae_k_ge_1.iloc[0] - res.baseline["mae_k_ge_1"]
    assert iso.value == pytest.approx((raw[raw.kind == "isotropic"].mae_k_ge_1 - res.baseline["mae_k_ge_1"]).mean())
    assert true.low <= true.high and true.interval == "bootstrap 95%" and true.null_low is None  # 2 matched draws
    assert iso.low is None and iso.n == 2 and "too few draws" in iso.note  # below MIN_DRAWS: no range
    assert 0 <= find(rows, "percentile_of_true", family="isotropic", **at).value <= 1


def test_axis_applied_at_another_layer_or_of_wrong_size_is_refused(tiny_dirs):
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.core.errors import InterventionError
    from interp_bayes.model.collect import collect
    from interp_bayes.model.edits import AxisCut, intervene
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["llama3"])
    acts = collect(model, ["the cat sat on the mat", "hello world 0 1 2 3", "the mat", "a b c d e f g",
                           "def f(x): return x + 1", "the cat sat"], layers=(1,), progress=False)
    axis = fit_entropy_axis(acts, layer=1, folds=0)
    with pytest.raises(InterventionError, match="fitted at layer 1 but would be applied at layer 0"):
        with intervene(model, {0: AxisCut(axis)}):
            pass
    with intervene(model, {0: AxisCut(axis)}, allow_layer_mismatch=True):
        pass
    with intervene(model, {-1: AxisCut(axis)}):  # -1 is layer 1 of 2
        pass
    with pytest.raises(InterventionError, match=r"has 7 numbers but blocks.1.attn.hook_v has 2 KV heads x 24 = 48"):
        with intervene(model, {1: AxisCut(torch.ones(7))}):
            pass


def _layer_module(hf, layer):
    return (hf.gpt_neox.layers if hf.config.model_type == "gpt_neox" else hf.model.layers)[layer]


@pytest.mark.parametrize("fam", ["llama3", "pythia"])
def test_subspace_edits_equal_weight_edits_at_every_site(tiny_dirs, fam):
    """v: the value projection pre-multiplied by I - P; z: the output projection post-multiplied by I - P;
    resid: a plain HF forward hook on the decoder layer's output. k = 1 equals AxisCut exactly."""
    from interp_bayes.model.edits import SubspaceCut, SubspaceOnly, site_dim
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs[fam])
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for site in ("v", "z", "resid"):
            dim = site_dim(model, site)
            basis = torch.randn(3, dim, generator=g)
            q = torch.linalg.qr(basis.double().T)[0].T.float()
            proj = torch.eye(dim) - q.T @ q
            with intervene(model, {1: SubspaceCut(basis)}, site=site):
                edited = model(ids)
            hf = load_hf(tiny_dirs[fam], like=model)
            if site == "v":
                value_edit(hf, 1, proj)
                ref = hf(ids).logits
            elif site == "z":
                dense = _layer_module(hf, 1).attention.dense if fam == "pythia" else _layer_module(hf, 1).self_attn.o_proj
                dense.weight.copy_(dense.weight @ proj)
                ref = hf(ids).logits
            else:
                def cut(module, args, out):
                    h = out[0] if isinstance(out, tuple) else out
                    h = h @ proj
                    return (h, *out[1:]) if isinstance(out, tuple) else h
                handle = _layer_module(hf, 1).register_forward_hook(cut)
                ref = hf(ids).logits
                handle.remove()
            torch.testing.assert_close(edited, ref, rtol=1e-4, atol=1e-4)
            v = torch.randn(2, 4, dim, generator=g)
            torch.testing.assert_close(SubspaceCut(basis)(v) + SubspaceOnly(basis)(v), v, rtol=1e-5, atol=1e-5)
        u = torch.randn(site_dim(model, "v"), generator=g)
        v = torch.randn(2, 5, *model.blocks[0].attn.W_V.shape[::2], generator=g)  # [b, p, n_kv, d_head]
        torch.testing.assert_close(SubspaceCut(u)(v), AxisCut(u)(v), rtol=1e-6, atol=1e-6)


def test_subspace_controls_are_orthogonal_reproducible_and_variance_matched():
    from interp_bayes.model.edits import orthonormal_rows
    from interp_bayes.analyses.controls import isotropic_subspaces, matched_subspaces

    rng = np.random.default_rng(0)
    values = rng.standard_normal((300, 24)) * np.linspace(3, 0.2, 24)  # decreasing variances
    basis = rng.standard_normal((2, 24))
    q = orthonormal_rows(basis, torch.float64).numpy()
    iso = isotropic_subspaces(basis, 5, layer=3, seed=1)
    assert iso.shape == (5, 2, 24)
    for frame in iso:
        np.testing.assert_allclose(frame @ frame.T, np.eye(2), atol=1e-10)
        assert np.abs(frame @ q.T).max() < 1e-10
    np.testing.assert_array_equal(iso, isotropic_subspaces(basis, 5, layer=3, seed=1))
    assert not np.allclose(iso, isotropic_subspaces(basis, 5, layer=4, seed=1))
    frames, ratio = matched_subspaces(values, basis, 6, layer=3, seed=1)
    np.testing.assert_allclose(ratio, 1.0, atol=1e-6)  # the basis is random, so matching is feasible
    for frame in frames:
        np.testing.assert_allclose(frame @ frame.T, np.eye(2), atol=1e-10)
        assert np.abs(frame @ q.T).max() < 1e-10
    top = np.eye(24)[:2]  # the strongest 2-frame: nothing orthogonal can match it
    _, ratio = matched_subspaces(values, top, 3, layer=0, seed=1)
    assert (ratio < 1).all()
    with pytest.raises(Exception, match="span fewer dimensions"):
        orthonormal_rows(np.vstack([basis[0], 2 * basis[0]]))


def _outcomes_close(fast, naive):
    """Per prompt: entropy, label log-probabilities, KL and the value readings at every layer, to 1e-5 relative."""
    assert len(fast) == len(naive)
    for a, b in zip(fast, naive):
        for x, y in [(a.entropy, b.entropy), (a.label_logprobs, b.label_logprobs), (a.kl, b.kl)] + \
                [(a.values[layer], b.values[layer]) for layer in b.values]:
            if y is not None:
                torch.testing.assert_close(x, y, rtol=1e-5, atol=0)


def _random_prompts(n_vocab=400, seed=0):
    """Token-id prompts of mixed lengths (several share one, one is alone, some pass Mistral's window of 16)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(2, n_vocab, size=n).tolist() for n in (3, 3, 3, 7, 7, 12, 20, 20, 20, 20, 33, 40, 40, 5)]


def test_fast_path_equals_naive_path(tiny):
    """Every edit of a first and a last layer (the replayed prefix, stacked edits and the last block cut to the
    final position) against a whole forward pass per edit: per prompt and in every row of the result."""
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.model.collect import collect
    from interp_bayes.model.edits import OPS, make_op, resolve_edits
    from interp_bayes.model.prefix import edited_runs

    bridge, _, _ = tiny
    prompts, labels = _random_prompts(), [5, 9]
    acts = collect(bridge, prompts, layers=(0, 1), label_tokens=labels, progress=False)
    axes = {layer: fit_entropy_axis(acts, layer, folds=0) for layer in (0, 1)}
    layer_sets = [[0], [1], [0, 1]]
    edits = [resolve_edits(bridge, {layer: make_op(op, axes[layer].direction, axes[layer].sigma) for layer in ls})
             for ls in layer_sets for op in OPS]
    _outcomes_close(*(edited_runs(bridge, prompts, edits, layers=[0, 1], label_tokens=labels, fast=fast)
                      for fast in (True, False)))

    rng = np.random.default_rng(1)
    task = dict(k=rng.integers(0, 3, len(prompts)).tolist(), latent=rng.integers(0, 2, len(prompts)).tolist(),
                bayes_entropy=rng.random(len(prompts)).tolist())
    protocol = EditProtocol(layer_sets, controls={"isotropic": 1, "matched": 1})
    runs = [run_interventions(bridge, prompts, axes, {layer: acts.values(layer) for layer in (0, 1)}, task, protocol,
                              label_tokens=labels, fast=fast, progress=False) for fast in (True, False)]
    fast, naive = (pd.DataFrame(r.rows) for r in runs)
    pd.testing.assert_frame_equal(fast, naive, rtol=1e-5, atol=0)
    assert runs[0].baseline == runs[1].baseline and runs[0].n_forward_prompts == runs[1].n_forward_prompts


@pytest.mark.slow
def test_fast_path_equals_naive_path_on_smollm2(smollm2):
    """SmolLM2's 30 layers: a middle layer, five layers to the last, and the last alone, on SULA prompts."""
    from interp_bayes.analyses.axis import fit_entropy_axis
    from interp_bayes.model.collect import collect
    from interp_bayes.model.edits import make_op, resolve_edits
    from interp_bayes.model.prefix import edited_runs
    from interp_bayes.tasks.icl import SULATask

    task = SULATask.for_tokenizer(smollm2.tokenizer, per_k=4)
    prompts, labels = task.generate("main", seed=0)["text"], task.label_token_ids(smollm2.tokenizer)
    layers = [10, 15, 20, 24, 29]
    acts = collect(smollm2, prompts, layers=layers, label_tokens=labels, progress=False)
    axes = {layer: fit_entropy_axis(acts, layer, folds=0) for layer in layers}
    rng = np.random.default_rng(0)
    edits = [resolve_edits(smollm2, {layer: make_op(op, axes[layer].direction if draw == 0 else
                                                    torch.tensor(rng.standard_normal(192)), axes[layer].sigma)
                                     for layer in ls})
             for ls in ([15], layers, [29]) for op in ("cut", "shift+") for draw in range(2)]
    _outcomes_close(*(edited_runs(smollm2, prompts, edits, layers=layers, label_tokens=labels, fast=fast)
                      for fast in (True, False)))


def test_control_families_are_one_registry():
    """Counts per family select the draws: the same directions as the family's own function; an unknown family
    is refused by name."""
    from interp_bayes.core.errors import InterventionError
    from interp_bayes.analyses.controls import CONTROL_FAMILIES, control_directions

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 12)) * np.linspace(2, 0.5, 12)
    u = np.eye(12)[4]
    drawn = control_directions(x, u, {"isotropic": 3, "matched": 2, "pcs": 0}, layer=3, seed=7)
    assert set(drawn) == {"isotropic", "matched"}
    np.testing.assert_array_equal(drawn["isotropic"][0], isotropic_axes(u, 3, layer=3, seed=7))
    np.testing.assert_array_equal(drawn["matched"][0], matched_axes(x, u, 2, layer=3, seed=7)[0])
    assert drawn["isotropic"][1] is None and drawn["matched"][1].shape == (2,)
    assert set(CONTROL_FAMILIES) == {"isotropic", "matched", "pcs"}
    with pytest.raises(InterventionError, match="Unknown control family random; choose from isotropic"):
        control_directions(x, u, {"random": 1}, layer=3, seed=7)


def test_edit_protocol_refuses_an_unknown_family_and_holds_its_edits_frozen():
    from interp_bayes.analyses.controls import FULL_CONTROLS
    from interp_bayes.core.errors import ConfigError
    from interp_bayes.model.edits import OPS

    with pytest.raises(ConfigError, match="Unknown control family random; families: isotropic, matched, pcs"):
        EditProtocol([[1]], controls={"random": 1, "isotropic": 2})
    sets = [[3, 5], [5]]
    protocol = EditProtocol(sets, ["cut"])
    sets[0].append(7)  # the caller's lists are copied
    assert protocol.layer_sets == ((3, 5), (5,)) and protocol.layers == [3, 5] and protocol.ops == ("cut",)
    assert protocol.controls == FULL_CONTROLS and protocol.controls is not FULL_CONTROLS
    assert EditProtocol([[1]]).ops == OPS


def test_control_draws_extend_from_any_start():
    """Draw i of a family is the same axis whatever batch it is drawn in: a larger cap extends a run."""
    from interp_bayes.analyses.controls import control_directions

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 12)) * np.linspace(2, 0.5, 12)
    u = np.eye(12)[4]
    whole = control_directions(x, u, {"isotropic": 7, "matched": 7, "pcs": 5}, layer=2, seed=3)
    later = control_directions(x, u, {"isotropic": 4, "matched": 4, "pcs": 3}, layer=2, seed=3, start=2)
    for fam in ("isotropic", "matched", "pcs"):
        np.testing.assert_array_equal(later[fam][0], whole[fam][0][2:6 if fam != "pcs" else 5])
    np.testing.assert_array_equal(later["matched"][1], whole["matched"][1][2:6])


@pytest.fixture(scope="module")
def planted(tiny_dirs):
    """A tiny Llama on 10 SULA prompts whose Bayes entropy is set to the model's own (so any edit's change in MAE is
    the mean |change in entropy| over k >= 1, never below 0), and two axes at layer 1: the values' top principal
    direction, whose cut moves the entropy far more than cutting a random direction, and a random direction, one
    among its controls."""
    from types import SimpleNamespace

    from interp_bayes.model.collect import collect
    from interp_bayes.model.loading import load_model
    from interp_bayes.tasks.icl import SULATask

    bridge = load_model(tiny_dirs["llama3"])
    task = SULATask.for_tokenizer(bridge.tokenizer, per_k=2)
    cols = task.generate("main", seed=0)
    labels = task.label_token_ids(bridge.tokenizer)
    acts = collect(bridge, cols["text"], layers=(1,), label_tokens=labels, progress=False)
    values = acts.values(1).double().numpy()
    pcs = np.linalg.svd(values - values.mean(0), full_matrices=False)[2]
    random = np.random.default_rng(5).standard_normal(pcs.shape[1])
    ev = dict(k=cols["k"], latent=cols["latent"], bayes_entropy=acts.entropy.double().numpy().tolist())

    def axes(direction):
        return {1: SimpleNamespace(direction=torch.tensor(direction / np.linalg.norm(direction)), sigma=1.0)}

    def run(direction, controls, batch):
        return run_interventions(bridge, cols["text"], axes(direction), {1: values}, ev,
                                 EditProtocol([[1]], ["cut"], controls, batch=batch), label_tokens=labels,
                                 progress=False)

    def readout(direction, controls, prompts=cols["text"], task=ev):
        return readout_errors(bridge, prompts, axes(direction), {1: values}, task,
                              EditProtocol([[1]], ["cut"], controls), (1,), label_tokens=labels, progress=False)
    return SimpleNamespace(run=run, readout=readout, top=pcs[0], values=values, random=random, task=ev,
                           n=len(cols["text"]), sula=task)


def test_a_clear_case_stops_long_before_its_cap_and_records_its_draws(planted):
    """The top direction's cut against isotropic controls: beyond every one of them, so the rank is settled as
    soon as the confidence sequence can exclude the level (242 draws with none as large at alpha 0.05, risk 1e-3:
    the fifth batch of 50), far below the cap of 1000; the rows carry the decision and the draws used."""
    from interp_bayes.stats.sequential import REJECT

    res = planted.run(planted.top, {"isotropic": 1000}, 50)
    test = res.tests[("1", "cut", "isotropic")]
    assert test["decision"] == REJECT and test["draws"] == 250 and test["p"] == pytest.approx(1 / 251)
    table = res.table()
    assert (table.kind == "isotropic").sum() == 250 and list(table.draw[table.kind == "isotropic"]) == list(range(250))
    assert res.n_forward_prompts == (2 + 5 + 250) * planted.n  # the true edit's run, then one per batch
    rows = summarize(res, planted.task, n_boot=20)
    pct = find(rows, "percentile_of_true", op="cut", measure="mae_k_ge_1", family="isotropic")
    assert pct.n == 250 and pct.test == test and pct.value == 1.0
    assert find(rows, "percentile_of_true", op="cut", measure="kl_bits", family="isotropic").test is None


def test_a_case_inside_its_controls_stops_as_accept_and_extends_the_fixed_count_run(planted):
    """A random direction's cut among isotropic ones, and a direction drawn like the matched ones among them:
    each rank is settled inside its controls after a few batches of 5 (accept), well before the cap of 40. The
    isotropic draws are, row for row, the first ones of a run that draws the whole cap in one batch (same seed: the
    same axes, the same numbers); the matched family of a cut runs to its cap all the same (the readout excess
    resamples its draws), with the same numbers as the one-batch run, and the readout claim holds on its excess."""
    from interp_bayes.kinds.interventions import READOUT_DELTA_BITS, readout_claim
    from interp_bayes.stats.ledger import BORDERLINE, HOLDS
    from interp_bayes.stats.sequential import ACCEPT

    # a direction drawn as the matched controls are (for another axis): of nine such draws the one whose cut moves
    # the MAE closest to their mean, so that it sits inside its controls on any CPU (the draws' basis comes from an
    # eigendecomposition of 10 prompts' covariance, whose near-equal eigenvalues make it differ between machines'
    # rounding: the first draw alone ranked 2nd of 41 on an AVX-512 Xeon)
    draws = matched_axes(planted.values, planted.random, 9, layer=1, seed=11)[0]
    effects = np.array([run.table().query("kind == 'true'").mae_k_ge_1.iloc[0]
                        for run in (planted.run(d, {}, 5) for d in draws)])
    like = draws[int(np.abs(effects - effects.mean()).argmin())]
    for u, fam in ((planted.random, "isotropic"), (like, "matched")):
        res = planted.run(u, {fam: 40}, 5)
        test = res.tests[("1", "cut", fam)]
        assert test["decision"] == ACCEPT and test["draws"] < 40, test
        fixed = planted.run(u, {fam: 40}, 40)  # one batch: every draw
        assert fixed.tests[("1", "cut", fam)]["draws"] == 40
        seq, whole = res.table(), fixed.table()
        if fam == "isotropic":
            assert res.n_forward_prompts < fixed.n_forward_prompts
            pd.testing.assert_frame_equal(seq, whole.head(1 + test["draws"]), check_exact=True)
        else:
            pd.testing.assert_frame_equal(seq, whole, check_exact=True)
            assert res.matched_errors[("1", "cut")].shape == (40, int((np.asarray(planted.task["k"]) >= 1).sum()))
            np.testing.assert_array_equal(res.matched_errors[("1", "cut")], fixed.matched_errors[("1", "cut")])
    rows = summarize(res, planted.task, n_boot=20, readout_delta=READOUT_DELTA_BITS)
    true = find(rows, "effect", op="cut", measure="mae_k_ge_1", family="true")
    pct = find(rows, "percentile_of_true", op="cut", measure="mae_k_ge_1", family="matched")
    excess = find(rows, "readout_excess", op="cut", measure="mae_k_ge_1", family="matched")
    # the rank test's decision stays the one at its stop; the rows' range reads all 40 draws
    assert pct.test == test and test["draws"] < pct.n == 40 and true.test is None
    assert excess.n == int((np.asarray(planted.task["k"]) >= 1).sum())
    # a draw like the controls: its excess over them is near 0, decided below delta or, on 8 prompts, not yet
    # (whether it is decided turns on the machine's rounding; the decision's error rates: tests/analyses/test_readout.py)
    assert excess.low < 0 < excess.high and excess.high < READOUT_DELTA_BITS
    decided = excess.test["decision"] == "reject"
    assert readout_claim(rows).verdict == (HOLDS if decided else BORDERLINE)
    assert "excess" in readout_claim(rows).evidence
    # rows written before the readout excess existed ask for a rerun instead of a verdict
    old = [r for r in rows if r.metric != "readout_excess"]
    assert readout_claim(old).verdict == "not testable here" and "rerun" in readout_claim(old).evidence


def test_prompts_beside_the_evaluation_set_are_cut_along_the_same_axes_and_pool_into_the_readout_row_only(planted):
    """``readout_errors`` cuts the true axis and the matched axes ``run_interventions`` draws (same seed, same
    draws): on the evaluation prompts themselves it gives their per-prompt errors to the bit, from the unperturbed
    run and 1 + m cuts. Pooled by ``summarize`` (here other SULA prompts, all k >= 1), they change the readout excess
    alone: the excess of the concatenated errors, over their prompts, every other row as it was."""
    from interp_bayes.kinds.interventions import READOUT_DELTA_BITS

    like = matched_axes(planted.values, planted.random, 1, layer=1, seed=11)[0][0]
    res = planted.run(like, {"matched": 10}, 5)
    same = planted.readout(like, {"matched": 10})
    pos = np.flatnonzero(np.asarray(planted.task["k"]) >= 1)
    bayes = np.asarray(planted.task["bayes_entropy"])[pos]
    np.testing.assert_array_equal(same.matched, res.matched_errors[("1", "cut")])
    np.testing.assert_array_equal(same.true, np.abs(res.true_entropy[("1", "cut")][pos] - bayes))
    assert same.n_forward_prompts == (2 + 10) * planted.n

    cols = dataclasses.replace(planted.sula, ks=(1, 2), per_k=3).generate("main", seed=1)
    more = planted.readout(like, {"matched": 10}, cols["text"], cols)
    assert more.true.shape == (6,) and more.matched.shape == (10, 6) and more.n_forward_prompts == 12 * 6
    alone = summarize(res, planted.task, n_boot=20, readout_delta=READOUT_DELTA_BITS)
    pooled = summarize(res, planted.task, n_boot=20, readout_delta=READOUT_DELTA_BITS, more={("1", "cut"): more})
    assert [repr(r) for r in alone if r.metric != "readout_excess"] == \
        [repr(r) for r in pooled if r.metric != "readout_excess"]
    excess = find(pooled, "readout_excess", op="cut", measure="mae_k_ge_1", family="matched")
    reference = readout_excess(np.r_[same.true, more.true], np.c_[same.matched, more.matched],
                               delta=READOUT_DELTA_BITS, beside=6, scope=excess.scope)
    assert repr(excess) == repr(reference) and excess.n == len(pos) + 6 and "6 drawn beside them" in excess.note
    # SULA's evaluation prompts carry groups, one per prompt (their labels any): the same row; the prompts beside
    # them units of their own beside grouped ones
    labelled = summarize(res, dict(planted.task, groups=np.arange(planted.n) * 3 + 7), n_boot=20,
                         readout_delta=READOUT_DELTA_BITS, more={("1", "cut"): more})
    assert repr(find(labelled, "readout_excess")) == repr(excess)
    pairs = np.arange(planted.n) // 2
    grouped = summarize(res, dict(planted.task, groups=pairs), n_boot=20, readout_delta=READOUT_DELTA_BITS,
                        more={("1", "cut"): more})
    units = np.r_[np.unique(pairs[pos], return_inverse=True)[1], 100 + np.arange(6)]
    assert repr(find(grouped, "readout_excess")) == repr(readout_excess(
        np.r_[same.true, more.true], np.c_[same.matched, more.matched], units, delta=READOUT_DELTA_BITS, beside=6,
        scope=excess.scope))
