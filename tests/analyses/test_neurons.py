"""Entropy neurons: the null space and scores against explicit SVDs and cosines (the whole vocabulary, and a readout
of a few tokens as a wind tunnel's), hooked total / direct / mediated effects against closed forms from cached
activations (every family, float64: total = direct + mediated to 1e-6; entropy over label tokens too), a planted
null-space neuron ranked first, and a planted token-frequency neuron found."""

import math

import numpy as np
import pytest
import torch

from interp_bayes.analyses.neurons import AblationProtocol, ablation_effects, entropy_neurons, final_norm_run
from interp_bayes.analyses.unembedding import frequency_neurons, neuron_scores, unembedding_null_space

TEXTS = ["the cat sat on the mat", "in context learning with induction heads", "hello world 0 1 2 3",
         "The capital of France is Paris.", "a b c d e f g h"]
LABELS = [5, 17, 30, 111]  # a readout of a few tokens, as a wind tunnel's hypotheses


def load64(folder):
    from interp_bayes.model.loading import load_model

    return load_model(folder, dtype=torch.float64)


@pytest.fixture(scope="module")
def tiny64(tiny_dirs):
    """family -> a float64 bridge, loaded once per module (for the tests that do not edit weights)."""
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = load64(tiny_dirs[family])
        return cache[family]
    return get


def explicit_unembedding(model) -> np.ndarray:
    """U = P diag(g) W_U C written out in full from the HF modules (the reference for the chunked Gram route)."""
    hf = model.original_model
    w_u = hf.get_output_embeddings().weight.detach().double().numpy().T  # [d, vocab]
    norm = model.ln_final.original_component
    u = norm.weight.detach().double().numpy()[:, None] * (w_u - w_u.mean(1, keepdims=True))
    return u - u.mean(0, keepdims=True) if isinstance(norm, torch.nn.LayerNorm) else u


def reference_null_basis(u: np.ndarray, k: int, centred: bool) -> np.ndarray:
    left, s, _ = np.linalg.svd(u, full_matrices=False)
    if centred:  # LayerNorm: the all-ones direction is an exact zero the norm never sees; drop it
        ones = np.ones(len(u)) / math.sqrt(len(u))
        drop = int(np.argmax(np.abs(left.T @ ones)))
        assert s[drop] < 1e-8 * s[0]
        left = np.delete(left, drop, axis=1)
    return left[:, -k:]


def test_null_space_and_scores_match_explicit_references(tiny64, family):
    model = tiny64(family)
    null = unembedding_null_space(model)
    assert null.k == 10 and null.exact_kernel == 0
    u = explicit_unembedding(model)
    ref = reference_null_basis(u, null.k, null.centred)
    np.testing.assert_allclose(null.basis @ null.basis.T, ref @ ref.T, atol=1e-8)  # the same subspace
    scores = neuron_scores(model, -1, null)
    w = model.blocks[-1].mlp.W_out.detach().double().numpy()
    w = w - w.mean(1, keepdims=True) if null.centred else w
    np.testing.assert_allclose(scores["norm"], np.linalg.norm(w, axis=1), rtol=1e-12)
    np.testing.assert_allclose(scores["rho"], np.linalg.norm(w @ ref, axis=1) / np.linalg.norm(w, axis=1), atol=1e-8)
    assert scores["write"] == "W_out"
    cos = (w @ u) / np.linalg.norm(w, axis=1, keepdims=True) / np.linalg.norm(u, axis=0, keepdims=True)
    np.testing.assert_allclose(scores["logit_var"], cos.var(axis=1), rtol=1e-8)


def test_null_space_of_a_token_readout_is_the_kernel_of_their_columns(tiny64, family):
    model = tiny64(family)
    tokens = list(range(40, 60))  # 20 tokens, fewer than d_model = 64: an exact kernel, as in the bijection tunnel
    null = unembedding_null_space(model, tokens=tokens)
    norm = model.ln_final.original_component
    w_u = model.original_model.get_output_embeddings().weight.detach().double().numpy().T[:, tokens]  # [d, 20]
    u = norm.weight.detach().double().numpy()[:, None] * (w_u - w_u.mean(1, keepdims=True))  # centred over them
    u = u - u.mean(0, keepdims=True) if null.centred else u
    rank = np.linalg.matrix_rank(u)
    assert rank == len(tokens) - 1  # the centring over the tokens removes one direction
    assert null.exact_kernel == null.k == len(null.singular_values) - rank  # the whole kernel, nothing else
    assert null.chance == math.sqrt(null.k / (63 if null.centred else 64))
    np.testing.assert_allclose(u.T @ null.basis, 0, atol=1e-8)  # invisible to the readout's logits
    np.testing.assert_allclose(null.basis.T @ null.basis, np.eye(null.k), atol=1e-10)
    assert unembedding_null_space(model).exact_kernel == 0  # the whole vocabulary (420 tokens) has none


