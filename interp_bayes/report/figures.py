"""Plotly figures of a run folder: each reads the run's metrics (and, where needed, its saved activations) and
returns a figure, or None when the probe behind it did not run. Built from the folder alone, never from live
objects, so a report can be rebuilt anywhere.

Prompt text shown in hover labels is HTML-escaped here (plotly renders hover text as HTML and decodes entities).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import yaml
from plotly.subplots import make_subplots

from ..errors import InterpBayesError
from ..extract import Activations
from ..geometry import pca
from ..prompts import load_prompts
from ..store import read_json
from ..tasks.icl import SULATask
from .tables import share_interval

# (probe name, label) of the value-manifold prompt sets, as in tables.summary_rows
MANIFOLD_PROBES = (("manifold_mixed", "mixed"), ("manifold_math", "math"), ("manifold_code", "code"))
SULA_GEOMETRY = (("geometry_all_k", "SULA, all k"), ("geometry_k_ge_1", "SULA, k≥1"))
COLOURS = dict(observed="#1f4e79", permuted="#9aa5b1", gaussian="#d0d5db", true="#c0392b", isotropic="#7f8c8d",
               matched="#2e86c1", pcs="#27ae60")
CONDITION_COLOURS = dict(main="#1f4e79", remap="#2e86c1", shuffled="#c0392b", label_masked="#e67e22",
                         carrier_masked="#27ae60")
METRIC_LABELS = dict(mae_k_ge_1="Δ entropy MAE vs Bayes, k≥1 (bits)", corr_bayes="Δ r(model H, Bayes H), k≥1",
                     kl_bits="KL(edited ‖ unperturbed) (bits)",
                     geom_downstream="Δ r(v·u, model H) at later layers")
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=30, t=110, b=50),
              font=dict(family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif", size=13))


class ReportError(InterpBayesError, ValueError):
    """A folder that is not a finished run folder."""


def last_layer(probe: dict) -> str:
    """The key of the deepest layer a manifold probe measured."""
    return max(probe["layers"], key=int)


def shorten(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _read_optional(path: Path) -> dict:
    return read_json(path) if path.exists() else {}


@dataclass
class RunData:
    """A run folder read back: metrics, config, environment, model facts, and its saved activations on demand."""

    folder: Path
    metrics: dict
    config: dict
    env: dict
    model: dict

    @classmethod
    def load(cls, folder: str | Path) -> "RunData":
        folder = Path(folder)
        if not (folder / "metrics.json").exists():
            raise ReportError(f"{folder} holds no metrics.json; pass a run folder written by `interp-bayes sweep` "
                              "(reports/<model>/<digest>).")
        config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").exists() else {}
        return cls(folder, read_json(folder / "metrics.json"), config or {}, _read_optional(folder / "env.json"),
                   _read_optional(folder / "model.json"))

    @property
    def name(self) -> str:
        """The model as the user named it (alias, Hub id or folder name)."""
        name = self.config.get("model") or self.model.get("name") or self.folder.parent.name
        return Path(name).name if Path(name).is_absolute() else name

    def _pool_name(self, probe: str) -> str:
        return self.metrics[probe]["_probe"]["params"].get("prompts", self.config.get("prompts", "pool"))

    def _pool_path(self, probe: str) -> Path:
        return self.folder / "acts" / f"pool-{Path(self._pool_name(probe)).stem}"

    def manifold_sets(self) -> list[tuple[str, str, dict]]:
        """(probe, label, metrics) of the value-manifold probes that ran."""
        return [(probe, label, self.metrics[probe]) for probe, label in MANIFOLD_PROBES if probe in self.metrics]

    def pool_acts(self, probe: str) -> Activations | None:
        """The activations of the prompt pool a manifold probe sampled from (``acts/pool-<stem>``)."""
        path = self._pool_path(probe)
        return Activations.load(path) if (path / "activations.json").exists() else None

    def pool_texts(self, probe: str) -> list[str] | None:
        """The pool's prompt texts: stored with the activations, or (older runs) the prompt set named in the
        config when it can still be read and matches the saved activations in size."""
        meta = self._pool_path(probe) / "activations.json"
        if meta.exists() and "texts" in read_json(meta):
            return read_json(meta)["texts"]
        try:
            texts = list(load_prompts(self._pool_name(probe))["text"])
        except InterpBayesError:
            return None
        return texts if meta.exists() and len(texts) == read_json(meta)["n_prompts"] else None

    @cached_property
    def sula_main(self) -> dict | None:
        """The SULA main-condition columns (k, Bayes entropy, text) of the icl probe, regenerated from the run's
        stored label words and the probe's seed (generation is deterministic and model-free)."""
        path = self.folder / "sula_task.json"
        if "geometry_all_k" not in self.metrics.get("icl", {}) or not path.exists():
            return None
        p, saved = self.metrics["icl"]["_probe"]["params"], read_json(path)
        task = SULATask(labels=tuple(saved["labels"]), remap_labels=tuple(saved["remap_labels"]),
                        per_k=p.get("per_k", 50))
        cols = task.generate("main", seed=p.get("seed", 42))
        return cols if len(cols["k"]) == self.metrics["icl"]["geometry_all_k"]["n_prompts"] else None


