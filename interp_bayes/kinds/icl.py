"""The SULA in-context task (Paper III §5.2) and its controls: calibration of the label entropy against the exact
posterior per k, and the value geometry of the main condition at the last layer (all k, and k >= 1, since k = 0
prompts hold no example at all: a formatting confound)."""

from __future__ import annotations

# the analyses (torch) and the statistics (scipy) are imported inside functions, plotly inside the ones that draw: this
# kind's module is loaded to read its parameters (`interp-bayes probes`, a finished run's report), where no model runs
import html
from dataclasses import dataclass

import numpy as np

from ..core.errors import ConfigError
from ..core.results import Row, find, select
from ..core.registry import register
from ..core.plugin import Claim, Figure, Kind, Line, Params, Result
from ..core.layers import check_recipe_layers
from .common import SULA_LAYERS, deconfounded, deconfounded_text, groups_of, manifold_rows, pct, plan_sula, sula
from ..core.figures import axis_titles, layout, shorten, table

CONDITION_COLOURS = dict(main="#1f4e79", remap="#2e86c1", shuffled="#c0392b", label_masked="#e67e22",
                         carrier_masked="#27ae60")
SUBSETS = (("all", lambda k: k >= 0), ("k>=1", lambda k: k >= 1))


@dataclass(frozen=True)
class ICLParams(Params):
    conditions: tuple[str, ...] = ("main", "remap", "shuffled", "label_masked", "carrier_masked", "fixed_k")
    per_k: int = 50  # prompts per k in (0, 1, 2, 4, 8), and per label split of the fixed_k condition
    seed: int = 42  # the prompt draws (paired across conditions)
    layers: tuple[int, ...] | str = SULA_LAYERS  # layers collected (shared with the axis and interventions probes)
    at: int | str = -1  # the one layer whose value geometry is analysed, among ``layers`` (-1, "last", "middle")
    n_boot: int = 1000
    n_null: int = 1000  # null clouds of the PC shares at most (drawn until the share's test is settled)
    covariates: tuple[str, ...] = ("length", "k", "log_k")  # nuisances of the deconfounded correlations (k: one
    #                                                           indicator per value; length: a spline basis)
    n_perm: int = 1000  # draws of the within-k permutation null

    def check(self, ctx, probe: str) -> None:
        if len(ctx.layers(self.at)) != 1:
            raise ConfigError(f"Parameter 'at' of probe '{probe}' names one layer (e.g. -1, 'last' or 'middle'), "
                              f"not {self.at!r}.")
        check_recipe_layers(ctx, probe, self.layers, dict(at=self.at))


def calibration_rows(cmp: dict, scope: dict) -> list[Row]:
    """Tidy rows of a ``stats.calibration.compare_to_bayes`` result: per k, for k >= 1 and over all prompts."""
    rows = []
    blocks = [(dict(k=k), b) for k, b in cmp.get("per_group", {}).items()]
    blocks += [(dict(subset="all"), cmp["all"])] + ([(dict(subset="k>=1"), cmp["k_ge_1"])] if "k_ge_1" in cmp else [])
    for extra, b in blocks:
        s = dict(scope, **extra)
        rows += [Row("entropy_mae", b["mae"], "bits", s, n=b["n"]),
                 Row("model_entropy", b["model_entropy"], "bits", s, n=b["n"]),
                 Row("bayes_entropy", b["bayes_entropy"], "bits", s, n=b["n"])]
        rows += [Row(name, b[name], unit, s, n=b["n"]) for name, unit in (("accuracy", "fraction"),
                                                                          ("kl_bits", "bits")) if name in b]
        corr = b["corr_with_bayes"]
        rows += [Row(f"{stat}_with_bayes", corr[stat], "r" if stat == "pearson" else "rho", s, n=b["n"],
                     note=corr.get("reason")) for stat in ("pearson", "spearman")]
    if "mean_curve_mae" in cmp["all"]:
        rows.append(Row("entropy_mae_mean_curve", cmp["all"]["mean_curve_mae"], "bits", dict(scope, subset="all"),
                        n=cmp["all"]["n"], note="|mean H model - mean H Bayes| per k, averaged over k"))
    return rows


TARGETS = (("latent", "bayes_entropy"), ("predictive", "predictive_entropy"))  # the two Bayes targets (tasks/icl.py)


