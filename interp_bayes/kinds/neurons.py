"""The rival to the value axis (Stolfo et al. 2024): entropy neurons, last-layer MLP neurons that write into the
unembedding's effective null space and change entropy through the final norm's scale. Scores of every neuron
(the authors' null-space fraction |V0^T w| / |w| of the write, ranked by it), mean ablations of the top
candidates, one row per neuron, beside random neurons (total, direct with the norm frozen, norm-mediated, and the
share through the norm),
token-frequency neurons, the value axis's overlap with the null space against random value directions, the
final-norm scale's correlation with entropy (raw and deconfounded), and optionally the two mechanisms ablated side by
side on the in-context task (docs/rivals.md).

On SULA (``tunnel: null``, the default) the model is the sweep's; on a wind tunnel (``tunnel: <checkpoint>``) it is
loaded here and every part runs on its query prefixes (``windtunnel_prompts``). A wind tunnel is trained and scored
over its hypothesis tokens alone (its other outputs are untrained), so they are the readout: the null space is that of their
unembedding columns, the ablations also report the change of the entropy over them at the query, the scale is
correlated with that entropy and with the exact Bayes entropy (not with the full vocabulary's), no token-frequency
neurons are sought, and the covariates include one indicator per query position by default."""

from __future__ import annotations

# plotly is imported inside the functions that draw: a run that only computes rows does not load it
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import numpy as np

from ..core.errors import ConfigError
from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, PlanItem, Result
from .common import SULA_LAYERS, deconfounded_text, plan_sula, recipe_nuisances, sula, sula_task
from .windtunnel import TunnelParams, check_layers, tunnel_plan, tunnel_subject, windtunnel_prompts, windtunnel_set
from ..analyses.axis import fit_entropy_axis
from ..analyses.mechanisms import axis_null_overlap, compare_mechanisms, scale_entropy
from ..analyses.neurons import AblationProtocol, entropy_neurons
from ..analyses.unembedding import frequency_neurons, unembedding_null_space, unigram_counts
from ..core.figures import COLOURS, axis_titles, layout
from ..core.prompts import load_source
from ..stats import ledger as L
from ..stats.confounds import deconfounded_rows
from ..windtunnel.tunnels import open_tunnel


@dataclass(frozen=True)
class EntropyNeuronsParams(TunnelParams):
    tunnel_archs: ClassVar[tuple[str, ...] | None] = ("transformer",)  # its value vectors
    tunnel: str | None = None  # a wind tunnel (packaged name or trained folder); None: the sweep's model on SULA
    prompts: str | dict | None = None  # SULA: prompts the neurons are ablated on (None: the sweep's pool)
    n_prompts: int = 96  # SULA: a seeded sample of them
    n_sequences: int = 40  # wind tunnel: sequences whose query prefixes are the prompts of every part
    layer: int = -1  # the MLP layer searched
    top_n: int = 5  # candidates ablated one by one
    n_random: int = 10  # random neurons of the same layer, ablated as the control
    n_boot: int = 1000
    frequency_top_n: int = 10  # token-frequency neurons listed (SULA)
    n_random_directions: int = 1000  # random value directions of the null-space overlap null, at most (drawn until
    #                                  the axis's rho is settled against them)
    per_k: int = 50  # SULA: the prompts of the axis and of the scale-entropy correlation
    seed: int = 42
    covariates: tuple[str, ...] = ("length", "k", "log_k")
    n_perm: int = 1000
    compare: bool = False  # also ablate both mechanisms side by side (slow on SmolLM2: minutes)
    n_controls: int = 5  # control draws of that comparison

    def check(self, ctx, probe: str) -> None:
        check_layers(ctx, probe, self.tunnel, dict(layer=self.layer))


