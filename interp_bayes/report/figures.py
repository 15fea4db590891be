"""The cross-run figures of the compare page, in the house style of ``core.figures`` (each probe kind draws its own
figures)."""

from __future__ import annotations

# plotly and .view (yaml) are imported inside the functions that need them: this module loads with the report's other
# modules, most of which draw nothing
import numpy as np

from ..core.figures import axis_titles, layout
from ..core.plugin import Figure
from ..core.results import find, select


def _relative_depth(layers) -> np.ndarray:
    layers = np.asarray(layers, dtype=float)
    return layers / max(layers.max(), 1.0)


def _depth_curve(name: str, rows):
    """One model's per-layer rows as a curve over relative depth."""
    import plotly.graph_objects as go

    return go.Scatter(x=_relative_depth([r.scope["layer"] for r in rows]), y=[r.value for r in rows],
                      mode="lines+markers", name=name)


DEPTH = "relative depth (layer / last layer)"


def _overlay(fig, fid: str, title: str, heading: str, x_title: str, y_title: str, caption: str) -> Figure:
    """A cross-model overlay in the house style, its y axis from zero."""
    axis_titles(fig, x_title, y_title, yaxis=dict(rangemode="tozero"))
    return Figure(fid, title, layout(fig, heading), caption)


def compare_figures(runs) -> list:
    """Cross-model overlays on relative depth (attention focusing, key orthogonality) and SULA calibration, drawn
    from each run's tidy rows."""
    import plotly.graph_objects as go

    from .view import subject_of

    out = []
    # the model's own rows: a wind tunnel's (its keys, its attention) would be drawn into the model's curve
    rows = {r.name: [row for p in r.probes() if not subject_of(p) for row in p.rows] for r in runs}
    have = {name: sorted(select(rs, "attention_entropy"), key=lambda r: r.scope["layer"]) for name, rs in rows.items()}
    have = {k: v for k, v in have.items() if v}
    if have:
        fig = go.Figure([_depth_curve(name, rs) for name, rs in have.items()])
        out.append(_overlay(fig, "compare-focusing", "Attention focusing", "Attention entropy across depth",
                            DEPTH, "attention entropy (bits)",
                            "Steeper falls mean stronger focusing; compare shapes, since context lengths set the "
                            "scale."))
    keys = {name: sorted(select(rs, "key_orthogonality"), key=lambda r: r.scope["layer"]) for name, rs in rows.items()
            if find(rs, "key_orthogonality_null_mean") is not None}
    if keys:
        fig = go.Figure()
        for name, rs in keys.items():
            fig.add_trace(_depth_curve(name, rs))
            fig.add_hline(y=find(rows[name], "key_orthogonality_null_mean").value,
                          line=dict(dash="dot", width=1, color="#888"))
        out.append(_overlay(fig, "compare-keys", "Key orthogonality",
                            "Key orthogonality across depth (dotted: Gaussian nulls)", DEPTH,
                            "mean |cos| of key columns", "Lower is more orthogonal; each model's null depends on its "
                            "d_model: read each against its line."))
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
        out.append(_overlay(fig, "compare-icl", "In-context calibration",
                            "SULA main condition: entropy per k vs Bayes", "k (in-context examples)",
                            "label entropy (bits)", "The closer a curve to the dashed Bayes curve, the better "
                            "calibrated the in-context inference."))
    return out