def run(ctx, p: ICLParams) -> Result:
    from ..stats.calibration import compare_to_bayes
    from ..stats.confounds import nuisance_columns
    from ..stats.pca import correlations
    from ..analyses.manifold import manifold_report

    rows, data = [], {}
    for condition in p.conditions:
        acts, cols = sula(ctx, condition, p.per_k, p.seed, p.layers)
        for target, column in TARGETS:
            cmp = compare_to_bayes(acts.entropy, cols[column], by=cols["k"],
                                   predicted=acts.label_logprobs.argmax(-1).numpy(), latent=cols["latent"])
            rows += calibration_rows(cmp, dict(condition=condition, target=target))
        if condition not in ("main", "fixed_k"):
            continue
        k, (layer,) = np.array(cols["k"]), ctx.layers(p.at)
        lengths = np.array([len(t) for t in acts.token_ids])
        columns = nuisance_columns(lengths, k=k)
        v = acts.values(layer)
        for subset, keep in SUBSETS if condition == "main" else SUBSETS[:1]:
            sel = keep(k)
            rep = manifold_report(v[sel], acts.entropy[sel], bayes_entropy=np.array(cols["bayes_entropy"])[sel],
                                  groups=groups_of(acts, sel), n_boot=p.n_boot, n_null=p.n_null, seed=ctx.config.seed)
            scope = dict(condition=condition, subset=subset, layer=layer)
            rows += manifold_rows(rep, scope, entropy_label="entropy")
            for target, y in [("model entropy", acts.entropy.numpy())] + [(f"bayes {t}", cols[c]) for t, c in TARGETS]:
                rows += deconfounded(rep["pc1_score"], np.asarray(y)[sel], {c: x[sel] for c, x in columns.items()},
                                     p.covariates, k[sel], "k", n_perm=p.n_perm, seed=ctx.config.seed,
                                     metric="corr_pc1", scope=dict(scope, target=target))
            if subset == "all":
                data[condition] = dict(k=k.tolist(), bayes_entropy=cols["bayes_entropy"],
                                       predictive_entropy=cols["predictive_entropy"], pc1=rep["pc1_score"],
                                       texts=cols["text"], layer=layer, n1=cols["n1"])
                r = correlations(k, rep["pc1_score"])
                rows.append(Row("spearman_k_pc1", r["spearman"], "rho", dict(scope), n=len(k), note=r.get("reason")))
    return Result(rows, data)


def plan(ctx, p: ICLParams) -> list:
    return plan_sula(ctx, "icl", p.conditions, p.per_k, p.seed, p.layers)


def summary(rows: list[Row], p: ICLParams) -> list[Line]:
    out = []
    for target in ("latent", "predictive"):
        per_k = sorted((r for r in select(rows, "entropy_mae", condition="main", target=target) if "k" in r.scope),
                       key=lambda r: r.scope["k"])
        pos = find(rows, "entropy_mae", condition="main", target=target, subset="k>=1")
        if pos is not None:
            ks = ", ".join(f"k={r.scope['k']}: {r.value:.3f}" for r in per_k)
            out.append(Line(f"SULA entropy MAE vs Bayes {target} entropy (bits)", f"{ks}; k>=1: {pos.value:.3f}",
                            "", "SULA MAE" if target == "latent" else None))
    for condition in p.conditions:
        r = find(rows, "entropy_mae", condition=condition, target="latent", subset="k>=1")
        if condition != "main" and r is not None:
            out.append(Line(f"SULA MAE, {condition} (k>=1)", f"{r.value:.3f}"))
    for condition, subset, label in (("main", "all", "all k"), ("main", "k>=1", "k>=1"), ("fixed_k", "all",
                                                                                          "fixed k = 8")):
        share = find(rows, "pc1_share", condition=condition, subset=subset)
        if share is None:
            continue
        for target in ("latent", "predictive"):
            text, claim = deconfounded_text(rows, "corr_pc1", condition=condition, subset=subset,
                                            target=f"bayes {target}")
            out.append(Line(f"SULA Spearman(PC1, Bayes {target} H), {label}", f"{text}; PC1 {pct(share.value)}",
                            claim))
    return out


def _calibration(p) -> Figure:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=["label entropy per k", "entropy MAE vs Bayes per k"])
    bayes_curves: dict[tuple, list[str]] = {}
    for condition in p.params.get("conditions", []):
        def curve(metric):
            rs = sorted((r for r in select(p.rows, metric, condition=condition, target="latent") if "k" in r.scope),
                        key=lambda r: r.scope["k"])
            return [r.scope["k"] for r in rs], [r.value for r in rs]
        if len([r for r in select(p.rows, "model_entropy", condition=condition, target="latent") if "k" in r.scope]) < 2:
            continue  # fixed_k holds one k: no curve
        ks, h = curve("model_entropy")
        colour = CONDITION_COLOURS.get(condition)
        fig.add_trace(go.Scatter(x=ks, y=h, mode="lines+markers", name=condition, legendgroup=condition,
                                 line=dict(color=colour)), row=1, col=1)
        fig.add_trace(go.Scatter(x=ks, y=curve("entropy_mae")[1], mode="lines+markers", name=condition,
                                 legendgroup=condition, showlegend=False, line=dict(color=colour)), row=1, col=2)
        bayes = tuple(zip(ks, np.round(curve("bayes_entropy")[1], 6)))
        bayes_curves.setdefault(bayes, []).append(condition)
    for i, (curve, names) in enumerate(bayes_curves.items()):
        fig.add_trace(go.Scatter(x=[k for k, _ in curve], y=[h for _, h in curve], mode="lines",
                                 name=f"Bayes ({', '.join(names)})",
                                 line=dict(color="black" if i == 0 else "#888", dash="dash", width=2.5)), row=1, col=1)
    axis_titles(fig, "k (in-context examples)", "bits", yaxis=dict(rangemode="tozero"))
    return Figure(f"icl-{p.name}", "In-context calibration", layout(
        fig, "In-context learning (SULA): model entropy against the exact posterior", height=430),
        "Solid lines should track their dashed Bayes curve as k grows; controls without evidence should stay flat.")


