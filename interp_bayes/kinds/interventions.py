"""Paper III's causal test on the SULA task: cut / only / +-1 sigma shift of the entropy axis at a middle layer
alone (so later layers show the geometry downstream of the edit) and at five evenly spaced layers ending at the last
(each with its own axis), against control axes. The axes are fitted on half of the prompts (half of every k, drawn
with the recipe's ``split_seed``) and the edits evaluated on the other half (``fit: in_sample`` fits on the
evaluation half itself, as the paper did)."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..core.checks import count_problem, refuse, seed_problem
from ..core.errors import ConfigError
from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, PlanItem, Result
from ..core.layers import check_recipe_layers
from .common import SULA_LAYERS, deconfounded, deconfounded_text, plan_sula, sula, sula_task
from ..core.figures import axis_titles, layout

if TYPE_CHECKING:  # imported where used: importing the kinds stays free of torch
    from ..analyses.interventions import EditProtocol

# the labels of the measures ``summarize`` reports (``analyses.interventions.MEASURES``), in its order
MEASURE_LABELS = dict(mae_k_ge_1="Δ entropy MAE vs Bayes, k≥1 (bits)", corr_bayes="Δ r(model H, Bayes H), k≥1",
                      kl_bits="KL(edited ‖ unperturbed) (bits)", geom_downstream="Δ r(v·u, model H) at later layers")
FAMILY_COLOURS = dict(true="#c0392b", isotropic="#7f8c8d", matched="#2e86c1", pcs="#27ae60")


@dataclass(frozen=True)
class InterventionsParams(Params):
    method: Literal["pc1", "ridge"] = "pc1"  # axis fit
    fit: str = "cross"  # "cross": fit on one half of the prompts, evaluate on the other; "in_sample": the paper's
    layer_sets: tuple = ("middle", "spread5")  # each a layer spec ("middle", "spread5") or a list of layers
    ops: tuple[str, ...] = ("cut", "only", "shift+", "shift-")
    controls: dict = field(default_factory=lambda: {"isotropic": 3, "matched": 3, "pcs": 1})  # family -> draws (a cap)
    per_k: int = 50
    seed: int = 42  # the SULA prompt draws
    # the fit / evaluation halves (``split_by_k``): a recipe's data, fixed whatever the run's --seed, which draws only
    # the control axes, the resample ablation's donors and the bootstraps (0: the split --seed 0 drew before)
    split_seed: int = 0
    layers: tuple[int, ...] | str = SULA_LAYERS
    # more evaluation prompts per k >= 1 for the readout claim alone (0: none): only the widest layer set's cut of the
    # true and matched axes (and the unedited run) is scored on them, and their errors pool with the evaluation
    # half's in its excess; drawn with ``readout_seed``, a recipe's data like ``split_seed``
    readout_per_k: int = 0
    readout_seed: int = 1
    axis_control: tuple[str, ...] = ()  # covariates of a conditional axis (e.g. [length, k, log_k]); () = plain axis
    covariates: tuple[str, ...] = ("length", "k", "log_k")  # nuisances of the deconfounded baseline geometry
    n_perm: int = 1000

    def check(self, ctx, probe: str) -> None:
        check_recipe_layers(ctx, probe, self.layers, {f"layer_sets[{i}]": s for i, s in enumerate(self.layer_sets)})
        check_protocol(probe, self, n_eval=self.per_k - self.per_k // 2, unit="prompts of each k", count="per_k")
        refuse(count_problem(self.readout_per_k, least=0), f"Parameter 'readout_per_k' of probe '{probe}'",
               self.readout_per_k)
        refuse(seed_problem(self.readout_seed), f"Parameter 'readout_seed' of probe '{probe}'", self.readout_seed)
        if self.readout_per_k and self.fit != "cross":
            raise ConfigError(f"Probe '{probe}' fits its axes on the evaluation prompts (fit: {self.fit}), which "
                              "would pool with held-out readout prompts; use fit: cross or readout_per_k: 0.")


def check_protocol(probe: str, p, *, n_eval: int, unit: str, count: str) -> None:
    """Refuse an edit protocol the run would refuse (unknown ops or control families, negative draws: the
    ``EditProtocol``'s own checks), an unknown ``fit``, and a resample ablation with fewer than two evaluation
    ``unit`` (``n_eval``: a prompt needs a donor of its own stratum), in one sentence naming ``probe``."""
    from ..analyses.interventions import EditProtocol

    if p.fit not in ("cross", "in_sample"):
        raise ConfigError(f"Parameter 'fit' of probe '{probe}' must be 'cross' or 'in_sample', not {p.fit!r}.")
    try:
        EditProtocol((), p.ops, p.controls)
    except ConfigError as err:
        raise ConfigError(f"Probe '{probe}': {err}") from None
    if "resample" in p.ops and n_eval < 2:
        raise ConfigError(f"Probe '{probe}' resamples each evaluation prompt from another of its stratum, and its "
                          f"{count} leaves {n_eval} evaluation {unit}; raise {count} (the evaluation half needs two).")


def split_by_k(k, seed: int) -> tuple[list[int], list[int]]:
    """Two halves of the prompt indices, each holding half of every k (the fit / evaluation split)."""
    rng = np.random.default_rng(seed)
    fit, ev = [], []
    k = np.asarray(k)
    for kk in sorted(set(k.tolist())):
        idx = rng.permutation(np.flatnonzero(k == kk))
        fit += idx[: len(idx) // 2].tolist()
        ev += idx[len(idx) // 2:].tolist()
    return sorted(fit), sorted(ev)


def split_by_group(groups, seed: int) -> tuple[list[int], list[int]]:
    """Two halves of the prompt indices such that no group (e.g. a wind-tunnel sequence, whose prefixes are the
    prompts) has prompts on both sides: the fit can learn nothing about the evaluation prompts' sequences."""
    groups = np.asarray(groups)
    ids = np.random.default_rng(seed).permutation(np.unique(groups))
    fit_groups = set(ids[: len(ids) // 2].tolist())
    fit = [i for i, g in enumerate(groups.tolist()) if g in fit_groups]
    return fit, [i for i in range(len(groups)) if groups[i] not in fit_groups]


def layer_sets(ctx, specs) -> list[list[int]]:
    return [ctx.layers(s) if isinstance(s, str) else ctx.layers(list(s)) for s in specs]


@dataclass(frozen=True)
class ProtocolPrompts:
    """The prompts a kind runs the intervention protocol on, as it prepared them."""

    model: Any
    prompts: list  # texts or token ids
    acts: Any  # their Activations at (at least) every edited layer
    task: dict  # per prompt: k, latent, bayes_entropy
    label_tokens: list[int]
    fit_idx: list[int]  # the prompts the axes are fitted on ...
    eval_idx: list[int]  # ... and those the edits are evaluated on
    nuisances: dict  # per prompt the nuisance covariates (``stats.confounds.nuisance_columns``) ...
    strata: Any  # ... their strata ...
    strata_name: str  # ... and what a stratum is (a row note)


def protocol(ctx, p, s: ProtocolPrompts, edits: EditProtocol, readout: dict | None = None) -> Result:
    """Fit an entropy axis per edited layer on ``s.fit_idx`` (``p.method``, conditional on ``p.axis_control`` when
    given), run every edit of ``edits`` on the ``s.eval_idx`` prompts against the control axes, and return tidy rows
    (plus every run's measures as data, for the figures): the axis' reading on the evaluation prompts deconfounded
    of ``p.covariates``, ``summarize``'s rows, each axis' sigma and the cost. ``readout``: task columns (``text``,
    ``k``, ``bayes_entropy``) of prompts beside the evaluation set on which the widest layer set's cut is scored
    too, for the readout excess (``analyses.interventions.readout_errors``)."""
    from ..analyses.axis import fit_entropy_axis
    from ..analyses.interventions import layer_set_name, readout_errors, run_interventions, summarize

    acts, fit_idx, eval_idx = s.acts, s.fit_idx, s.eval_idx
    layers = edits.layers
    control = {c: s.nuisances[c] for c in p.axis_control} if p.axis_control else None
    axes = {layer: fit_entropy_axis(acts, layer, p.method, subset=fit_idx, folds=0, seed=ctx.config.seed,
                                    control=control) for layer in layers}
    ev = np.asarray(eval_idx)
    geometry = []  # the axis' reading on the evaluation prompts (never fitted on), raw and deconfounded
    for layer, a in axes.items():
        proj = a.project(acts.values(layer)[ev]).double().numpy()
        for target, y in (("model entropy", acts.entropy.numpy()),
                          ("bayes latent", np.asarray(s.task["bayes_entropy"]))):
            geometry += deconfounded(proj, y[ev], {c: v[ev] for c, v in s.nuisances.items()}, p.covariates,
                                     np.asarray(s.strata)[ev], s.strata_name, n_perm=p.n_perm, seed=ctx.config.seed,
                                     metric="corr_eval_projection", scope=dict(layer=layer, target=target,
                                                                               condition="baseline"))
    task = {key: [s.task[key][i] for i in eval_idx] for key in ("k", "latent", "bayes_entropy")}
    if acts.groups is not None:  # the MAE's bootstrap resamples whole groups (a wind tunnel's sequences)
        task["groups"] = np.asarray(acts.groups)[ev]
    fit_values = {layer: acts.values(layer)[fit_idx] for layer in layers}
    res = run_interventions(s.model, [s.prompts[i] for i in eval_idx], axes, fit_values, task, edits,
                            label_tokens=s.label_tokens, batch_size=ctx.config.batch_size,
                            progress=not ctx.config.quiet)
    more, forwards = {}, res.n_forward_prompts
    if readout is not None:
        names = [layer_set_name(ls) for ls in edits.layer_sets]
        name = widest(names)
        errors = readout_errors(s.model, readout["text"], axes, fit_values, readout, edits,
                                edits.layer_sets[names.index(name)], label_tokens=s.label_tokens,
                                batch_size=ctx.config.batch_size, progress=not ctx.config.quiet)
        more[(name, "cut")], forwards = errors, forwards + errors.n_forward_prompts
    rows = summarize(res, task, seed=ctx.config.seed, readout_delta=READOUT_DELTA_BITS, more=more)
    rows += geometry + [Row("axis_sigma", a.sigma, "value units", dict(layer=layer)) for layer, a in axes.items()]
    rows.append(Row("forward_prompts", forwards, "prompts", {}))  # wall time: stage.json's seconds
    return Result(rows, dict(runs=res.rows, baseline={k: v for k, v in res.baseline.items() if k != "entropy"},
                             fit=p.fit, n_eval=len(eval_idx), n_fit=len(fit_idx)))


def run(ctx, p: InterventionsParams) -> Result:
    from ..analyses.interventions import EditProtocol
    from ..stats.confounds import nuisance_columns

    edits = EditProtocol(layer_sets(ctx, p.layer_sets), p.ops, p.controls, ctx.config.seed)
    acts, cols = sula(ctx, "main", p.per_k, p.seed, p.layers)
    fit_idx, eval_idx = split_by_k(cols["k"], p.split_seed)
    if p.fit == "in_sample":
        fit_idx = eval_idx
    task, ids = sula_task(ctx, p.per_k)
    columns = nuisance_columns([len(t) for t in acts.token_ids], k=cols["k"])
    return protocol(ctx, p, ProtocolPrompts(ctx.model, cols["text"], acts, cols, ids["main"], fit_idx, eval_idx,
                                            columns, cols["k"], "k"), edits,
                    readout_prompts(task, p) if readout_scored(p) else None)


def readout_scored(p: InterventionsParams) -> bool:
    """Whether the recipe scores prompts beside the evaluation half: ``readout_per_k`` of them, a cut, and the 2
    matched draws a readout excess needs."""
    return p.readout_per_k > 0 and "cut" in p.ops and p.controls.get("matched", 0) >= 2


def readout_prompts(task, p: InterventionsParams) -> dict:
    """The SULA prompts beside the evaluation half, for the readout claim: ``p.readout_per_k`` of every k >= 1 (the
    claim reads k >= 1 only) drawn with ``p.readout_seed``."""
    return replace(task, ks=tuple(k for k in task.ks if k >= 1), per_k=p.readout_per_k).generate(
        "main", seed=p.readout_seed)


def plan(ctx, p: InterventionsParams) -> list:
    from ..analyses.controls import RANDOM_FAMILIES
    from ..analyses.interventions import CONTROL_BATCH
    from ..model.edits import ONMANIFOLD_OPS

    items = plan_sula(ctx, "interventions", ["main"], p.per_k, p.seed, p.layers)
    # at most: the random control families stop once the true edit's rank among them is settled (their counts are
    # caps), at the cost of one unperturbed run per call of ``edited_runs`` (the true edits and PCs, then a batch of
    # random controls at a time up to the largest cap), and one run reads the on-manifold ablations' values
    cap = max((n for fam, n in p.controls.items() if fam in RANDOM_FAMILIES), default=0)
    n_runs = (1 + -(-cap // CONTROL_BATCH) + any(op in ONMANIFOLD_OPS for op in p.ops)
              + len(p.layer_sets) * len(p.ops) * (1 + sum(p.controls.values())))
    n_eval = 5 * p.per_k - 5 * p.per_k // 2
    items.append(PlanItem("interventions", f"at most {n_runs} edited and unedited runs of ~{n_eval} prompts", False,
                          n_runs * n_eval, sample=items[0].sample))  # the runs' prompts are SULA prompts
    if readout_scored(p):
        n_more, runs = len(readout_prompts(sula_task(ctx, p.per_k)[0], p)["text"]), 2 + p.controls["matched"]
        items.append(PlanItem("interventions", f"{runs} runs (unedited, true and matched cuts) of {n_more} readout "
                                               "prompts", False, runs * n_more, sample=items[0].sample))
    return items


def effect_text(rows: list[Row], **scope) -> tuple[str, str]:
    """'true +x (CI); family mean [range] (pct p of n draws); ...' and the true effect's verdict."""
    true = find(rows, "effect", family="true", **scope)
    ci = f" ({true.low:+.4f}, {true.high:+.4f})" if true.low is not None else ""
    parts = [f"true {true.value:+.4f}{ci}"]
    for r in select(rows, "effect", **scope):
        fam = r.scope["family"]
        if fam == "true":
            continue
        pct = find(rows, "percentile_of_true", family=fam, **scope)
        if r.low is None:
            parts.append(f"{fam} {r.value:+.4f} (too few draws for a percentile: {r.n})")
        else:
            parts.append(f"{fam} {r.value:+.4f} [{r.low:+.4f}, {r.high:+.4f}] (pct {pct.value:.2f} of {r.n} draws)")
    return "; ".join(parts), true.verdict().replace("null", "matched controls")


def summary_lines(rows: list[Row], prefix: str = "") -> list[Line]:
    out = []
    layers = sorted({r.scope["layer"] for r in select(rows, "corr_eval_projection")})
    if layers:
        text, claim = deconfounded_text(rows, "corr_eval_projection", layer=layers[-1], target="bayes latent")
        out.append(Line(f"{prefix}axis L{layers[-1]} on the evaluation prompts vs Bayes H", text, claim))
    for r in select(rows, "effect", measure="mae_k_ge_1", family="true"):
        text, verdict = effect_text(rows, layer_set=r.scope["layer_set"], op=r.scope["op"], measure="mae_k_ge_1")
        out.append(Line(f"{prefix}{r.scope['op']} L{r.scope['layer_set']}: change in MAE k>=1 (bits)", text, verdict))
    return out


def summary(rows: list[Row], p: InterventionsParams) -> list[Line]:
    return summary_lines(rows, "conditional axis: " if p.axis_control else "")


def effects_figure(p, title_prefix: str = "") -> Figure | None:
    """Per layer set and operator: the true axis' effect (diamond, bootstrap CI for the MAE) against every control
    draw (strips per family), one panel per measure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    runs = p.data.get("runs")
    if not runs:
        return None
    measures = [m for m in MEASURE_LABELS if select(p.rows, "effect", measure=m, family="true")]
    fig = make_subplots(rows=len(measures), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[MEASURE_LABELS[m] for m in measures])
    families = list(dict.fromkeys(r["kind"] for r in runs if r["kind"] != "true"))
    for i, measure in enumerate(measures, start=1):
        true = select(p.rows, "effect", measure=measure, family="true")
        # a draw's effect is its raw measure minus the edit's reference (the baseline; 0 for the KL), and the true
        # run's row gives that reference as its raw measure minus its effect
        ref = {(r.scope["layer_set"], r.scope["op"]): r.value - _true_raw(runs, r.scope) for r in true}
        for fam in families:
            sel = [r for r in runs if r["kind"] == fam and (r["layer_set"], r["op"]) in ref]
            fig.add_trace(go.Box(x=[f"L{r['layer_set']} · {r['op']}" for r in sel],
                                 y=[r[measure] + ref[(r["layer_set"], r["op"])] for r in sel],
                                 name=f"{fam} controls", legendgroup=fam, showlegend=i == 1, boxpoints="all",
                                 jitter=0.6, pointpos=0, fillcolor="rgba(0,0,0,0)", line=dict(color="rgba(0,0,0,0)"),
                                 marker=dict(color=FAMILY_COLOURS.get(fam), size=6, opacity=0.75)), row=i, col=1)
        has_ci = all(r.low is not None for r in true)
        fig.add_trace(go.Scatter(
            x=[f"L{r.scope['layer_set']} · {r.scope['op']}" for r in true], y=[r.value for r in true],
            mode="markers", name="true entropy axis", legendgroup="true", showlegend=i == 1,
            marker=dict(symbol="diamond", size=13, color=FAMILY_COLOURS["true"], line=dict(color="white", width=1)),
            error_y=dict(type="data", array=[r.high - r.value for r in true],
                         arrayminus=[r.value - r.low for r in true]) if has_ci else None), row=i, col=1)
        fig.add_hline(y=0, line=dict(color="#888", width=1), row=i, col=1)
    return Figure(f"interventions-{p.name}", f"{title_prefix}Interventions", layout(
        fig, f"{title_prefix}Interventions: true axis vs control axes ({p.data.get('fit')} fit, "
             f"{p.data.get('n_eval')} evaluation prompts)", boxmode="group", height=260 * len(measures) + 80),
        "A red diamond outside its control strips means editing the entropy axis does something random axes do not.")


def _true_raw(runs: list[dict], scope: dict) -> float:
    """The raw measure of the true-axis run of a (layer set, op)."""
    for r in runs:
        if r["kind"] == "true" and r["layer_set"] == scope["layer_set"] and r["op"] == scope["op"]:
            return r[scope["measure"]]
    return float("nan")


def per_k_figure(p, title_prefix: str = "") -> Figure | None:
    """Change in entropy MAE per k of every edit, true axis against the mean of each control family."""
    import plotly.graph_objects as go

    runs, base = p.data.get("runs"), p.data.get("baseline", {})
    ks = sorted(int(key[len("mae_k"):]) for key in base if key.startswith("mae_k") and key[5:].isdigit())
    if not runs or not ks:
        return None
    from plotly.colors import qualitative

    fig = go.Figure()
    edits = list(dict.fromkeys((r["layer_set"], r["op"]) for r in runs))
    sets = list(dict.fromkeys(layer_set for layer_set, _ in edits))
    families = list(dict.fromkeys(r["kind"] for r in runs))
    control = "matched" if "matched" in families else next((f for f in families if f != "true"), None)
    for i, (layer_set, op) in enumerate(edits):
        # one colour per edit (its legend entry), the layer set as the marker; its matched controls' mean as a
        # thin dotted line of the same colour in the same legend group (one entry per edit, not per family)
        colour = qualitative.Plotly[i % len(qualitative.Plotly)]
        for fam in ("true", control) if control else ("true",):
            sel = [r for r in runs if r["kind"] == fam and r["layer_set"] == layer_set and r["op"] == op]
            if not sel:
                continue
            y = [float(np.mean([r[f"mae_k{k}"] for r in sel])) - base[f"mae_k{k}"] for k in ks]
            true = fam == "true"
            fig.add_trace(go.Scatter(x=ks, y=y, mode="lines+markers" if true else "lines",
                                     name=f"L{layer_set} {op}" if true else f"L{layer_set} {op}: {fam} controls' mean",
                                     legendgroup=f"{layer_set}{op}", showlegend=true,
                                     marker=dict(symbol=["circle", "square", "diamond", "x"][sets.index(layer_set) % 4]),
                                     line=dict(color=colour, dash="solid" if true else "dot", width=2 if true else 1)))
    fig.add_hline(y=0, line=dict(color="#888", width=1))
    axis_titles(fig, "k (in-context examples)", "Δ entropy MAE vs Bayes (bits)")
    return Figure(f"interventions-per-k-{p.name}", f"{title_prefix}Intervention effects per k", layout(
        fig, f"{title_prefix}Change in calibration per k (solid: true axis; dotted: its matched controls' mean)"),
        "Where an edit hurts: a solid curve above its dotted controls' curve at some k means the axis matters there. "
        "Click a legend entry to hide an edit.")


def figures(probes) -> list[Figure]:
    out = []
    for p in probes:
        out += [f for f in (effects_figure(p), per_k_figure(p)) if f is not None]
    return out


# the readout claim's delta (bits of in-context entropy MAE): an ablation that adds this much is a bottleneck the claim
# must be able to see; it is the wind tunnels' calibration bound (windtunnel.CALIBRATED_BITS "holds" at 0.01 bits), so
# a harm the claim cannot see could take a calibrated tunnel out of calibration
READOUT_DELTA_BITS = 0.01
READOUT_OPS = {"cut": "cut", "resample": "resample ablation, on the manifold",
               "mean": "stratum-mean ablation, on the manifold"}  # op -> how the claim names it


def widest(layer_sets: list[str]) -> str:
    """The layer set the readout claim reads: the one editing the most layers (names like "10+15+20"; the first of
    equals)."""
    return max(layer_sets, key=lambda name: len(name.split("+")))


def readout_claim(rows: list[Row], subject: str = "", section: str = "", op: str = "cut"):
    """The claim that the axis is a readout, not a bottleneck: ablating it (``op``: the linear cut, or the
    on-manifold ``resample`` / ``mean``) at the widest layer set costs less than ``READOUT_DELTA_BITS`` of
    in-context MAE beyond ablating matched random axes the same way (None when the run made no such ablation).
    Decided by the ``readout_excess`` row (``analyses.interventions.readout_excess``: the paired excess over the
    mean matched ablation, its two-level bootstrap interval drawn until settled against the delta) with
    ``ledger.below_margin``. Rows written before that row existed read "not testable here", asking for a rerun.
    Claim keys: ``readout``, ``readout-resample``, ``readout-mean``."""
    from ..stats import ledger as L

    cuts = select(rows, "effect", op=op, measure="mae_k_ge_1", family="true")
    if not cuts:
        return None
    layer_set = widest([str(r.scope.get("layer_set", "")) for r in cuts])
    key = "readout" if op == "cut" else f"readout-{op}"
    text = f"The axis is a readout, not a bottleneck ({READOUT_OPS[op]} at L{layer_set}: change in MAE k >= 1, bits)"
    row = find(rows, "readout_excess", op=op, measure="mae_k_ge_1", layer_set=layer_set)
    if row is None:
        matched = find(rows, "effect", op=op, measure="mae_k_ge_1", layer_set=layer_set, family="matched")
        why = ("no readout_excess row: the stage was written before the readout excess existed; rerun it"
               if matched is not None else "no matched controls to compare with")
        return Claim(key, text, L.UNTESTABLE, why, subject=subject, section=section)
    evidence = (f"excess {L.fmt(row)} (claim: below {READOUT_DELTA_BITS:g} bits; "
                f"{(row.note or '').split(';')[0]})")
    return Claim(key, text, L.below_margin(row, READOUT_DELTA_BITS), evidence, subject=subject, section=section)


def readout_claims(rows: list[Row], subject: str = "", section: str = "") -> list:
    """``readout_claim`` for every ablation the run holds (the cut, then the on-manifold ones)."""
    out = [readout_claim(rows, subject, section, op) for op in READOUT_OPS]
    return [c for c in out if c is not None]


def ledger(probes) -> list:
    return [c for p in probes for c in readout_claims(p.rows, section=f"fig-interventions-{p.name}")]


KIND = register(Kind("interventions", InterventionsParams, run, summary, figures, plan, doc=__doc__, ledger=ledger))
