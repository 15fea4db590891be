"""Hugging Face's own modules wherever TransformerLens's bridge would re-derive a computation no hook observes.

To make ``hook_attn_scores``, ``hook_pattern``, ``hook_rot_q`` and friends fire, the bridge's attention recomputes
attention step by step in eager arithmetic, and its norms compute the normalisation twice (once for
``hook_scale`` / ``hook_normalized``, once through the HF module). ``run_native_when_unobserved`` gives those
components a forward that, while none of the component's *inner* hook points has a hook, runs the wrapped HF
module instead: the same weights and HF's own code (its default sdpa attention). The hook points that sit on a
component's edges or sub-layers still fire and can still edit on that path: ``hook_in`` / ``hook_out``, and for
attention ``hook_q`` / ``hook_k`` / ``hook_v`` (the projections' outputs) and ``hook_z`` (the output projection's
input), because HF's module calls the bridge's own projection components.

A hook on any inner point (``run_with_cache`` hooks them all), or TransformerLens's compatibility mode, sends that
component back to the bridge's own forward for that call, so those hooks see exactly what they always saw. Only
attention whose HF module holds separate q / k / v / o projections (Llama, Mistral, Qwen2, Phi, SmolLM2, ...)
qualifies; a fused qkv projection (GPT-NeoX / Pythia, GPT-2) keeps the bridge's attention, because HF's module
would never fire ``hook_v`` there.

A block whose components all qualify goes one step further (``NativeBlock``): while nothing anywhere inside it is
observed (no hook on any hook point, component or HF module of the block), it runs an unwrapped copy of its HF
layer, whose children are HF's own modules (the very same weights) instead of the bridge components around them.
That is HF's forward call for call, without the ~40 component and hook-point calls per layer that only matter when
somebody listens. The first hook anywhere in the block, ``stop_at_layer`` / ``start_at_layer`` at that block, or
anything that sends a component back to the bridge's forward, sends the whole block through the bridge for that
call.

Two more mixins drop per-call work of the bridge that does nothing here: ``Resident`` (no accelerate device context
around each component call when no weight is offloaded) and ``PassKwargs`` (a block whose HF layer takes
``**kwargs`` passes every keyword through without reading the layer's signature on each call).
"""

from __future__ import annotations

# TransformerLens (~5 s) and accelerate are imported inside the functions that patch a loaded bridge: this module
# is imported with ``model.loading``, which every command imports and most never load weights
import copy
import inspect
from typing import Any

import torch
from torch.nn.modules import module as torch_module

EDGES = ("hook_in", "hook_out")
# Config flags under which the bridge's component does something HF's module does not: split inputs, per-head
# results and gated queries for attention, folded weights for norms.
ATTENTION_BRIDGE_FLAGS = ("use_split_qkv_input", "use_attn_in", "use_attn_result", "gated_q_proj")
NORM_BRIDGE_FLAGS = ("layer_norm_folding",)
BRIDGE_FLAGS = ATTENTION_BRIDGE_FLAGS + NORM_BRIDGE_FLAGS


GLOBAL_HOOKS = (torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks,
                torch_module._global_backward_hooks, torch_module._global_backward_pre_hooks)


def _hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def inner_hooks_observed(component) -> bool:
    """Whether any hook point the component owns, other than its input and output, has a hook."""
    from transformer_lens.hook_points import HookPoint

    return any(_hooked(m) for name, m in component._modules.items()
               if isinstance(m, HookPoint) and name not in EDGES)


def _bridge_forward_needed(component, flags: tuple[str, ...]) -> bool:
    """Compatibility mode, one of ``flags`` set in the config, or an observed inner hook point."""
    return (getattr(component, "compatibility_mode", False) or any(getattr(component.config, f, False) for f in flags)
            or inner_hooks_observed(component))


class NativeAttention:
    """Mixed in before a bridge attention class: HF's attention module unless the bridge's forward is needed."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if _bridge_forward_needed(self, ATTENTION_BRIDGE_FLAGS):
            return super().forward(*args, **kwargs)
        if "hidden_states" in kwargs:
            hidden = kwargs.pop("hidden_states")
        else:
            hidden, *args = args
        output, weights = self.original_component(self.hook_in(hidden), *args, **kwargs)
        return self.hook_out(output), weights


class NativeNorm:
    """Mixed in before a bridge normalisation class: HF's norm unless ``hook_scale`` / ``hook_normalized`` (or
    another inner hook point) is observed, or the bridge's forward is otherwise needed."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if _bridge_forward_needed(self, NORM_BRIDGE_FLAGS):
            return super().forward(hidden_states, **kwargs)
        x = self.hook_in(hidden_states)
        return self.hook_out(self.original_component(x).to(x.dtype))


