"""ib.collect against run_with_cache and HF logits; batching invariance; save/load."""

import math

import torch

from conftest import load_hf
from interp_bayes.extract import Activations, collect, length_batches, logit_entropy_bits

PROMPTS = ["the cat sat on the mat", "hello world 0 1 2 3", "in context learning with induction heads",
           "the cat sat", "hello world", "a b c d e f g", "def f(x): return x + 1", "the mat"]


def test_collect_matches_run_with_cache_and_hf_entropy(tiny):
    bridge, hf, _ = tiny
    acts = collect(bridge, PROMPTS, layers=(0, -1), readings=("v", "z", "resid"), progress=False)
    last = bridge.cfg.n_layers - 1
    assert acts.layers == [0, last]
    n_kv = bridge.cfg.n_key_value_heads or bridge.cfg.n_heads
    assert acts.values(-1).shape == (len(PROMPTS), n_kv * bridge.cfg.d_head)
    assert acts.reading("z", 0).shape == (len(PROMPTS), bridge.cfg.n_heads * bridge.cfg.d_head)
    assert acts.reading("resid", -1).shape == (len(PROMPTS), bridge.cfg.d_model)
    for i in (0, 3, 7):
        ids = torch.tensor([acts.token_ids[i]])
        _, cache = bridge.run_with_cache(ids)
        for name, hook in (("v", "attn.hook_v"), ("z", "attn.hook_z"), ("resid", "hook_resid_post")):
            for layer in (0, last):
                ref = cache[f"blocks.{layer}.{hook}"][0, -1].reshape(-1)
                torch.testing.assert_close(acts.reading(name, layer)[i], ref, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            logits = hf(ids).logits[0, -1]
        p = torch.softmax(logits.double(), -1)
        expected = -(p * p.log()).sum() / math.log(2)
        assert abs(acts.entropy[i].item() - expected.item()) < 1e-4
        assert acts.next_token[i] == logits.argmax()


def test_batched_equals_single(tiny):
    """Equal-length batching never pads, so only float32 rounding of different batch shapes remains."""
    bridge, _, _ = tiny
    batched = collect(bridge, PROMPTS, layers=(-1,), readings=("v", "resid"), progress=False)
    for i, text in enumerate(PROMPTS):
        single = collect(bridge, [text], progress=False, readings=("v", "resid"))
        for name in ("v", "resid"):  # relative to the vector's norm: residual norms grow large in random models
            a, b = batched.reading(name)[i], single.reading(name)[0]
            assert (a - b).norm() <= 1e-6 * b.norm(), (name, i, (a - b).norm() / b.norm())
        torch.testing.assert_close(batched.entropy[i], single.entropy[0], rtol=1e-5, atol=1e-6)
    assert sorted(batched.token_ids, key=len) != batched.token_ids  # order kept, not bucket order


def test_length_batches_never_mix_lengths():
    ids = [[1] * n for n in (3, 5, 3, 5, 5, 2, 3)]
    batches = list(length_batches(ids, batch_size=2))
    assert sorted(i for b in batches for i in b) == list(range(len(ids)))
    for b in batches:
        assert len({len(ids[i]) for i in b}) == 1 and len(b) <= 2


def test_label_entropy_is_renormalised_over_labels(tiny):
    bridge, hf, _ = tiny
    labels = [5, 9]
    acts = collect(bridge, PROMPTS[:3], label_tokens=labels, progress=False)
    for i in range(3):
        with torch.no_grad():
            logits = hf(torch.tensor([acts.token_ids[i]])).logits[0, -1, labels].double()
        p = torch.softmax(logits, -1)
        assert abs(acts.entropy[i].item() - (-(p * p.log2()).sum()).item()) < 1e-5
        torch.testing.assert_close(acts.label_logprobs[i].double().exp(), p, rtol=1e-5, atol=1e-6)
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
    text = "the cat sat on the mat"
    assert bridge.tokenizer(text)["input_ids"][0] == bridge.tokenizer.bos_token_id  # the rebuilt one adds BOS
    ids, logits = _hf_reference(folder, text, bridge)
    acts = collect(bridge, [text], keep_logprobs=True, progress=False)
    assert acts.token_ids[0] == ids and ids[0] != bridge.tokenizer.bos_token_id
    torch.testing.assert_close(acts.logprobs[0], torch.log_softmax(logits.float(), -1), rtol=0, atol=1e-5)
    assert acts.meta["tokenizer"]["adds_bos"] is False and acts.meta["bos_prepended"] == [False]


def test_smollm2_token_ids_and_logits_equal_hugging_face(smollm2):
    from interp_bayes.models import model_info

    text = "The capital of France is"
    ids, logits = _hf_reference(model_info(smollm2).source, text, smollm2)
    acts = collect(smollm2, [text], keep_logprobs=True, progress=False)
    assert acts.token_ids[0] == ids and ids[0] != 1  # SmolLM2 under transformers 5 adds no <|im_start|>
    torch.testing.assert_close(acts.logprobs[0], torch.log_softmax(logits.float(), -1), rtol=0, atol=1e-5)
