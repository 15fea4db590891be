"""The hooked interface against independent references: HF's own KV cache, HF logits and weight edits."""

import warnings

import pytest
import torch

from conftest import load_hf, value_edit

# The bridge splits GPT-2's fused Conv1D c_attn into three matmuls: equal up to float32 rounding, not bitwise.
TOLERANCE = {"gpt2": dict(rtol=1e-5, atol=1e-5)}
EXACT = dict(rtol=0, atol=0)
PROMPTS = ["the cat sat on the mat", "hello world 0 1 2 3", "in context learning with induction heads"]


def ids_of(bridge, text):
    return torch.tensor([bridge.tokenizer(text)["input_ids"]])


def cached_values(cache, layer):
    """Layer ``layer``'s values from HF's KV cache as [batch, pos, n_kv, d_head] (absorbs Cache API changes)."""
    v = cache.layers[layer].values if hasattr(cache, "layers") else cache[layer][1]
    return v.transpose(1, 2)


@torch.no_grad()
def test_hook_v_equals_hf_kv_cache_at_every_layer(tiny):
    bridge, hf, _ = tiny
    for text in (PROMPTS[0], PROMPTS[2]):  # shorter and longer than Mistral's sliding window of 16
        _check_against_cache(bridge, hf, ids_of(bridge, text))


def _check_against_cache(bridge, hf, ids):
    tol = TOLERANCE.get(hf.config.model_type, EXACT)
    cache = hf(ids, use_cache=True).past_key_values
    _, acts = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith("attn.hook_v"))
    n_kv = bridge.cfg.n_key_value_heads or bridge.cfg.n_heads
    for layer in range(bridge.cfg.n_layers):
        v = acts[f"blocks.{layer}.attn.hook_v"]
        assert v.shape == (1, ids.shape[1], n_kv, bridge.cfg.d_head)
        ref = cached_values(cache, layer)  # a sliding-window cache keeps only the last positions
        torch.testing.assert_close(v[:, -ref.shape[1]:], ref, **tol)
        assert ref.shape[1] >= min(ids.shape[1], 15)


@torch.no_grad()
def test_bridge_logits_equal_hf_eager(tiny):
    bridge, hf, _ = tiny
    ids = ids_of(bridge, PROMPTS[0])
    torch.testing.assert_close(bridge(ids), hf(ids).logits, **TOLERANCE.get(hf.config.model_type, EXACT))


@torch.no_grad()
def test_identity_hook_is_bit_exact_and_zeroing_is_live(tiny):
    bridge, _, _ = tiny
    ids = ids_of(bridge, PROMPTS[1])
    base = bridge(ids)
    names = [f"blocks.{layer}.attn.hook_v" for layer in range(bridge.cfg.n_layers)]
    with bridge.hooks(fwd_hooks=[(n, lambda v, hook: v.clone()) for n in names]):
        assert torch.equal(bridge(ids), base)
    with bridge.hooks(fwd_hooks=[(names[-1], lambda v, hook: torch.zeros_like(v))]):
        zeroed = bridge(ids)
    assert (zeroed - base).abs().max() > 1e-3
    assert torch.equal(bridge(ids), base)  # and nothing left behind


@torch.no_grad()
def test_projection_through_hook_equals_weight_edit(tiny):
    """Projecting u (in the concatenated kv-head space) out of hook_v at every position equals a model copy
    whose value weights and bias were pre-multiplied by (I - u u^T)."""
    bridge, _, folder = tiny
    layer = bridge.cfg.n_layers - 1
    n_kv = bridge.cfg.n_key_value_heads or bridge.cfg.n_heads
    dim = n_kv * bridge.cfg.d_head
    u = torch.randn(dim, generator=torch.Generator().manual_seed(1))
    u /= u.norm()

    def project_out(v, hook):  # [batch, pos, n_kv, d_head]
        flat = v.reshape(*v.shape[:2], -1)
        return (flat - (flat @ u)[..., None] * u).reshape(v.shape)

    ids = ids_of(bridge, PROMPTS[2])
    with bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_v", project_out)]):
        hooked = bridge(ids)

    edited = load_hf(folder, like=bridge)
    value_edit(edited, layer, torch.eye(dim) - torch.outer(u, u))
    expected = edited(ids).logits
    torch.testing.assert_close(hooked, expected, rtol=1e-5, atol=1e-5)
    assert (hooked - bridge(ids)).abs().max() > 1e-3  # the edit did something


def test_no_hook_remains_after_exception(tiny):
    bridge, _, _ = tiny
    name = f"blocks.{bridge.cfg.n_layers - 1}.attn.hook_v"
    with pytest.raises(RuntimeError, match="boom"):
        with bridge.hooks(fwd_hooks=[(name, lambda v, hook: v * 0)]):
            raise RuntimeError("boom")
    assert all(len(hp.fwd_hooks) == 0 for hp in bridge.hook_dict.values())


def test_attention_goes_native_only_where_hf_calls_the_bridges_projections(tiny):
    """Separate q/k/v/o projections (Llama, Mistral, Phi): HF's attention module, as sdpa. A fused qkv (GPT-NeoX,
    GPT-2): the bridge's own attention, eager. Every norm is switched either way."""
    from interp_bayes.model.loading import model_info

    bridge, hf, _ = tiny
    native = model_info(bridge).native
    separate = hf.config.model_type in ("llama", "mistral", "phi")
    assert native["attention_total"] == bridge.cfg.n_layers and native["norms"] == 2 * bridge.cfg.n_layers + 1 - (
        bridge.cfg.n_layers if hf.config.model_type == "phi" else 0)  # Phi's blocks have one norm
    assert native["attention"] == (bridge.cfg.n_layers if separate else 0)
    assert native["resident"] and native["blocks_passing_kwargs"] == bridge.cfg.n_layers  # nothing offloaded
    assert bridge.original_model.config._attn_implementation == ("sdpa" if separate else "eager")


