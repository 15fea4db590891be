"""The wind-tunnel architectures beside the transformer (``windtunnel.archs``, ``configs.build_*``): their hook points
against independent forwards (a stacked ``torch.nn.LSTM``, HF Mamba-2's own hidden states, a per-position loop),
an edit at a hook point against the same edit made by a forward hook on the module, the capacity match, the folder
round trip, and ``interp-bayes train --arch`` end to end."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import interp_bayes as ib
from interp_bayes.cli import main
from interp_bayes.windtunnel.archs import ContextMLP, LSTMWindtunnel, MLPBaseline
from interp_bayes.windtunnel.configs import (MAMBA_CHUNK, PRESETS, build_model, build_transformer,
                                             make_config, make_task, n_params)
from interp_bayes.windtunnel.train import save_folder
from interp_bayes.windtunnel.tunnels import open_tunnel

# float32 with a few hundred rounded operations per output at these sizes (each within 2**-24 relative): 1e-5
# relative leaves two orders of magnitude of room, and a wrong layer or position differs at O(1e-2) or more
TOL = dict(rtol=1e-5, atol=1e-6)
ARCHS = ("mlp", "mlp-context", "lstm", "mamba")


def tiny(arch: str, n_layers: int = 2):
    """A fresh tiny bijection model of ``arch`` with two layers (so there is a layer between two others), its
    config and task."""
    torch.manual_seed(0)
    cfg = make_config("bijection", "tiny", arch=arch, n_layers=n_layers)
    task = make_task(cfg)
    return build_model(cfg, task).eval(), cfg, task


def ids_for(task, n: int = 3) -> torch.Tensor:
    return task.sample(n, seed=7).input_ids  # [n, T]


def test_lstm_hook_points_equal_a_stacked_torch_lstm():
    torch.manual_seed(0)
    model = LSTMWindtunnel(vocab_size=11, n_positions=9, d_model=8, n_layers=3).eval()
    ids = torch.randint(0, 11, (2, 9))
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
        x = model.wte.weight[ids] + model.wpe.weight[:9]  # [2, 9, 8]
        torch.testing.assert_close(cache["hook_embed"], model.wte.weight[ids], rtol=0, atol=0)
        torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], x, **TOL)
        for layer in range(3):  # one nn.LSTM of layer + 1 layers, weights copied from ours
            ref = nn.LSTM(8, 8, num_layers=layer + 1, batch_first=True)
            for k in range(layer + 1):
                for name, p in model.blocks[k].lstm.named_parameters():
                    getattr(ref, name.replace("_l0", f"_l{k}")).copy_(p)
            out = ref(x)[0]
            torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], out, **TOL)
            if layer:
                torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_pre"], cache[f"blocks.{layer - 1}.hook_resid_post"],
                                           rtol=0, atol=0)
        final = F.layer_norm(out, (8,), model.ln_f.weight, model.ln_f.bias) @ model.wte.weight.T
        torch.testing.assert_close(logits, final, **TOL)


def test_mamba_hook_points_equal_hf_hidden_states(tmp_path):
    hf, cfg, task = tiny("mamba")
    assert type(hf).__name__ == "Mamba2ForCausalLM"
    save_folder(hf, cfg, task, tmp_path, {})
    bridge = ib.load_model(tmp_path)
    ids = ids_for(task)
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)  # hidden_states[L]: the output of layer L; the last: after norm_f
        logits, cache = bridge.run_with_cache(ids)
        torch.testing.assert_close(cache["hook_embed"], hf.backbone.embeddings(ids), rtol=0, atol=0)
        torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], hf.backbone.embeddings(ids), rtol=0, atol=0)
        for layer in range(cfg.n_layers):
            torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], ref.hidden_states[layer], **TOL)
        torch.testing.assert_close(logits, ref.logits, **TOL)


def test_mamba_chunk_length_changes_the_cost_not_the_function():
    """configs.MAMBA_CHUNK (16, for speed) against HF's default 64 and a length that splits the sequence unevenly:
    the same weights give the same logits (the chunked scan is exact; float32 sums in another order)."""
    hf, cfg, task = tiny("mamba")
    assert hf.config.chunk_size == MAMBA_CHUNK
    ids = ids_for(task)  # 39 tokens: two whole chunks of 16 and a part, one padded chunk of 64, five and a part of 7
    with torch.no_grad():
        ref = hf(ids).logits
        for chunk in (64, 7):
            for mixer in (layer.mixer for layer in hf.backbone.layers):
                mixer.chunk_size = chunk
            torch.testing.assert_close(hf(ids).logits, ref, **TOL)


def test_context_mlp_hook_points_equal_a_per_position_loop():
    torch.manual_seed(0)
    W, d_e, d = 6, 3, 8
    model = ContextMLP(vocab_size=11, n_positions=W, d_embed=d_e, d_model=d, n_blocks=2, d_hidden=5).eval()
    ids = torch.randint(0, 11, (2, W))
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
        emb = model.wte.weight[ids]  # [2, W, d_e]
        for t in range(W):  # position t: zeros for the W - 1 - t slots before the sequence, then tokens 0..t
            window = torch.cat([torch.zeros(2, W - 1 - t, d_e), emb[:, : t + 1]], dim=1).reshape(2, W * d_e)
            torch.testing.assert_close(cache["blocks.0.hook_resid_pre"][:, t], model.window_proj(window), **TOL)
        h = cache["blocks.0.hook_resid_pre"]
        for layer, block in enumerate(model.blocks):
            ln, fc1, _, fc2 = (block._modules[k] for k in "0123")
            h = h + F.linear(F.gelu(F.linear(F.layer_norm(h, (d,), ln.weight, ln.bias), fc1.weight, fc1.bias)),
                             fc2.weight, fc2.bias)
            torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], h, **TOL)
        torch.testing.assert_close(logits, model.head(F.layer_norm(h, (d,), model.ln_f.weight, model.ln_f.bias)),
                                   **TOL)
        changed = ids.clone()
        changed[:, 3] = (changed[:, 3] + 1) % 11
        after = model(changed)
    torch.testing.assert_close(after[:, :3], logits[:, :3], rtol=0, atol=0)  # causal: the past does not see t = 3
    assert not torch.allclose(after[:, 3:], logits[:, 3:])  # ... and every later position does


def test_mlp_baseline_hook_points_and_the_committed_checkpoint():
    tunnel = open_tunnel("bijection-cpu-mlp")
    model, cfg = tunnel.model, tunnel.config
    task = make_task(cfg)
    ids = ids_for(task)
    with torch.no_grad():
        logits, cache = model.run_with_cache(ids)
        h = model.wte.weight[ids] + model.wpe.weight[: ids.shape[1]]
        torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], h, **TOL)
        for layer, block in enumerate(model.blocks):
            ln, fc1, _, fc2 = (block._modules[k] for k in "0123")
            h = h + fc2(F.gelu(fc1(ln(h))))
            torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], h, **TOL)
    assert isinstance(model, MLPBaseline)


def module_site(arch: str, model: nn.Module, site: str) -> tuple[nn.Module, str]:
    """The module whose output (or input: "pre") is the stream at ``site`` of layer 0: the edit a user would make
    without hook points."""
    if arch == "mamba":
        return (model.backbone.layers[0], "out") if site == "resid" else (model.backbone.embeddings, "out")
    if arch == "lstm":
        return model.blocks[0].lstm, "out" if site == "resid" else "pre"
    return model.blocks[0], "out" if site == "resid" else "pre"


@pytest.mark.parametrize("site", ["resid", "resid_pre"])
@pytest.mark.parametrize("arch", ARCHS)
def test_an_edit_at_a_hook_point_equals_the_same_edit_of_the_module(tmp_path, arch, site):
    model, cfg, task = tiny(arch)
    save_folder(model, cfg, task, tmp_path, {})
    hooked = ib.load_model(tmp_path)  # the bridge for Mamba; the same class for the others
    ids = ids_for(task)
    d = hooked.cfg.d_model
    op = ib.SubspaceCut(torch.randn(2, d, generator=torch.Generator().manual_seed(1)))
    module, where = module_site(arch, model, site)

    def out_hook(mod, args, output):
        return (op(output[0]), *output[1:]) if isinstance(output, tuple) else op(output)

    handle = (module.register_forward_pre_hook(lambda mod, args: (op(args[0]), *args[1:])) if where == "pre"
              else module.register_forward_hook(out_hook))
    with torch.no_grad():
        try:
            expected = model(ids)
        finally:
            handle.remove()
        expected = expected if isinstance(expected, torch.Tensor) else expected.logits
        plain = hooked(ids)
        with ib.intervene(hooked, {0: op}, site=site):
            edited = hooked(ids)
    torch.testing.assert_close(edited, expected, **TOL)
    assert (edited - plain).abs().max() > 1e-3  # the edit did something, so the equality above can fail


@pytest.mark.parametrize("arch", ARCHS)
def test_folder_round_trip_and_collect(tmp_path, arch):
    model, cfg, task = tiny(arch)
    save_folder(model, cfg, task, tmp_path, {})
    tunnel = open_tunnel(tmp_path)
    loaded, cfg2 = tunnel.model, tunnel.config
    assert cfg2 == cfg
    ids = ids_for(task)
    with torch.no_grad():
        out = model(ids)
        out = out if isinstance(out, torch.Tensor) else out.logits
        got, cache = loaded.run_with_cache(ids)
    assert torch.equal(got, out)
    prompts = [row[: task.seq_len(3)].tolist() for row in ids]
    acts = ib.collect(loaded, prompts, layers="all", readings=("resid", "resid_pre"), progress=False)
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(acts.reading("resid", layer), cache[f"blocks.{layer}.hook_resid_post"][:, task.seq_len(3) - 1], **TOL)
    torch.testing.assert_close(acts.reading("resid_pre", 0), cache["blocks.0.hook_resid_pre"][:, task.seq_len(3) - 1],
                               **TOL)
    assert acts.meta["model"]["n_params"] == n_params(model)


@pytest.mark.parametrize("task,preset", [(t, p) for t, ps in PRESETS.items() for p in ps if "paper" not in p])
def test_parameter_counts_match_the_transformer(task, preset):
    cfg = make_config(task, preset)
    the_task = make_task(cfg)
    target = n_params(build_transformer(cfg, the_task))
    for arch in ARCHS:
        model = build_model(make_config(task, preset, arch=arch), the_task)
        assert abs(n_params(model) - target) <= 0.02 * target, (arch, n_params(model), target)


@pytest.mark.slow
@pytest.mark.parametrize("task,preset", [(t, p) for t, ps in PRESETS.items() for p in ps if "paper" in p])
def test_parameter_counts_match_the_transformer_at_paper_size(task, preset):
    test_parameter_counts_match_the_transformer(task, preset)


def test_lstm_keeps_the_transformers_layer_count():
    cfg = make_config("hmm", "paper", arch="lstm")
    model = build_model(cfg, make_task(cfg))
    assert len(model.blocks) == cfg.n_layers == 9


@pytest.mark.parametrize("arch", ARCHS)
def test_train_cli_end_to_end(tmp_path, arch):
    out = tmp_path / arch
    assert main(["train", "bijection", "--preset", "tiny", "--arch", arch, "--steps", "3", "--out", str(out),
                 "--quiet", "--threads", "1"]) == 0
    meta = json.loads((out / "windtunnel.json").read_text())
    assert meta["config"]["arch"] == arch and meta["eval"]
    model = ib.load_model(out)
    assert n_params(model) == meta["n_params"]


class CollectingContext:
    """The two things ``kinds.windtunnel.windtunnel_set`` asks of a sweep: its layers and an activation set."""

    config = type("Config", (), {"layers": "all"})()

    def activations(self, label, prompts, *, subject, layers, readings, label_tokens):
        return ib.collect(subject.model, prompts, layers=layers, readings=readings, label_tokens=label_tokens,
                          progress=False)


@pytest.mark.parametrize("arch", ["lstm", "mamba"])
def test_the_windtunnel_prompt_set_of_the_probes_reads_any_architecture(tmp_path, arch):
    from interp_bayes.core.errors import ConfigError
    from interp_bayes.kinds.windtunnel import windtunnel_set

    model, cfg, task = tiny(arch)
    save_folder(model, cfg, task, tmp_path, {})
    wt = windtunnel_set(CollectingContext(), str(tmp_path), 3, 0, layers="all", readings=("resid", "resid_pre"))
    assert wt.layers == [0, 1]
    assert wt.acts.reading("resid_pre", 0).shape == (len(wt.prompts), wt.model.cfg.d_model)
    with pytest.raises(ConfigError, match="no attention"):  # the windtunnel kind's value vectors: refused, said why
        windtunnel_set(CollectingContext(), str(tmp_path), 3, 0, layers="all", readings=("v", "attn_entropy"))
