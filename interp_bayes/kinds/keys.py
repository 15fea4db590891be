"""Key orthogonality (Paper III): mean |cos| between the d_head columns of W_K per layer and KV head, beside
Gaussian W_K of the same shape (the null, in the right dimension: columns live in R^d_model)."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
from dataclasses import dataclass

import numpy as np

from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, Result
from ..core.figures import COLOURS, axis_titles, layout


@dataclass(frozen=True)
class KeysParams(Params):
    n_null: int = 1000  # Gaussian W_K draws of the null at most (drawn until the claim's test is settled)


def run(ctx, p: KeysParams) -> Result:
    from ..analyses.keys import key_orthogonality
    from ..stats.pca import key_orthogonality_null
    from ..stats import interval

    model = ctx.model
    scores = key_orthogonality(model)  # [layers, kv heads]
    median = float(np.median(scores))  # the claim's score, tested against the null (drawn until settled)
    null = key_orthogonality_null(model.cfg.d_model, model.cfg.d_head, median, n_draws=p.n_null, seed=ctx.config.seed)
    band = interval(scores, level=0.8)  # the central 80% of heads
    n_heads, label = scores.shape[1], f"gaussian W_K ({null['test']['draws']} draws)"
    rows = [Row("key_orthogonality", scores[layer].mean(), "|cos|", dict(layer=layer), float(scores[layer].min()),
                float(scores[layer].max()), "range over KV heads", null["range"][0], null["range"][1], label,
                n_heads) for layer in range(len(scores))]
    rows += [Row("key_orthogonality_heads", median, "|cos|", {}, band[0], band[1], "10-90% of heads",
                 null["range"][0], null["range"][1], label, scores.size, test=null["test"]),
             Row("key_orthogonality_null_mean", null["mean"], "|cos|", {}, null["range"][0], null["range"][1],
                 "gaussian null 95%", note=f"analytic large-d value {null['analytic']:.4f}")]
    return Result(rows, dict(per_head=scores.tolist()))


def summary(rows: list[Row], p: KeysParams) -> list[Line]:
    heads, null = find(rows, "key_orthogonality_heads"), find(rows, "key_orthogonality_null_mean")
    return [Line("key orthogonality (10-90% of heads)", f"{heads.low:.3f}-{heads.high:.3f}; Gaussian null "
                 f"{null.value:.3f}", heads.verdict(), "key orthogonality")]


def figures(probes) -> list[Figure]:
    import plotly.graph_objects as go

    out = []
    for p in probes:
        per_head = np.asarray(p.data["per_head"])  # [layers, kv heads]
        layers = np.arange(len(per_head))
        means = sorted(select(p.rows, "key_orthogonality"), key=lambda r: r.scope["layer"])
        null, heads = find(p.rows, "key_orthogonality_null_mean"), find(p.rows, "key_orthogonality_heads")
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=np.r_[layers, layers[::-1]], y=np.r_[per_head.max(1), per_head.min(1)[::-1]],
                                 fill="toself", fillcolor="rgba(31,78,121,0.15)", line=dict(width=0), mode="lines",
                                 name="range across heads", hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=np.repeat(layers, per_head.shape[1]), y=per_head.ravel(), mode="markers",
                                 marker=dict(size=5, color="rgba(31,78,121,0.5)"), name="KV head",
                                 customdata=np.tile(np.arange(per_head.shape[1]), len(layers)),
                                 hovertemplate="layer %{x}, head %{customdata}: %{y:.3f}<extra></extra>"))
        fig.add_trace(go.Scatter(x=layers, y=[r.value for r in means], mode="lines", name="layer mean",
                                 line=dict(color=COLOURS["observed"], width=2)))
        fig.add_hrect(y0=null.low, y1=null.high, fillcolor="rgba(192,57,43,0.08)", line_width=0)
        fig.add_trace(go.Scatter(x=[layers[0], layers[-1]], y=[null.value] * 2, mode="lines",
                                 line=dict(color=COLOURS["true"], dash="dash"), name="Gaussian W_K null (95% range)"))
        axis_titles(fig, "layer", "mean |cos| of key columns", xaxis=dict(dtick=max(1, len(layers) // 12)))
        out.append(Figure(f"keys-{p.name}", "Key orthogonality", layout(
            fig, f"Key orthogonality per layer (10-90% of heads: {heads.low:.3f}-{heads.high:.3f})"),
            "Points well below the red dashed null mean keys more orthogonal than random weights of the same shape."))
    return out


ORTHOGONAL_CEILING = 0.2  # mean |cos| the papers still call orthogonal (their widest range: 0.15-0.18)


def ledger(probes) -> list:
    from ..stats import ledger as L
    from .common import claims_from

    return claims_from(probes, "key_orthogonality_heads", lambda p, heads: Claim(
        "orthogonal-keys", "Keys are near-orthogonal (mean |cos| of key columns per head, 10-90% of heads)",
        L.small_beside_null(heads, ORTHOGONAL_CEILING), L.fmt(heads), paper="key orthogonality",
        section=f"fig-keys-{p.name}"))


KIND = register(Kind("keys", KeysParams, run, summary, figures, doc=__doc__, ledger=ledger))
