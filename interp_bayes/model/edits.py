"""Edit operators on an axis or subspace of value space inside the forward pass, and the hooks that apply them
(Paper III §4.6, methods §3.8).

Operators act on ``blocks.L.attn.hook_v`` at every position, in the concatenated key/value-head space of layer L
(``n_kv_heads * d_head``: the native GQA space, not the repeated per-query-head one), before attention mixes the
values; u is a unit vector there:

- ``AxisCut(u, scale=0)``: v - (1 - scale)(v.u)u   (scale 1 is the identity; 0 removes the component)
- ``AxisOnly(u)``: (v.u)u
- ``AxisShift(u, sigma, delta_sigma=1)``: v + delta_sigma * sigma * u
- ``AxisSet(u, targets)``: v - (v.u)u + c u, with c a per-prompt, per-position target: the on-manifold ablations
  (``resample``: another prompt's component, as in causal scrubbing; ``mean``: the stratum's mean component), whose
  values stay among those the data gives. It needs to know which prompts a batch holds: ``bind(index)``.

Their k-dimensional generalisations, ``SubspaceCut(basis)`` (v - Pv) and ``SubspaceOnly(basis)`` (Pv), with P the
orthogonal projector onto the span of a [k, dim] basis, act at any of four sites (``site=`` of ``intervene``):
``"v"`` (``hook_v``), ``"z"`` (the attention output per query head, ``hook_z``), ``"resid"`` (the residual stream
after the block, ``hook_resid_post``) or ``"resid_pre"`` (entering it, ``hook_resid_pre``; at layer 0 the embedding
output).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from ..core.errors import InterventionError
from ..core.layers import layer_index
from .hooks import reading_hook

# the edit sites, hooked where the reading of the same name is taken (``model.hooks.reading_hook``): hook_v
# [batch, pos, n_kv_heads, d_head], hook_z [batch, pos, n_heads, d_head], hook_resid_post / hook_resid_pre
# [batch, pos, d_model]
SITES = ("v", "z", "resid", "resid_pre")


def site_dim(model, site: str) -> int:
    """The flattened width of an edit site: n_kv * d_head for "v", n_heads * d_head for "z", d_model for "resid"
    and "resid_pre"."""
    cfg = model.cfg
    dims = {"v": (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head, "z": cfg.n_heads * cfg.d_head,
            "resid": cfg.d_model, "resid_pre": cfg.d_model}
    if site not in dims:
        raise InterventionError(f"Unknown edit site '{site}'; choose from {', '.join(SITES)}.")
    return dims[site]


def unit_direction(direction) -> torch.Tensor:
    u = getattr(direction, "direction", direction)
    u = torch.as_tensor(u, dtype=torch.float32)
    return u / u.norm()


def _init_direction(op) -> None:
    """Normalise an operator's direction (a tensor, array or EntropyAxis) and take the axis' layer when given one."""
    if op.layer is None:
        object.__setattr__(op, "layer", getattr(op.direction, "layer", None))
    object.__setattr__(op, "direction", unit_direction(op.direction))


def _flat(v: torch.Tensor, dim: int) -> torch.Tensor:
    """[..., heads, d_head] -> [..., heads * d_head] when that is the edit's width; [..., dim] stays as it is."""
    return v.reshape(*v.shape[:-2], -1) if v.dim() >= 3 and v.shape[-1] != dim and v.shape[-2] * v.shape[-1] == dim \
        else v


