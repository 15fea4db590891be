"""Real weights offline: SmolLM2-135M-Instruct through ib.load_model, against the plain HF model."""

import torch

from conftest import load_hf
from interp_bayes.model.collect import collect
from interp_bayes.model.loading import model_info


def test_smollm2_logits_equal_plain_hf_and_predict_paris(smollm2):
    info = model_info(smollm2)
    assert info.n_params == 134_515_008 and info.dtype == "float32"
    ids = torch.tensor([smollm2.tokenizer("The capital of France is")["input_ids"]])
    hf = load_hf(info.source, like=smollm2)
    with torch.no_grad():
        ours, ref = smollm2(ids), hf(ids).logits
    assert torch.equal(ours, ref)
    assert smollm2.tokenizer.decode(ours[0, -1].argmax()) == " Paris"


def test_smollm2_hook_v_has_three_kv_heads_of_64(smollm2):
    ids = torch.tensor([smollm2.tokenizer("Once upon a time, there was a")["input_ids"]])
    _, cache = smollm2.run_with_cache(ids, names_filter="blocks.29.attn.hook_v")
    assert cache["blocks.29.attn.hook_v"].shape == (1, ids.shape[1], 3, 64)
    acts = collect(smollm2, ["The capital of France is", "Once upon a time, there was a"], progress=False)
    assert acts.values().shape == (2, 192)
    # a confident factual completion vs an open story opening
    assert acts.entropy[0] < 3.0 < acts.entropy[1]
