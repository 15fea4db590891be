"""Attention focusing (Paper III): entropy of the final query's attention, per head then averaged over heads, at
every layer, on a prompt set drawn per entropy quantile from the pool; the reduction from the first to the last
layer, with bootstrap intervals over prompts."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
from dataclasses import dataclass

import numpy as np

from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, Result
from .common import claims_from, pool
from ..core.figures import COLOURS, axis_titles, layout
from ..core.prompts import load_source, source_label, stratified_sample


@dataclass(frozen=True)
class FocusingParams(Params):
    prompts: str | dict | None = None  # prompt source (None: the sweep's pool)
    per_bin: int = 15  # prompts per entropy quintile
    n_boot: int = 1000


def _chosen(ctx, p: FocusingParams):
    acts, ds = pool(ctx, p.prompts)
    idx = stratified_sample(acts.entropy.numpy(), per_bin=p.per_bin, seed=ctx.config.seed)
    return [ds["text"][i] for i in idx]


def run(ctx, p: FocusingParams) -> Result:
    from ..analyses.focusing import attention_focusing

    texts = _chosen(ctx, p)
    acts = ctx.activations("focusing", texts, layers=ctx.layers("all"), readings=("attn_entropy",))
    f = attention_focusing(acts.readings["attn_entropy"], n_boot=p.n_boot, seed=ctx.config.seed)
    n = f["n_prompts"]
    rows = [Row("attention_entropy", m, "bits", dict(layer=layer), ci[0], ci[1], "bootstrap 95%", n=n)
            for layer, m, ci in zip(f["layers"], f["mean_entropy"], f["ci"])]
    rows.append(Row("focusing_reduction", f["reduction"], "fraction", {}, *f["reduction_ci"], "bootstrap 95%", n=n,
                    note="(first - last) / first layer's mean attention entropy", test=f["reduction_test"]))
    return Result(rows)


def plan(ctx, p: FocusingParams) -> list:
    spec = p.prompts if p.prompts is not None else ctx.config.prompts
    texts = list(load_source(spec)["text"])
    pool_cached = (ctx.acts_path(f"pool-{source_label(spec)}", texts, layers=ctx.layers(None)) /
                   "activations.json").exists()
    chosen = _chosen(ctx, p) if pool_cached else 5 * p.per_bin  # the prompts depend on the pool's entropies
    items = [] if pool_cached else [ctx.plan_acts("focusing", f"pool-{source_label(spec)}", texts,
                                                  layers=ctx.layers(None), dims=ctx.site_dims())]
    return items + [ctx.plan_acts("focusing", "focusing", chosen, layers=ctx.layers("all"),
                                  readings=("attn_entropy",), dims=ctx.site_dims())]


def summary(rows: list[Row], p: FocusingParams) -> list[Line]:
    r = find(rows, "focusing_reduction")
    return [Line("attention focusing (first -> last layer)", f"{100 * r.value:.1f}% ({100 * r.low:.1f}, "
                 f"{100 * r.high:.1f}; bootstrap)", "", "attention focusing")]


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    out = []
    for p in probes:
        per = sorted(select(p.rows, "attention_entropy"), key=lambda r: r.scope["layer"])
        x = np.array([r.scope["layer"] for r in per])
        red = find(p.rows, "focusing_reduction")
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=np.r_[x, x[::-1]], y=[r.high for r in per] + [r.low for r in per[::-1]],
                                 fill="toself", fillcolor="rgba(31,78,121,0.18)", line=dict(width=0), mode="lines",
                                 name="bootstrap 95% CI", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=x, y=[r.value for r in per], mode="lines+markers",
                                 name="mean over heads and prompts", line=dict(color=COLOURS["observed"])))
        axis_titles(fig, "layer", "attention entropy (bits)", xaxis=dict(dtick=max(1, len(x) // 12)),
                    yaxis=dict(rangemode="tozero"))
        out.append(Figure(f"focusing-{p.name}", "Attention focusing", layout(
            fig, f"Attention focusing: {100 * red.value:.0f}% reduction first→last layer (95% CI "
                 f"{100 * red.low:.0f}%, {100 * red.high:.0f}%)"),
            "A falling curve means attention sharpens with depth; the band is the bootstrap interval over prompts."))
    return out


def ledger(probes) -> list:
    from ..stats import ledger as L

    return claims_from(probes, "focusing_reduction", lambda p, red: Claim(
        "attention-focuses", "Attention focuses with depth (entropy falls from the first to the last layer)",
        L.interval_side(red, "above", 0.0), L.fmt(red, pct=True), paper="attention focusing",
        section=f"fig-focusing-{p.name}"))


KIND = register(Kind("focusing", FocusingParams, run, summary, figures, plan, doc=__doc__, ledger=ledger))
