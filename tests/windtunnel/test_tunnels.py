"""``open_tunnel`` and ``ib.load_model`` on every committed wind tunnel, each architecture: the model it boots, its
hook points, and logits equal to the architecture's own forward."""

from __future__ import annotations

import json

import pytest
import torch

import interp_bayes as ib
from interp_bayes.core.errors import ConfigError, ModelLoadError
from interp_bayes.model.loading import model_identity
from interp_bayes.windtunnel.archs import MODEL_TYPES
from interp_bayes.windtunnel.configs import ARCHS, TrainConfig
from interp_bayes.windtunnel.tunnels import PACKAGED, Tunnel, is_tunnel, open_tunnel

COMMITTED = sorted(d.name for d in PACKAGED.iterdir() if d.is_dir())
# the hook points every architecture has at each block (the residual stream a block reads and writes), and those
# of its own kind: attention for the transformer, the mixer for Mamba, the token embedding for the hooked modules
BLOCK_HOOKS = ("hook_resid_pre", "hook_resid_post")
OWN_HOOKS = {"transformer": ("attn.hook_v", "attn.hook_z", "attn.hook_pattern"),
             "mamba": ("hook_mixer_in", "hook_mixer_out")}


def own_forward(folder, model_type: str):
    """The architecture's own module, loaded without the toolkit: HF's (eager attention) or the hooked class's."""
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type].from_pretrained(folder).eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def test_every_architecture_is_committed():
    archs = {open_tunnel(name).config.arch for name in COMMITTED}
    assert archs == set(ARCHS)


@pytest.mark.parametrize("name", COMMITTED)
def test_load_model_boots_every_committed_tunnel_with_its_hook_points(name):
    tunnel = open_tunnel(name)
    assert isinstance(tunnel, Tunnel) and tunnel.folder == PACKAGED / name and is_tunnel(tunnel.folder)
    assert tunnel.task.name == tunnel.config.task and tunnel.identity == model_identity(tunnel.folder)
    model_type = json.loads((tunnel.folder / "config.json").read_text())["model_type"]
    model = ib.load_model(name)  # the packaged name, as open_tunnel takes it; a folder works the same
    arch = tunnel.config.arch
    assert (type(model).__name__ == "TransformerBridge") == (arch in ("transformer", "mamba"))
    n = model.cfg.n_layers
    want = [f"blocks.{layer}.{hook}" for layer in range(n) for hook in BLOCK_HOOKS + OWN_HOOKS.get(arch, ())]
    if model_type in MODEL_TYPES:
        want.append("hook_embed")
    missing = sorted(set(want) - set(model.hook_dict))
    assert not missing, f"{name} ({arch}) lacks hook points {missing}"
    ids = torch.randint(0, model.cfg.d_vocab, (2, min(model.cfg.n_ctx, 12)), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids)
        ref = own_forward(tunnel.folder, model_type)(ids)
        ref = ref if isinstance(ref, torch.Tensor) else ref.logits
        # the same modules on the same weights in the same order: bit for bit
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
        if model_type in MODEL_TYPES:  # the last block's hooked output is the stream the read-out reads
            logits, cache = model.run_with_cache(ids)
            torch.testing.assert_close(logits, got, rtol=0, atol=0)
            torch.testing.assert_close(model.unembed(cache[f"blocks.{n - 1}.hook_resid_post"]), got, rtol=0, atol=0)
    assert ib.model_info(model).family == model_type


def test_a_folder_and_a_name_open_the_same_tunnel_and_anything_else_is_refused(tmp_path):
    by_name, by_folder = open_tunnel("bijection-cpu-lstm"), open_tunnel(PACKAGED / "bijection-cpu-lstm")
    assert by_name.config == by_folder.config and isinstance(by_name.config, TrainConfig)
    assert by_name.step == json.loads((by_name.folder / "windtunnel.json").read_text())["step"]
    with pytest.raises(ConfigError, match="no wind-tunnel checkpoint.*bijection-cpu-lstm"):
        open_tunnel(tmp_path)  # the refusal lists the packaged ones
    assert not is_tunnel(tmp_path) and not is_tunnel("smollm2-135m")
    with pytest.raises(ModelLoadError, match="device_map do not apply"):
        ib.load_model("bijection-cpu-lstm", device_map="auto")
    model = ib.load_model("bijection-cpu-mlp", dtype=torch.float64)
    assert next(model.parameters()).dtype == torch.float64 and ib.model_info(model).dtype == "float64"