def closed_form_logits(model, x: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Logits from a final residual x [pos, d], with the norm scale recomputed (None) or the given one [pos]."""
    norm = model.ln_final.original_component
    xc = x - x.mean(-1, keepdims=True) if isinstance(norm, torch.nn.LayerNorm) else x
    eps = getattr(norm, "eps", None) or getattr(norm, "variance_epsilon")
    s = np.sqrt((xc**2).mean(-1) + eps) if scale is None else scale
    y = xc / s[:, None] * norm.weight.detach().double().numpy()
    if getattr(norm, "bias", None) is not None:
        y = y + norm.bias.detach().double().numpy()
    return y @ model.W_U.detach().double().numpy() + model.b_U.detach().double().numpy()


def entropy_and_loss(logits: np.ndarray, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    h = -(np.exp(logp) * logp).sum(-1) / math.log(2)
    return h, -logp[np.arange(len(ids) - 1), ids[1:]] / math.log(2)


def label_entropy(logits: np.ndarray) -> float:
    """Entropy (bits) of the final position's distribution renormalised over LABELS."""
    z = logits[-1, LABELS] - logits[-1, LABELS].max()
    p = np.exp(z) / np.exp(z).sum()
    return float(-(p * np.log2(p)).sum())


def test_hooked_effects_equal_closed_forms_and_decompose_exactly(tiny64, family):
    model = tiny64(family)
    neurons = [3, 50, 101]
    clean = final_norm_run(model, TEXTS, label_tokens=LABELS)
    ablations = ablation_effects(model, TEXTS, neurons, clean=clean, label_tokens=LABELS, progress=False)
    assert ablations.path == "head"  # the last layer: only the head reruns, checked against a full pass
    effects = ablations.per_neuron
    w_out = model.blocks[-1].mlp.W_out.detach().double().numpy()
    # only what is read is cached: an unfiltered cache hooks the attention's inner points, which sends it down the
    # bridge's own path (float32 softmax even in a float64 model), while the runs above took HF's (native.py)
    kept = ("blocks.1.mlp.hook_post", "ln_final.hook_in", "ln_final.hook_scale")
    caches = [model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n in kept)[1]
              for ids in clean["token_ids"]]
    post = np.concatenate([c["blocks.1.mlp.hook_post"][0].double().numpy() for c in caches])
    np.testing.assert_allclose(clean["means"], post.mean(0), rtol=1e-10)  # mean over every position
    for i, (ids, cache) in enumerate(zip(clean["token_ids"], caches)):
        x = cache["ln_final.hook_in"][0].double().numpy()
        s = cache["ln_final.hook_scale"][0, :, 0].double().numpy()
        a = cache["blocks.1.mlp.hook_post"][0].double().numpy()
        logits0 = closed_form_logits(model, x, None)
        h0, l0 = entropy_and_loss(logits0, ids)
        np.testing.assert_allclose(clean["entropy"][i], h0, atol=1e-9)
        assert clean["label_entropy"][i] == pytest.approx(label_entropy(logits0), abs=1e-9)
        for j in neurons:
            xj = x + (clean["means"][j] - a[:, j])[:, None] * w_out[j]
            logits_tot, logits_dir = closed_form_logits(model, xj, None), closed_form_logits(model, xj, s)
            h_tot, l_tot = entropy_and_loss(logits_tot, ids)
            h_dir, l_dir = entropy_and_loss(logits_dir, ids)
            e = effects[j]
            assert e["total_label"][i] == pytest.approx(label_entropy(logits_tot) - label_entropy(logits0), abs=1e-9)
            assert e["direct_label"][i] == pytest.approx(label_entropy(logits_dir) - label_entropy(logits0), abs=1e-9)
            assert e["total_entropy"][i] == pytest.approx((h_tot - h0).sum(), abs=1e-9)
            assert e["direct_entropy"][i] == pytest.approx((h_dir - h0).sum(), abs=1e-9)
            assert e["total_loss"][i] == pytest.approx((l_tot - l0).sum(), abs=1e-9)
            assert e["direct_loss"][i] == pytest.approx((l_dir - l0).sum(), abs=1e-9)
            assert e["total_abs_loss"][i] == pytest.approx(np.abs(l_tot - l0).sum(), abs=1e-9)
            assert e["direct_abs_loss"][i] == pytest.approx(np.abs(l_dir - l0).sum(), abs=1e-9)
            # the mediated effect, computed on its own: the ablated residual with the scale it really gets vs the
            # clean scale; total = direct + mediated
            mediated = (h_tot - h_dir).sum()
            assert abs(e["total_entropy"][i] - (e["direct_entropy"][i] + mediated)) < 1e-6
            assert abs(e["total_final"][i] - e["direct_final"][i] - (h_tot - h_dir)[-1]) < 1e-6


