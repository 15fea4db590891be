"""The numbers of docs/windtunnels.md for trained wind-tunnel folders: each model against the shortcut baselines,
and entropy-axis against hypothesis-frame ablations (the belief probes are the opt-in ``belief`` recipes).

    python examples/windtunnel_analyses.py --out runs/wt-analyses [--checkpoints bijection-cpu hmm-sticky-cpu]
        [--parts table subspaces] [--threads 1]

Folders are names under interp_bayes/windtunnel/checkpoints/ or paths; a folder NAME with a NAME-mlp beside it gets
its MLP baseline in the table. Each part writes OUT/<checkpoint>/<part>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from interp_bayes.windtunnel.evaluate import evaluate_windtunnel
from interp_bayes.analyses.subspaces import subspace_ablation
from interp_bayes.windtunnel.tunnels import checkpoint_folder

METRICS = ("per_sample_entropy_mae_bits", "mean_curve_entropy_mae_bits", "kl_bits")


def fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:.4g}"


def table(folder: Path) -> dict:
    """Transformer, MLP (when a NAME-mlp folder exists), and every baseline, per evaluation length."""
    meta = json.loads((folder / "windtunnel.json").read_text())
    res = {"transformer": evaluate_windtunnel(folder, n=2000)}
    mlp = folder.parent / f"{folder.name}-mlp"
    if mlp.is_dir():
        res["mlp"] = evaluate_windtunnel(mlp, n=2000, baselines=False)
        res["mlp_meta"] = {k: json.loads((mlp / "windtunnel.json").read_text()).get(k)
                           for k in ("preset", "step", "train_wall_s", "train_cpu_s", "n_params")}
    res["meta"] = {k: meta.get(k) for k in ("preset", "step", "train_wall_s", "train_cpu_s", "n_params")}
    for who, m in (("transformer", res["meta"]), ("MLP", res.get("mlp_meta"))):
        if m:
            print(f"{folder.name} {who}: preset {m['preset']}, {m['n_params']:,} parameters, {m['step']} steps, "
                  f"{m['train_wall_s']} s wall, {m.get('train_cpu_s') or 'unrecorded'} s CPU")
    for length, ev in res["transformer"].items():
        print(f"\n{folder.name}, {length} observations (n = {ev['n']} sequences)\n")
        print("| predictor | per-sample MAE | mean-curve MAE | KL |\n|---|---|---|---|")
        rows = {"transformer": ev} | ({"MLP": res["mlp"][length]} if "mlp" in res else {}) | ev["baselines"]
        for name, m in rows.items():
            print(f"| {name} | " + " | ".join(fmt(m[k]) for k in METRICS) + " |")
        v = ev["vs_best_window"]
        print(f"\nvs {v['best_window']}: margin {v['margin_bits']:.4g} bits [{v['margin_ci'][0]:.4g}, "
              f"{v['margin_ci'][1]:.4g}], KL ratio {v['kl_ratio']:.3g}, beats: {v['beats']}")
    return res


def subspaces(folder: Path) -> dict:
    res = subspace_ablation(folder)
    print(f"\n{folder.name}: cost of each edit in bits over the unedited model ({res.meta['base']}); controls: "
          "mean [95% range] of equal-dimension random subspaces, and the share at or below the true cost\n")
    print("| layer | subspace | k | op | metric | cost [CI] | isotropic | matched (variance ratio) |\n"
          "|---|---|---|---|---|---|---|---|")
    for s in res.summary:
        print(f"| {s['layer']} | {s['subspace']} | {s['k']} | {s['op']} | {s['metric']} | {s['true_cost']:.4f} "
              f"[{s['true_cost_ci'][0]:.4f}, {s['true_cost_ci'][1]:.4f}] | {s['isotropic_mean']:.4f} "
              f"[{s['isotropic_range'][0]:.4f}, {s['isotropic_range'][1]:.4f}] ({s['isotropic_percentile']:.2f}) | "
              f"{s['matched_mean']:.4f} [{s['matched_range'][0]:.4f}, {s['matched_range'][1]:.4f}] "
              f"({s['matched_percentile']:.2f}; ratio {s['matched_variance_ratio_mean']:.3f}) |")
    return {"rows": res.rows, "summary": res.summary, "meta": res.meta}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoints", nargs="+", default=["bijection-cpu", "hmm-cpu", "hmm-sticky-cpu"])
    parser.add_argument("--parts", nargs="+", default=["table", "subspaces"])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = {"table": table, "subspaces": subspaces}
    for name in args.checkpoints:
        folder = checkpoint_folder(name)
        for part in args.parts:
            start, cpu = time.perf_counter(), time.process_time()
            result = parts[part](folder)
            result["seconds"] = {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu}
            out = Path(args.out) / folder.name / f"{part}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1, default=lambda x: x.tolist() if isinstance(x, np.ndarray)
                                      else float(x)))
            print(f"[{folder.name} {part}: {result['seconds']['wall']:.0f} s wall, {result['seconds']['cpu']:.0f} s CPU]")


if __name__ == "__main__":
    main()
