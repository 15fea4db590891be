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
    they never overlap subplot titles); axis titles never clipped; layer axes ticked at whole layers; a panel with
    nothing to draw says so. Call it once the traces are in."""
    spec = {**LAYOUT, **kw}
    h = spec["height"]
    fig.update_layout(**spec, title=dict(text=title, x=0, xref="paper", y=1 - 14 / h, yanchor="top",
                                         font=dict(size=15)),
                      legend=dict(orientation="h", x=0, xref="paper", yref="container", y=1 - 46 / h, yanchor="top"))
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    integer_layer_ticks(fig)
    note_empty_panels(fig)
    return fig


def _axis_names(fig, letter: str) -> list[str]:
    """'xaxis', 'xaxis2', ... of a figure (layout keys)."""
    names = [k for k in fig.layout.to_plotly_json() if k == f"{letter}axis" or
             (k.startswith(f"{letter}axis") and k[5:].isdigit())]
    return sorted(names or [f"{letter}axis"], key=lambda k: int(k[5:] or 1))


def _ref(name: str) -> str:
    """'xaxis2' -> 'x2' (what a trace's xaxis property holds)."""
    return name[0] + name[5:]


def _finite_values(values) -> list[float]:
    out = []
    for v in values if values is not None else []:
        try:
            v = float(v)
        except (TypeError, ValueError):
            continue
        if np.isfinite(v):
            out.append(v)
    return out


def integer_layer_ticks(fig) -> None:
    """A layer axis whose traces sit at whole numbers gets ticks at whole layers only (a two-layer model would
    otherwise show 0.5, 1.5): every layer up to 15 of them, then a whole-number step."""
    for name in _axis_names(fig, "x"):
        axis = fig.layout[name]
        if "layer" not in str(axis.title.text or "").lower() or axis.type in ("log", "category"):
            continue
        xs = [x for t in fig.data if (getattr(t, "xaxis", None) or "x") == _ref(name)
              for x in _finite_values(getattr(t, "x", None))]
        if not xs or any(x != int(x) for x in xs):
            continue
        span = max(xs) - min(xs)
        axis.update(tickmode="linear", tick0=int(min(xs)), dtick=max(1, int(np.ceil(span / 15))))


def note_empty_panels(fig) -> None:
    """A panel (x / y axis pair) that no trace draws a finite value on gets a note in its middle, so an empty
    panel reads as "nothing here" rather than as a broken figure."""
    pairs = {}
    for name in _axis_names(fig, "x"):
        anchor = fig.layout[name].anchor
        pairs[_ref(name)] = anchor if anchor and anchor != "free" else "y" + _ref(name)[1:]
    for x, y in pairs.items():
        drawn = any((getattr(t, "xaxis", None) or "x") == x and (getattr(t, "yaxis", None) or "y") == y
                    and _finite_values(getattr(t, "y", None)) for t in fig.data)
        if not drawn:
            fig.add_annotation(text="nothing to draw here: no finite value (see the table of numbers)",
                               xref=f"{x} domain", yref=f"{y} domain", x=0.5, y=0.5, showarrow=False,
                               font=dict(color="#5b6b7c", size=12), name="empty-panel-note")


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