def test_an_ablation_that_changes_nothing_has_exactly_zero_effect(tiny_dirs):
    model = load64(tiny_dirs["llama3"])  # RMSNorm: the native path, where a frozen scale forces a recomputation
    with torch.no_grad():  # a dead neuron: its input weights zero, so its activation is its mean everywhere
        mlp = model.blocks[-1].mlp
        for name in ("gate", "in"):
            getattr(mlp, name).original_component.weight[7] = 0.0
    effects = ablation_effects(model, TEXTS, [7], progress=False).per_neuron
    for key, v in effects[7].items():
        assert np.all(v == 0.0), key


@pytest.mark.parametrize("fam", ["llama3", "pythia"])
def test_the_head_shortcut_is_its_former_expression_bit_for_bit(tiny_dirs, fam):
    """``_AffineHead.logits`` builds its sums in place: in float32 the same bits as the expressions it replaced,
    z0 + G(dx) / s0 (direct) and r z0 + (1 - r) beta + G(dx) / s (total), and its cached neuron image is untouched;
    ``_batch_stats`` takes the log-softmax over the logits' own buffer, with the same bits as before."""
    from interp_bayes.analyses.neurons import _AffineHead, _head, _scale_of
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs[fam])  # float32, the sweep's arithmetic
    clean = final_norm_run(model, TEXTS, keep_head_inputs=True)
    resid, act, _ = clean["head_inputs"][0]
    frozen = clean["scale_tensors"][0]
    w_out = model.blocks[-1].mlp.W_out.detach()
    with torch.no_grad():
        head = _AffineHead(model, w_out, None)
        z0 = _head(model, resid, lambda t, hook: t.clone())
        for j in (3, 50):
            c = torch.tensor(clean["means"][j], dtype=act.dtype) - act[..., j]
            image = head.g_neuron(j).clone()
            gdx = c[..., None].to(z0.dtype) * image
            s = _scale_of(model, resid + c[..., None] * w_out[j])
            r = frozen / s
            assert torch.equal(head.logits(j, c, resid, z0, frozen, freeze_scale=True), z0 + gdx / frozen)
            assert torch.equal(head.logits(j, c, resid, z0, frozen, freeze_scale=False),
                               r * z0 + (1 - r) * head.beta + gdx / s)
            assert torch.equal(head.g_neuron(j), image)
    # the statistics of an ablation's logits, computed over their buffer, against the former out-of-place ones
    from interp_bayes.analyses.neurons import _batch_stats
    from interp_bayes.stats.info import LN2

    ids = torch.tensor([clean["token_ids"][i] for i in clean["batches"][0]])
    logits = head.logits(3, c, resid, z0, frozen, freeze_scale=False)
    logp = torch.log_softmax(logits, dim=-1)
    got = _batch_stats(logits.clone(), ids, LABELS)
    assert torch.equal(got["entropy"], -(logp.exp() * logp).sum(-1) / LN2)
    assert torch.equal(got["loss"], -logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0] / LN2)
    assert torch.equal(got["label_logprobs"], torch.log_softmax(logp[:, -1, LABELS], dim=-1))


def set_w_out(model, layer: int, neuron: int, vec: torch.Tensor) -> None:
    """Write ``vec`` as the output weight of one neuron, in the module's own layout (Linear or GPT-2 Conv1D)."""
    out = model.blocks[layer].mlp.out.original_component
    with torch.no_grad():
        if isinstance(out, torch.nn.Linear):
            out.weight[:, neuron] = vec
        else:
            out.weight[neuron] = vec
    torch.testing.assert_close(model.blocks[layer].mlp.W_out[neuron], vec.to(model.blocks[layer].mlp.W_out.dtype))


