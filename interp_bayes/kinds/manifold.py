"""Value manifold (Paper III Table 1): PCA of final-token values of a prompt set drawn per entropy quantile from a
pool, with an interval over fresh draws, the bootstrap (the paper's statistic) and two empirical nulls."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
import html
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError
from ..core.results import Row, find, select
from ..core.plugin import Claim, Figure, Kind, Line, Params, Result
from .common import deconfounded, deconfounded_text, groups_of, last_layer, manifold_rows, pool, share_text
from ..core.registry import register
from ..core.figures import COLOURS, axis_titles, error_bars, layout, shorten, table
from ..core.prompts import load_source, source_label, stratified_sample

DOMAIN_LABELS = {None: "mixed", "mathematics": "math"}


@dataclass(frozen=True)
class ManifoldParams(Params):
    prompts: str | dict | None = None  # prompt source: built-in set, JSONL path or {dataset: ...}; None: the sweep's
    domain: str | None = None  # restrict the pool to one domain (e.g. mathematics)
    per_bin: int = 15  # prompts per entropy quantile bin (Paper III: 15 x 5 = 75)
    n_bins: int = 5
    n_boot: int = 1000  # bootstrap resamples (the paper's interval, biased upward when n < d)
    n_null: int = 1000  # draws of each null at most (drawn until the share's test against it is settled)
    n_resample: int = 200  # fresh stratified draws from the pool: the interval shown
    covariates: tuple[str, ...] = ("length",)  # nuisances of the deconfounded PC1-entropy correlation (a spline)
    # prompts per stratum of the within-stratum correlation, by length (ties kept together): fine enough that a
    # strong length confound barely varies within one (5 quantile bins left a false-positive rate of 25-65%)
    stratum_size: int = 3
    n_perm: int = 1000  # draws of the within-stratum permutation null
    # the prompts drawn from the pool (and seed + 1 + r: the resamples of the shown interval): a recipe's data, fixed
    # whatever the run's --seed, which seeds the nulls and bootstraps only (0: the sample --seed 0 drew before)
    seed: int = 0


def label(params: ManifoldParams) -> str:
    return DOMAIN_LABELS.get(params.domain, params.domain)


def run(ctx, p: ManifoldParams) -> Result:
    from ..analyses.manifold import manifold_report
    from ..stats.pca import pca, resample_shares

    acts, ds = pool(ctx, p.prompts)
    domains = np.array(ds["domain"])
    pool_idx = np.arange(len(acts)) if p.domain is None else np.flatnonzero(domains == p.domain)
    if len(pool_idx) == 0:
        raise ConfigError(f"No prompts of domain {p.domain!r} in the prompt source; domains there: "
                          f"{', '.join(sorted(set(domains.tolist())))}.")

    def draw(seed: int) -> np.ndarray:
        return pool_idx[stratified_sample(acts.entropy[pool_idx].numpy(), per_bin=p.per_bin, n_bins=p.n_bins,
                                          seed=seed)]

    from ..stats import fine_strata
    from ..stats.confounds import nuisance_columns

    chosen = draw(p.seed)
    redraws = [draw(p.seed + 1 + r) for r in range(p.n_resample)]
    lengths = np.array([len(acts.token_ids[i]) for i in chosen])
    columns = nuisance_columns(lengths)
    rows, layers = [], {}
    for layer in acts.layers:
        x = acts.values(layer)[chosen]
        rep = manifold_report(x, acts.entropy[chosen], groups=groups_of(acts, chosen), n_boot=p.n_boot,
                              n_null=p.n_null, seed=ctx.config.seed)
        rep["resample"] = resample_shares(acts.values(layer), redraws)
        rows += manifold_rows(rep, dict(layer=layer))
        rows += deconfounded(rep["pc1_score"], acts.entropy[chosen], columns, p.covariates,
                             fine_strata(lengths, p.stratum_size), "length", n_perm=p.n_perm,
                             seed=ctx.config.seed, metric="corr_pc1", scope=dict(layer=layer, target="entropy"))
        ratios, _, scores = pca(x)
        sign = 1.0 if np.dot(scores[:, 0], rep["pc1_score"]) >= 0 else -1.0  # PC1 oriented with entropy
        layers[str(layer)] = dict(pc1=(sign * scores[:, 0]).tolist(), pc2=scores[:, 1].tolist(),
                                  ratios=ratios[:2].tolist())
    texts = list(ds["text"])
    data = dict(label=label(p), indices=chosen.tolist(), entropy=acts.entropy[chosen].tolist(),
                texts=[texts[i] for i in chosen], lengths=lengths.tolist(), pool_size=int(len(pool_idx)),
                layers=layers)
    return Result(rows, data)


def plan(ctx, p: ManifoldParams) -> list:
    spec = p.prompts if p.prompts is not None else ctx.config.prompts
    texts = list(load_source(spec)["text"])
    return [ctx.plan_acts("manifold", f"pool-{source_label(spec)}", texts, layers=ctx.layers(None),
                          dims=ctx.site_dims())]


def summary(rows: list[Row], p: ManifoldParams) -> list[Line]:
    name, layer = label(p), last_layer(rows)
    if layer is None:
        return []
    at = dict(layer=layer)
    pc1, v1 = share_text(rows, "pc1", **at)
    pc12, v12 = share_text(rows, "pc12", **at)
    rho = find(rows, "spearman_pc1", target="entropy", **at)
    pr = find(rows, "participation_ratio", **at)
    dim = find(rows, "dim", **at)
    deconf, claim = deconfounded_text(rows, "corr_pc1", target="entropy", **at)
    return [Line(f"{name} PC1 (layer {layer})", pc1, v1, f"{name} PC1"),
            Line(f"{name} PC1+PC2 (layer {layer})", pc12, v12, f"{name} PC1+PC2"),
            Line(f"{name} Spearman(PC1, H)", f"{rho.value:+.2f} (PC1 oriented so that Pearson r >= 0)"
                 + (f"; {deconf}" if deconf else ""), claim, "Spearman(PC1, H) mixed / math"),
            Line(f"{name} participation ratio", f"{pr.value:.1f} of {dim.value:.0f} dims")]


def _scatter(probes) -> Figure | None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = []
    for p in probes:
        d = p.data
        layer = str(last_layer(p.rows))
        if layer not in d.get("layers", {}):
            continue
        L = d["layers"][layer]
        panels.append((d["label"], np.asarray(L["pc1"]), np.asarray(L["pc2"]), L["ratios"], np.asarray(d["entropy"]),
                       [html.escape(shorten(t)) for t in d["texts"]]))
    if not panels:
        return None
    hmin, hmax = min(x[4].min() for x in panels), max(x[4].max() for x in panels)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[
        f"{lab} (n={len(h)}): PC1 {100 * r[0]:.0f}%, PC2 {100 * r[1]:.0f}%" for lab, _, _, r, h, _ in panels])
    for i, (lab, x, y, _, h, hover) in enumerate(panels, start=1):
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers", name=lab, showlegend=False, text=hover, customdata=h,
            hovertemplate="%{text}<br>entropy %{customdata:.2f} bits<extra></extra>",
            marker=dict(color=h, cmin=hmin, cmax=hmax, colorscale="Viridis", size=9, line=dict(width=0.5,
                        color="white"), colorbar=dict(title="entropy (bits)") if i == len(panels) else None)),
            row=1, col=i)
        axis_titles(fig, "PC1 (oriented with entropy)", "PC2" if i == 1 else None, row=1, col=i)
    return Figure("manifold", "Value manifold", layout(fig, "Last-layer values: PC1 vs PC2, coloured by next-token "
                                                            "entropy"),
                  "Look for a low-dimensional shape with a smooth colour gradient along PC1: entropy laid out on one "
                  "axis.")


def _shares(probes) -> Figure | None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sets = [(p.data.get("label", p.name), p.rows) for p in probes if last_layer(p.rows) is not None]
    if not sets:
        return None
    # the per-layer panel only where some set has two layers or more (one layer: a single point, said by the bars)
    per_layer = any(len({r.scope["layer"] for r in select(rows, "pc1_share")}) > 1 for _, rows in sets)
    fig = make_subplots(rows=1, cols=2 if per_layer else 1,
                        subplot_titles=["PC1 share (last layer)"] + (["PC1 share per layer"] if per_layer else []))
    for series, colour in (("observed", COLOURS["observed"]), ("permuted", COLOURS["permuted"]),
                           ("gaussian", COLOURS["gaussian"])):
        xs, ys, lo, hi = [], [], [], []
        for name, rows in sets:
            layer = last_layer(rows)
            r = find(rows, "pc1_share", layer=layer) if series == "observed" else \
                find(rows, "pc1_share_null_mean", layer=layer, null=series)
            xs.append(name), ys.append(r.value), lo.append(r.low), hi.append(r.high)
        label = f"{series}" + (" (interval over fresh sets)" if series == "observed" else " null (95% range)")
        fig.add_trace(go.Bar(x=xs, y=ys, name=label, marker_color=colour,
                             error_y=dict(type="data", array=np.subtract(hi, ys), arrayminus=np.subtract(ys, lo))),
                      row=1, col=1)
    for name, rows in sets if per_layer else []:
        obs = sorted(select(rows, "pc1_share"), key=lambda r: r.scope["layer"])
        fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in obs], y=[r.value for r in obs], mode="lines+markers",
                                 name=f"{name} per layer",
                                 error_y=error_bars(obs)), row=1, col=2)
        fig.add_trace(go.Scatter(x=[r.scope["layer"] for r in obs], y=[r.null_high for r in obs], mode="lines",
                                 line=dict(dash="dot", color=COLOURS["permuted"]), name=f"{name} permuted null, 97.5%"),
                      row=1, col=2)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    if per_layer:
        axis_titles(fig, "layer", None, row=1, col=2)
    return Figure("shares", "PC shares vs nulls", layout(fig, "Variance on PC1 against empirical nulls", barmode="group"),
                  "Dark bars far above both grey null bars mean real low-dimensional structure; bars at null height "
                  "mean none." + (" Right: the same share at every collected layer, with the permuted null's upper "
                                  "bound." if per_layer else " (One layer collected: no per-layer panel.)"))


def _examples(probes) -> Figure | None:
    parts = []
    for p in probes:
        d = p.data
        layer = str(last_layer(p.rows))
        if "texts" not in d or layer not in d.get("layers", {}):
            continue
        order = np.argsort(d["entropy"], kind="stable")
        score = d["layers"][layer]["pc1"]
        rows = []
        for q, group in enumerate(np.array_split(order, p.params.get("n_bins", 5)), start=1):
            rows += [[f"Q{q}", f"{d['entropy'][i]:.2f}", f"{score[i]:+.2f}", shorten(d["texts"][i], 160)]
                     for i in group[:3]]
        parts.append(f"<h3>{html.escape(d['label'])} set</h3>"
                     + table(["quintile", "entropy (bits)", "PC1 score", "prompt"], rows, ["", "num", "num", "prompt"]))
    if not parts:
        return None
    return Figure("manifold-examples", "Example prompts per entropy quintile", "".join(parts),
                  "Three prompts of each entropy quintile of each set, with their PC1 scores.")


def figures(probes) -> list[Figure]:
    return [f for f in (_scatter(probes), _shares(probes), _examples(probes)) if f is not None]


DOMINANT = 1 / 3  # a "dominant" PC1: its interval's low end at a third of the variance (the papers' smallest: 36.6%)


def ledger(probes) -> list:
    """One dominant axis and PC1 tracking entropy (on the mixed set, else the first), and the manifold's collapse
    under domain restriction (each restricted set's PC1+PC2 share against the mixed set's)."""
    from ..stats import ledger as L

    sets = {}
    for p in probes:
        if last_layer(p.rows) is not None:
            sets.setdefault(label(p.params_object()), p)
    if not sets:
        return []
    name, base = ("mixed", sets["mixed"]) if "mixed" in sets else next(iter(sets.items()))
    at = dict(layer=last_layer(base.rows))
    pc1 = find(base.rows, "pc1_share", **at)
    known = name in DOMAIN_LABELS.values()
    out = [Claim("dominant-axis", f"One dominant value axis (PC1 share, {name} prompts, L{at['layer']})",
                 L.at_least(L.beyond_null(pc1), pc1, DOMINANT), L.fmt(pc1, pct=True),
                 paper=f"{name} PC1" if known else "", section="fig-shares")]
    raw = find(base.rows, "corr_pc1", target="entropy", deconfounded="raw", **at)
    text, claim = deconfounded_text(base.rows, "corr_pc1", target="entropy", **at)
    out.append(Claim("pc1-entropy", f"PC1 tracks next-token entropy beyond prompt length ({name} prompts)",
                     L.from_deconfounded(claim or L.deconfounded_claim(raw)), text or L.fmt(raw),
                     paper="Spearman(PC1, H) mixed / math", section="fig-manifold"))
    mixed12 = find(base.rows, "pc12_share", **at) if name == "mixed" else None
    for other, p in sets.items():
        if mixed12 is None or other == "mixed":
            continue
        mine = find(p.rows, "pc12_share", layer=last_layer(p.rows))
        out.append(Claim(f"domain-collapse-{other}", f"Restricting prompts to {other} collapses the manifold "
                         "(PC1+PC2 share rises)", L.exceeds(mine, mixed12),
                         f"{other} {L.fmt(mine, pct=True).split(' vs ')[0]} vs mixed "
                         f"{L.fmt(mixed12, pct=True).split(' vs ')[0]}",
                         paper=f"{other} PC1+PC2" if other in DOMAIN_LABELS.values() else "", section="fig-shares"))
    return out


KIND = register(Kind("manifold", ManifoldParams, run, summary, figures, plan, doc=__doc__, ledger=ledger))
