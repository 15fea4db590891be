"""If the entropy axis is only a readout, where is the uncertainty computed? Distributed alignment search (DAS;
Geiger et al. 2023/2024) at a layer's residual stream (or values): for d in ``ds``, a d-dim subspace trained by
interchange interventions between base and source prompts that differ in their evidence (SULA: the label counts at
the same k; a wind tunnel: another posterior at the same query position), so that swapping it moves the base's
output to the source's exact posterior (``targets: bayes``) or to the model's own output on the source (``model``).
Held out (folds of whole prompts or sequences): its interchange-intervention accuracy (the share of the entropy
difference transferred) against random d-dim subspaces and against the PC1 and ridge entropy axes completed to d,
and its principal angles to those axes against random subspaces' (``analyses.causal``; plain torch, no pyvene).

On SULA with the sweep's model (``tunnel: null``); on a wind tunnel (``tunnel: <checkpoint>``) with its query
prefixes, at its own layers."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch

from ..core.plugin import Claim, Kind, Line, PlanItem, Result
from ..core.registry import register
from ..core.results import Row, select
from .common import check_folds, figure_per_probe, sula_groups, sula_prompts, sula_request, sula_task
from .windtunnel import (TunnelParams, check_layers, load_windtunnel_task, tunnel_plan, tunnel_prefix, tunnel_subject,
                         windtunnel_prompts)
from ..analyses.causal import Training, das_report, model_site
from ..core.errors import ConfigError
from ..core.figures import COLOURS, axis_titles, error_bars
from ..core.layers import resolve_layers
from ..stats import ledger as L
from ..stats.info import entropy_of_log_probs


@dataclass(frozen=True)
class CausalSubspaceParams(TunnelParams):
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # blocks to replay, values to swap
    tunnel: str | None = None  # a wind tunnel (packaged name or trained folder); None: the sweep's model on SULA
    layers: tuple[str | int, ...] | str | int = ("middle", "last")  # layer specs, each resolved and joined
    reading: Literal["resid", "v"] = "resid"  # the site: the residual stream after the block, or hook_v
    ds: tuple[int, ...] = (1, 2, 4, 8)  # subspace dimensions
    targets: tuple[Literal["bayes", "model"], ...] = ("bayes", "model")  # the source's exact posterior; its output
    per_k: int = 20  # SULA: prompts per k
    n_sequences: int = 40  # wind tunnel: sequences whose query prefixes are the prompts
    seed: int = 42  # the prompt draws
    folds: int = 2
    steps: int = 200  # Adam steps of DAS per (fold, d)
    lr: float = 0.01
    batch: int = 64  # pairs per step at most (bases of one token length)
    n_null: int = 250  # random subspaces of the IIA null at most (drawn until the test is settled)
    n_angle_null: int = 2000  # random subspaces of the angles' null at most
    n_boot: int = 1000

    def check(self, ctx, probe: str) -> None:
        if not self.ds or min(self.ds) < 1:
            raise ConfigError(f"Probe '{probe}' needs subspace dimensions ds of at least 1 (got {list(self.ds)}).")
        if self.tunnel is None:
            check_folds(probe, self.folds, sula_prompts(self.per_k), "SULA prompts", "per_k")
        else:
            check_folds(probe, self.folds, self.n_sequences, "sequences", "n_sequences")
        check_layers(ctx, probe, self.tunnel, {f"layers[{i}]": s for i, s in enumerate(self._specs())})

    def _specs(self) -> list:
        return [self.layers] if isinstance(self.layers, (str, int)) else list(self.layers)


def _layers(p: CausalSubspaceParams, resolve) -> list[int]:
    """The union of the recipe's layer specs, each resolved by ``resolve``."""
    return sorted({layer for spec in p._specs() for layer in resolve(spec)})


