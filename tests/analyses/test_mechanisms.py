"""Mechanism against mechanism: the value axis's residual image equals the attention output's response to a value
shift (every family, GQA included); the null-space overlap separates a planted direction; the final-norm readings
equal the cached scale and collect's entropy; the comparison's neuron ablation equals the ablation runner's."""

import numpy as np
import pytest
import torch

from interp_bayes.analyses.axis import EntropyAxis
from interp_bayes.model.edits import AxisShift, intervene
from interp_bayes.analyses.mechanisms import (axis_null_overlap, compare_mechanisms, scale_entropy,
    value_axis_in_residual)
from interp_bayes.analyses.neurons import ablation_effects, final_norm_run
from interp_bayes.analyses.unembedding import unembedding_null_space

TEXTS = ["the cat sat on the mat", "in context learning with induction heads", "hello world 0 1 2 3",
         "The capital of France is Paris.", "a b c d e f g h", "happy: dax, sad: lug. calm:"]


def value_dim(model):
    return (model.cfg.n_key_value_heads or model.cfg.n_heads) * model.cfg.d_head


@torch.no_grad()
def test_residual_image_equals_the_attention_output_shift(tiny, family):
    model, _, _ = tiny
    u = torch.randn(value_dim(model), generator=torch.Generator().manual_seed(0))
    u = u / u.norm()
    ids = torch.tensor([model.tokenizer(TEXTS[1])["input_ids"]])
    name = "blocks.1.hook_attn_out"
    _, base = model.run_with_cache(ids, names_filter=name)
    with intervene(model, {1: AxisShift(u, sigma=1.0)}):
        _, shifted = model.run_with_cache(ids, names_filter=name)
    delta = (shifted[name] - base[name])[0].double().numpy()  # [pos, d_model]: the same at every position
    r = value_axis_in_residual(model, u, 1)
    np.testing.assert_allclose(delta, np.broadcast_to(r, delta.shape), atol=2e-5)


def test_null_overlap_ranks_a_direction_built_to_land_in_the_null_space(tiny_dirs):
    from scipy.linalg import eigh

    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["llama3"])
    null = unembedding_null_space(model)
    dim = value_dim(model)
    m = np.stack([value_axis_in_residual(model, e, 1) for e in np.eye(dim)])  # [dim, d_model]: the linear map
    proj = null.basis @ null.basis.T
    vals, vecs = eigh(m @ proj @ m.T, m @ m.T)  # rho(u)^2 = u'M P M'u / u'M M'u, maximised and minimised
    best, worst = axis_null_overlap(model, vecs[:, -1], 1, null=null, n_random=1000), \
        axis_null_overlap(model, vecs[:, 0], 1, null=null, n_random=1000)
    assert best["rho"] == pytest.approx(np.sqrt(vals[-1]), rel=1e-6) and best["percentile"] == 1.0
    # the extremes of rho settle outside the random directions before the cap, and record the draws used
    assert best["test"]["decision"] == worst["test"]["decision"] == "reject"
    assert best["n_random"] == best["test"]["draws"] < 1000
    assert worst["rho"] < best["random_range"][0] and worst["percentile"] == 0.0
    assert best["random_range"][0] < best["random_mean"] < best["random_range"][1]


def test_final_norm_readings_equal_the_cache_and_collect(tiny_dirs):
    from interp_bayes.model.collect import collect
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["pythia"])
    labels = model.tokenizer(" dax lug")["input_ids"][-2:]
    clean = final_norm_run(model, TEXTS, label_tokens=labels)
    final = final_norm_run(model, TEXTS, label_tokens=labels, final_only=True)  # unembeds the last position alone
    for key in ("final_entropy", "final_scale", "label_entropy", "means"):
        np.testing.assert_allclose(final[key], clean[key], rtol=1e-5, atol=1e-6)
    acts = collect(model, TEXTS, readings=(), progress=False)
    np.testing.assert_allclose(clean["final_entropy"], acts.entropy.double().numpy(), atol=1e-4)
    label_acts = collect(model, TEXTS, readings=(), label_tokens=labels, progress=False)
    np.testing.assert_allclose(clean["label_entropy"], label_acts.entropy.double().numpy(), atol=1e-5)
    for i, ids in enumerate(clean["token_ids"]):
        _, cache = model.run_with_cache(torch.tensor([ids]), names_filter="ln_final.hook_scale")
        assert clean["final_scale"][i] == pytest.approx(float(cache["ln_final.hook_scale"][0, -1, 0]), rel=1e-6)
    k = np.array([1, 1, 2, 2, 3, 3])
    bayes = np.array([1.0, 0.9, 0.5, 0.6, 0.2, 0.1])  # a further target, as a wind tunnel's exact entropy
    out = scale_entropy(model, TEXTS, label_tokens=labels, covariates=np.column_stack([k, list(map(len, clean["token_ids"]))]),
                        strata=k, n_perm=50, clean=clean, targets=dict(bayes_entropy=bayes))
    assert out["entropy"]["raw"]["pearson"] == pytest.approx(np.corrcoef(clean["final_scale"],
                                                                         clean["final_entropy"])[0, 1])
    assert out["bayes_entropy"]["raw"]["pearson"] == pytest.approx(np.corrcoef(clean["final_scale"], bayes)[0, 1])
    dec = out["label_entropy"]["deconfounded"]
    assert set(dec.values) == {"raw", "partial", "within"} and dec.n == out["n"] == len(TEXTS)


def test_comparison_neuron_ablation_equals_the_ablation_runner(tiny_dirs):
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["mistral"])
    labels = model.tokenizer(" dax lug")["input_ids"][-2:]
    axis = EntropyAxis(direction=torch.nn.functional.normalize(torch.randn(value_dim(model)), dim=0), layer=1,
                       method="pc1", sigma=1.0, in_sample={}, held_out=None)
    task = dict(k=[1, 1, 2, 2, 4, 4], latent=[0, 1, 0, 1, 0, 1], bayes_entropy=[0.47, 0.47, 0.2, 0.9, 0.1, 0.3])
    out = compare_mechanisms(model, TEXTS, neurons=[5], axis=axis, task=task, label_tokens=labels, n_controls=3,
                             progress=False)
    true = next(e for e in out.edits if e["mechanism"] == "entropy_neurons" and e["kind"] == "true")
    effects = ablation_effects(model, TEXTS, [5], progress=False).per_neuron[5]
    assert true["d_full_entropy"] == pytest.approx(effects["total_final"].mean(), abs=1e-5)
    assert {s["mechanism"] for s in out.summary} == {"entropy_neurons", "axis_cut"}
    assert {s["metric"] for s in out.summary} >= {"d_entropy", "kl_bits", "d_mae_k_ge_1", "d_corr_bayes"}
    assert len([e for e in out.edits if e["kind"] == "control"]) == 6 and len(out.rows()) == len(out.summary)
