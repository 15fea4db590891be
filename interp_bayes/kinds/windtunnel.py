"""The same analyses on a wind-tunnel transformer, where the posterior is exact: calibration against Bayes per query
position, the value manifold against the exact entropy, cross-fitted entropy axes (against the model's and the exact
entropy), keys, attention focusing and the intervention protocol (axes fitted on the prompts of half of the
sequences, drawn with the recipe's ``split_seed``, edits evaluated on those of the other half)."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, PlanItem, Result
from .common import check_folds, deconfounded, deconfounded_text, manifold_rows, pct
from .icl import calibration_rows
from .interventions import (ProtocolPrompts, check_protocol, effects_figure, per_k_figure, protocol, readout_claims,
                            split_by_group, summary_lines)
from ..windtunnel.tunnels import PACKAGED, checkpoint_folder, is_tunnel, open_tunnel, tunnel_config
from ..analyses.axis import fit_entropy_axis
from ..analyses.focusing import attention_focusing
from ..analyses.interventions import EditProtocol
from ..analyses.keys import key_orthogonality
from ..analyses.manifold import manifold_report
from ..core.errors import ConfigError
from ..core.figures import COLOURS, axis_titles, layout
from ..core.layers import resolve_layers
from .manifold import DOMINANT
from ..model.hooks import reading_hook
from ..stats import info, ledger as L
from ..stats.calibration import compare_to_bayes
from ..stats.confounds import nuisance_columns
from ..stats.pca import key_orthogonality_null
from ..windtunnel.configs import n_params

DISCRETE_TASKS = ("bijection", "hmm", "recall")  # tasks whose exact posterior is over hypothesis tokens


def tunnel_folder(name: str, kind: str, tasks: tuple[str, ...], archs: tuple[str, ...] | None = None,
                  param: str = "tunnel") -> Path:
    """The folder of the wind tunnel ``name`` (a packaged checkpoint's name or a trained folder) that the kind's
    parameter ``param`` names, refused (ConfigError listing the packaged ones that fit) when it holds no wind
    tunnel, or one of a task this kind does not read, or (``archs``) of an architecture without the hooks it
    reads."""
    def fits(config: dict | None) -> bool:
        return config is not None and config["task"] in tasks and (archs is None or config.get("arch") in archs)

    folder = checkpoint_folder(name)
    config = tunnel_config(folder)
    if fits(config):
        return folder
    # only a refusal lists the packaged ones that fit (reading every packaged windtunnel.json): the stage key asks
    # for the folder again and again
    fit = ", ".join(d.name for d in sorted(PACKAGED.iterdir()) if fits(tunnel_config(d)))
    what = " or ".join(tasks) + (f" {'/'.join(archs)}" if archs else "")
    if config is None:
        raise ConfigError(f"Parameter '{param}' of probe kind '{kind}' names {name!r}, which is no wind-tunnel "
                          f"checkpoint (no windtunnel.json there); name a packaged one ({fit}) or a folder written "
                          "by `interp-bayes train`.")
    raise ConfigError(f"Parameter '{param}' of probe kind '{kind}' names {name!r}, a {config['task']} "
                      f"{config.get('arch', '')} wind tunnel, but this kind reads {what} tunnels; name one of "
                      f"{fit} (or a trained folder of that kind).")


@dataclass(frozen=True)
class TunnelParams(Params):
    """Parameters of a kind that runs on a wind tunnel named by ``tunnel:`` (None: on the sweep's model, where the
    kind allows it); ``tunnel_tasks`` are the tasks whose checkpoints it reads, ``tunnel_archs`` the architectures
    with the hooks it reads (None: any)."""

    tunnel_tasks: ClassVar[tuple[str, ...]] = DISCRETE_TASKS
    tunnel_archs: ClassVar[tuple[str, ...] | None] = None

    def checkpoints(self) -> dict:
        tunnel = getattr(self, "tunnel", None)
        return {} if tunnel is None else {"tunnel": tunnel_folder(tunnel, self.kind, self.tunnel_tasks,
                                                                  self.tunnel_archs)}


def check_layers(ctx, probe: str, tunnel: str | None, analysed: dict) -> None:
    """Refuse, before a sweep's first write, a layer a recipe names outside the model it indexes: the wind tunnel
    ``tunnel``'s own depth, or the sweep's model where ``tunnel`` is None (``ctx.layers``); ``analysed``: recipe key
    -> layer spec (None: the default, every layer of a tunnel). One sentence naming the probe, the key and the fix."""
    if tunnel is not None and not is_tunnel(tunnel):
        return  # no wind tunnel there: ``checkpoints`` refuses it in its own sentence
    depth = None if tunnel is None else open_tunnel(tunnel).config.n_layers
    for key, spec in analysed.items():
        try:
            ctx.layers(spec) if depth is None else resolve_layers(spec, depth, "all")
        except ConfigError as err:
            shown = spec if spec is None or isinstance(spec, (str, int)) else list(spec)
            on = "the sweep's model" if depth is None else f"wind tunnel {tunnel}"
            raise ConfigError(f"Probe '{probe}', {key}: {shown!r} on {on}: {err}") from None


def tunnel_subject(p: TunnelParams) -> str:
    """The wind tunnel a probe runs on, by its folder's name ("": the sweep's model, where the kind allows it)."""
    return "" if p.tunnel is None else Path(p.tunnel).name


def tunnel_prefix(p: TunnelParams) -> str:
    """A summary line's prefix naming the wind tunnel ("<name>: "; "" on the sweep's model)."""
    return "" if p.tunnel is None else f"{tunnel_subject(p)}: "


def tunnel_plan(p: TunnelParams, what: str, forwards: int = 0) -> list[PlanItem]:
    """The dry-run line of a probe on the wind tunnel ``p.tunnel``: ``what`` it computes there, with ``forwards``
    prompt forward passes where it counts them."""
    return [PlanItem(p.kind, f"wind tunnel {p.tunnel}: {what}", None, forwards, model=tunnel_subject(p))]


@dataclass(frozen=True)
class WindtunnelParams(TunnelParams):
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # values and attention patterns
    tunnel: str = "bijection-cpu"  # a packaged checkpoint's name or a trained folder
    n_sequences: int = 40  # sequences; every query position of each is a prompt
    seed: int = 2024  # the sequence draws
    # the interventions' fit / evaluation halves of the sequences (``split_by_group``), fixed whatever the run's
    # --seed, which draws only the control axes, the donors and the bootstraps (0: the split --seed 0 drew before)
    split_seed: int = 0
    folds: int = 5
    n_boot: int = 1000
    n_null: int = 1000  # null clouds of the PC shares at most (drawn until the share's test is settled)
    method: Literal["pc1", "ridge"] = "pc1"
    fit: str = "cross"
    layer_sets: tuple = ((-1,),)  # each a layer spec of the tunnel ("last", "middle", a list of layers)
    ops: tuple[str, ...] = ("cut", "only", "shift+", "shift-")
    controls: dict = field(default_factory=lambda: {"isotropic": 20, "matched": 20, "pcs": 3})
    covariates: tuple[str, ...] = ("position",)  # the query position: the bijection's exact entropy is a function of it
    axis_control: tuple[str, ...] = ()  # covariates of a conditional axis for the interventions; () = plain axis
    n_perm: int = 1000

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, self.n_sequences, "sequences", "n_sequences")
        check_layers(ctx, probe, self.tunnel, {f"layer_sets[{i}]": s for i, s in enumerate(self.layer_sets)})
        # the evaluation half's sequences (``split_by_group``): a resampled prompt's donor is at its position
        check_protocol(probe, self, n_eval=self.n_sequences - self.n_sequences // 2, unit="sequences",
                       count="n_sequences")


def windtunnel_prompts(task, n_sequences: int, seed: int) -> tuple[list[list[int]], dict]:
    """One prompt per (sequence, query position): the prefix ending at the query, so the final token is the one
    whose next-token belief the exact posterior describes. Returns token ids and task columns (k = query number,
    latent = the realised hypothesis, bayes_entropy in bits, sequence = the sequence's index)."""
    batch = task.sample(n_sequences, seed=seed)
    h = info.entropy(batch.posterior.double())  # [n, Q]
    prompts, cols = [], dict(k=[], latent=[], bayes_entropy=[], sequence=[])
    for i in range(n_sequences):
        for q, pos in enumerate(batch.query_pos.tolist()):
            prompts.append(batch.input_ids[i, : pos + 1].tolist())
            cols["k"].append(q + 1)
            cols["latent"].append(int(batch.labels[i, q]))
            cols["bayes_entropy"].append(float(h[i, q]))
            cols["sequence"].append(i)
    return prompts, cols


def load_windtunnel_task(name: str):
    """(the model, the task) of a packaged wind-tunnel checkpoint's name or a trained folder: a bridge for an HF
    checkpoint (transformer, Mamba), TransformerLens-hooked otherwise (``windtunnel.tunnels.open_tunnel``)."""
    tunnel = open_tunnel(name)
    return tunnel.model, tunnel.task


@dataclass
class WindtunnelSet:
    """A wind-tunnel checkpoint's query prefixes as a probe's prompt set (``windtunnel_set``)."""

    model: Any  # the checkpoint's bridge
    task: Any
    prompts: list[list[int]]  # token ids, one prompt per (sequence, query)
    cols: dict  # windtunnel_prompts's columns: k, latent, bayes_entropy, sequence
    acts: Any  # Activations at ``layers``; entropy renormalised over the task's hypotheses
    layers: list[int]


def windtunnel_set(ctx, checkpoint: str, n_sequences: int, seed: int, *, layers, readings=("v",)) -> WindtunnelSet:
    """The bridge, the task, the prompts of ``n_sequences`` sequences (``windtunnel_prompts``) and their
    activations at ``layers`` (a layer parameter resolved against the checkpoint's own depth; None: the sweep's
    ``layers``), from the run folder's cache, with the task's hypothesis tokens as the label tokens."""
    tunnel = open_tunnel(checkpoint)
    model, task = tunnel.model, tunnel.task
    prompts, cols = windtunnel_prompts(task, n_sequences, seed)
    idx = resolve_layers(layers, model.cfg.n_layers, ctx.config.layers)
    missing = [r for r in readings if reading_hook(r, idx[0]) not in model.hook_dict]
    if missing:  # the LSTM, Mamba and the MLPs have no attention: no value vectors, no patterns
        raise ConfigError(f"Wind tunnel {checkpoint} has no hook for the reading(s) {missing} (it has no attention); "
                          "read it at the residual stream ('resid', 'resid_pre') instead.")
    acts = ctx.activations(f"windtunnel-{tunnel.folder.name}", prompts, subject=tunnel, layers=idx,
                           readings=readings, label_tokens=task.hypothesis_ids)
    acts.with_groups(cols["sequence"])  # the prefixes of one sequence are not independent: it is the unit
    return WindtunnelSet(model, task, prompts, cols, acts, idx)


def run(ctx, p: WindtunnelParams) -> Result:
    wt = windtunnel_set(ctx, p.tunnel, p.n_sequences, p.seed, layers="all", readings=("v", "attn_entropy"))
    model, task, prompts, cols, acts = wt.model, wt.task, wt.prompts, wt.cols, wt.acts
    n = model.cfg.n_layers
    bayes, k = np.array(cols["bayes_entropy"]), np.array(cols["k"])
    columns = nuisance_columns([len(t) for t in prompts], position=k)
    rows = calibration_rows(compare_to_bayes(acts.entropy, bayes, by=cols["k"]), dict(condition="windtunnel"))
    last = n - 1
    rep = manifold_report(acts.values(-1), acts.entropy, bayes_entropy=bayes, groups=acts.groups, n_boot=p.n_boot,
                          n_null=p.n_null, seed=ctx.config.seed)
    rows += manifold_rows(rep, dict(condition="windtunnel", layer=last))
    rows += deconfounded(rep["pc1_score"], bayes, columns, p.covariates, k, "position", n_perm=p.n_perm,
                         seed=ctx.config.seed, metric="corr_pc1", scope=dict(layer=last, target="bayes entropy"))
    control = {c: columns[c] for c in p.covariates}
    for layer in range(1, n):  # layer 0's final-token value depends on the final token alone
        for target, y in (("model entropy", None), ("bayes entropy", bayes)):
            for kind in ("unconditional", "conditional") if target == "bayes entropy" else ("unconditional",):
                a = fit_entropy_axis(acts, layer, p.method, folds=p.folds, entropy=y, seed=ctx.config.seed,
                                     control=control if kind == "conditional" else None, strata=k)
                scope = dict(layer=layer, method=p.method, target=target, axis=kind)
                rows.append(Row("axis_residual_confounding", a.residual_confounding, "share", dict(scope),
                                n=len(acts), note="share of the projection's variance between query positions"))
                for fit, corr in (("in-sample", a.in_sample), ("held-out", a.held_out)):
                    rows.append(Row("pearson_projection", corr["pearson"], "r", dict(scope, fit=fit), n=len(acts),
                                    note=corr.get("reason")))
                if target == "bayes entropy":
                    rows += deconfounded(a.held_out["projections"], bayes, columns, p.covariates, k, "position",
                                         n_perm=p.n_perm, seed=ctx.config.seed, metric="corr_held_out_projection",
                                         scope=scope)
    scores = key_orthogonality(model)
    null = key_orthogonality_null(model.cfg.d_model, model.cfg.d_head, float(np.median(scores)),
                                  seed=ctx.config.seed)
    rows += [Row("key_orthogonality", scores[layer].mean(), "|cos|", dict(layer=layer), float(scores[layer].min()),
                 float(scores[layer].max()), "range over heads", null["range"][0], null["range"][1],
                 "gaussian W_K", scores.shape[1]) for layer in range(n)]
    f = attention_focusing(acts.readings["attn_entropy"], groups=acts.groups, n_boot=p.n_boot, seed=ctx.config.seed)
    rows.append(Row("focusing_reduction", f["reduction"], "fraction", {}, *f["reduction_ci"], "bootstrap 95%",
                    n=f["n_prompts"], test=f["reduction_test"]))
    fit_idx, eval_idx = split_by_group(cols["sequence"], p.split_seed)  # no sequence on both sides
    # each a layer spec of the checkpoint, as on the sweep's model; one outside it was refused by ``check``
    sets = [resolve_layers(s, n, "all") for s in p.layer_sets]
    iv = protocol(ctx, p, ProtocolPrompts(model, prompts, acts, cols, task.hypothesis_ids, fit_idx, eval_idx, columns, k,
                                          "position"), EditProtocol(sets, p.ops, p.controls, ctx.config.seed))
    rows += iv.rows
    data = dict(iv.data, checkpoint=p.tunnel, task=task.name, k=k.tolist(), bayes_entropy=bayes.tolist(),
                model_entropy=acts.entropy.tolist(), pc1=rep["pc1_score"], n_params=n_params(model))
    return Result(rows, data)


def plan(ctx, p: WindtunnelParams) -> list:
    task = open_tunnel(p.tunnel).task
    prompts, _ = windtunnel_prompts(task, p.n_sequences, p.seed)
    return tunnel_plan(p, f"{len(prompts)} prompts and the intervention protocol (a small model: seconds)",
                       len(prompts))


def summary(rows: list[Row], p: WindtunnelParams) -> list[Line]:
    prefix = f"wind tunnel {p.tunnel}: "
    mae = find(rows, "entropy_mae", condition="windtunnel", subset="all")
    layer = max(r.scope["layer"] for r in select(rows, "pc1_share"))
    share, share12 = find(rows, "pc1_share", layer=layer), find(rows, "pc12_share", layer=layer)
    perm1 = find(rows, "pc1_share_null_mean", layer=layer, null="permuted")
    perm12 = find(rows, "pc12_share_null_mean", layer=layer, null="permuted")
    axis_layer = max(r.scope["layer"] for r in select(rows, "pearson_projection", target="bayes entropy"))
    at = dict(layer=axis_layer, target="bayes entropy")
    ins = find(rows, "pearson_projection", fit="in-sample", axis="unconditional", **at)
    held = find(rows, "pearson_projection", fit="held-out", axis="unconditional", **at)
    red = find(rows, "focusing_reduction")
    pc1, pc1_claim = deconfounded_text(rows, "corr_pc1", layer=layer, target="bayes entropy")
    out = [Line(prefix + "entropy MAE vs Bayes (bits)", f"{mae.value:.4f}"),
           Line(prefix + "PC1 / PC1+PC2 share", f"{pct(share.value)} / {pct(share12.value)}; null "
                f"{pct(perm1.value)} / {pct(perm12.value)}", share.verdict()),
           Line(prefix + "Spearman(PC1, Bayes H)", pc1, pc1_claim),
           Line(prefix + f"axis (Bayes H) L{axis_layer}: r in-sample / held-out",
                f"{ins.value:+.2f} / {held.value:+.2f}")]
    for kind in ("unconditional", "conditional"):
        text, claim = deconfounded_text(rows, "corr_held_out_projection", axis=kind, **at)
        if text:
            out.append(Line(prefix + f"{kind} axis L{axis_layer}: held-out projection vs Bayes H", text, claim))
    return out + [Line(prefix + "attention focusing", pct(red.value))] + summary_lines(rows, prefix)


def _calibration(p) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    per = sorted((r for r in select(p.rows, "model_entropy", condition="windtunnel") if "k" in r.scope),
                 key=lambda r: r.scope["k"])
    ks = [r.scope["k"] for r in per]
    bayes = [find(p.rows, "bayes_entropy", condition="windtunnel", k=k).value for k in ks]
    mae = [find(p.rows, "entropy_mae", condition="windtunnel", k=k).value for k in ks]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["mean entropy per query position", "entropy MAE per position"])
    fig.add_trace(go.Scatter(x=ks, y=[r.value for r in per], mode="lines+markers", name="model",
                             line=dict(color=COLOURS["observed"])), row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=bayes, mode="lines", name="exact Bayes", line=dict(color="black", dash="dash")),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=mae, mode="lines+markers", name="|H model - H Bayes|",
                             line=dict(color=COLOURS["true"])), row=1, col=2)
    axis_titles(fig, "query position k", "bits", yaxis=dict(rangemode="tozero"))
    return Figure(f"windtunnel-calibration-{p.name}", f"Wind tunnel {p.data.get('checkpoint')}: calibration",
                  layout(fig, f"Wind tunnel ({p.data.get('task')}): model entropy against the exact posterior"),
                  "The model's curve should lie on the dashed exact curve; the right panel shows the error per position.")