class NativeBlock:
    """Mixed in before a block bridge whose attention and norms are native: the unwrapped HF layer while nothing in
    the block is observed (module docstring), else the bridge's block forward."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        layer = _unobserved_layer(self)
        if layer is None:
            return super().forward(*args, **kwargs)
        kwargs = self._filter_kwargs_for_forward(kwargs, len(args))
        # The bridge's own output convention (a tuple for a standalone block(hidden) call); hook_out is unobserved.
        return self._apply_output_hook(layer(*args, **kwargs),
                                       force_tuple_for_bare_tensor=self._is_standalone_hidden_state_call(args, kwargs))


def _unwrap(module: torch.nn.Module, sources: list) -> torch.nn.Module:
    """``module`` with every bridge component in its subtree replaced by the HF module it wraps: shallow copies of
    the HF containers on the way (their parameter, buffer and hook dicts are the originals' own), the HF leaves
    themselves. ``sources`` collects (component, wrapped module) pairs, to notice a rewrapped component later."""
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

    if isinstance(module, GeneralizedComponent):
        inner = module._modules["_original_component"]
        sources.append((module, inner))
        return _unwrap(inner, sources)
    if not any(isinstance(m, GeneralizedComponent) for m in module.modules()):
        return module
    clone = copy.copy(module)
    clone._modules = {name: _unwrap(child, sources) for name, child in module._modules.items()}
    return clone


def _wire_unwrapped_layer(block) -> None:
    from transformer_lens.hook_points import HookPoint
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent

    block._maybe_wire_capture_hooks()  # TL's own input-capture hooks, installed now rather than on a first call
    sources: list = []
    layer = _unwrap(block._modules["_original_component"], sources)
    # What the unwrapped layer skips, so whose hooks would not fire: the block's components and hook points (HF's
    # modules keep theirs: the copies share the originals' hook dicts, the leaves are the originals).
    skipped = tuple(m for m in block.modules() if isinstance(m, (GeneralizedComponent, HookPoint)))
    configs = tuple({id(c.config): c.config for c in skipped if getattr(c, "config", None) is not None}.values())
    # Kept outside the module tree (object.__setattr__): the copies add no parameter, state-dict entry or child.
    object.__setattr__(block, "_native_layer", (layer, tuple(sources), skipped, configs))


def _unobserved_layer(block) -> torch.nn.Module | None:
    """The block's unwrapped HF layer, or None when the bridge's block forward is needed: a hook on any of the
    block's components or hook points (other than the block's own input-capture hooks, which only act for split-qkv
    inputs and hook_mlp_in) or a forward replaced on one of them (``prefix.per_copy``), a global module hook,
    stop/start_at_layer here, a traced call, or a component that needs its bridge forward (compatibility mode,
    processed weights, a config flag)."""
    # Read from the instance dict, where TransformerLens sets them: a getattr miss would go through the bridge's
    # attribute forwarding to the HF module (about 6 us, twice per block and forward, before any stop_at_layer).
    state = block.__dict__
    if (any(GLOBAL_HOOKS) or state.get("_stop_at_layer_idx") is not None
            or state.get("_start_at_layer_idx") is not None or torch._C._get_tracing_state()):
        return None
    layer, sources, skipped, configs = block._native_layer
    if any(component._modules.get("_original_component") is not inner for component, inner in sources):
        _wire_unwrapped_layer(block)
        layer, sources, skipped, configs = block._native_layer
    capture = {handle.id for handle in block._capture_hook_handles}
    if any(m._forward_hooks or m._backward_hooks or m._backward_pre_hooks or "forward" in m.__dict__
           or (m._forward_pre_hooks and not capture.issuperset(m._forward_pre_hooks)) for m in skipped):
        return None
    if any(c.__dict__.get("compatibility_mode") or c.__dict__.get("_use_processed_weights") for c, _ in sources):
        return None
    if any(getattr(config, flag, False) for config in configs for flag in BRIDGE_FLAGS):
        return None
    return layer


def _unwraps_to_hf(block, native: set[int]) -> bool:
    """Whether every bridge component that the block's HF layer calls is a pass-through when unobserved (native
    attention and norms, plain linear and MLP bridges), and no module there has an instance-level forward (as
    accelerate's dispatch hooks install), so that the unwrapped layer computes what the bridge's path computes."""
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent
    from transformer_lens.model_bridge.generalized_components.gated_mlp import GatedMLPBridge
    from transformer_lens.model_bridge.generalized_components.linear import LinearBridge
    from transformer_lens.model_bridge.generalized_components.mlp import MLPBridge

    hf = block._modules.get("_original_component")
    if hf is None:
        return False
    for module in hf.modules():
        if "forward" in module.__dict__:
            return False
        if isinstance(module, GeneralizedComponent) and not (
                id(module) in native or (type(module) in (LinearBridge, MLPBridge, GatedMLPBridge)
                                         and module.name is not None)):
            return False
    return True


class Resident:
    """Mixed into every bridge component when no weight is offloaded: TransformerLens wraps each component call in
    accelerate's ``align_module_device`` context, which only matters for offloaded weights."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.nn.Module.__call__(self, *args, **kwargs)


class PassKwargs:
    """Mixed into a block bridge whose HF layer takes ``**kwargs``: TransformerLens's filter then passes every keyword
    through, but reads the layer's signature on every call to find that out."""

    def _filter_kwargs_for_forward(self, kwargs: dict, num_positional_args: int = 0) -> dict:
        return kwargs


_MIXED: dict[tuple[type, type], type] = {}


def _mix(component, mixin: type) -> None:
    cls = type(component)
    if issubclass(cls, mixin):
        return
    if (mixin, cls) not in _MIXED:
        _MIXED[mixin, cls] = type(f"{mixin.__name__}{cls.__name__}", (mixin, cls), {"__module__": cls.__module__})
    component.__class__ = _MIXED[mixin, cls]


def _projections_are_hf_children(attn) -> bool:
    """Whether the HF attention module calls the bridge's own q, k, v and o components (so its forward fires
    hook_q / hook_k / hook_v / hook_z)."""
    hf = attn._modules.get("_original_component")
    if hf is None:
        return False
    children = {id(child) for child in hf.children()}
    return all(name in attn._modules and id(attn._modules[name]) in children for name in ("q", "k", "v", "o"))


def _takes_any_kwargs(block) -> bool:
    hf = block._modules.get("_original_component")
    return hf is not None and any(p.kind == inspect.Parameter.VAR_KEYWORD
                                  for p in inspect.signature(hf.forward).parameters.values())


def run_native_when_unobserved(bridge) -> dict:
    """Give ``bridge``'s qualifying attention and norm components the HF-native forward, and its blocks and
    components the two per-call shortcuts (see the module docstring); when every attention component qualifies,
    HF's attention runs as sdpa. Returns what was switched, for provenance."""
    from accelerate.utils import has_offloaded_params
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    from transformer_lens.model_bridge.generalized_components.base import GeneralizedComponent
    from transformer_lens.model_bridge.generalized_components.block import BlockBridge
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    components = [m for m in bridge.modules() if isinstance(m, GeneralizedComponent)]
    attention = [m for m in components if isinstance(m, AttentionBridge)]
    native_attention = [m for m in attention if _projections_are_hf_children(m)]
    norms = [m for m in components if isinstance(m, NormalizationBridge)
             and isinstance(m._modules.get("_original_component"), torch.nn.Module)
             and not isinstance(m._modules["_original_component"], torch.nn.Identity)]
    blocks = [m for m in components if isinstance(m, BlockBridge) and _takes_any_kwargs(m)]
    resident = not any(has_offloaded_params(m) for m in bridge.original_model.modules())
    native = {id(m) for m in native_attention + norms}
    unwrapped = [b for b in components if resident and isinstance(b, BlockBridge) and _unwraps_to_hf(b, native)]
    for group, mixin in ((native_attention, NativeAttention), (norms, NativeNorm), (blocks, PassKwargs),
                         (unwrapped, NativeBlock), (components if resident else [], Resident)):
        for component in group:
            _mix(component, mixin)
    for block in unwrapped:
        _wire_unwrapped_layer(block)
    if attention and len(native_attention) == len(attention):
        # The bridge's own attention (still used whenever an inner hook is observed) builds its causal mask when
        # HF passes none and applies HF's 4D masks (sliding window) as given, so it is exact under sdpa masks too.
        bridge.original_model.set_attn_implementation("sdpa")
    return dict(attention=len(native_attention), attention_total=len(attention), norms=len(norms),
                blocks_passing_kwargs=len(blocks), blocks_unwrapped=len(unwrapped), resident=resident)
