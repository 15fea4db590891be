"""The summary table of a run, beside the paper's rows (Paper III Tables 1-2 and §5, methods.md §3.9)."""

from __future__ import annotations

# Paper III v1 numbers, as printed (Table 1 bootstrap means; Table 2; §5.1 Spearman; §5.2 SULA MAE).
PAPER_ROWS = {
    "Pythia-410M": {"mixed PC1": "79.6% (78.4, 80.8)", "mixed PC1+PC2": "99.7%", "math PC1": "58.0%",
                    "math PC1+PC2": "99.9%", "Spearman(PC1, H) mixed / math": "-0.32 / -0.14",
                    "key orthogonality": "0.11-0.13", "attention focusing": "82%", "SULA MAE": "0.44 bits"},
    "Phi-2": {"mixed PC1": "46.4% (43.9, 48.9)", "mixed PC1+PC2": "60.6%", "math PC1": "52.2%",
              "math PC1+PC2": "63.5%", "Spearman(PC1, H) mixed / math": "+0.34 / +0.16",
              "key orthogonality": "0.034-0.051", "attention focusing": "86%", "SULA MAE": "0.31 bits"},
    "Llama-3.2-1B": {"mixed PC1": "36.6% (34.8, 38.4)", "mixed PC1+PC2": "51.4%", "math PC1": "52.5%",
                     "math PC1+PC2": "73.6%", "Spearman(PC1, H) mixed / math": "+0.59 / -0.51",
                     "key orthogonality": "0.15-0.18", "attention focusing": "31%", "SULA MAE": "0.36 bits"},
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(pair) -> str:
    return f"({100 * pair[0]:.1f}, {100 * pair[1]:.1f})"


def _last(probe: dict) -> dict:
    return probe["layers"][max(probe["layers"], key=int)]


def share_interval(rep: dict, which: str) -> tuple[list[float], str]:
    """The interval to show for a share: over fresh prompt sets from the pool where the probe drew them, else
    the bootstrap (biased upward when prompts are fewer than coordinates; see geometry.bootstrap_shares)."""
    if "resample" in rep:
        return rep["resample"][f"{which}_ci"], "resampled"
    return rep["bootstrap"][f"{which}_ci"], "bootstrap"


def share_cells(rep: dict, which: str) -> str:
    """'share (interval); bootstrap mean; null permuted / gaussian' for a manifold report."""
    ci, kind = share_interval(rep, which)
    n = rep["nulls"]
    return (f"{_pct(rep[f'{which}_share'])} ({kind} {100 * ci[0]:.1f}, {100 * ci[1]:.1f}); "
            f"bootstrap mean {_pct(rep['bootstrap'][f'{which}_mean'])}; "
            f"null {_pct(n['permuted'][f'{which}_mean'])} / {_pct(n['gaussian'][f'{which}_mean'])}")


def summary_rows(metrics: dict) -> list[tuple[str, str]]:
    """(measure, our value) rows from a run's metrics, for whichever probes ran."""
    rows: list[tuple[str, str]] = []
    for name, label in (("manifold_mixed", "mixed"), ("manifold_math", "math"), ("manifold_code", "code")):
        if name in metrics:
            rep = _last(metrics[name])
            rows += [(f"{label} PC1", share_cells(rep, "pc1")), (f"{label} PC1+PC2", share_cells(rep, "pc12")),
                     (f"{label} Spearman(PC1, H)", f"{rep['pc1_vs_entropy']['spearman']:+.2f} (PC1 oriented so that Pearson r >= 0)"),
                     (f"{label} participation ratio", f"{rep['participation_ratio']:.1f} of {rep['dim']} dims")]
    if "keys" in metrics:
        k = metrics["keys"]
        rows.append(("key orthogonality (10-90% of heads)",
                     f"{k['band'][0]:.3f}-{k['band'][1]:.3f}; Gaussian null {k['null']['mean']:.3f}"))
    if "focusing" in metrics:
        f = metrics["focusing"]
        rows.append(("attention focusing (first -> last layer)", f"{_pct(f['reduction'])} {_ci(f['reduction_ci'])}"))
    if "icl" in metrics:
        icl = metrics["icl"]
        main = icl["conditions"]["main"]
        per_k = ", ".join(f"k={k}: {v['mae']:.3f}" for k, v in main["per_k"].items())
        rows.append(("SULA entropy MAE vs Bayes (bits)", f"{per_k}; k>=1: {main['k_ge_1']['mae']:.3f}"))
        for cond, c in icl["conditions"].items():
            if cond != "main":
                rows.append((f"SULA MAE, {cond} (k>=1)", f"{c['k_ge_1']['mae']:.3f}"))
        for key, label in (("geometry_all_k", "all k"), ("geometry_k_ge_1", "k>=1")):
            g = icl[key]
            rows.append((f"SULA Spearman(PC1, Bayes H), {label}",
                         f"{g['pc1_vs_bayes_entropy']['spearman']:+.2f}; PC1 {_pct(g['pc1_share'])}"))
    if "axis" in metrics:
        last = max(metrics["axis"].values(), key=lambda a: (a.get("layer", -1), a.get("method") == "pc1"))["layer"]
        for key, a in sorted(metrics["axis"].items()):
            if key.startswith("_") or a["layer"] != last:
                continue
            rows.append((f"entropy axis {a['method']} L{a['layer']}: r in-sample / held-out",
                         f"{a['in_sample']['pearson']:+.2f} / {a['held_out']['pearson']:+.2f}"))
    if "interventions" in metrics:
        rows += intervention_rows(metrics["interventions"]["summary"], "")
    for name, m in metrics.items():
        if isinstance(m, dict) and m.get("_probe", {}).get("kind") == "windtunnel":
            rows += windtunnel_rows(m)
    return rows


MIN_DRAWS = 10  # below this many control draws a percentile takes too few values to read, and no interval is shown


def control_cell(s: dict, fam: str) -> str:
    """A control family's mean effect with its percentile and draw count, or why there is no percentile."""
    n = s.get(f"{fam}_n", 0)
    if n < MIN_DRAWS:
        return f"{fam} {s[f'{fam}_mean']:+.4f} (too few draws for a percentile: {n})"
    lo, hi = s[f"{fam}_range"]
    return f"{fam} {s[f'{fam}_mean']:+.4f} [{lo:+.4f}, {hi:+.4f}] (pct {s[f'{fam}_percentile']:.2f} of {n} draws)"


def intervention_rows(summary: list[dict], prefix: str) -> list[tuple[str, str]]:
    """One row per (layer set, op): the true axis' change in k>=1 MAE with its interval, against the control
    families' mean changes and its percentile among their draws (with the draw count)."""
    rows = []
    for s in summary:
        if s["metric"] != "mae_k_ge_1":
            continue
        controls = "; ".join(control_cell(s, fam) for fam in ("isotropic", "matched", "pcs") if f"{fam}_mean" in s)
        ci = s.get("true_effect_ci", [float("nan")] * 2)
        rows.append((f"{prefix}{s['op']} L{s['layer_set']}: change in MAE k>=1 (bits)",
                     f"true {s['true_effect']:+.4f} ({ci[0]:+.4f}, {ci[1]:+.4f}); {controls}"))
    return rows


def windtunnel_rows(m: dict) -> list[tuple[str, str]]:
    """The wind-tunnel probe's headline numbers, prefixed with its checkpoint."""
    p = f"wind tunnel {m['checkpoint']}: "
    rep = m["manifold"]
    axis = m["axis"][max((k for k in m["axis"] if k.endswith("-bayes")), key=lambda k: m["axis"][k]["layer"])]
    rows = [(p + "entropy MAE vs Bayes (bits)", f"{m['calibration']['mae']:.4f}"),
            (p + "PC1 / PC1+PC2 share", f"{_pct(rep['pc1_share'])} / {_pct(rep['pc12_share'])}; null "
             f"{_pct(rep['nulls']['permuted']['pc1_mean'])} / {_pct(rep['nulls']['permuted']['pc12_mean'])}"),
            (p + "Spearman(PC1, Bayes H)", f"{rep['pc1_vs_bayes_entropy']['spearman']:+.2f}"),
            (p + f"axis (Bayes H) L{axis['layer']}: r in-sample / held-out",
             f"{axis['in_sample']['pearson']:+.2f} / {axis['held_out']['pearson']:+.2f}"),
            (p + "attention focusing", f"{_pct(m['focusing']['reduction'])}")]
    return rows + intervention_rows(m["interventions"]["summary"], p)


def markdown_summary(metrics: dict, model: str) -> str:
    """A markdown table of our measurements (the paper's rows are in PAPER_ROWS)."""
    lines = [f"| measure | {model} |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(metrics)]
    return "\n".join(lines)