def test_planted_null_space_neuron_is_ranked_first(tiny_dirs, family):
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs[family])
    u = explicit_unembedding(model)
    centred = not model.ln_final.uses_rms_norm
    v = reference_null_basis(u, 1, centred)[:, 0]  # the weakest logit direction (centred for LayerNorm)
    top = np.linalg.svd(u, full_matrices=False)[0][:, 0]  # the strongest
    with torch.no_grad():  # make v an exact null direction: remove (g * v) from every token's unembedding row
        lm_head = model.original_model.get_output_embeddings().weight  # [vocab, d]
        a = torch.tensor(model.ln_final.original_component.weight.detach().double().numpy() * v, dtype=lm_head.dtype)
        lm_head -= (lm_head @ a)[:, None] * a[None, :] / (a @ a)
    size = 3 * float(model.blocks[-1].mlp.W_out.detach().norm(dim=1).max())
    set_w_out(model, -1, 40, torch.tensor(v * size, dtype=torch.float32))
    set_w_out(model, -1, 90, torch.tensor(top * size * 1.5, dtype=torch.float32))  # larger, but seen by the logits
    report = entropy_neurons(model, TEXTS, AblationProtocol(top_n=3, n_random=3, n_boot=100), progress=False)
    assert report.ablation_path == "head"
    first = report.candidates[0]
    assert first["neuron"] == 40 and first["rho"] > 0.999 and first["percentile"]["null_norm"] == 1.0
    assert neuron_scores(model)["rho"][90] < 0.1  # the bigger decoy writes where the logits see it
    effects = first["effects"]  # no direct path to the logits: it acts through the norm alone
    assert abs(effects["direct_entropy"]) < 1e-4 < abs(effects["total_entropy"])
    assert effects["mediated_fraction_entropy"] > 0.99
    rows = report.rows()
    assert any(r.metric == "ablation_mediated_entropy" and r.scope["rank"] == 1 for r in rows)


def test_frequency_neuron_planted_along_the_frequency_direction_is_found(tiny_dirs):
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["pythia"])
    rng = np.random.default_rng(0)
    counts = np.floor(rng.pareto(1.2, size=model.cfg.d_vocab) * 5)
    seen = counts >= 1
    u = explicit_unembedding(model)[:, seen]
    logf = np.log(counts[seen] / counts.sum())
    direction = np.linalg.lstsq(u.T, logf - logf.mean(), rcond=None)[0]
    direction -= direction.mean()  # the LayerNorm centring would remove the rest anyway
    size = float(model.blocks[-1].mlp.W_out.detach().norm(dim=1).mean())
    set_w_out(model, -1, 17, torch.tensor(direction / np.linalg.norm(direction) * size, dtype=torch.float32))
    out = frequency_neurons(model, counts, top_n=3, n_random=100)
    assert out["top"][0]["neuron"] == 17
    assert out["top"][0]["r"] == pytest.approx(out["ceiling_r"], abs=1e-6)
    assert out["top"][0]["r"] > out["null_range"][1]


def test_bad_input_raises_one_sentence_errors(tiny_dirs):
    from interp_bayes.core.errors import PromptError
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["gpt2"])
    with pytest.raises(PromptError, match="more than the model's context"):
        final_norm_run(model, [[5] * 300])
    with pytest.raises(ValueError, match="out of range"):
        neuron_scores(model, layer=5)