def _geometry(p) -> Figure | None:
    import plotly.graph_objects as go

    d = p.data.get("main", {})
    if "pc1" not in d:
        return None
    k, bayes, score = np.asarray(d["k"]), np.asarray(d["bayes_entropy"]), np.asarray(d["pc1"])
    fig = go.Figure()
    for kk in sorted(set(k.tolist())):
        sel = np.flatnonzero(k == kk)
        fig.add_trace(go.Scatter(x=bayes[sel], y=score[sel], mode="markers", name=f"k={kk}",
                                 marker=dict(size=8, opacity=0.8),
                                 text=[html.escape(shorten(d["texts"][i])) for i in sel],
                                 hovertemplate="%{text}<br>Bayes H %{x:.2f} bits, PC1 %{y:.2f}<extra></extra>"))
    rho = find(p.rows, "spearman_pc1", condition="main", subset="all", target="bayes entropy")
    share = find(p.rows, "pc1_share", condition="main", subset="all")
    axis_titles(fig, "exact Bayes entropy (bits)", "PC1 score (oriented with model entropy)")
    return Figure(f"icl-geometry-{p.name}", "In-context value geometry", layout(
        fig, f"SULA value geometry, layer {d['layer']}: PC1 vs Bayes entropy (Spearman {rho.value:+.2f}, PC1 "
             f"{100 * share.value:.0f}% of variance)"),
        "A monotone trend within each k would mean PC1 tracks the exact posterior uncertainty; a trend only across "
        "k (colours) means PC1 tracks the number of examples.")


def _examples(p) -> Figure | None:
    d = p.data.get("main", {})
    if "texts" not in d:
        return None
    first = {k: i for i, k in reversed(list(enumerate(d["k"])))}
    rows = [[str(k), f"{d['bayes_entropy'][i]:.3f}", d["texts"][i]] for k, i in sorted(first.items())]
    return Figure(f"icl-examples-{p.name}", "SULA prompts (main condition)",
                  table(["k", "Bayes entropy (bits)", "prompt"], rows, ["num", "num", "prompt"]),
                  "One prompt per k; the model's entropy is over the two label words, renormalised.")


def figures(probes) -> list[Figure]:
    out = []
    for p in probes:
        out += [f for f in (_calibration(p), _geometry(p), _examples(p)) if f is not None]
    return out


def ledger(probes) -> list:
    """Calibration to Bayes (the in-context entropy error against the shuffled-label control's, else against the
    error at k = 0), and PC1 tracking the posterior's entropy beyond k."""
    from ..stats import ledger as L

    out = []
    for p in probes:
        mae = find(p.rows, "entropy_mae", condition="main", target="latent", subset="k>=1")
        if mae is not None:
            ref = find(p.rows, "entropy_mae", condition="shuffled", target="latent", subset="k>=1")
            what = "with shuffled labels"
            if ref is None:
                ref, what = find(p.rows, "entropy_mae", condition="main", target="latent", k=0), "at k = 0"
            out.append(Claim("calibration", "In-context entropy is calibrated to Bayes (SULA, |H model - H Bayes| "
                             "at k >= 1)", L.below_reference(mae.value, ref.value if ref else None),
                             f"{mae.value:.3f} bits vs {ref.value:.3f} bits {what}" if ref else f"{mae.value:.3f} bits",
                             paper="SULA MAE", section=f"fig-icl-{p.name}"))
        raw = find(p.rows, "corr_pc1", condition="main", subset="all", target="bayes latent", deconfounded="raw")
        if raw is not None:
            text, claim = deconfounded_text(p.rows, "corr_pc1", condition="main", subset="all",
                                            target="bayes latent")
            out.append(Claim("pc1-posterior", "PC1 tracks the in-context posterior's entropy beyond k (SULA, all k)",
                             L.from_deconfounded(claim), text, section=f"fig-icl-geometry-{p.name}"))
    return out


KIND = register(Kind("icl", ICLParams, run, summary, figures, plan, doc=__doc__, ledger=ledger))