@torch.no_grad()
def test_unobserved_blocks_run_hfs_layer_and_any_hook_sends_its_block_through_the_bridge(tiny):
    """Blocks whose components all go native run an unwrapped copy of HF's layer while nothing in them is observed
    (native.NativeBlock). Through the bridge's block forward (a hook on each block's input) the logits are
    bit-equal; a hook registered on a component, on an HF leaf, or globally is live; stop_at_layer still stops; the
    copies add no parameter."""
    from interp_bayes.model.loading import model_info

    bridge, hf, _ = tiny
    n = bridge.cfg.n_layers
    separate = hf.config.model_type in ("llama", "mistral", "phi")
    assert model_info(bridge).native["blocks_unwrapped"] == (n if separate else 0)
    weights = {id(p) for p in bridge.parameters()}
    for block in bridge.blocks[:n if separate else 0]:  # the copies hold the bridge's own weight tensors
        assert {id(p) for p in block._native_layer[0].parameters()} <= weights
    ids = ids_of(bridge, PROMPTS[2])
    base = bridge(ids)
    torch.testing.assert_close(base, hf(ids).logits, **TOLERANCE.get(hf.config.model_type, EXACT))
    with bridge.hooks(fwd_hooks=[(f"blocks.{layer}.hook_in", lambda x, hook: None) for layer in range(n)]):
        assert torch.equal(bridge(ids), base)  # every block through the bridge's forward: the same arithmetic

    mlp = bridge.blocks[1].mlp
    handle = mlp.register_forward_hook(lambda module, args, out: out * 0)  # on the bridge component itself
    assert not torch.equal(bridge(ids), base)
    handle.remove()
    leaf = next(m for m in mlp.modules() if type(m) in (torch.nn.Linear, torch.nn.Conv1d)
                or type(m).__name__ == "Conv1D")  # an HF module the unwrapped layer shares
    handle = leaf.register_forward_hook(lambda module, args, out: out * 0)
    assert not torch.equal(bridge(ids), base)
    handle.remove()
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: seen.append(module))
    try:
        bridge(ids)
    finally:
        handle.remove()
    assert any(m is mlp for m in seen)  # a global hook sees the bridge's components
    assert torch.equal(bridge(ids), base)

    kept = {}
    with bridge.hooks(fwd_hooks=[("blocks.0.hook_out", lambda x, hook: kept.setdefault("resid", x.clone()))]):
        bridge(ids)
    assert torch.equal(bridge(ids, stop_at_layer=1), kept["resid"])


@torch.no_grad()
def test_incremental_decoding_with_a_kv_cache_gives_hfs_logits(tiny, request):
    """Token by token with HF's KV cache, through the model the bridge wraps: unwrapped blocks, and (a hook on every
    block's input) the bridge's own blocks, give HF's own logits at every step (24 tokens: past Mistral's sliding
    window of 16)."""
    bridge, hf, _ = tiny
    if hf.config.model_type == "gpt2":
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "TransformerLens's own GPT-2 attention (a plain bridge, without native.py, too) ignores HF's KV cache: "
            "the second step's logits differ from HF's by about 6. Decode GPT-2 with the HF model, not through the "
            "bridge; ib.collect and the probes never use a cache.")))
    ids = torch.randint(0, hf.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))

    def steps(model):
        out = model(ids[:, :4], use_cache=True)
        logits = [out.logits[:, -1]]
        for t in range(4, ids.shape[1]):
            out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits[:, -1])
        return torch.stack(logits)

    reference = steps(hf)
    tolerance = TOLERANCE.get(hf.config.model_type, EXACT)
    torch.testing.assert_close(steps(bridge.original_model), reference, **tolerance)
    with bridge.hooks(fwd_hooks=[(f"blocks.{layer}.hook_in", lambda x, hook: None)
                                 for layer in range(bridge.cfg.n_layers)]):
        torch.testing.assert_close(steps(bridge.original_model), reference, **tolerance)


@torch.no_grad()
def test_observed_inner_hooks_run_the_bridges_own_forward(tiny):
    """A hook on hook_pattern / hook_attn_scores / hook_scale sends that component back to the bridge's step-by-step
    forward: the pattern fires (rows sum to 1), an observing hook leaves the logits equal to the native ones up to
    eager-vs-sdpa rounding, an editing hook is live, and nothing stays switched afterwards."""
    bridge, _, _ = tiny
    ids = ids_of(bridge, PROMPTS[2])
    base = bridge(ids)
    last = bridge.cfg.n_layers - 1
    _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith(("hook_pattern", "ln_final.hook_scale")))
    pattern = cache[f"blocks.{last}.attn.hook_pattern"]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
    assert cache["ln_final.hook_scale"].shape[:2] == ids.shape
    with bridge.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: None)
                                 for layer in range(bridge.cfg.n_layers)]):
        torch.testing.assert_close(bridge(ids), base, rtol=1e-5, atol=1e-5)

    def self_only(scores, hook):  # every query attends to itself alone
        eye = torch.eye(scores.shape[-1], dtype=torch.bool)
        return scores.masked_fill(~eye, float("-inf"))

    with bridge.hooks(fwd_hooks=[(f"blocks.{last}.attn.hook_attn_scores", self_only)]):
        assert (bridge(ids) - base).abs().max() > 1e-3
    with warnings.catch_warnings(), bridge.hooks(fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: 2 * x)]):
        warnings.simplefilter("ignore")  # TransformerLens says the edited norm is recomputed: that is the point
        assert (bridge(ids) - base).abs().max() > 1e-3
    assert torch.equal(bridge(ids), base)