def _along(v: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten [..., n_kv, d_head] to [..., dim] and return it with the component (v.u) along u."""
    flat = _flat(v, u.numel())
    uu = u.to(v.dtype).to(v.device)
    return flat, (flat @ uu)[..., None] * uu


@dataclass(frozen=True, eq=False)
class AxisCut:
    """v - (1 - scale)(v.u)u: scale 0 removes the axis, 1 leaves v as it is."""

    direction: torch.Tensor
    scale: float = 0.0
    layer: int | None = None  # the layer the axis was fitted at (taken from an EntropyAxis); checked by intervene

    def __post_init__(self) -> None:
        _init_direction(self)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        flat, par = _along(v, self.direction)
        return (flat - (1.0 - self.scale) * par).reshape(v.shape)


@dataclass(frozen=True, eq=False)
class AxisOnly:
    """(v.u)u: keep only the component along the axis."""

    direction: torch.Tensor
    layer: int | None = None

    def __post_init__(self) -> None:
        _init_direction(self)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return _along(v, self.direction)[1].reshape(v.shape)


@dataclass(frozen=True, eq=False)
class AxisShift:
    """v + delta_sigma * sigma * u: move every value along the axis by delta_sigma standard deviations."""

    direction: torch.Tensor
    sigma: float
    delta_sigma: float = 1.0
    layer: int | None = None

    def __post_init__(self) -> None:
        _init_direction(self)

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        flat, _ = _along(v, self.direction)
        step = (self.delta_sigma * self.sigma) * self.direction.to(v.dtype).to(v.device)
        return (flat + step).reshape(v.shape)


def orthonormal_rows(basis, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[k, dim] -> an orthonormal basis of the same span (QR in float64), in ``dtype``; a rank-deficient basis is
    refused."""
    b = torch.as_tensor(getattr(basis, "direction", basis), dtype=torch.float64)
    b = b[None] if b.dim() == 1 else b
    q, r = torch.linalg.qr(b.T)
    if (r.diagonal().abs() <= 1e-10 * r.diagonal().abs().max()).any():
        raise InterventionError(f"The {b.shape[0]} basis vectors span fewer dimensions than there are vectors; "
                                "pass linearly independent rows.")
    return q.T.to(dtype).contiguous()


@dataclass(frozen=True, eq=False)
class _SubspaceEdit:
    basis: torch.Tensor  # [k, dim], orthonormalised here
    layer: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "basis", orthonormal_rows(self.basis))

    def _split(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(v flattened to the basis' width, its projection Pv onto the span)."""
        q = self.basis.to(v.dtype).to(v.device)  # [k, dim]
        flat = _flat(v, q.shape[1])
        return flat, (flat @ q.T) @ q


class SubspaceCut(_SubspaceEdit):
    """v - Pv: remove the span of ``basis`` ([k, dim], orthonormalised here) from every vector at the site."""

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        flat, proj = self._split(v)
        return (flat - proj).reshape(v.shape)


class SubspaceOnly(_SubspaceEdit):
    """Pv: keep only the component in the span of ``basis`` ([k, dim], orthonormalised here)."""

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return self._split(v)[1].reshape(v.shape)


@dataclass(frozen=True, eq=False)
class AxisSet:
    """v - (v.u)u + c u: the component along u set to ``targets``, one [len_i] tensor per prompt (in the order of
    the prompt list the edit runs on, aligned with its tokens; NaN leaves that position as it is). A batch's rows
    are prompts whose indices only the caller knows, so the operator acts once bound to them (``bind``):
    ``model.prefix.edited_runs`` binds it per batch; by hand, ``intervene(model, {L: op.bind(range(n))})`` for a
    batch of the first n prompts."""

    direction: torch.Tensor
    targets: tuple  # [n_prompts] float32 tensors [len_i]
    layer: int | None = None
    rows: tuple[int, ...] | None = None  # the prompt indices of the batch's rows, once bound

    def __post_init__(self) -> None:
        _init_direction(self)
        object.__setattr__(self, "targets", tuple(torch.as_tensor(t, dtype=torch.float32) for t in self.targets))

    def bind(self, index: Sequence[int]) -> "AxisSet":
        """The same operator for a batch whose rows are the prompts ``index`` (the direction is not renormalised)."""
        out = object.__new__(AxisSet)
        for name, value in (("direction", self.direction), ("targets", self.targets), ("layer", self.layer),
                            ("rows", tuple(int(i) for i in index))):
            object.__setattr__(out, name, value)
        return out

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            raise InterventionError("This AxisSet sets a different value for every prompt but does not know which "
                                    "prompts the batch holds; bind it first (op.bind(prompt indices of the rows)).")
        u = self.direction.to(v.dtype).to(v.device)
        flat = v.reshape(*v.shape[:2], -1)  # [batch, pos, dim] at every site (also with a single KV head)
        par = (flat @ u)[..., None] * u
        lengths = {len(self.targets[i]) for i in self.rows}
        if len(self.rows) != flat.shape[0] or lengths != {flat.shape[1]}:
            raise InterventionError(f"The edit is bound to {len(self.rows)} prompts of {sorted(lengths)} tokens but "
                                    f"the batch has {flat.shape[0]} rows of {flat.shape[1]} tokens; bind it to the "
                                    "indices of the prompts in this batch.")
        c = torch.stack([self.targets[i] for i in self.rows]).to(device=v.device, dtype=v.dtype)[..., None]
        edited = flat - par + c * u
        return torch.where(torch.isnan(c), flat, edited).reshape(v.shape)


def bind_edit(op, index: Sequence[int]):
    """``op`` bound to a batch of the prompts ``index`` where it needs to know them (``AxisSet``), else ``op``."""
    return op.bind(index) if hasattr(op, "bind") else op


def components(values: Sequence[torch.Tensor], direction) -> list[torch.Tensor]:
    """Per prompt, the component v.u at every position ([len_i] float32, computed in float64) of its values
    ``values[i]`` [len_i, dim] (``model.collect.token_values``)."""
    u = unit_direction(direction).double()
    return [(torch.as_tensor(v).double() @ u).float() for v in values]


def resample_targets(comps: Sequence[torch.Tensor], donors) -> list[torch.Tensor]:
    """Per prompt i, prompt ``donors[i]``'s components aligned from the end (the final tokens match, as the query
    does); positions before the donor's first token are NaN (left as they are)."""
    out = []
    for i, d in enumerate(np.asarray(donors).tolist()):
        own, src = len(comps[i]), comps[d]
        m = min(own, len(src))
        t = torch.full((own,), float("nan"))
        t[own - m:] = src[len(src) - m:]
        out.append(t)
    return out


def stratum_mean_targets(comps: Sequence[torch.Tensor], strata) -> list[torch.Tensor]:
    """Per prompt, the mean component of its stratum's prompts at each position counted from the end (float64
    mean, over the prompts long enough to have that position; the prompt itself always does)."""
    strata = np.asarray(strata)
    out: list[torch.Tensor] = [torch.empty(0)] * len(comps)
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s).tolist()
        width = max(len(comps[i]) for i in members)
        padded = torch.full((len(members), width), float("nan"), dtype=torch.float64)
        for r, i in enumerate(members):
            padded[r, width - len(comps[i]):] = comps[i].double()
        mean = padded.nanmean(0).float()
        for i in members:
            out[i] = mean[width - len(comps[i]):].clone()
    return out


OPS = ("cut", "only", "shift+", "shift-")
ONMANIFOLD_OPS = ("resample", "mean")  # AxisSet ops: values the data gives (``onmanifold_op``)


def make_op(kind: str, direction, sigma: float):
    """An operator by name: ``cut``, ``only``, ``shift+`` (+1 sigma) or ``shift-`` (-1 sigma)."""
    if kind == "cut":
        return AxisCut(direction)
    if kind == "only":
        return AxisOnly(direction)
    if kind in ("shift+", "shift-"):
        return AxisShift(direction, sigma, 1.0 if kind == "shift+" else -1.0)
    raise InterventionError(f"Unknown intervention '{kind}'; choose from {', '.join(OPS + ONMANIFOLD_OPS)}.")


def onmanifold_op(kind: str, direction, values: Sequence[torch.Tensor], strata, donors) -> AxisSet:
    """An on-manifold ablation of the component along ``direction`` for the prompts whose values at the edited site
    are ``values`` ([len_i, dim] per prompt): ``resample`` sets it to the component of prompt ``donors[i]``
    (``stats.donors_within``: the same stratum, never the prompt itself), ``mean`` to the mean component of the
    prompt's stratum, position by position from the end."""
    comps = components(values, direction)
    if kind == "resample":
        return AxisSet(direction, resample_targets(comps, donors))
    if kind == "mean":
        return AxisSet(direction, stratum_mean_targets(comps, strata))
    raise InterventionError(f"Unknown on-manifold intervention '{kind}'; choose from {', '.join(ONMANIFOLD_OPS)}.")


def _check_edit(model, idx: int, op, site: str, allow_layer_mismatch: bool) -> None:
    """Refuse an axis fitted at another layer, and a direction of the wrong size, with one sentence each."""
    fitted = getattr(op, "layer", None)
    if fitted is not None and fitted != idx and not allow_layer_mismatch:
        raise InterventionError(f"The axis was fitted at layer {fitted} but would be applied at layer {idx}; apply it "
                                "where it was fitted, or pass allow_layer_mismatch=True to do this on purpose.")
    vectors = getattr(op, "direction", getattr(op, "basis", None))
    dim = site_dim(model, site)
    if vectors is not None and vectors.shape[-1] != dim:
        cfg = model.cfg
        shape = {"v": f"{cfg.n_key_value_heads or cfg.n_heads} KV heads x {cfg.d_head} = {dim}",
                 "z": f"{cfg.n_heads} heads x {cfg.d_head} = {dim}", "resid": f"d_model = {dim}",
                 "resid_pre": f"d_model = {dim}"}[site]
        raise InterventionError(f"The direction has {vectors.shape[-1]} numbers but {reading_hook(site, idx)} "
                                f"has {shape}; fit the axis on this model's readings at that site.")


def resolve_edits(model, edits: dict[int, Callable[[torch.Tensor], torch.Tensor]], *, site: str = "v",
                  allow_layer_mismatch: bool = False) -> dict[int, Callable[[torch.Tensor], torch.Tensor]]:
    """``edits`` keyed by non-negative layer index, after refusing a layer out of range, an axis fitted at another
    layer (unless ``allow_layer_mismatch``) and a direction of the wrong size for ``site``."""
    n = model.cfg.n_layers
    out = {}
    for layer, op in edits.items():
        idx = layer_index(layer, n, error=InterventionError)
        _check_edit(model, idx, op, site, allow_layer_mismatch)
        out[idx] = op
    return out


@contextmanager
def intervene(model, edits: dict[int, Callable[[torch.Tensor], torch.Tensor]], *, site: str = "v",
              allow_layer_mismatch: bool = False) -> Iterator:
    """Apply ``edits[layer]`` at ``site`` of each layer (negative: from the end) at every position: ``"v"`` (hook_v,
    the default), ``"z"`` (hook_z) or ``"resid"`` (hook_resid_post). The hooks are removed on exit, also after an
    exception. An operator built from an ``EntropyAxis`` remembers the axis' layer, and applying it at another layer
    is refused unless ``allow_layer_mismatch`` is set."""
    resolved = resolve_edits(model, edits, site=site, allow_layer_mismatch=allow_layer_mismatch)
    hooks = [(reading_hook(site, idx), lambda v, hook, op=op: op(v)) for idx, op in resolved.items()]
    with model.hooks(fwd_hooks=hooks):
        yield model