def _layout(fig: go.Figure, title: str, **kw) -> go.Figure:
    """House style: the title on top, then a horizontal legend, both above the plot area (pixel positions, so
    they never overlap subplot titles)."""
    layout = {**LAYOUT, **kw}
    h = layout["height"]
    fig.update_layout(**layout, title=dict(text=title, x=0, xref="paper", y=1 - 14 / h, yanchor="top",
                                           font=dict(size=15)),
                      legend=dict(orientation="h", x=0, xref="paper", yref="container", y=1 - 46 / h, yanchor="top"))
    return fig


def manifold_scatter(run: RunData) -> go.Figure | None:
    """PC1 vs PC2 of the standardised last-layer values of each manifold prompt set, coloured by entropy.

    The PCA is recomputed from the saved pool activations and the probe's chosen prompts; PC1 is oriented like
    the stored report (positive correlation with entropy)."""
    panels = []
    for probe, label, m in run.manifold_sets():
        acts = run.pool_acts(probe)
        if acts is None:
            continue
        layer = last_layer(m)
        idx = np.asarray(m["indices"])
        ratios, _, scores = pca(acts.values(int(layer))[idx])
        if np.dot(scores[:, 0], m["layers"][layer]["pc1_score"]) < 0:
            scores[:, 0] *= -1
        texts = run.pool_texts(probe)
        hover = [html.escape(shorten(texts[i])) if texts else f"prompt {i}" for i in idx]
        panels.append((label, layer, ratios, scores, np.asarray(m["entropy"]), hover))
    if not panels:
        return None
    hmin = min(p[4].min() for p in panels)
    hmax = max(p[4].max() for p in panels)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[
        f"{label} (n={len(h)}): PC1 {100 * r[0]:.0f}%, PC2 {100 * r[1]:.0f}%" for label, _, r, _, h, _ in panels])
    for i, (label, layer, ratios, scores, h, hover) in enumerate(panels, start=1):
        fig.add_trace(go.Scatter(
            x=scores[:, 0], y=scores[:, 1], mode="markers", name=label, showlegend=False, text=hover,
            customdata=h, hovertemplate="%{text}<br>entropy %{customdata:.2f} bits<extra></extra>",
            marker=dict(color=h, cmin=hmin, cmax=hmax, colorscale="Viridis", size=9, line=dict(width=0.5,
                        color="white"), showscale=i == 1, colorbar=dict(title="entropy<br>(bits)"))),
            row=1, col=i)
        fig.update_xaxes(title_text=f"PC1 (L{layer})", row=1, col=i)
        fig.update_yaxes(title_text="PC2", row=1, col=i)
    return _layout(fig, "Value manifold: final-token values, standardised, first two principal components",
                   height=450)