def _prompt_sets(ctx, p: EntropyNeuronsParams) -> SimpleNamespace:
    """The model and prompts of each part: ``ablate`` (the ablations), ``acts``/``cols``/``prompts`` (the axis, the
    scale correlation, the comparison), ``labels`` (their label tokens), ``readout`` (the tokens the null space and
    the ablations' label entropy are over; None: the whole vocabulary), ``texts`` (the pool, for token frequency;
    None on a wind tunnel), ``bayes`` (targets of the scale correlation beside the model's own: a wind tunnel's exact
    entropy), ``reported`` (the scale correlation's targets reported) and ``name`` (the prompt set, a row scope)."""
    if p.tunnel is not None:
        if p.prompts is not None:
            raise ConfigError("Parameter 'prompts' applies to the sweep's model (no tunnel:); on a wind tunnel every "
                              "part runs on its query prefixes (set n_sequences).")
        wt = windtunnel_set(ctx, p.tunnel, p.n_sequences, p.seed, layers=[-1])
        hyp = wt.task.hypothesis_ids
        # trained over its hypotheses alone, a wind tunnel's full-vocabulary entropy is not its output: not reported
        return SimpleNamespace(model=wt.model, ablate=wt.prompts, acts=wt.acts, cols=wt.cols, prompts=wt.prompts,
                               labels=hyp, readout=hyp, texts=None, bayes=dict(bayes_entropy=wt.cols["bayes_entropy"]),
                               reported=("label_entropy", "bayes_entropy"), name=tunnel_subject(p))
    # the pool's texts alone: the ablations and token counts run on text, so no activation set of it is collected
    texts = list(load_source(p.prompts if p.prompts is not None else ctx.config.prompts)["text"])
    chosen = sorted(np.random.default_rng(p.seed).choice(len(texts), min(p.n_prompts, len(texts)), replace=False))
    acts, cols = sula(ctx, "main", p.per_k, p.seed, SULA_LAYERS)
    _, ids = sula_task(ctx, p.per_k)
    return SimpleNamespace(model=ctx.model, ablate=[texts[i] for i in chosen], acts=acts, cols=cols,
                           prompts=cols["text"], labels=ids["main"], readout=None, texts=texts, bayes={},
                           reported=("entropy", "label_entropy"), name="sula")


def run(ctx, p: EntropyNeuronsParams) -> Result:
    s = _prompt_sets(ctx, p)
    model = s.model
    null = unembedding_null_space(model, tokens=s.readout)
    report = entropy_neurons(model, s.ablate, AblationProtocol(p.layer, p.top_n, p.n_random, p.seed, p.n_boot),
                             null=null, label_tokens=s.readout, batch_size=ctx.config.batch_size,
                             progress=not ctx.config.quiet)
    rows = report.rows()
    if s.texts is not None:
        freq = frequency_neurons(model, unigram_counts(model, s.texts), layer=p.layer, top_n=p.frequency_top_n,
                                 seed=p.seed)
        rows += [Row("frequency_r", t["r"], "Pearson r", dict(layer=freq["layer"], neuron=t["neuron"], rank=rank),
                     null_low=freq["null_range"][0], null_high=freq["null_range"][1],
                     null=f"{freq['n_random']} random directions", note=f"ceiling r {freq['ceiling_r']:.3f}")
                 for rank, t in enumerate(freq["top"], 1)]
    axis = fit_entropy_axis(s.acts, -1, "pc1", folds=0, seed=ctx.config.seed)
    overlap = axis_null_overlap(model, axis.direction, axis.layer, null=null, n_random=p.n_random_directions,
                                seed=p.seed)
    rows.append(Row("axis_null_rho", overlap["rho"], "fraction of |r|", dict(layer=overlap["layer"]),
                    null_low=overlap["random_range"][0], null_high=overlap["random_range"][1],
                    null=f"{overlap['n_random']} random value directions",
                    note=f"percentile {overlap['percentile']:.3f}; chance {overlap['chance_rho']:.4f}",
                    test=overlap["test"]))
    k = np.array(s.cols["k"])
    cov, names = recipe_nuisances(p, [len(t) for t in s.acts.token_ids], k)
    scale = scale_entropy(model, s.prompts, label_tokens=s.labels, covariates=cov, strata=k, n_perm=p.n_perm,
                          seed=p.seed, batch_size=ctx.config.batch_size, covariate_names=names, strata_name="k",
                          targets=s.bayes)
    for target in s.reported:
        rows += deconfounded_rows(scale[target]["deconfounded"], "corr_final_scale", dict(target=target,
                                                                                           prompts=s.name))
    data = dict(rho=report.scores.get("rho"), norm=report.scores.get("norm"),
                candidates=[c["neuron"] for c in report.candidates], null_dim=null.k, write=report.write,
                ablation_path=report.ablation_path)
    if p.compare:
        neurons = [c["neuron"] for c in report.candidates]
        task = dict(k=s.cols["k"], latent=s.cols["latent"], bayes_entropy=s.cols["bayes_entropy"])
        cmp = compare_mechanisms(model, s.prompts, neurons=neurons, axis=axis, neuron_layer=p.layer, task=task,
                                 label_tokens=s.labels, n_controls=p.n_controls, seed=p.seed,
                                 batch_size=ctx.config.batch_size, progress=not ctx.config.quiet)
        rows += cmp.rows()
    return Result(rows, data)