@pytest.mark.parametrize("fam", ["gpt2", "pythia"])
def test_full_pass_ablation_of_an_earlier_layer_equals_a_weight_edit(tiny_dirs, tiny64, fam):
    """Layer 0 of 2: the ablation changes what layer 1 computes, so whole hooked passes run. Reference: a copy whose
    MLP output weights drop the neuron and whose bias adds mean * w_out (the same function, edited in the weights),
    read through the closed-form head with the real scale (total) or the clean scale (direct)."""
    model, edited = tiny64(fam), load64(tiny_dirs[fam])
    j = 11
    clean = final_norm_run(model, TEXTS, layer=0)
    ablations = ablation_effects(model, TEXTS, [j], layer=0, clean=clean, progress=False)
    assert ablations.path == "full"
    effects = ablations.per_neuron[j]
    out = edited.blocks[0].mlp.out.original_component
    with torch.no_grad():
        w = edited.blocks[0].mlp.W_out[j].detach().clone()
        if isinstance(out, torch.nn.Linear):
            out.weight[:, j] = 0.0
        else:
            out.weight[j] = 0.0
        out.bias += clean["means"][j] * w
    for i, ids in enumerate(clean["token_ids"]):
        _, cache = edited.run_with_cache(torch.tensor([ids]), names_filter="ln_final.hook_in")
        x = cache["ln_final.hook_in"][0].double().numpy()
        clean_cache = model.run_with_cache(torch.tensor([ids]), names_filter="ln_final.hook_in")[1]
        h0, l0 = entropy_and_loss(closed_form_logits(model, clean_cache["ln_final.hook_in"][0].double().numpy(), None),
                                  ids)
        h_tot, l_tot = entropy_and_loss(closed_form_logits(model, x, None), ids)
        h_dir, _ = entropy_and_loss(closed_form_logits(model, x, clean["scale"][i]), ids)
        assert effects["total_entropy"][i] == pytest.approx((h_tot - h0).sum(), abs=1e-9)
        assert effects["total_loss"][i] == pytest.approx((l_tot - l0).sum(), abs=1e-9)
        assert effects["direct_entropy"][i] == pytest.approx((h_dir - h0).sum(), abs=1e-9)


def test_candidates_are_ranked_by_the_authors_norm_ratio(tiny_dirs):
    """The authors' selection (``get_potential_entropy_neurons_udark`` in bpwu1/confidence-regulation-neurons'
    utils.py): left-singular vectors of the processed W_U, the bottom k as V0, |V0^T w| / |w| per neuron, sorted
    descending, the top n, no threshold on the norm. Planted: a small neuron 95% (of its norm) in the null space
    and one four times bigger, 60% in it; the ratio ranks the small one first, |V0^T w| the big one."""
    from interp_bayes.model.loading import load_model

    model = load_model(tiny_dirs["llama3"])
    left = np.linalg.svd(explicit_unembedding(model), full_matrices=False)[0]  # RMSNorm: nothing to centre
    v0, top = left[:, -10:], left[:, 0]
    size = float(model.blocks[-1].mlp.W_out.detach().norm(dim=1).max())
    set_w_out(model, -1, 21, torch.tensor((0.95 * v0[:, 0] + math.sqrt(1 - 0.95**2) * top) * size, dtype=torch.float32))
    set_w_out(model, -1, 22, torch.tensor((0.6 * v0[:, 1] + 0.8 * top) * 4 * size, dtype=torch.float32))
    w = model.blocks[-1].mlp.W_out.detach().double().numpy()
    ratio = np.linalg.norm(w @ v0, axis=1) / np.linalg.norm(w, axis=1)  # the authors' norm_fraction_on_U_entropy
    report = entropy_neurons(model, TEXTS, AblationProtocol(top_n=3, n_random=2, n_boot=50), progress=False)
    assert [c["neuron"] for c in report.candidates] == np.argsort(-ratio)[:3].tolist()
    assert report.candidates[0]["neuron"] == 21 and report.candidates[0]["rho"] == pytest.approx(0.95, abs=1e-6)
    big = np.linalg.norm(w @ v0, axis=1)
    assert big.argmax() == 22  # what the old ranking (|V0^T w|) put first
    assert report.null_space["chance_rho"] == pytest.approx(math.sqrt(10 / 64))


