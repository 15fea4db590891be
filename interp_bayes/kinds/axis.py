"""Entropy axes on the SULA main set at each of the probe's layers: PC1 of standardised values and a ridge probe,
their in-sample and cross-fitted held-out correlation with the model's entropy, and the projection's correlation
with the exact Bayes entropy; each axis is saved in the probe folder (``axes/<method>-L<layer>``)."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
from dataclasses import dataclass

import numpy as np

from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, Result
from .common import SULA_LAYERS, check_folds, deconfounded, deconfounded_text, plan_sula, sula, sula_prompts
from .icl import TARGETS
from ..core.figures import axis_titles, layout


@dataclass(frozen=True)
class AxisParams(Params):
    methods: tuple[str, ...] = ("pc1", "ridge")
    folds: int = 5  # K of the cross-fitted held-out correlation
    per_k: int = 50
    seed: int = 42  # the SULA prompt draws
    layers: tuple[int, ...] | str = SULA_LAYERS
    covariates: tuple[str, ...] = ("length", "k", "log_k")  # nuisances: of the conditional axis and the statistics
    conditional: bool = True  # also fit the conditional axis (values and entropy residualised on the covariates)
    n_perm: int = 1000  # draws of the within-k permutation null

    def check(self, ctx, probe: str) -> None:
        check_folds(probe, self.folds, sula_prompts(self.per_k), "SULA prompts", "per_k")


def run(ctx, p: AxisParams) -> Result:
    from ..analyses.axis import fit_entropy_axis
    from ..stats.confounds import nuisance_columns
    from ..stats.pca import correlations

    acts, cols = sula(ctx, "main", p.per_k, p.seed, p.layers)
    rows, n = [], len(acts)
    k = np.array(cols["k"])
    columns = nuisance_columns([len(t) for t in acts.token_ids], k=k)
    control = {c: columns[c] for c in p.covariates}
    targets = [("model entropy", acts.entropy.numpy())] + [(f"bayes {t}", np.array(cols[c])) for t, c in TARGETS]
    for layer in ctx.layers(p.layers):
        for method in p.methods:
            for kind in ("unconditional", "conditional") if p.conditional else ("unconditional",):
                axis = fit_entropy_axis(acts, layer, method, folds=p.folds, seed=ctx.config.seed,
                                        control=control if kind == "conditional" else None, strata=k)
                axis.save(ctx.probe_folder / "axes" / f"{method}-{kind}-L{layer}")
                scope = dict(layer=layer, method=method, axis=kind)
                for fit, corr in (("in-sample", axis.in_sample), ("held-out", axis.held_out)):
                    if corr is None:
                        continue
                    rows += [Row(f"{stat}_projection", corr[stat], "r" if stat == "pearson" else "rho",
                                 dict(scope, target="model entropy", fit=fit), n=n, note=corr.get("reason"))
                             for stat in ("pearson", "spearman")]
                bayes = correlations(axis.project(acts.values(layer)), cols["bayes_entropy"])
                rows += [Row(f"{stat}_projection", bayes[stat], "r" if stat == "pearson" else "rho",
                             dict(scope, target="bayes latent", fit="in-sample"), n=n, note=bayes.get("reason"))
                         for stat in ("pearson", "spearman")]
                rows.append(Row("sigma", axis.sigma, "value units", dict(scope), n=n))
                rows.append(Row("axis_residual_confounding", axis.residual_confounding, "share", dict(scope), n=n,
                                note="share of the projection's variance between values of k"))
                if axis.held_out is None:
                    continue
                held = np.array(axis.held_out["projections"])  # each prompt on an axis fitted without it
                for target, y in targets:
                    rows += deconfounded(held, y, columns, p.covariates, k, "k", n_perm=p.n_perm,
                                         seed=ctx.config.seed, metric="corr_held_out_projection",
                                         scope=dict(scope, target=target))
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
        for kind in ("unconditional", "conditional"):
            at = dict(layer=last, method=method, axis=kind)
            ins = find(rows, "pearson_projection", target="model entropy", fit="in-sample", **at)
            held = find(rows, "pearson_projection", target="model entropy", fit="held-out", **at)
            if ins is None or held is None:
                continue
            name = f"entropy axis {method} L{last}" + (" (conditional)" if kind == "conditional" else "")
            out.append(Line(f"{name}: r in-sample / held-out", f"{ins.value:+.2f} / {held.value:+.2f}"
                            + (" (partial, given the covariates)" if kind == "conditional" else "")))
            for target in ("bayes latent", "bayes predictive"):
                text, claim = deconfounded_text(rows, "corr_held_out_projection", target=target, **at)
                if text:
                    out.append(Line(f"{name}: held-out projection vs {target} H", text, claim))
    return out


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    out = []
    for p in probes:
        fig = go.Figure()
        for method in p.params.get("methods", []):
            for fit, dash in (("in-sample", "solid"), ("held-out", "dash")):
                rs = sorted(select(p.rows, "pearson_projection", method=method, target="model entropy", fit=fit,
                                   axis="unconditional"), key=lambda r: r.scope["layer"])
                fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in rs], y=[r.value for r in rs],
                                         mode="lines+markers", name=f"{method}, {fit}", line=dict(dash=dash),
                                         marker=dict(size=9), legendgroup=method))
        fig.add_hline(y=0, line=dict(color="#888", width=1))
        axis_titles(fig, "layer", "Pearson r(v·u, model entropy)", xaxis=dict(dtick=1), yaxis=dict(range=[-1.05, 1.05]))
        out.append(Figure(f"axis-{p.name}", "Entropy axis", layout(
            fig, "Entropy axis: in-sample vs held-out correlation (SULA prompts)"),
            "Held-out (dashed) close to in-sample (solid) means the axis generalises; a large gap means overfitting."))
        out.append(_deconfounded_figure(p))
    return out


def _deconfounded_figure(p) -> Figure:
    """Per layer: the held-out projection's correlation with the Bayes entropy, raw and within k, for the plain and
    the conditional PC1 axis, with the within-k permutation null's range."""
    import plotly.graph_objects as go

    fig = go.Figure()
    method = (p.params.get("methods") or ["pc1"])[0]
    for axis, kind, dash in (("unconditional", "raw", "solid"), ("unconditional", "within", "dash"),
                             ("conditional", "within", "dot")):
        rs = sorted(select(p.rows, "corr_held_out_projection", method=method, axis=axis, deconfounded=kind,
                           target="bayes latent"), key=lambda r: r.scope["layer"])
        if not rs:
            continue
        x = [r.scope["layer"] for r in rs]
        fig.add_trace(go.Scatter(x=x, y=[r.value for r in rs], mode="lines+markers", line=dict(dash=dash),
                                 name=f"{axis} axis, {kind}"))
        if kind == "within":
            fig.add_trace(go.Scatter(x=x + x[::-1], y=[r.null_high for r in rs] + [r.null_low for r in rs[::-1]],
                                     fill="toself", fillcolor="rgba(150,150,150,0.15)", line=dict(width=0),
                                     name=f"{axis}: within-k null 95%", hoverinfo="skip"))
    fig.add_hline(y=0, line=dict(color="#888", width=1))
    axis_titles(fig, "layer", "Spearman ρ(held-out v·u, Bayes H)", xaxis=dict(dtick=1), yaxis=dict(range=[-1.05, 1.05]))
    return Figure(f"axis-deconfounded-{p.name}", "Entropy axis: raw vs within k", layout(
        fig, f"Does the {method} axis track uncertainty beyond k? Raw and within-k correlation with Bayes entropy"),
        "A raw curve far from zero whose within-k curve sits inside the grey null tracks k (the number of examples), "
        "not the posterior; the conditional axis is fitted on what k (one indicator per value) and length (a spline) "
        "leave over.")


def ledger(probes) -> list:
    """Per axis method: the held-out projection tracks the Bayes entropy beyond the confounds (last layer)."""
    from ..stats import ledger as L

    out = []
    for p in probes:
        corr = select(p.rows, "corr_held_out_projection", target="bayes latent", axis="unconditional")
        if not corr:
            continue
        last = max(r.scope["layer"] for r in corr)
        for method in dict.fromkeys(r.scope.get("method") for r in corr):
            at = dict(layer=last, method=method, axis="unconditional")
            text, claim = deconfounded_text(p.rows, "corr_held_out_projection", target="bayes latent", **at)
            if text:
                out.append(Claim(f"axis-{method}", f"A held-out {method} entropy axis (L{last}) tracks the Bayes "
                                 "entropy beyond k and length", L.from_deconfounded(claim), text,
                                 section=f"fig-axis-{p.name}"))
    return out


KIND = register(Kind("axis", AxisParams, run, summary, figures, plan, doc=__doc__, ledger=ledger))
