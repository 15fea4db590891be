"""Every bad input gets one sentence naming the problem and the fix."""

import inspect
from collections import namedtuple

import pytest
import torch

from interp_bayes.model import loading as models
from interp_bayes.core.errors import (InterpBayesError, ModelLoadError, ModelNotFoundError, NonFiniteActivationError,
    PromptError)
from interp_bayes.model.collect import collect
from interp_bayes.model.loading import load_model
from interp_bayes.model.testing import TINY_FAMILIES


def test_unknown_alias_lists_known_ones():
    with pytest.raises(ModelNotFoundError, match=r"Unknown model alias 'pythia-9000'.*smollm2-135m.*pythia-410m"):
        load_model("pythia-9000")


def test_missing_local_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"No model folder at '.*nowhere'"):
        load_model(tmp_path / "nowhere")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no readable config.json"):
        load_model(tmp_path)


def test_not_a_causal_lm(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"not a causal language model.*BertForMaskedLM.*ForCausalLM"):
        load_model(tmp_path)


def test_hub_id_without_network_fails_fast_with_the_fix():
    import time

    t = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"Cannot fetch 'EleutherAI/pythia-410m'.*pass that folder"):
        load_model("pythia-410m")
    assert time.perf_counter() - t < 10


def test_memory_preflight_refuses(tiny_dirs, monkeypatch):
    Mem = namedtuple("Mem", "available")
    monkeypatch.setattr(models.psutil, "virtual_memory", lambda: Mem(10 * 2**20))
    with pytest.raises(ModelLoadError, match=r"needs about .* GiB of RAM .* only 0.0 GiB is free; pass dtype"):
        load_model(tiny_dirs["llama3"])


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_preflight_counts_the_bytes_the_bridge_holds(tiny_dirs, family):
    """The preflight's weight bytes, from the config alone, against the tensor storages a loaded bridge holds (GPT-NeoX:
    TransformerLens's split q / k / v copies beside HF's fused query_key_value, 17% more here)."""
    folder = tiny_dirs[family]
    config = models.load_config(folder, local=True)
    planned = models.plan_devices(models._empty_model(config), torch.float32)
    bridge = load_model(folder)
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*bridge.parameters(), *bridge.buffers()]}.values())
    n_params, held_params = models.count_parameters(config)  # what the grid reserves
    from transformers import AutoModelForCausalLM

    assert n_params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())
    for planned_bytes in (planned.shares["cpu"], 4 * held_params):
        assert abs(planned_bytes - held) <= 0.01 * held, (family, planned_bytes, held)


def test_dtype_policy_and_trust_remote_code_off():
    assert models.default_dtype(410_000_000) == torch.float32
    assert models.default_dtype(7_000_000_000) == torch.bfloat16
    assert inspect.signature(load_model).parameters["trust_remote_code"].default is False


def test_empty_prompt_list(tiny_dirs):
    bridge = load_model(tiny_dirs["llama3"])
    with pytest.raises(PromptError, match="prompt list is empty"):
        collect(bridge, [], progress=False)


def test_prompt_longer_than_context(tiny_dirs):
    bridge = load_model(tiny_dirs["pythia"])
    long_text = "the cat sat on the mat " * 60
    with pytest.raises(PromptError, match=r"Prompt 1 \('the cat sat.*'\) has \d+ tokens, more than the model's context of 256"):
        collect(bridge, ["hello", long_text], progress=False)


def test_non_finite_activations_name_the_layer(tiny_dirs):
    bridge = load_model(tiny_dirs["mistral"])
    with torch.no_grad():
        bridge.original_model.model.layers[1].self_attn.v_proj.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteActivationError, match="reading 'v' at layer 1"):
        collect(bridge, ["the cat sat"], layers=(0, 1), progress=False)


def test_unknown_layer_and_reading(tiny_dirs):
    bridge = load_model(tiny_dirs["phi2"])
    with pytest.raises(ValueError, match="Layer 7 is out of range for a model with 2 layers"):
        collect(bridge, ["hi"], layers=(7,), progress=False)
    with pytest.raises(ValueError, match="Unknown reading"):
        collect(bridge, ["hi"], readings=("q",), progress=False)


def test_run_id_is_the_model_not_its_spelling(tiny_dirs, tmp_path, monkeypatch):
    import shutil

    from interp_bayes.run.config import SweepConfig

    folder = tmp_path / "model"
    shutil.copytree(tiny_dirs["pythia"], folder)
    monkeypatch.chdir(tmp_path)
    ids = {SweepConfig(model=spelling).digest() for spelling in (str(folder), "model", "./model/", str(folder) + "/")}
    assert len(ids) == 1
    assert SweepConfig(model="model", probes=["keys"]).digest() in ids  # the probe list is not the run's identity
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one changed bit in the weights, same size
    weights.write_bytes(bytes(data))
    assert SweepConfig(model="model").digest() not in ids
    assert SweepConfig(model=str(tiny_dirs["llama3"])).digest() not in ids


def test_gguf_path_is_explained(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"\.gguf file is converted automatically"):
        load_model(tmp_path / "missing.gguf")


def test_evaluate_windtunnel_takes_a_task_name():
    from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
    from interp_bayes.windtunnel.tunnels import open_tunnel

    model = open_tunnel("bijection-cpu").model
    out = evaluate_windtunnel(model, "bijection", n=50)
    assert out[20]["per_sample_entropy_mae_bits"] < 0.05
    with pytest.raises(InterpBayesError, match="known tasks: bijection, hmm"):
        evaluate_windtunnel(model, "bijektion", n=10)


def test_prompt_sources_local_dataset_jsonl_and_offline_hub(tmp_path):
    from datasets import Dataset

    from interp_bayes.core.prompts import load_source

    Dataset.from_dict(dict(body=["a b c", "d e f", ""], topic=["x", "y", "z"])).save_to_disk(str(tmp_path / "ds"))
    ds = load_source(dict(dataset=str(tmp_path / "ds"), column="body", domain_column="topic"))
    assert list(ds["text"]) == ["a b c", "d e f"] and list(ds["domain"]) == ["x", "y"]  # empty rows dropped
    (tmp_path / "p.jsonl").write_text('{"body": "hello", "topic": "t"}\n{"body": "world", "topic": "u"}\n')
    ds = load_source(dict(dataset=str(tmp_path / "p.jsonl"), column="body", n=1))
    assert list(ds["text"]) == ["hello"]
    with pytest.raises(PromptError, match="Cannot load the prompt dataset 'no-such/dataset-xyz'.*Hugging Face Hub"):
        load_source(dict(dataset="no-such/dataset-xyz"))
    with pytest.raises(PromptError, match="has no column 'txt'"):
        load_source(dict(dataset=str(tmp_path / "ds"), column="txt"))
    with pytest.raises(PromptError, match="takes"):
        load_source(dict(dataset=str(tmp_path / "ds"), colum="body"))


def test_result_files_respect_the_umask(tmp_path):
    import os

    from interp_bayes.core.store import write_json

    old = os.umask(0o027)
    try:
        mode = write_json(tmp_path / "x.json", {"a": 1}).stat().st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o640  # 0666 less the umask, as a plain open() would give; not mkstemp's 0600