def test_rows_report_each_candidate_against_the_random_neurons(tiny64):
    """One row per candidate and effect, with the random neurons' 2.5-97.5% range as its null, the share through
    the norm (1 - |direct| / |total|) and the authors' |change of loss| measure; no signed mean over candidates."""
    from interp_bayes.kinds.neurons import EntropyNeuronsParams, summary
    from interp_bayes.core.results import find

    model = tiny64("pythia")
    report = entropy_neurons(model, TEXTS, AblationProtocol(top_n=3, n_random=6, n_boot=50), progress=False)
    rows = report.rows()
    assert not [r for r in rows if "candidates_mean" in r.metric]
    for key in ("total_entropy", "mediated_entropy", "total_abs_loss", "mediated_fraction_entropy"):
        rand = np.array([r["effects"][key] for r in report.random])
        for c in report.candidates:
            row = find(rows, f"ablation_{key}", neuron=c["neuron"])
            assert row.value == c["effects"][key] and row.scope["path"] == "head" == report.ablation_path
            assert [row.null_low, row.null_high] == pytest.approx(np.quantile(rand, [0.025, 0.975]).tolist())
    for c in report.candidates:
        e = c["effects"]
        assert e["mediated_fraction_entropy"] == pytest.approx(1 - abs(e["direct_entropy"]) / abs(e["total_entropy"]))
        assert e["mediated_fraction_abs_loss"] == pytest.approx(1 - e["direct_abs_loss"] / e["total_abs_loss"])
        assert e["total_abs_loss"] >= abs(e["total_loss"])
    line = next(x for x in summary(rows, EntropyNeuronsParams()) if "per candidate" in x.label)
    assert all(f"{c['neuron']}: {c['effects']['total_entropy']:+.4f}" in line.value for c in report.candidates)


# ---------------------------------------------------------------------------------------------------------------
# a norm after the MLP (Gemma 2 / 3's post_feedforward_layernorm)