def summary(rows: list[Row], p: EntropyNeuronsParams) -> list[Line]:
    out = []
    name = tunnel_subject(p) or "sula"  # the prompt set's scope: a checkpoint's folder name, or sula
    shown = "SULA" if p.tunnel is None else name
    where = "" if p.tunnel is None else f"{name}: "  # the pool's lines keep their old labels
    top = sorted(select(rows, "neuron_rho"), key=lambda r: r.scope["rank"])
    if top:
        chance = find(rows, "null_space_chance_rho")
        out.append(Line(f"{where}entropy-neuron candidates: null-space fraction rho (rank: neuron rho)",
                        "; ".join(f"{r.scope['neuron']}: {r.value:.3f}" for r in top)
                        + f" (all neurons 2.5-97.5%: {top[0].null_low:.3f}-{top[0].null_high:.3f}; chance "
                          f"{chance.value:.3f})", top[0].verdict()))
    measure, what, unit = (("label", "label entropy at the final token", "bits/prompt")  # a wind tunnel's readout
                           if select(rows, "ablation_total_label") else ("entropy", "entropy", "bits/token"))
    totals = sorted(select(rows, f"ablation_total_{measure}"), key=lambda r: r.scope["rank"])
    if totals:  # one entry per neuron: a signed mean over candidates would let opposite effects cancel
        shares = {r.scope["neuron"]: r.value for r in select(rows, f"ablation_mediated_fraction_{measure}")}
        outside = [r for r in totals if r.verdict() != "within null"]
        out.append(Line(f"{where}entropy-neuron ablation, total effect on {what} ({unit}) per candidate "
                        f"(share through the norm; {totals[0].scope['path']} path)",
                        "; ".join(f"{r.scope['neuron']}: {r.value:+.4f} ({shares.get(r.scope['neuron'], math.nan):.2f})"
                                  for r in totals) + f" (random neurons {totals[0].null_low:+.4f}, "
                                                     f"{totals[0].null_high:+.4f})",
                        f"{len(outside)} of {len(totals)} outside the random neurons' range"))
    absolute = sorted(select(rows, "ablation_total_abs_loss"), key=lambda r: r.scope["rank"])
    if absolute and measure == "entropy":  # the authors' measure: mean |change of the loss| per token
        shares = {r.scope["neuron"]: r.value for r in select(rows, "ablation_mediated_fraction_abs_loss")}
        out.append(Line(f"{where}entropy-neuron ablation, mean |change of loss| per candidate (bits/token; share "
                        "through the norm, 1 - |direct| / |total|: the authors' measure)",
                        "; ".join(f"{r.scope['neuron']}: {r.value:.4f} ({shares.get(r.scope['neuron'], math.nan):.2f})"
                                  for r in absolute) + f" (random neurons {absolute[0].null_low:.4f}, "
                                                       f"{absolute[0].null_high:.4f})", ""))
    r = find(rows, "axis_null_rho")
    if r is not None:
        out.append(Line(f"{where}value axis L{r.scope['layer']} in the unembedding's null space (rho)",
                        f"{r.value:.3f} (random value directions {r.null_low:.3f}-{r.null_high:.3f}; {r.note})",
                        r.verdict()))
    for target in dict.fromkeys(r.scope["target"] for r in select(rows, "corr_final_scale")):
        text, claim = deconfounded_text(rows, "corr_final_scale", target=target, prompts=name)
        if text:
            out.append(Line(f"final-norm scale vs {target.replace('_', ' ')} ({shown})", text, claim))
    for mechanism in ("entropy_neurons", "axis_cut"):
        r = find(rows, "d_entropy", mechanism=mechanism)
        if r is not None:
            out.append(Line(f"{shown}: {mechanism.replace('_', ' ')} ablation, change in label entropy (bits)",
                            f"{r.value:+.4f} (controls {r.null_low:+.4f}, {r.null_high:+.4f})",
                            r.verdict().replace("null", "controls")))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    out = []
    for p in probes:
        d = p.data
        if not d.get("rho"):
            continue
        rho, norm = np.asarray(d["rho"]), np.asarray(d["norm"])
        cand = set(d["candidates"])
        rest = [i for i in range(len(rho)) if i not in cand]
        fig = go.Figure([go.Scatter(x=norm[rest], y=rho[rest], mode="markers", name="neurons",
                                    marker=dict(size=4, color="rgba(31,78,121,0.35)"),
                                    hovertemplate="neuron %{text}<extra></extra>", text=[str(i) for i in rest]),
                         go.Scatter(x=norm[sorted(cand)], y=rho[sorted(cand)], mode="markers", name="candidates",
                                    marker=dict(size=11, color=COLOURS["true"], symbol="diamond"),
                                    text=[str(i) for i in sorted(cand)],
                                    hovertemplate="neuron %{text}<extra></extra>")])
        # the y title short enough for the plot's height (the long form was clipped); the definition is in the caption
        axis_titles(fig, "|w_out|" if d.get("write", "W_out") == "W_out" else
                    "|write| per unit of activation (measured through the post-MLP norm)", "rho = |V0ᵀw| / |w|")
        out.append(Figure(f"entropy-neurons-{p.name}", "Entropy neurons", layout(
            fig, f"Last-layer neurons: output norm against null-space fraction (null space of {d['null_dim']} "
                 "dimensions)"),
            "Entropy neurons sit top right: a large write mostly in the null space, so they change entropy "
            "through the final norm rather than the logits' ranking. rho is the fraction of a write's norm in the "
            "unembedding's null space. Candidates are ranked by rho alone, as the authors rank them."))
    return out