def _sula(ctx, p):
    """(model, prompts, label tokens, columns, exact predictive distribution [n, 2], strata, evidence, groups,
    layers) of the SULA main set."""
    task, _ = sula_task(ctx, p.per_k)
    req = sula_request(ctx, "main", p.per_k, p.seed, "last")
    cols = req["cols"]
    p1 = np.asarray(cols["p_label1"])
    pred = task.alpha * p1 + (1 - task.alpha) * (1 - p1)  # p(query label = L1 | D)
    layers = _layers(p, lambda spec: ctx.layers(spec if isinstance(spec, str) else [spec]))
    return (ctx.model, req["prompts"], req["label_tokens"], np.column_stack([pred, 1 - pred]), np.asarray(cols["k"]),
            np.asarray(cols["n1"]), sula_groups(cols), layers)


def _tunnel(ctx, p):
    """The same for a wind tunnel's query prefixes: the exact posterior over its hypotheses, strata = the query
    position, evidence = which posterior, groups = the sequence."""
    model, task = load_windtunnel_task(p.tunnel)
    prompts, cols = windtunnel_prompts(task, p.n_sequences, p.seed)
    post = task.sample(p.n_sequences, seed=p.seed).posterior.double().numpy()  # the same draws: [n, Q, H]
    post = post.reshape(-1, post.shape[-1])
    evidence = np.unique(np.round(post, 6), axis=0, return_inverse=True)[1].reshape(-1)
    layers = _layers(p, lambda spec: resolve_layers(spec, model.cfg.n_layers, ctx.config.layers))
    return (model, prompts, task.hypothesis_ids, post, np.asarray(cols["k"]), evidence, np.asarray(cols["sequence"]),
            layers)


def run(ctx, p: CausalSubspaceParams) -> Result:
    model, prompts, labels, exact, strata, evidence, groups, layers = (_sula if p.tunnel is None else _tunnel)(ctx, p)
    training = Training(p.steps, p.lr, p.batch)
    rows, data = [], dict(layers=layers, seconds={})
    for layer in layers:
        start = time.process_time()
        site = model_site(model, prompts, layer, p.reading, labels)
        clean = site.clean_logp()
        own = clean.exp().double().numpy()
        for target in p.targets:
            res = das_report(site, exact if target == "bayes" else own, strata=strata, evidence=evidence,
                             groups=groups, entropy=entropy_of_log_probs(clean).double().numpy(), ds=p.ds, folds=p.folds,
                             training=training, n_null=p.n_null, n_angle_null=p.n_angle_null, n_boot=p.n_boot,
                             seed=ctx.config.seed, scope=dict(layer=layer, reading=p.reading, target=target))
            rows += res.rows
        seconds = time.process_time() - start
        data["seconds"][str(layer)] = seconds
        rows.append(Row("training_cpu_seconds", seconds, "s", dict(layer=layer, reading=p.reading), n=len(prompts),
                        note=f"CPU time of the layer's DAS fits and nulls, {torch.get_num_threads()} thread(s)"))
    return Result(rows, data)


def summary(rows: list[Row], p: CausalSubspaceParams) -> list[Line]:
    out = []
    for r in select(rows, "iia"):
        at = r.scope
        axes = next(iter(select(rows, "iia_axes", **at)), None)
        pc1 = next(iter(select(rows, "angle_pc1", **at)), None)
        text = (f"{r.value:.2f} ({r.low:.2f}, {r.high:.2f}); random subspaces up to {r.null_high:.2f}; entropy "
                f"axes {axes.value:.2f}" if axes is not None else f"{r.value:.2f}")
        if pc1 is not None:
            text += f"; angle to PC1 {pc1.value:.0f}° (random {pc1.null_low:.0f}-{pc1.null_high:.0f}°)"
        out.append(Line(f"{tunnel_prefix(p)}DAS IIA L{at['layer']} {at['reading']} d={at['d']} ({at['target']} target)",
                        text, r.verdict()))
    return out