@pytest.fixture(scope="module")
def post_norm64(tmp_path_factory):
    """family -> a float64 bridge of a tiny Gemma 2 / Gemma 3 whose last post-MLP norm has gains from ~0.05 to ~20
    (Gemma 2 27B's reach ~1,600): a neuron's write is then far from its W_out."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from interp_bayes.model.loading import load_model
    from interp_bayes.model.testing import make_tiny_model

    cache = {}

    def get(family):
        if family not in cache:
            folder = tmp_path_factory.mktemp(f"tiny-{family}")
            make_tiny_model(family, folder)
            if family == "gemma3":
                model = load_model(folder, dtype=torch.float64)
            else:  # load_model refuses Gemma 2 (native.py asks HF for sdpa, which Gemma 2 lacks): boot it directly
                from transformer_lens.model_bridge import TransformerBridge

                hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64)
                model = TransformerBridge.boot_transformers(str(folder), hf_model=hf, device="cpu",
                                                            tokenizer=AutoTokenizer.from_pretrained(folder),
                                                            dtype=torch.float64).eval()
            with torch.no_grad():  # Gemma stores the gain as an offset from 1
                weight = model.blocks[-1].ln2_post.original_component.weight
                weight.copy_(torch.exp(1.5 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(1),
                                                         dtype=torch.float64)) - 1)
            cache[family] = model
        return cache[family]
    return get


def hooked_writes(model, neurons, token_ids):
    """Per neuron: [positions, d] measured changes of the final residual when it is mean-ablated alone (its mean
    over every position), and the activation changes c; from plain hooked passes."""
    post = f"blocks.{model.cfg.n_layers - 1}.mlp.hook_post"
    caches = [model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n in (post, "ln_final.hook_in"))[1]
              for ids in token_ids]
    acts = torch.cat([c[post][0] for c in caches])  # [P, d_mlp]
    means = acts.mean(0)
    out = {}
    for j in neurons:
        def hook(t, hook, j=j):
            t = t.clone()
            t[..., j] = means[j]
            return t
        deltas = []
        with model.hooks(fwd_hooks=[(post, hook)]):
            for ids, c in zip(token_ids, caches):
                _, ab = model.run_with_cache(torch.tensor([ids]), names_filter="ln_final.hook_in")
                deltas.append((ab["ln_final.hook_in"] - c["ln_final.hook_in"])[0])
        out[j] = (torch.cat(deltas).double().numpy(), (means[j] - acts[:, j]).double().numpy())
    return out


@pytest.mark.parametrize("fam", ["gemma2", "gemma3"])
def test_a_write_through_a_post_mlp_norm_is_the_measured_change_of_the_residual(post_norm64, fam):
    model = post_norm64(fam)
    assert model.blocks[-1].ln2_post.uses_rms_norm
    null = unembedding_null_space(model)
    clean = final_norm_run(model, TEXTS, keep_head_inputs=True)
    scores = neuron_scores(model, -1, null, clean=clean)
    assert scores["write"] == "measured"
    with pytest.raises(ValueError, match="normalises its MLP output"):
        neuron_scores(model, -1, null)
    w_u = model.original_model.get_output_embeddings().weight.detach().double().numpy().T  # [d, vocab]
    gain = 1 + model.ln_final.original_component.weight.detach().double().numpy()  # Gemma: an offset from 1
    u = gain[:, None] * (w_u - w_u.mean(1, keepdims=True))  # an RMSNorm: nothing to centre over d_model
    v0 = reference_null_basis(u, null.k, centred=False)
    cos_u = u / np.linalg.norm(u, axis=0, keepdims=True)
    neurons = [0, 7, 50, 101, 127]
    tol = 1e-5  # Gemma's RMSNorm computes in float32 whatever the model's dtype: the hooked change carries that
    for j, (dx, c) in hooked_writes(model, neurons, clean["token_ids"]).items():
        sq = (dx**2).sum(1)
        assert scores["rho"][j] == pytest.approx(math.sqrt(((dx @ v0) ** 2).sum() / sq.sum()), rel=tol)
        assert scores["norm"][j] == pytest.approx(math.sqrt(sq.sum() / (c**2).sum()), rel=tol)
        cos = (dx @ cos_u) / np.sqrt(sq)[:, None]  # per position: LogitVar pooled with weights |dx|^2
        assert scores["logit_var"][j] == pytest.approx((cos.var(axis=1) * sq).sum() / sq.sum(), rel=tol)
    weights_only = null.rho(model.blocks[-1].mlp.W_out.detach())  # the write taken as W_out: another ranking
    assert len(set(np.argsort(-weights_only)[:5]) - set(np.argsort(-scores["rho"])[:5])) >= 2


@pytest.mark.parametrize("fam", ["gemma2", "gemma3"])
@torch.no_grad()
def test_the_head_shortcut_covers_a_post_mlp_norm_and_a_soft_cap(post_norm64, fam):
    """The ablations through the post-MLP norm (and Gemma 2's logit soft cap) take the shortcut, and equal plain
    hooked passes (total: the scale free; direct: the clean scale held by a hook) to float32 rounding (Gemma's
    RMSNorm computes in float32 whatever the model's dtype; summed over a prompt's positions)."""
    model = post_norm64(fam)
    assert (getattr(model.cfg, "output_logits_soft_cap", 0) or 0) > 0 if fam == "gemma2" else True
    neurons = [3, 50, 101]
    clean = final_norm_run(model, TEXTS, keep_head_inputs=True)
    ablations = ablation_effects(model, TEXTS, neurons, clean=clean, progress=False)
    assert ablations.path == "post"
    post = f"blocks.{model.cfg.n_layers - 1}.mlp.hook_post"
    for i, ids in enumerate(clean["token_ids"]):
        x = torch.tensor([ids])
        seen = {}
        with model.hooks(fwd_hooks=[("ln_final.hook_scale", lambda t, hook: seen.setdefault("s", t.clone()))]):
            h0, l0 = entropy_and_loss(model(x)[0].double().numpy(), ids)
        for j in neurons:
            def ablate(t, hook, j=j):
                t = t.clone()
                t[..., j] = float(clean["means"][j])
                return t
            with model.hooks(fwd_hooks=[(post, ablate), ("ln_final.hook_scale", lambda t, hook: t.clone())]):
                h_tot, l_tot = entropy_and_loss(model(x)[0].double().numpy(), ids)
            with model.hooks(fwd_hooks=[(post, ablate), ("ln_final.hook_scale", lambda t, hook: seen["s"].clone())]):
                h_dir, _ = entropy_and_loss(model(x)[0].double().numpy(), ids)
            e = ablations.per_neuron[j]
            assert e["total_entropy"][i] == pytest.approx((h_tot - h0).sum(), abs=1e-5)
            assert e["total_loss"][i] == pytest.approx((l_tot - l0).sum(), abs=1e-5)
            assert e["direct_entropy"][i] == pytest.approx((h_dir - h0).sum(), abs=1e-5)
            assert np.abs(h_tot - h0).max() > 1e-3  # the effects are well above that rounding


def test_entropy_neurons_on_a_post_norm_family_record_the_write_and_the_path(post_norm64):
    model = post_norm64("gemma3")
    report = entropy_neurons(model, TEXTS, AblationProtocol(top_n=2, n_random=2, n_boot=20), progress=False)
    assert report.write == "measured" and report.ablation_path == "post"
    rows = report.rows()
    assert {r.scope["path"] for r in rows if r.metric.startswith("ablation_")} == {"post"}
    assert all("measured" in r.unit for r in rows if r.metric == "neuron_norm")