def plan(ctx, p: EntropyNeuronsParams) -> list:
    """The SULA set it reads (shared with other probes), then the ablations: each of the ``top_n``
    candidates and ``n_random`` random neurons ablated on every prompt, total and with the final norm frozen
    (direct), plus the clean forward; with ``compare``, both mechanisms against their controls on the SULA set."""
    if p.tunnel is not None:
        prompts, _ = windtunnel_prompts(open_tunnel(p.tunnel).task, p.n_sequences, p.seed)
        n = len(prompts) * (1 + 2 * (p.top_n + p.n_random)) + (len(prompts) * 2 * (1 + p.n_controls)
                                                               if p.compare else 0)
        return tunnel_plan(p, f"ablations on {len(prompts)} prefixes (a small model: seconds)", n)
    n_ablate = min(p.n_prompts, len(load_source(p.prompts if p.prompts is not None else ctx.config.prompts)))
    items = plan_sula(ctx, "entropy_neurons", ["main"], p.per_k, p.seed, SULA_LAYERS)
    n = n_ablate * (1 + 2 * (p.top_n + p.n_random))
    items.append(PlanItem("entropy_neurons", f"ablations: {p.top_n} candidates and {p.n_random} random neurons on "
                          f"{n_ablate} prompts, total and direct", False, n))
    if p.compare:
        items.append(PlanItem("entropy_neurons", f"both mechanisms ablated with {p.n_controls} controls on the SULA "
                              "set", False, 5 * p.per_k * 2 * (1 + p.n_controls)))
    return items


def ledger(probes) -> list:
    """Rivals: the final-norm scale (entropy neurons' route) tracks entropy beyond the confounds; the value axis
    lies in the unembedding's null space more than random value directions do."""
    out = []
    for p in probes:
        where = tunnel_subject(p.params_object())
        for target in ("entropy", "bayes_entropy"):
            raw = find(p.rows, "corr_final_scale", target=target, deconfounded="raw")
            if raw is None:
                continue
            text, claim = deconfounded_text(p.rows, "corr_final_scale", target=target)
            out.append(Claim("final-norm", f"The final-norm scale tracks {target.replace('_', ' ')} beyond the "
                             "confounds (entropy neurons)", L.from_deconfounded(claim or L.deconfounded_claim(raw)),
                             text, subject=where, rival=True, section=f"fig-entropy-neurons-{p.name}"))
            break
        rho = next(iter(select(p.rows, "axis_null_rho")), None)
        if rho is not None:
            out.append(Claim("axis-null-space", "The value axis lies in the unembedding's null space (beyond random "
                             "value directions)", L.beyond_null(rho), L.fmt(rho), subject=where, rival=True,
                             section=f"fig-entropy-neurons-{p.name}"))
    return out


KIND = register(Kind("entropy_neurons", EntropyNeuronsParams, run, summary, figures, plan, doc=__doc__, ledger=ledger,
                     subject=tunnel_subject))
