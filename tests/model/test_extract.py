"""ib.collect against run_with_cache and HF logits; batching invariance; save/load."""

import functools
import math

import pytest
import torch

from conftest import load_hf
from interp_bayes.model.collect import collect
from interp_bayes.model.read import Activations, length_batches, logit_entropy_bits
from interp_bayes.model.loading import load_model
from interp_bayes.model.testing import float32_lambda, float32_spread

PROMPTS = ["the cat sat on the mat", "hello world 0 1 2 3", "in context learning with induction heads",
           "the cat sat", "hello world", "a b c d e f g", "def f(x): return x + 1", "the mat"]


@functools.cache
def _spread(folder, layers=(0, -1), readings=("v", "z", "resid"), label_tokens=None):
    """Mean-square float32 rounding error of each of ``collect``'s outputs on ``PROMPTS`` (readings as
    (name, layer >= 0) -> [n, dim], "entropy" [n], "logprobs" [n, vocab], "label_logprobs" [n, labels]), from a float64 copy of the tiny model
    (``model.testing.float32_spread``): the scale of any two float32 evaluations' difference, whatever their kernels."""
    b64 = load_model(folder, dtype=torch.float64)
    keys = [(name, layer % b64.cfg.n_layers) for name in readings for layer in layers]

    def run():
        a = collect(b64, PROMPTS, layers=layers, readings=readings, label_tokens=label_tokens, keep_logprobs=True,
                    progress=False)
        extra = [a.label_logprobs] if label_tokens else []
        return [a.reading(*k) for k in keys] + [a.entropy, a.logprobs] + extra
    return dict(zip(keys + ["entropy", "logprobs", "label_logprobs"], float32_spread(run)))


def _within(diff, mean_square, lam):
    """Whether the float32 difference ``diff`` of two evaluations lies within lam * sqrt(2) * (its rounding
    error's root-mean-square norm): the Hoeffding / Pinelis bound of ``model.testing.float32_spread``; returns the ratio
    too (printed on failure)."""
    bound = lam * math.sqrt(2) * mean_square.sum().sqrt().item()
    ratio = diff.double().norm().item() / bound
    return ratio <= 1, ratio


def test_collect_matches_run_with_cache_and_hf_entropy(tiny):
    bridge, hf, folder = tiny
    acts = collect(bridge, PROMPTS, layers=(0, -1), readings=("v", "z", "resid"), progress=False)
    last = bridge.cfg.n_layers - 1
    assert acts.layers == [0, last]
    n_kv = bridge.cfg.n_key_value_heads or bridge.cfg.n_heads
    assert acts.values(-1).shape == (len(PROMPTS), n_kv * bridge.cfg.d_head)
    assert acts.reading("z", 0).shape == (len(PROMPTS), bridge.cfg.n_heads * bridge.cfg.d_head)
    assert acts.reading("resid", -1).shape == (len(PROMPTS), bridge.cfg.d_model)
    # Claim (b): run_with_cache hooks every inner point, so it runs the bridge's eager attention and norms while
    # collect runs HF's modules (sdpa) and the last block at the final position only: other kernels from layer 0
    # on. Each compared vector (and the entropy against HF's logits) must lie within the float32 rounding bound of
    # the whole forward (_spread), at a lam that keeps all 3 * 7 comparisons' failure probability below 1e-6.
    spread, lam = _spread(folder), float32_lambda(3 * 7)
    for i in (0, 3, 7):
        ids = torch.tensor([acts.token_ids[i]])
        _, cache = bridge.run_with_cache(ids)
        for name, hook in (("v", "attn.hook_v"), ("z", "attn.hook_z"), ("resid", "hook_resid_post")):
            for layer in (0, last):
                ref = cache[f"blocks.{layer}.{hook}"][0, -1].reshape(-1)
                ok, ratio = _within(acts.reading(name, layer)[i] - ref, spread[(name, layer)][i], lam)
                assert ok, (name, layer, i, ratio)
        with torch.no_grad():
            logits = hf(ids).logits[0, -1]
        p = torch.softmax(logits.double(), -1)
        expected = -(p * p.log()).sum() / math.log(2)
        ok, ratio = _within(acts.entropy[i] - expected, spread["entropy"][i], lam)
        assert ok, ("entropy", i, ratio)
        assert acts.next_token[i] == logits.argmax()


