"""The architecture table of issue 27 (Paper I v3's comparison): every committed wind-tunnel checkpoint scored afresh
against its tunnel's exact posterior, one row per architecture, one column per tunnel.

Each cell: KL to the exact posterior (bits, at the tunnel's training length), the margin over the best window
filter with its paired bootstrap interval over sequences (positive: the model beats every window), and the paper's
number where Paper I v3 gives one. A cell with no committed checkpoint says so: it is never filled from elsewhere.

    python examples/architecture_table.py --out runs/architectures      # table.md + table.json
    python examples/architecture_table.py --checkpoints DIR ...        # extra trained folders (interp-bayes train)
    python examples/architecture_table.py --no-committed --checkpoints DIR ...   # those folders only (paper size)

A later folder of the same architecture and tunnel takes the earlier one's cell (both stay in the second table).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from interp_bayes.core.checks import count_arg, out_folder_arg
from interp_bayes.core.store import atomic_write_text
from interp_bayes.windtunnel.tunnels import PACKAGED
from interp_bayes.windtunnel.configs import ARCHS, TrainConfig
from interp_bayes.windtunnel.evaluate import evaluate_windtunnel

TUNNELS = ("bijection", "bijection-replacement", "hmm", "hmm-sticky", "recall")
# Paper I v3 (issue 27): KL in bits for the bijection and the paper-family HMM, % correct for associative recall
PAPER = {
    ("transformer", "bijection"): "0.007", ("mamba", "bijection"): "0.010", ("lstm", "bijection"): "0.009",
    ("mlp", "bijection"): "1.85",
    ("transformer", "hmm"): "0.049", ("mamba", "hmm"): "0.024", ("lstm", "hmm"): "0.411", ("mlp", "hmm"): "≈ 0.40",
    ("transformer", "recall"): "100%", ("mamba", "recall"): "97.8%", ("lstm", "recall"): "0.5%",
}


def tunnel_of(cfg: TrainConfig) -> str:
    """The column a checkpoint belongs to, from its task and task options."""
    if cfg.task == "bijection":
        return "bijection-replacement" if cfg.task_kwargs.get("replacement") else "bijection"
    if cfg.task == "hmm":
        return "hmm-sticky" if cfg.task_kwargs.get("transitions") == "sticky" else "hmm"
    return cfg.task


def score(folder: Path, n: int) -> dict:
    """One checkpoint's cell: fresh evaluation at its first training length, with the shortcut baselines."""
    meta = json.loads((folder / "windtunnel.json").read_text())
    cfg = TrainConfig.from_dict(meta["config"])
    length = int(next(iter(meta["eval"])))
    t0 = time.perf_counter()
    metrics = evaluate_windtunnel(folder, n=n, lengths=[length], baselines=True)[length]
    vs = metrics["vs_best_window"]
    return {"checkpoint": folder.name, "arch": cfg.arch, "tunnel": tunnel_of(cfg), "length": length, "n": n,
            "kl_bits": metrics["kl_bits"], "best_window": vs["best_window"], "margin_bits": vs["margin_bits"],
            "margin_ci": vs["margin_ci"], "beats": vs["beats"], "recall_accuracy": metrics.get("recall_accuracy"),
            "n_params": meta["n_params"], "train_wall_s": meta.get("train_wall_s"),
            "train_cpu_s": meta.get("train_cpu_s"), "steps": meta.get("step"), "planned_steps": cfg.steps,
            "eval_seconds": time.perf_counter() - t0}


def cell(row: dict | None, arch: str, tunnel: str) -> str:
    paper = PAPER.get((arch, tunnel))
    paper = f"; paper {paper}" if paper else ""
    if row is None:
        return f"not trained{paper}"
    lo, hi = row["margin_ci"]
    recall = f", recall {100 * row['recall_accuracy']:.1f}%" if row["recall_accuracy"] is not None else ""
    stopped = (f" (stopped at step {row['steps']:,} of {row['planned_steps']:,})"
               if row.get("steps") is not None and row["steps"] < row["planned_steps"] else "")
    return (f"KL {row['kl_bits']:.4g}{recall}; vs {row['best_window']} {row['margin_bits']:+.4g} "
            f"[{lo:+.4g}, {hi:+.4g}]{paper}{stopped}")


def table(rows: list[dict]) -> str:
    """Markdown: architectures x tunnels, then the parameter counts and training times behind the cells."""
    by = {(r["arch"], r["tunnel"]): r for r in rows}
    lines = ["| architecture | " + " | ".join(TUNNELS) + " |", "|---" * (len(TUNNELS) + 1) + "|"]
    lines += [f"| {arch} | " + " | ".join(cell(by.get((arch, t)), arch, t) for t in TUNNELS) + " |" for arch in ARCHS]
    lines += ["", "| checkpoint | architecture | tunnel | parameters | steps | training wall s | training CPU s "
              "| length | n |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['checkpoint']} | {r['arch']} | {r['tunnel']} | {r['n_params']:,} | {r['steps']:,} | "
              f"{r['train_wall_s']} | {'—' if r['train_cpu_s'] is None else r['train_cpu_s']} | {r['length']} | "
              f"{r['n']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder_arg, required=True, help="folder of table.json and table.md")
    parser.add_argument("--checkpoints", type=Path, nargs="*", default=[], help="trained folders beside the committed")
    parser.add_argument("--committed", action=argparse.BooleanOptionalAction, default=True,
                        help="score the committed cpu-preset checkpoints too")
    parser.add_argument("--n", type=count_arg(), default=2000, help="held-out sequences per checkpoint")
    parser.add_argument("--threads", type=count_arg(), default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    missing = [str(f) for f in args.checkpoints if not (f / "windtunnel.json").is_file()]
    if missing:
        parser.error(f"{', '.join(missing)}: no windtunnel.json; pass folders written by `interp-bayes train`.")
    committed = sorted(p for p in PACKAGED.iterdir() if (p / "windtunnel.json").exists()) if args.committed else []
    folders = committed + list(args.checkpoints)
    rows = [score(f, args.n) for f in folders if tunnel_of(TrainConfig.from_dict(
        json.loads((f / "windtunnel.json").read_text())["config"])) in TUNNELS]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "table.json", json.dumps(rows, indent=2))
    text = table(rows)
    atomic_write_text(args.out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