@figure_per_probe("causal-subspace", tunnel_subject)
def figures(fig, pr, where):
    cells = sorted({(r.scope["layer"], r.scope["target"]) for r in select(pr.rows, "iia")})
    for layer, target in cells:
        rs = sorted(select(pr.rows, "iia", layer=layer, target=target), key=lambda r: r.scope["d"])
        ax = sorted(select(pr.rows, "iia_axes", layer=layer, target=target), key=lambda r: r.scope["d"])
        ds = [r.scope["d"] for r in rs]
        name = f"L{layer} {target}"
        fig.add_scatter(x=ds, y=[r.value for r in rs], mode="lines+markers", name=f"DAS, {name}",
                        error_y=error_bars(rs))
        fig.add_scatter(x=ds, y=[r.value for r in ax], mode="lines", line=dict(dash="dash"),
                        name=f"entropy axes, {name}")
        fig.add_scatter(x=ds, y=[r.null_high for r in rs], mode="lines",
                        line=dict(dash="dot", color=COLOURS["permuted"]), name=f"random 97.5%, {name}")
    axis_titles(fig, "subspace dimension d", "held-out IIA (share of ΔH transferred)",
                xaxis=dict(type="log", tickvals=[1, 2, 4, 8]))
    return ("Where the uncertainty is computed (DAS)",
            "Interchange-intervention accuracy of the DAS subspace, the entropy axes and random subspaces",
            "Solid: the DAS subspace's held-out IIA (bootstrap 95%); dashed: the PC1 and ridge entropy axes' span "
            "completed to d; dotted: the top of the random-subspace null.")


def plan(ctx, p: CausalSubspaceParams) -> list:
    what = (f"DAS at {p.reading}, d in {list(p.ds)}, {len(p.targets)} target(s), {p.folds} folds of {p.steps} "
            f"steps, random-subspace nulls of at most {p.n_null}")
    if p.tunnel is not None:
        return tunnel_plan(p, f"{what} (a small model: minutes)")
    return [PlanItem("causal_subspace", f"SULA ({sula_prompts(p.per_k)} prompts): {what}", None)]


IIA_CONTROLS = 0.5  # a subspace that transfers under half the entropy difference controls it only weakly


def ledger(probes) -> list:
    """Two claims per probe, on its first target: a low-dimensional subspace controls the uncertainty (the IIA
    cells over layers and d, one Holm family against their random-subspace nulls; the decisive cell is the
    surviving one of highest IIA; "holds" only where its bootstrap interval clears ``IIA_CONTROLS``, so that the
    point estimate's side of it, which moves with the seed of the draws, cannot decide between "holds" and "holds
    weakly"), and that subspace lies apart from the entropy axes (its angles to PC1 and the ridge axis no smaller
    than random subspaces', at that cell)."""
    out = []
    for pr in probes:
        params = pr.params_object()
        where, section = tunnel_subject(params), f"fig-causal-subspace-{pr.name}"
        target = params.targets[0] if params.targets else None
        cells = select(pr.rows, "iia", target=target)
        if not cells:
            continue
        survive, undecided = L.family(cells, "above")
        best = max(survive or cells, key=lambda r: r.value if np.isfinite(r.value) else -np.inf)
        verdict = L.HOLDS if survive else L.BORDERLINE if undecided else L.FAILS
        at = {k: best.scope[k] for k in ("layer", "reading", "target", "d")}
        axes = next(iter(select(pr.rows, "iia_axes", **at)), None)
        loc = f"L{at['layer']} {at['reading']}, d = {at['d']}, {at['target']} target"
        out.append(Claim("causal-subspace", "A low-dimensional subspace controls the model's uncertainty (IIA beyond "
                         "random subspaces)", L.at_least(verdict, best, IIA_CONTROLS),
                         f"{L.fmt(best)} ({loc}; {len(survive)} of {len(cells)} cells survive Holm); entropy axes "
                         f"{axes.value:.3g}" if axes is not None else L.fmt(best), subject=where, rival=True,
                         section=section))
        angles = [next(iter(select(pr.rows, f"angle_{a}", **at)), None) for a in ("pc1", "ridge")]
        out.append(Claim("subspace-apart", "That subspace is apart from the entropy axis (angles no smaller than "
                         "random)", L.worst(L.not_beyond_null(a, "below") for a in angles),
                         "; ".join(f"to {name} {L.fmt(a)} (degrees)" for name, a in zip(("PC1", "ridge"), angles))
                         + f" ({loc})",
                         subject=where, rival=True, section=section))
    return out


KIND = register(Kind("causal_subspace", CausalSubspaceParams, run, summary, figures, plan, doc=__doc__,
                     ledger=ledger, subject=tunnel_subject))
