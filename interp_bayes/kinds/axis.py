"""Entropy axes on the SULA main set at each of the probe's layers: PC1 of standardised values and a ridge probe,
their in-sample and cross-fitted held-out correlation with the model's entropy, and the projection's correlation
with the exact Bayes entropy; each axis is saved in the probe folder (``axes/<method>-L<layer>``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..results import Row, find, select
from . import register
from .base import Figure, Kind, Line, Params, Result
from .common import SULA_LAYERS, plan_sula, sula


@dataclass(frozen=True)
class AxisParams(Params):
    methods: tuple[str, ...] = ("pc1", "ridge")
    folds: int = 5  # K of the cross-fitted held-out correlation
    per_k: int = 50
    seed: int = 42  # the SULA prompt draws
    layers: tuple[int, ...] | str = SULA_LAYERS


def run(ctx, p: AxisParams) -> Result:
    from ..axis import fit_entropy_axis
    from ..geometry import correlations

    acts, cols = sula(ctx, "main", p.per_k, p.seed, p.layers)
    rows, n = [], len(acts)
    for layer in ctx.layers(p.layers):
        for method in p.methods:
            axis = fit_entropy_axis(acts, layer, method, folds=p.folds, seed=ctx.config.seed)
            axis.save(ctx.probe_folder / "axes" / f"{method}-L{layer}")
            scope = dict(layer=layer, method=method, target="model entropy")
            for fit, corr in (("in-sample", axis.in_sample), ("held-out", axis.held_out)):
                if corr is None:
                    continue
                rows += [Row(f"{stat}_projection", corr[stat], "r" if stat == "pearson" else "rho",
                             dict(scope, fit=fit), n=n, note=corr.get("reason")) for stat in ("pearson", "spearman")]
            bayes = correlations(axis.project(acts.values(layer)), cols["bayes_entropy"])
            rows += [Row(f"{stat}_projection", bayes[stat], "r" if stat == "pearson" else "rho",
                         dict(layer=layer, method=method, target="bayes entropy", fit="in-sample"), n=n,
                         note=bayes.get("reason")) for stat in ("pearson", "spearman")]
            rows.append(Row("sigma", axis.sigma, "value units", dict(layer=layer, method=method), n=n))
    return Result(rows)


def plan(ctx, p: AxisParams) -> list:
    return plan_sula(ctx, "axis", ["main"], p.per_k, p.seed, p.layers)


def summary(rows: list[Row], p: AxisParams) -> list[Line]:
    corr = select(rows, "pearson_projection", target="model entropy")
    if not corr:
        return []
    last = max(r.scope["layer"] for r in corr)
    out = []
    for method in p.methods:
        ins = find(rows, "pearson_projection", layer=last, method=method, target="model entropy", fit="in-sample")
        held = find(rows, "pearson_projection", layer=last, method=method, target="model entropy", fit="held-out")
        if ins is not None and held is not None:
            out.append(Line(f"entropy axis {method} L{last}: r in-sample / held-out",
                            f"{ins.value:+.2f} / {held.value:+.2f}"))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    from ..report.figures import layout

    out = []
    for p in probes:
        fig = go.Figure()
        for method in p.params.get("methods", []):
            for fit, dash in (("in-sample", "solid"), ("held-out", "dash")):
                rs = sorted(select(p.rows, "pearson_projection", method=method, target="model entropy", fit=fit),
                            key=lambda r: r.scope["layer"])
                fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs],
                                         mode="lines+markers", name=f"{method}, {fit}", line=dict(dash=dash),
                                         marker=dict(size=9), legendgroup=method))
        fig.add_hline(y=0, line=dict(color="#888", width=1))
        fig.update_xaxes(title_text="layer", dtick=1)
        fig.update_yaxes(title_text="Pearson r(v·u, model entropy)", range=[-1.05, 1.05])
        out.append(Figure(f"axis-{p.name}", "Entropy axis", layout(
            fig, "Entropy axis: in-sample vs held-out correlation (SULA prompts)"),
            "Held-out (dashed) close to in-sample (solid) means the axis generalises; a large gap means overfitting."))
    return out


KIND = register(Kind("axis", AxisParams, run, summary, figures, plan, doc=__doc__))