def pc_shares(run: RunData) -> go.Figure | None:
    """PC1 and PC1+PC2 shares per prompt set with 95% intervals (over fresh prompt sets from the pool where the
    probe drew them, else the bootstrap), beside the permuted and Gaussian nulls (mean and 95% range): a share
    means something only where it clears its nulls."""
    reports = [(label, m["layers"][last_layer(m)]) for _, label, m in run.manifold_sets()]
    if "icl" in run.metrics:
        reports += [(label, run.metrics["icl"][key]) for key, label in SULA_GEOMETRY if key in run.metrics["icl"]]
    if not reports:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=["PC1 share", "PC1+PC2 share"], shared_yaxes=True)
    labels = [label for label, _ in reports]
    for col, which in enumerate(("pc1", "pc12"), start=1):
        obs = np.array([r[f"{which}_share"] for _, r in reports])
        ci = np.array([share_interval(r, which)[0] for _, r in reports])
        fig.add_trace(go.Bar(x=labels, y=obs, name="observed (95% interval)", marker_color=COLOURS["observed"],
                             showlegend=col == 1, error_y=dict(type="data", array=np.clip(ci[:, 1] - obs, 0, None),
                                                               arrayminus=np.clip(obs - ci[:, 0], 0, None))),
                      row=1, col=col)
        for kind in ("permuted", "gaussian"):
            mean = np.array([r["nulls"][kind][f"{which}_mean"] for _, r in reports])
            rng = np.array([r["nulls"][kind][f"{which}_range"] for _, r in reports])
            fig.add_trace(go.Bar(x=labels, y=mean, name=f"{kind} null (95% range)", marker_color=COLOURS[kind],
                                 showlegend=col == 1, error_y=dict(type="data", array=rng[:, 1] - mean,
                                                                   arrayminus=mean - rng[:, 0])), row=1, col=col)
    fig.update_yaxes(tickformat=".0%", rangemode="tozero")
    return _layout(fig, "Variance on the leading components vs empirical nulls (last layer)", barmode="group")


def axis_correlations(run: RunData) -> go.Figure | None:
    """Entropy-axis correlation with model entropy per layer: in-sample vs cross-fitted held-out, per method."""
    axes = [a for key, a in run.metrics.get("axis", {}).items() if not key.startswith("_")]
    if not axes:
        return None
    fig = go.Figure()
    dash = dict(in_sample="solid", held_out="dash")
    for method in sorted({a["method"] for a in axes}):
        rows = sorted((a for a in axes if a["method"] == method), key=lambda a: a["layer"])
        for key, label in (("in_sample", "in-sample"), ("held_out", "held-out")):
            fig.add_trace(go.Scatter(
                x=[a["layer"] for a in rows], y=[(a[key] or {}).get("pearson") for a in rows],
                mode="lines+markers", name=f"{method}, {label}", line=dict(dash=dash[key]),
                marker=dict(size=9), legendgroup=method))
    fig.add_hline(y=0, line=dict(color="#888", width=1))
    fig.update_xaxes(title_text="layer", dtick=1)
    fig.update_yaxes(title_text="Pearson r(v·u, model entropy)", range=[-1.05, 1.05])
    return _layout(fig, "Entropy axis: in-sample vs held-out correlation (SULA prompts)")