def _geometry(p) -> Figure | None:
    import plotly.graph_objects as go

    d = p.data
    if "pc1" not in d:
        return None
    fig = go.Figure(go.Scatter(x=d["bayes_entropy"], y=d["pc1"], mode="markers",
                               marker=dict(color=d["k"], colorscale="Viridis", size=7,
                                           colorbar=dict(title="position k")),
                               hovertemplate="Bayes H %{x:.2f} bits, PC1 %{y:.2f}<extra></extra>"))
    axis_titles(fig, "exact Bayes entropy (bits)", "last-layer PC1 score")
    return Figure(f"windtunnel-geometry-{p.name}", f"Wind tunnel {d.get('checkpoint')}: value geometry", layout(
        fig, "Last-layer PC1 against the exact entropy, coloured by query position"),
        "Where the exact entropy is a function of position alone (the bijection without replacement), a smooth "
        "colour gradient along the x axis cannot tell an entropy axis from a position axis; with replacement and in "
        "the HMM, entropy also varies within one colour.")


def figures(probes) -> list[Figure]:
    out = []
    for p in probes:
        prefix = f"Wind tunnel {p.data.get('checkpoint')}: "
        out += [f for f in (_calibration(p), _geometry(p), effects_figure(p, prefix), per_k_figure(p, prefix))
                if f is not None]
    return out