def test_batched_equals_single(tiny):
    """Equal-length batching never pads, so only float32 rounding of different batch shapes remains."""
    # Claim (b): a batch of several prompts runs every matrix product with another row count than one prompt
    # alone, and BLAS picks its kernel (gemv / gemm, blocking, SIMD width) by shape, so sums accumulate in another
    # order from layer 0 on. The bound is the float32 rounding bound of the whole forward (_spread), at a lam for
    # 8 prompts x 3 comparisons.
    bridge, _, folder = tiny
    spread, lam, last = _spread(folder), float32_lambda(3 * len(PROMPTS)), bridge.cfg.n_layers - 1
    batched = collect(bridge, PROMPTS, layers=(-1,), readings=("v", "resid"), progress=False)
    for i, text in enumerate(PROMPTS):
        single = collect(bridge, [text], progress=False, readings=("v", "resid"))
        for name in ("v", "resid"):
            ok, ratio = _within(batched.reading(name)[i] - single.reading(name)[0], spread[(name, last)][i], lam)
            assert ok, (name, i, ratio)
        ok, ratio = _within(batched.entropy[i] - single.entropy[0], spread["entropy"][i], lam)
        assert ok, ("entropy", i, ratio)
    assert sorted(batched.token_ids, key=len) != batched.token_ids  # order kept, not bucket order


def test_length_batches_never_mix_lengths():
    ids = [[1] * n for n in (3, 5, 3, 5, 5, 2, 3)]
    batches = list(length_batches(ids, batch_size=2))
    assert sorted(i for b in batches for i in b) == list(range(len(ids)))
    for b in batches:
        assert len({len(ids[i]) for i in b}) == 1 and len(b) <= 2


def test_label_entropy_is_renormalised_over_labels(tiny):
    # Claim (b): collect (HF modules, last block at the final position) against plain HF on all positions:
    # other kernels from layer 0 on, so the whole forward's float32 rounding bound (_spread), 6 comparisons.
    bridge, hf, folder = tiny
    labels = [5, 9]
    spread, lam = _spread(folder, label_tokens=tuple(labels)), float32_lambda(6)
    acts = collect(bridge, PROMPTS[:3], label_tokens=labels, progress=False)
    for i in range(3):
        with torch.no_grad():
            logits = hf(torch.tensor([acts.token_ids[i]])).logits[0, -1, labels].double()
        p = torch.softmax(logits, -1)
        ok, ratio = _within(acts.entropy[i] - (-(p * p.log2()).sum()), spread["entropy"][i], lam)
        assert ok, ("entropy", i, ratio)
        # exp moves an error e of the log-probability to p * e
        ok, ratio = _within(acts.label_logprobs[i].double().exp() - p, p ** 2 * spread["label_logprobs"][i], lam)
        assert ok, ("label probabilities", i, ratio)
    assert acts.meta["entropy_over"] == "labels" and acts.meta["label_tokens"] == labels


def test_token_id_prompts_and_save_load_round_trip(tiny, tmp_path):
    bridge, _, _ = tiny
    acts = collect(bridge, [[5, 6, 7], [8, 9, 10, 11]], layers=(0, 1), readings=("v", "z"), label_tokens=[3, 4],
                   progress=False)
    back = Activations.load(acts.save(tmp_path / "acts"))
    assert back.token_ids == [[5, 6, 7], [8, 9, 10, 11]]
    assert back.meta == acts.meta
    for name in ("v", "z"):
        for layer in (0, 1):
            assert torch.equal(back.reading(name, layer), acts.reading(name, layer))
    assert torch.equal(back.entropy, acts.entropy) and torch.equal(back.label_logprobs, acts.label_logprobs)
    assert torch.equal(back.next_token, acts.next_token)


def test_entropy_bits_of_uniform():
    assert abs(logit_entropy_bits(torch.zeros(1024)).item() - 10.0) < 1e-5


def test_activations_render_in_notebooks(tiny):
    bridge, _, _ = tiny
    acts = collect(bridge, ["<b>bold</b> the cat", "hello world", "a b c", "the mat"], progress=False)
    assert "4 prompts" in acts._repr_html_()
    fig = acts.figure()
    assert fig.data[0].x.shape == (4,) and "&lt;b&gt;" in fig.data[0].text[0]