def key_orthogonality(run: RunData) -> go.Figure | None:
    """Mean |cos| between W_K columns per layer: every KV head as a point, the min-max band across heads, and
    the Gaussian null (lower is more orthogonal)."""
    if "keys" not in run.metrics:
        return None
    k = run.metrics["keys"]
    per_head = np.asarray(k["per_head"])  # [layers, kv heads]
    layers = np.arange(len(per_head))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=np.r_[layers, layers[::-1]], y=np.r_[per_head.max(1), per_head.min(1)[::-1]],
                             fill="toself", fillcolor="rgba(31,78,121,0.15)", line=dict(width=0), mode="lines",
                             name="range across heads", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=np.repeat(layers, per_head.shape[1]), y=per_head.ravel(), mode="markers",
                             marker=dict(size=5, color="rgba(31,78,121,0.5)"), name="KV head",
                             customdata=np.tile(np.arange(per_head.shape[1]), len(layers)),
                             hovertemplate="layer %{x}, head %{customdata}: %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=layers, y=k["layer_mean"], mode="lines", name="layer mean",
                             line=dict(color=COLOURS["observed"], width=2)))
    null = k["null"]
    fig.add_hrect(y0=null["range"][0], y1=null["range"][1], fillcolor="rgba(192,57,43,0.08)", line_width=0)
    fig.add_trace(go.Scatter(x=[layers[0], layers[-1]], y=[null["mean"]] * 2, mode="lines",
                             line=dict(color=COLOURS["true"], dash="dash"), name="Gaussian W_K null (95% range)"))
    fig.update_xaxes(title_text="layer", dtick=max(1, len(layers) // 12))
    fig.update_yaxes(title_text="mean |cos| of key columns")
    return _layout(fig, f"Key orthogonality per layer (10-90% of heads: {k['band'][0]:.3f}-{k['band'][1]:.3f})")


def attention_focusing(run: RunData) -> go.Figure | None:
    """Mean attention entropy of the final query per layer with its bootstrap 95% band."""
    if "focusing" not in run.metrics:
        return None
    f = run.metrics["focusing"]
    ci = np.asarray(f["ci"])
    x = np.asarray(f["layers"])
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=np.r_[x, x[::-1]], y=np.r_[ci[:, 1], ci[::-1, 0]], fill="toself",
                             fillcolor="rgba(31,78,121,0.18)", line=dict(width=0), mode="lines",
                             name="bootstrap 95% CI",
                             hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=f["mean_entropy"], mode="lines+markers", name="mean over heads and prompts",
                             line=dict(color=COLOURS["observed"])))
    fig.update_xaxes(title_text="layer", dtick=max(1, len(x) // 12))
    fig.update_yaxes(title_text="attention entropy (bits)", rangemode="tozero")
    lo, hi = f["reduction_ci"]
    return _layout(fig, f"Attention focusing: {100 * f['reduction']:.0f}% reduction first→last layer "
                        f"(95% CI {100 * lo:.0f}%, {100 * hi:.0f}%)")


def icl_calibration(run: RunData) -> go.Figure | None:
    """SULA: mean model entropy per k for each condition beside its exact Bayes curve, and the per-k MAE."""
    if "icl" not in run.metrics:
        return None
    conds = run.metrics["icl"]["conditions"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["label entropy per k", "entropy MAE vs Bayes per k"])
    bayes_curves: dict[tuple, list[str]] = {}
    for cond, c in conds.items():
        ks = [int(k) for k in c["per_k"]]
        colour = CONDITION_COLOURS.get(cond)
        fig.add_trace(go.Scatter(x=ks, y=[v["model_entropy"] for v in c["per_k"].values()], mode="lines+markers",
                                 name=cond, legendgroup=cond, line=dict(color=colour)), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=[v["mae"] for v in c["per_k"].values()], mode="lines+markers",
                                 name=cond, legendgroup=cond, showlegend=False, line=dict(color=colour)), row=1, col=2)
        curve = tuple((k, round(v["bayes_entropy"], 6)) for k, v in zip(ks, c["per_k"].values()))
        bayes_curves.setdefault(curve, []).append(cond)
    for i, (curve, names) in enumerate(bayes_curves.items()):
        fig.add_trace(go.Scatter(x=[k for k, _ in curve], y=[h for _, h in curve], mode="lines",
                                 name=f"Bayes ({', '.join(names)})",
                                 line=dict(color="black" if i == 0 else "#888", dash="dash", width=2.5)), row=1, col=1)
    fig.update_xaxes(title_text="k (in-context examples)")
    fig.update_yaxes(title_text="bits", rangemode="tozero")
    return _layout(fig, "In-context learning (SULA): model entropy against the exact posterior", height=430)


def icl_geometry(run: RunData) -> go.Figure | None:
    """SULA main condition: each prompt's last-layer PC1 score against its exact Bayes entropy, coloured by k."""
    cols = run.sula_main
    if cols is None:
        return None
    g = run.metrics["icl"]["geometry_all_k"]
    k = np.asarray(cols["k"])
    fig = go.Figure()
    for kk in sorted(set(k.tolist())):
        sel = np.flatnonzero(k == kk)
        fig.add_trace(go.Scatter(
            x=np.asarray(cols["bayes_entropy"])[sel], y=np.asarray(g["pc1_score"])[sel], mode="markers",
            name=f"k={kk}", marker=dict(size=8, opacity=0.8),
            text=[html.escape(shorten(cols["text"][i])) for i in sel],
            hovertemplate="%{text}<br>Bayes H %{x:.2f} bits, PC1 %{y:.2f}<extra></extra>"))
    r = g["pc1_vs_bayes_entropy"]["spearman"]
    fig.update_xaxes(title_text="exact Bayes entropy (bits)")
    fig.update_yaxes(title_text="PC1 score (oriented with model entropy)")
    return _layout(fig, f"SULA value geometry: PC1 vs Bayes entropy (Spearman {r:+.2f}, PC1 "
                        f"{100 * g['pc1_share']:.0f}% of variance)")


def _category(row: dict) -> str:
    """x-axis category of an intervention: layer set and operator."""
    return f"L{row['layer_set']} · {row['op']}"


def intervention_effects(run: RunData) -> go.Figure | None:
    """Per layer set and operator: the effect of editing the true entropy axis (marker, bootstrap CI for the MAE)
    against every control axis draw (strips per control family)."""
    iv = run.metrics.get("interventions")
    rows_path = run.folder / "probes" / "interventions" / "rows.json"
    if iv is None or not rows_path.exists():
        return None
    rows = read_json(rows_path)
    summary = {(s["layer_set"], s["op"], s["metric"]): s for s in iv["summary"]}
    metrics = list(dict.fromkeys(s["metric"] for s in iv["summary"]))
    fig = make_subplots(rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[METRIC_LABELS.get(m, m) for m in metrics])
    families = list(dict.fromkeys(r["kind"] for r in rows if r["kind"] != "true"))
    for i, metric in enumerate(metrics, start=1):
        for fam in families:
            sel = [r for r in rows if r["kind"] == fam and (r["layer_set"], r["op"], metric) in summary]
            fig.add_trace(go.Box(
                x=[_category(r) for r in sel],
                y=[r[metric] - summary[(r["layer_set"], r["op"], metric)]["baseline"] for r in sel],
                name=f"{fam} controls", legendgroup=fam, showlegend=i == 1, boxpoints="all", jitter=0.6,
                pointpos=0, fillcolor="rgba(0,0,0,0)", line=dict(color="rgba(0,0,0,0)"),
                marker=dict(color=COLOURS.get(fam), size=6, opacity=0.75)), row=i, col=1)
        true = [s for s in iv["summary"] if s["metric"] == metric]
        ci = [s.get("true_effect_ci") for s in true]
        fig.add_trace(go.Scatter(
            x=[_category(s) for s in true], y=[s["true_effect"] for s in true], mode="markers",
            name="true entropy axis", legendgroup="true", showlegend=i == 1,
            marker=dict(symbol="diamond", size=13, color=COLOURS["true"], line=dict(color="white", width=1)),
            error_y=dict(type="data", array=[c[1] - s["true_effect"] for c, s in zip(ci, true)],
                         arrayminus=[s["true_effect"] - c[0] for c, s in zip(ci, true)])
            if all(ci) else None), row=i, col=1)
        fig.add_hline(y=0, line=dict(color="#888", width=1), row=i, col=1)
    return _layout(fig, f"Interventions: true axis vs control axes ({iv['fit']} fit, {iv['n_eval']} evaluation "
                        "prompts)", boxmode="group", height=260 * len(metrics) + 80)


# (id, title, function, caption: what to look for)
FIGURES = (
    ("manifold", "Value manifold", manifold_scatter,
     "Look for a low-dimensional shape with a smooth colour gradient along PC1: entropy laid out on one axis."),
    ("shares", "PC shares vs nulls", pc_shares,
     "Dark bars far above both grey null bars mean real low-dimensional structure; bars at null height mean none."),
    ("icl", "In-context calibration", icl_calibration,
     "Solid lines should track their dashed Bayes curve as k grows; controls without evidence should stay flat."),
    ("icl_geometry", "In-context value geometry", icl_geometry,
     "A monotone trend means the last-layer PC1 tracks the exact posterior uncertainty of the in-context task."),
    ("axis", "Entropy axis", axis_correlations,
     "Held-out (dashed) close to in-sample (solid) means the axis generalises; a large gap means overfitting."),
    ("interventions", "Interventions", intervention_effects,
     "A red diamond outside its control strips means editing the entropy axis does something random axes do not."),
    ("keys", "Key orthogonality", key_orthogonality,
     "Points well below the red dashed null mean keys more orthogonal than random weights of the same shape."),
    ("focusing", "Attention focusing", attention_focusing,
     "A falling curve means attention sharpens with depth; the band is the bootstrap interval over prompts."),
)


def run_figures(run: RunData) -> list[tuple[str, str, go.Figure, str]]:
    """(id, title, figure, caption) for every figure whose probe ran."""
    out = []
    for key, title, make, caption in FIGURES:
        fig = make(run)
        if fig is not None:
            out.append((key, title, fig, caption))
    return out


def _relative_depth(layers) -> np.ndarray:
    layers = np.asarray(layers, dtype=float)
    return layers / max(layers.max(), 1.0)


def compare_figures(runs: list[RunData]) -> list[tuple[str, str, go.Figure, str]]:
    """Cross-model overlays on relative depth: attention focusing, key orthogonality, and SULA calibration."""
    out = []
    have = [r for r in runs if "focusing" in r.metrics]
    if have:
        fig = go.Figure([go.Scatter(x=_relative_depth(r.metrics["focusing"]["layers"]),
                                    y=r.metrics["focusing"]["mean_entropy"], mode="lines+markers", name=r.name)
                         for r in have])
        fig.update_xaxes(title_text="relative depth (layer / last layer)")
        fig.update_yaxes(title_text="attention entropy (bits)", rangemode="tozero")
        out.append(("focusing", "Attention focusing", _layout(fig, "Attention entropy across depth"),
                    "Steeper falls mean stronger focusing; compare shapes, since context lengths set the scale."))
    have = [r for r in runs if "keys" in r.metrics]
    if have:
        fig = go.Figure()
        for r in have:
            mean = r.metrics["keys"]["layer_mean"]
            fig.add_trace(go.Scatter(x=_relative_depth(range(len(mean))), y=mean, mode="lines+markers", name=r.name))
            fig.add_hline(y=r.metrics["keys"]["null"]["mean"], line=dict(dash="dot", width=1, color="#888"))
        fig.update_xaxes(title_text="relative depth (layer / last layer)")
        fig.update_yaxes(title_text="mean |cos| of key columns", rangemode="tozero")
        out.append(("keys", "Key orthogonality",
                    _layout(fig, "Key orthogonality across depth (dotted: Gaussian nulls)"),
                    "Lower is more orthogonal; each model's null depends on its d_model: read each against its line."))
    have = [r for r in runs if "main" in r.metrics.get("icl", {}).get("conditions", {})]
    if have:
        fig = go.Figure()
        for r in have:
            per_k = r.metrics["icl"]["conditions"]["main"]["per_k"]
            fig.add_trace(go.Scatter(x=[int(k) for k in per_k], y=[v["model_entropy"] for v in per_k.values()],
                                     mode="lines+markers", name=r.name))
        per_k = have[0].metrics["icl"]["conditions"]["main"]["per_k"]
        fig.add_trace(go.Scatter(x=[int(k) for k in per_k], y=[v["bayes_entropy"] for v in per_k.values()],
                                 mode="lines", name="Bayes", line=dict(color="black", dash="dash", width=2.5)))
        fig.update_xaxes(title_text="k (in-context examples)")
        fig.update_yaxes(title_text="label entropy (bits)", rangemode="tozero")
        out.append(("icl", "In-context calibration", _layout(fig, "SULA main condition: entropy per k vs Bayes"),
                    "The closer a curve to the dashed Bayes curve, the better calibrated the in-context inference."))
    return out
