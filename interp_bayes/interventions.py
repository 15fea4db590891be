"""Interventions on an axis of value space inside the forward pass, and their controls (Paper III §4.6, methods §3.8).

Operators act on ``blocks.L.attn.hook_v`` at every position, in the concatenated key/value-head space of layer L
(``n_kv_heads * d_head``: the native GQA space, not the repeated per-query-head one), before attention mixes the
values; u is a unit vector there:

- ``AxisCut(u, scale=0)``: v - (1 - scale)(v.u)u   (scale 1 is the identity; 0 removes the component)
- ``AxisOnly(u)``: (v.u)u
- ``AxisShift(u, sigma, delta_sigma=1)``: v + delta_sigma * sigma * u

Their k-dimensional generalisations, ``SubspaceCut(basis)`` (v - Pv) and ``SubspaceOnly(basis)`` (Pv), with P the
orthogonal projector onto the span of a [k, dim] basis, act at any of three sites (``site=`` of ``intervene``):
``"v"`` (``hook_v``), ``"z"`` (the attention output per query head, ``hook_z``) or ``"resid"`` (the residual stream
after the block, ``hook_resid_post``).

Controls, each a seeded family of draws (one generator per (seed, family, layer, draw)):

- ``isotropic``: Gaussian directions orthogonalised against the true axis (the paper's control; such a direction
  carries about 1/d of the variance, so it is weak);
- ``matched``: random directions orthogonal to the true axis with exactly the true axis' projected variance
  (a rotation between a direction drawn in the top principal subspace and an isotropic one);
- ``pcs``: the other leading principal components (2..k), as raw-space readouts like the PC1 axis.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from .errors import InterventionError
from .geometry import as_float64, pca
from .stats import bootstrap, interval, percentile_of
from .prefix import HOOK_V, EditedRun, edited_runs

SITES = {"v": HOOK_V,  # [batch, pos, n_kv_heads, d_head]
         "z": "blocks.{layer}.attn.hook_z",  # [batch, pos, n_heads, d_head]
         "resid": "blocks.{layer}.hook_resid_post"}  # [batch, pos, d_model]


def site_dim(model, site: str) -> int:
    """The flattened width of an edit site: n_kv * d_head for "v", n_heads * d_head for "z", d_model for "resid"."""
    cfg = model.cfg
    dims = {"v": (cfg.n_key_value_heads or cfg.n_heads) * cfg.d_head, "z": cfg.n_heads * cfg.d_head,
            "resid": cfg.d_model}
    if site not in dims:
        raise InterventionError(f"Unknown edit site '{site}'; choose from {', '.join(SITES)}.")
    return dims[site]


def _unit(direction) -> torch.Tensor:
    u = getattr(direction, "direction", direction)
    u = torch.as_tensor(u, dtype=torch.float32)
    return u / u.norm()


def _init_direction(op) -> None:
    """Normalise an operator's direction (a tensor, array or EntropyAxis) and take the axis' layer when given one."""
    if op.layer is None:
        object.__setattr__(op, "layer", getattr(op.direction, "layer", None))
    object.__setattr__(op, "direction", _unit(op.direction))


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


def _orthonormal_rows(basis, dtype: torch.dtype = torch.float32) -> torch.Tensor:
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
class SubspaceCut:
    """v - Pv: remove the span of ``basis`` ([k, dim], orthonormalised here) from every vector at the site."""

    basis: torch.Tensor
    layer: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "basis", _orthonormal_rows(self.basis))

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        q = self.basis.to(v.dtype).to(v.device)  # [k, dim]
        flat = _flat(v, q.shape[1])
        return (flat - (flat @ q.T) @ q).reshape(v.shape)


@dataclass(frozen=True, eq=False)
class SubspaceOnly:
    """Pv: keep only the component in the span of ``basis`` ([k, dim], orthonormalised here)."""

    basis: torch.Tensor
    layer: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "basis", _orthonormal_rows(self.basis))

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        q = self.basis.to(v.dtype).to(v.device)
        return ((_flat(v, q.shape[1]) @ q.T) @ q).reshape(v.shape)


OPS = ("cut", "only", "shift+", "shift-")


def make_op(kind: str, direction, sigma: float):
    """An operator by name: ``cut``, ``only``, ``shift+`` (+1 sigma) or ``shift-`` (-1 sigma)."""
    if kind == "cut":
        return AxisCut(direction)
    if kind == "only":
        return AxisOnly(direction)
    if kind in ("shift+", "shift-"):
        return AxisShift(direction, sigma, 1.0 if kind == "shift+" else -1.0)
    raise InterventionError(f"Unknown intervention '{kind}'; choose from {', '.join(OPS)}.")


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
                 "z": f"{cfg.n_heads} heads x {cfg.d_head} = {dim}", "resid": f"d_model = {dim}"}[site]
        raise InterventionError(f"The direction has {vectors.shape[-1]} numbers but {SITES[site].format(layer=idx)} "
                                f"has {shape}; fit the axis on this model's readings at that site.")


def resolve_edits(model, edits: dict[int, Callable[[torch.Tensor], torch.Tensor]], *, site: str = "v",
                  allow_layer_mismatch: bool = False) -> dict[int, Callable[[torch.Tensor], torch.Tensor]]:
    """``edits`` keyed by non-negative layer index, after refusing a layer out of range, an axis fitted at another
    layer (unless ``allow_layer_mismatch``) and a direction of the wrong size for ``site``."""
    n = model.cfg.n_layers
    out = {}
    for layer, op in edits.items():
        idx = layer + n if layer < 0 else layer
        if not 0 <= idx < n:
            raise InterventionError(f"Layer {layer} is out of range for a model with {n} layers.")
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
    hooks = [(SITES[site].format(layer=idx), lambda v, hook, op=op: op(v)) for idx, op in resolved.items()]
    with model.hooks(fwd_hooks=hooks):
        yield model


def _generator(seed: int, family: str, layer: int, draw: int) -> np.random.Generator:
    """One generator per (seed, family, layer, draw); a negative layer index is a distinct non-negative word."""
    return np.random.default_rng(np.random.SeedSequence([seed % 2**32, sum(map(ord, family)), layer % 2**32, draw]))


def _orthogonal(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    v = v - (v @ u) * u
    return v / np.linalg.norm(v)


def isotropic_axes(u, n: int, *, layer: int, seed: int) -> np.ndarray:
    """[n, dim] Gaussian unit directions orthogonal to ``u``."""
    u = as_float64(_unit(u))
    return np.stack([_orthogonal(_generator(seed, "isotropic", layer, i).standard_normal(len(u)), u) for i in range(n)])


def matched_axes(values, u, n: int, *, layer: int, seed: int, top: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """([n, dim] unit directions orthogonal to ``u``, [n] their projected variance / u's) over ``values``.

    Each draw rotates a random direction g of the top-``top`` principal subspace orthogonal to u (variance >= the
    target) towards an isotropic h orthogonal to both (variance below it; drawn among the weakest directions when an
    isotropic one is above the target) until the variance matches, by bisection.
    When no direction orthogonal to u carries u's variance (u is the top principal direction), each draw is a
    random direction in the top three principal directions orthogonal to u: as strong as the data allows, still
    distinct draws, and the ratio, below 1, says so.
    """
    x = as_float64(values)
    x = x - x.mean(axis=0)
    u = as_float64(_unit(u))
    proj = np.eye(len(u)) - np.outer(u, u)
    cov = x.T @ x / (len(x) - 1)
    target = u @ cov @ u
    evals, vecs = np.linalg.eigh(proj @ cov @ proj)  # variance orthogonal to u, ascending
    feasible = evals[-1] >= target
    basis = vecs[:, ::-1][:, :top if feasible else 3]
    out = []
    for i in range(n):
        rng = _generator(seed, "matched", layer, i)
        g = _orthogonal(basis @ rng.standard_normal(basis.shape[1]), u)
        if not feasible:
            out.append(g)
            continue
        if g @ cov @ g < target:
            g = vecs[:, -1]  # the strongest direction orthogonal to u carries at least the target
        h = _orthogonal(_orthogonal(rng.standard_normal(len(u)), u), g)
        if h @ cov @ h > target:  # an isotropic direction is too strong here: rotate towards the weakest ones
            h = _orthogonal(_orthogonal(vecs[:, 1:4] @ rng.standard_normal(3), u), g)
        lo, hi = 0.0, np.pi / 2
        for _ in range(60):
            mid = (lo + hi) / 2
            r = np.cos(mid) * g + np.sin(mid) * h
            lo, hi = (mid, hi) if r @ cov @ r > target else (lo, mid)
        out.append(np.cos(lo) * g + np.sin(lo) * h)
    out = np.stack(out)
    return out, np.einsum("nd,de,ne->n", out, cov, out) / target


def _orthonormalise(frame: np.ndarray, against: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``frame`` [k, dim] made orthonormal (QR), first orthogonal to the orthonormal rows of ``against``."""
    if against is not None:
        frame = frame - (frame @ against.T) @ against
    return np.linalg.qr(frame.T)[0].T


def isotropic_subspaces(basis, n: int, *, layer: int, seed: int) -> np.ndarray:
    """[n, k, dim] Gaussian k-dimensional frames orthogonal to the span of ``basis`` ([k, dim])."""
    q = _orthonormal_rows(basis, torch.float64).numpy()
    return np.stack([_orthonormalise(_generator(seed, "isotropic-subspace", layer, i).standard_normal(q.shape),
                                     q) for i in range(n)])


def matched_subspaces(values, basis, n: int, *, layer: int, seed: int, top: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """([n, k, dim] orthonormal frames orthogonal to span(basis), [n] their total projected variance / the true
    subspace's) over ``values``: the k-dimensional version of ``matched_axes``.

    Each draw rotates a random k-frame G of the top principal subspace orthogonal to the true one towards an
    isotropic frame H orthogonal to both (cos t G + sin t H stays orthonormal) until the total variance matches, by
    bisection (H is drawn among the weakest directions instead when an isotropic frame is above the target); when even
    the strongest orthogonal k-frame carries less than the target, the draw is a random frame in the top k + 2
    orthogonal principal directions and the ratio, below 1, says so."""
    x = as_float64(values)
    x = x - x.mean(axis=0)
    q = _orthonormal_rows(basis, torch.float64).numpy()
    k, d = q.shape
    cov = x.T @ x / (len(x) - 1)
    target = np.trace(q @ cov @ q.T)
    proj = np.eye(d) - q.T @ q
    evals, vecs = np.linalg.eigh(proj @ cov @ proj)
    feasible = evals[::-1][:k].sum() >= target
    top_dirs = vecs[:, ::-1][:, :max(top, k) if feasible else k + 2]  # [d, m]
    variance = lambda f: np.trace(f @ cov @ f.T)  # noqa: E731
    out = []
    for i in range(n):
        rng = _generator(seed, "matched-subspace", layer, i)
        g = _orthonormalise(rng.standard_normal((k, top_dirs.shape[1])) @ top_dirs.T, q)
        if not feasible:
            out.append(g)
            continue
        if variance(g) < target:
            g = vecs[:, ::-1][:, :k].T  # the strongest orthogonal k-frame carries at least the target
        h = _orthonormalise(rng.standard_normal((k, d)), np.vstack([q, g]))
        if variance(h) > target:  # an isotropic frame is too strong here: rotate towards the weakest directions
            h = _orthonormalise(rng.standard_normal((k, k + 2)) @ vecs[:, k:2 * k + 2].T, np.vstack([q, g]))
        lo, hi = 0.0, np.pi / 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if variance(np.cos(mid) * g + np.sin(mid) * h) > target else (lo, mid)
        out.append(np.cos(lo) * g + np.sin(lo) * h)
    out = np.stack(out)
    return out, np.array([variance(f) for f in out]) / target


def pc_axes(values, k: int = 4) -> np.ndarray:
    """[k-1, dim] principal components 2..k of the standardised values, carried back to raw space as readouts."""
    x = as_float64(values)
    sd = x.std(axis=0, ddof=1)
    _, comps, _ = pca(x)
    dirs = comps[1:k] / np.where(sd > 0, sd, 1.0)
    return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)


ControlDraw = Callable[..., tuple[np.ndarray, np.ndarray | None]]

# The control families, each drawn per layer: name -> draw(fit values, true axis u, n, layer=, seed=) returning
# ([n, dim] unit directions, [n] their projected variance / u's, or None where the family does not match variance).
# Adding a family is one entry; run_interventions takes family -> number of draws.
CONTROL_FAMILIES: dict[str, ControlDraw] = {
    "isotropic": lambda values, u, n, *, layer, seed: (isotropic_axes(u, n, layer=layer, seed=seed), None),
    "matched": lambda values, u, n, *, layer, seed: matched_axes(values, u, n, layer=layer, seed=seed),
    "pcs": lambda values, u, n, *, layer, seed: (pc_axes(values, n + 1), None),
}
FULL_CONTROLS = {"isotropic": 20, "matched": 20, "pcs": 3}  # the paper's protocol


def control_directions(values, u, controls: dict[str, int], *, layer: int,
                       seed: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """family -> ([n, dim] control directions, [n] variance ratios or None) for one layer, for every family of
    ``controls`` (name -> number of draws) with at least one draw."""
    unknown = sorted(set(controls) - set(CONTROL_FAMILIES))
    if unknown:
        raise InterventionError(f"Unknown control famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                                f"choose from {', '.join(CONTROL_FAMILIES)}.")
    return {fam: CONTROL_FAMILIES[fam](values, u, n, layer=layer, seed=seed) for fam, n in controls.items() if n > 0}


@dataclass
class InterventionResult:
    """One row per (layer set, operator, axis kind, draw), the per-prompt baseline, and the forward-pass count."""

    rows: list[dict]
    baseline: dict
    n_forward_prompts: int
    true_entropy: dict  # (layer set, op) -> [n] model entropy under the true-axis edit, for bootstrap intervals

    def table(self):
        """The rows as a pandas DataFrame (tidy: one measurement set per row)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def figure(self, metric: str = "mae_k_ge_1"):
        """Plotly strip of ``metric`` per layer set and operator: every control draw, and the true axis."""
        import plotly.express as px

        df = self.table()
        df["edit"] = df.layer_set.map("L{}".format) + " " + df.op
        return px.strip(df, x="edit", y=metric, color="kind", template="plotly_white",
                        title=f"{metric}: true axis vs control draws (baseline {self.baseline[metric]:.4f})")

    def _repr_html_(self) -> str:
        cols = ["layer_set", "op", "kind", "draw", "mae_k_ge_1", "corr_bayes", "kl_bits", "accuracy"]
        return self.table()[cols].to_html(index=False, float_format="%.4f", max_rows=40)


def _behaviour(entropy: np.ndarray, label_logprobs: np.ndarray, task: dict) -> dict:
    """Calibration of a run against the exact posterior: MAE per k, for k >= 1 and overall; correlation with
    Bayes entropy and label accuracy for k >= 1."""
    from .calibration import compare_to_bayes

    cmp = compare_to_bayes(entropy, task["bayes_entropy"], groups=task["k"], predicted=label_logprobs.argmax(-1),
                           latent=task["latent"])
    pos = cmp["k_ge_1"]
    out = dict(mae=cmp["all"]["mae"], mae_k_ge_1=pos["mae"], corr_bayes=pos["corr_with_bayes"]["pearson"],
               accuracy=pos["accuracy"])
    out.update({f"mae_k{k}": b["mae"] for k, b in cmp["per_group"].items()})
    return out


def _geometry(run: EditedRun, directions: dict[int, np.ndarray], spread: dict[int, float] | None = None) -> dict:
    """corr(v_L . u_L, model entropy) at every collected layer L (on the values this run actually computed).

    Where the projection has lost its spread (below 1e-6 of ``spread[L]``, the unperturbed one: after a cut on
    that axis) the correlation would be one of rounding noise, so it is NaN.
    """
    from .geometry import correlations

    h = as_float64(run.entropy)
    out = {}
    for layer, u in directions.items():
        proj = as_float64(run.values[layer]) @ u
        flat = spread is not None and proj.std() < 1e-6 * spread[layer]
        out[f"geom_L{layer}"] = float("nan") if flat else correlations(proj, h)["pearson"]
    return out


def plan_edits(model, axes: dict, fit_values: dict, *, layer_sets: list[list[int]], ops=OPS,
               controls: dict[str, int], seed: int = 0) -> tuple[list[tuple], list[dict], dict]:
    """Every edit of the protocol: ([(layer set, op, kind, draw)], the matching edits layer -> operator, and per
    layer the control draws ``control_directions`` gave), kinds ordered true axis first, then the families of
    ``controls`` in their order."""
    drawn = {layer: control_directions(fit_values[layer], axes[layer].direction, controls, layer=layer, seed=seed)
             for layer in sorted(axes)}
    kinds = [("true", 0)] + [(fam, i) for fam, count in controls.items() for i in range(count)]
    plan = [(layer_set, op, kind, draw) for layer_set in layer_sets for op in ops for kind, draw in kinds]
    edits = [resolve_edits(model, {layer: make_op(op, torch.tensor(
        as_float64(axes[layer].direction) if kind == "true" else drawn[layer][kind][0][draw]), axes[layer].sigma)
        for layer in layer_set}) for layer_set, op, kind, draw in plan]
    return plan, edits, drawn


def run_interventions(model, prompts: list[str], axes: dict, fit_values: dict, task: dict, *,
                      label_tokens: list[int], layer_sets: list[list[int]], ops=OPS,
                      controls: dict[str, int] | None = None, seed: int = 0, batch_size: int | None = None,
                      fast: bool = True, progress: bool = True) -> InterventionResult:
    """Edit the value axis of each layer set with each operator, for the true axes and every control draw.

    axes: layer -> EntropyAxis (fitted on other prompts: cross-fitting); fit_values: layer -> the values the axes
    were fitted on (for the matched and PC controls); task: columns ``k``, ``latent``, ``bayes_entropy`` of the
    evaluation ``prompts``; controls: control family (``CONTROL_FAMILIES``) -> number of draws, by default
    ``FULL_CONTROLS``.
    Geometry is read at every axis layer from the values each run computes: at an edited layer it sees the edited
    values (nearly tautological after a cut, as in the paper), at later layers values computed downstream of the edit.

    fast: reuse what an edit cannot change (the blocks before its first edited layer) and stack several edits into
    one forward (``prefix.edited_runs``); the same numbers as ``fast=False``, a whole forward pass per edit (bit for
    bit on CPU with MKL; the tests check 1e-5 relative on every model family and on SmolLM2).
    """
    from tqdm.auto import tqdm

    from .geometry import correlations

    controls = controls if controls is not None else FULL_CONTROLS
    layers = sorted(axes)
    true_dirs = {layer: as_float64(axes[layer].direction) for layer in layers}
    plan, edits, drawn = plan_edits(model, axes, fit_values, layer_sets=layer_sets, ops=ops, controls=controls,
                                    seed=seed)

    with tqdm(total=len(edits) * len(prompts), desc="interventions", unit="prompt", disable=not progress) as bar:
        base, *runs = edited_runs(model, prompts, edits, layers=layers, label_tokens=label_tokens,
                                  batch_size=batch_size, fast=fast, tick=bar.update)
    spread = {layer: float((as_float64(base.values[layer]) @ u).std()) for layer, u in true_dirs.items()}
    baseline = dict(_behaviour(as_float64(base.entropy), base.label_logprobs.numpy(), task),
                    **_geometry(base, true_dirs), entropy=as_float64(base.entropy).tolist())
    rows, true_entropy = [], {}
    for (layer_set, op, kind, draw), run in zip(plan, runs):
        h = as_float64(run.entropy)
        row = dict(layer_set="+".join(map(str, layer_set)), op=op, kind=kind, draw=draw,
                   kl_bits=float(run.kl.mean()),
                   corr_entropy_baseline=correlations(h, baseline["entropy"])["pearson"],
                   **_behaviour(h, run.label_logprobs.numpy(), task), **_geometry(run, true_dirs, spread))
        later = [row[f"geom_L{layer}"] for layer in layers if layer > max(layer_set)]
        row["geom_downstream"] = float(np.nanmean(later)) if later else float("nan")
        if kind != "true" and drawn[layer_set[0]][kind][1] is not None:  # a family matching variance
            row["variance_ratio"] = float(np.mean([drawn[layer][kind][1][draw] for layer in layer_set]))
        rows.append(row)
        if kind == "true":
            true_entropy[(row["layer_set"], op)] = h
    return InterventionResult(rows, baseline, (1 + len(plan)) * len(prompts), true_entropy)


def summarize(result: InterventionResult, task: dict, *,
              metrics=("mae_k_ge_1", "corr_bayes", "kl_bits", "geom_downstream"),
              n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Per (layer set, op, metric): the true axis' effect (value minus baseline; KL as is), the control families'
    effects (mean and 95% range), the true effect's percentile within each family, and for the MAE a bootstrap
    interval over prompts (over whole ``task["groups"]`` where given: a wind tunnel's sequences)."""
    import pandas as pd

    df = pd.DataFrame(result.rows)
    base = result.baseline
    bayes, k = np.asarray(task["bayes_entropy"]), np.asarray(task["k"])
    base_h = np.asarray(base["entropy"])
    pos = np.flatnonzero(k >= 1)
    layers = sorted(int(key[len("geom_L"):]) for key in base if key.startswith("geom_L"))

    def base_metric(metric: str, layer_set: str) -> float:
        if metric != "geom_downstream":
            return base[metric]
        later = [base[f"geom_L{layer}"] for layer in layers if layer > max(map(int, layer_set.split("+")))]
        return float(np.mean(later)) if later else float("nan")

    out = []
    for (layer_set, op), group in df.groupby(["layer_set", "op"], sort=False):
        true = group[group.kind == "true"].iloc[0]
        for metric in metrics:
            ref = 0.0 if metric == "kl_bits" else base_metric(metric, layer_set)
            if np.isnan(ref):  # no layer after the edited ones: no downstream geometry to compare
                continue
            entry = dict(layer_set=layer_set, op=op, metric=metric, baseline=ref, true_effect=true[metric] - ref)
            for fam, g in group[group.kind != "true"].groupby("kind"):
                eff = g[metric].to_numpy() - ref
                entry[f"{fam}_mean"] = float(np.nanmean(eff))
                entry[f"{fam}_range"] = interval(eff)
                entry[f"{fam}_percentile"] = percentile_of(entry["true_effect"], eff)
                entry[f"{fam}_n"] = int(len(eff))
            if metric == "mae_k_ge_1":
                h = result.true_entropy[(layer_set, op)]
                err = np.abs(h[pos] - bayes[pos]) - np.abs(base_h[pos] - bayes[pos])  # per prompt, paired
                groups = None if task.get("groups") is None else np.asarray(task["groups"])[pos]
                _, low, high = bootstrap(lambda idx: err[idx].mean(), len(pos), groups, n_boot=n_boot, seed=seed)
                entry["true_effect_ci"] = [float(low[0]), float(high[0])]
            out.append(entry)
    return out