CALIBRATED_BITS = (0.01, 0.1)  # entropy MAE vs Bayes: "holds" at most 0.01 bits (Paper I: ~1e-3), weakly 0.1


def ledger(probes) -> list:
    """Per wind tunnel: calibration to the exact posterior, one dominant value axis, PC1 tracking the Bayes
    entropy beyond the query position, and the axis as a readout (the interventions kind's claim)."""
    out = []
    for p in probes:
        tunnel = tunnel_subject(p.params_object())
        mae = find(p.rows, "entropy_mae", condition="windtunnel", subset="all")
        layers = [r.scope["layer"] for r in select(p.rows, "pc1_share")]
        if mae is None or not layers:
            continue
        at = dict(layer=max(layers))
        out.append(Claim("wt-calibration", "The wind tunnel is calibrated to the exact posterior (entropy MAE vs "
                         "Bayes)", L.magnitude(mae.value, *CALIBRATED_BITS, larger=False), f"{mae.value:.4f} bits",
                         subject=tunnel, paper="Paper I: ~0.001 bits", section=f"fig-windtunnel-calibration-{p.name}"))
        pc1 = find(p.rows, "pc1_share", **at)
        out.append(Claim("dominant-axis", f"One dominant value axis (PC1 share, L{at['layer']})",
                         L.at_least(L.beyond_null(pc1), pc1, DOMINANT), L.fmt(pc1, pct=True), subject=tunnel,
                         section=f"fig-windtunnel-geometry-{p.name}"))
        text, claim = deconfounded_text(p.rows, "corr_pc1", target="bayes entropy", **at)
        if text:
            out.append(Claim("wt-pc1-bayes", "PC1 tracks the exact posterior's entropy beyond the query position",
                             L.from_deconfounded(claim), text, subject=tunnel,
                             section=f"fig-windtunnel-geometry-{p.name}"))
        out += readout_claims(p.rows, tunnel, f"fig-interventions-{p.name}")
    return out


KIND = register(Kind("windtunnel", WindtunnelParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