def _hf_reference(folder, text, bridge):
    """The checkpoint's own tokenizer and plain HF model (attention as ``bridge`` runs it) on ``text``: (token ids,
    final logits)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return ids[0].tolist(), load_hf(folder, like=bridge)(ids).logits[0, -1]


def test_text_is_tokenised_with_the_checkpoints_own_bos_policy(tiny):
    """TransformerLens rebuilds the tokenizer to always prepend BOS; collect must not inherit that."""
    bridge, _, folder = tiny
    text = PROMPTS[0]
    assert bridge.tokenizer(text)["input_ids"][0] == bridge.tokenizer.bos_token_id  # the rebuilt one adds BOS
    ids, logits = _hf_reference(folder, text, bridge)
    acts = collect(bridge, [text], keep_logprobs=True, progress=False)
    assert acts.token_ids[0] == ids and ids[0] != bridge.tokenizer.bos_token_id
    # Claim (b), as in test_label_entropy_is_renormalised_over_labels: the whole forward's rounding bound
    ok, ratio = _within(acts.logprobs[0] - torch.log_softmax(logits.float(), -1), _spread(folder)["logprobs"][0],
                        float32_lambda(1))
    assert ok, ratio
    assert acts.meta["tokenizer"]["adds_bos"] is False and acts.meta["bos_prepended"] == [False]


@pytest.mark.parametrize("adds_bos", [False, True])
def test_transformer_lens_string_paths_follow_the_checkpoints_bos_policy(tiny_dirs, tmp_path, adds_bos):
    """A TransformerLens user's first calls (to_tokens, to_str_tokens, run_with_cache and generate on text) give the
    ids collect and HF's tokenizer give, for a tokenizer without BOS and for one that adds it (once)."""
    import shutil

    from tokenizers import processors
    from transformers import AutoTokenizer

    folder = tmp_path / "m"
    shutil.copytree(tiny_dirs["llama3"], folder)
    if adds_bos:
        tok = AutoTokenizer.from_pretrained(folder)
        tok._tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
        tok.save_pretrained(folder)
    bridge = load_model(folder)
    text = PROMPTS[0]
    ids = AutoTokenizer.from_pretrained(folder)(text)["input_ids"]
    assert (ids[0] == bridge.tokenizer.bos_token_id) is adds_bos and ids.count(bridge.tokenizer.bos_token_id) <= 1
    assert bridge.to_tokens(text)[0].tolist() == ids == collect(bridge, [text], progress=False).token_ids[0]
    assert len(bridge.to_str_tokens(text)) == len(ids)
    logits, cache = bridge.run_with_cache(text)
    by_ids, _ = bridge.run_with_cache(torch.tensor([ids]))
    assert torch.equal(logits, by_ids) and cache["blocks.0.attn.hook_v"].shape[1] == len(ids)
    out = bridge.generate(text, max_new_tokens=2, do_sample=False, verbose=False, return_type="tokens")
    assert out[0, :len(ids)].tolist() == ids
    assert bridge.to_tokens(text, prepend_bos=not adds_bos)[0].tolist() != ids  # TL's explicit override still works


def test_smollm2_token_ids_and_logits_equal_hugging_face(smollm2, smollm2_f64):
    from interp_bayes.model.loading import model_info

    text = "The capital of France is"
    ids, logits = _hf_reference(model_info(smollm2).source, text, smollm2)
    acts = collect(smollm2, [text], keep_logprobs=True, progress=False)
    assert acts.token_ids[0] == ids and ids[0] != 1  # SmolLM2 under transformers 5 adds no <|im_start|>
    assert smollm2.to_tokens(text)[0].tolist() == ids  # nor does TransformerLens's to_tokens on a load_model bridge
    # Claim (b): blocks 0-28 run HF's own layers on the same [1, T] inputs in both (test_smollm2.py checks that
    # forward bit for bit), but collect runs the last block's output projection and MLP and the unembedding on the
    # final position alone ([1, 1]: gemv) where HF runs all T positions (gemm), and the 49,152 logits then differ,
    # so the log-softmax's sum rounds differently too. Bound: the float32 rounding of everything from the last
    # block on (``start``), propagated in float64; one comparison.
    spread = float32_spread(lambda: [collect(smollm2_f64, [text], keep_logprobs=True, progress=False).logprobs[0]],
                            start=smollm2_f64.blocks[-1])[0]
    ok, ratio = _within(acts.logprobs[0] - torch.log_softmax(logits.float(), -1), spread, float32_lambda(1))
    assert ok, ratio
