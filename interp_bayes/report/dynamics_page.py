"""One self-contained page for ``interp-bayes dynamics`` results: loss curves of SGD vs the EM-style optimisers
on the sticky chain, and frame vs precision curves over wind-tunnel checkpoints (Paper II)."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..core.store import atomic_write_text
from ..core.plugin import Figure
from ..core.figures import LAYOUT
from .html import figure_sections, page

FRAME_METRICS = ("attention_similarity", "layer0_similarity", "key_orthogonality", "frame_head_match")


def loss_figure(results: dict) -> go.Figure | None:
    """Mean training loss per step of each optimiser, with the chain's entropy floor."""
    sticky = results.get("sticky")
    if not sticky:
        return None
    fig = go.Figure()
    for method, curve in sticky["loss_curves"].items():
        fig.add_trace(go.Scatter(y=curve, mode="lines", name=method))
    fig.add_hline(y=sticky["entropy_floor"], line=dict(dash="dash", color="#888"),
                  annotation_text=f"entropy floor {sticky['entropy_floor']:.3f} nats")
    return fig.update_layout(**LAYOUT, xaxis_title="step", yaxis_title="cross-entropy (nats)",
                             title="Sticky chain: SGD vs EM-like vs closed-form EM (mean over seeds)")


def frames_figure(results: dict) -> go.Figure | None:
    """Each metric's progress (0 = first checkpoint, 1 = final) per run: frame metrics left, precision right."""
    frames = results.get("frames")
    if not frames:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=["frame metrics", "precision metrics"], shared_yaxes=True)
    for run in frames:
        for metric, curve in run["curves"].items():
            first, last = curve[0], curve[-1]
            progress = [(c - first) / (last - first) if last != first else 1.0 for c in curve]
            col = 1 if metric in FRAME_METRICS else 2
            fig.add_trace(go.Scatter(x=run["steps"], y=progress, mode="lines+markers", name=metric,
                                     legendgroup=metric, showlegend=run is frames[0],
                                     hovertext=html.escape(str(run["run"]))), row=1, col=col)
    fig.update_xaxes(type="log", title_text="training step")
    fig.update_yaxes(range=[-1, 2])  # non-monotone metrics overshoot far; the settling near 1 is what matters
    return fig.update_layout(**LAYOUT, yaxis_title="progress to final value",
                             title="Frame vs precision over checkpoints (each run, each metric)")


def build_dynamics_page(results: dict, out: str | Path) -> Path:
    """Write the page for a ``run_dynamics`` result dict to ``out``."""
    figs = [Figure(key, title, fig, caption) for key, title, fig, caption in (
        ("losses", "EM vs SGD", loss_figure(results),
         "The EM-style curves should reach SGD's final loss in fewer steps; all should approach the floor."),
        ("frames", "Frame vs precision", frames_figure(results),
         "A dissociation shows as frame curves reaching 1 at earlier steps than the precision curves."),
    ) if fig is not None]
    summary = results.get("frames_summary")
    note = (f"<p class=\"note\">Dissociation ratio (precision settle step / frame settle step), geometric mean over "
            f"{summary['n']} runs: {summary['geomean']:.2f} (95% CI {summary['lo']:.2f}-{summary['hi']:.2f}); above 1 "
            "means the frame settles first.</p>" if summary else "")
    body = f"<h1>interp_bayes: gradient dynamics (Paper II)</h1>{note}{figure_sections(figs)}"
    return atomic_write_text(out, page("interp_bayes dynamics", body))
