"""The house style of every figure, and the cross-run figures of the compare page. Each probe kind draws its own
figures (``interp_bayes.kinds``); prompt text shown in hover labels is HTML-escaped by the kinds (plotly renders
hover text as HTML and decodes entities)."""

from __future__ import annotations

import numpy as np

from ..results import find, select

COLOURS = dict(observed="#1f4e79", permuted="#9aa5b1", gaussian="#d0d5db", true="#c0392b", isotropic="#7f8c8d",
               matched="#2e86c1", pcs="#27ae60")
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=30, t=110, b=50),
              font=dict(family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", size=13))


def shorten(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def layout(fig, title: str, **kw):
    """House style: the title on top, then a horizontal legend, both above the plot area (pixel positions, so
    they never overlap subplot titles)."""
    spec = {**LAYOUT, **kw}
    h = spec["height"]
    fig.update_layout(**spec, title=dict(text=title, x=0, xref="paper", y=1 - 14 / h, yanchor="top",
                                         font=dict(size=15)),
                      legend=dict(orientation="h", x=0, xref="paper", yref="container", y=1 - 46 / h, yanchor="top"))
    return fig


def _relative_depth(layers) -> np.ndarray:
    layers = np.asarray(layers, dtype=float)
    return layers / max(layers.max(), 1.0)


def compare_figures(runs) -> list:
    """Cross-model overlays on relative depth (attention focusing, key orthogonality) and SULA calibration, drawn
    from each run's tidy rows."""
    import plotly.graph_objects as go

    from ..kinds import Figure

    from .view import subject_of

    out = []
    # the model's own rows: a wind tunnel's (its keys, its attention) would be drawn into the model's curve
    rows = {r.name: [row for p in r.probes() if not subject_of(p) for row in p.rows] for r in runs}
    have = {name: sorted(select(rs, "attention_entropy"), key=lambda r: r.scope["layer"]) for name, rs in rows.items()}
    have = {k: v for k, v in have.items() if v}
    if have:
        fig = go.Figure([go.Scatter(x=_relative_depth([r.scope["layer"] for r in rs]), y=[r.value for r in rs],
                                    mode="lines+markers", name=name) for name, rs in have.items()])
        fig.update_xaxes(title_text="relative depth (layer / last layer)")
        fig.update_yaxes(title_text="attention entropy (bits)", rangemode="tozero")
        out.append(Figure("compare-focusing", "Attention focusing", layout(fig, "Attention entropy across depth"),
                          "Steeper falls mean stronger focusing; compare shapes, since context lengths set the scale."))
    keys = {name: sorted(select(rs, "key_orthogonality"), key=lambda r: r.scope["layer"]) for name, rs in rows.items()
            if find(rs, "key_orthogonality_null_mean") is not None}
    if keys:
        fig = go.Figure()
        for name, rs in keys.items():
            fig.add_trace(go.Scatter(x=_relative_depth([r.scope["layer"] for r in rs]), y=[r.value for r in rs],
                                     mode="lines+markers", name=name))
            fig.add_hline(y=find(rows[name], "key_orthogonality_null_mean").value,
                          line=dict(dash="dot", width=1, color="#888"))
        fig.update_xaxes(title_text="relative depth (layer / last layer)")
        fig.update_yaxes(title_text="mean |cos| of key columns", rangemode="tozero")
        out.append(Figure("compare-keys", "Key orthogonality",
                          layout(fig, "Key orthogonality across depth (dotted: Gaussian nulls)"),
                          "Lower is more orthogonal; each model's null depends on its d_model: read each against its "
                          "line."))
    sula = {name: sorted((r for r in select(rs, "model_entropy", condition="main", target="latent") if "k" in r.scope),
                         key=lambda r: r.scope["k"]) for name, rs in rows.items()}
    sula = {k: v for k, v in sula.items() if v}
    if sula:
        fig = go.Figure()
        for name, rs in sula.items():
            fig.add_trace(go.Scatter(x=[r.scope["k"] for r in rs], y=[r.value for r in rs], mode="lines+markers",
                                     name=name))
        first = next(iter(sula))
        bayes = sorted((r for r in select(rows[first], "bayes_entropy", condition="main", target="latent") if "k" in r.scope),
                       key=lambda r: r.scope["k"])
        fig.add_trace(go.Scatter(x=[r.scope["k"] for r in bayes], y=[r.value for r in bayes], mode="lines",
                                 name="Bayes", line=dict(color="black", dash="dash", width=2.5)))
        fig.update_xaxes(title_text="k (in-context examples)")
        fig.update_yaxes(title_text="label entropy (bits)", rangemode="tozero")
        out.append(Figure("compare-icl", "In-context calibration",
                          layout(fig, "SULA main condition: entropy per k vs Bayes"),
                          "The closer a curve to the dashed Bayes curve, the better calibrated the in-context "
                          "inference."))
    return out
