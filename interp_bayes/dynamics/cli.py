"""Command line ``interp-bayes dynamics``: flags, the run, and its markdown tables."""

from __future__ import annotations

# the page (plotly) is imported inside dynamics_main, only when --out asks for one
import argparse
import json
import time
from pathlib import Path

import torch

from ..core.checks import count_arg, device_arg, out_file_arg, seed_arg
from ..core.store import atomic_write_text
from .deep import train_deep
from .frames import FRAME_METRICS, PRECISION_METRICS, frame_precision_run, ratio_interval
from .laws import law_check
from .sticky import PAPER_SEEDS, sticky_comparison


def add_dynamics_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``interp-bayes dynamics``; the defaults are the paper's protocol."""
    parser.add_argument("--seeds", type=seed_arg, nargs="+", default=list(PAPER_SEEDS),
                        help="seeds of the sticky-chain runs, one run per optimiser each (default: the paper's)")
    parser.add_argument("--steps", type=count_arg(), default=1000, help="training steps per optimiser (single head)")
    parser.add_argument("--T", type=count_arg(2), default=2000, help="chain length")
    parser.add_argument("--record-every", type=count_arg(), default=50,
                        help="steps between value-manifold measurements")
    parser.add_argument("--law-cases", type=count_arg(), default=200, help="random shapes for the gradient-law check")
    parser.add_argument("--deep", action="store_true", help="also train the 4-layer variant (slow on CPU)")
    parser.add_argument("--deep-steps", type=count_arg(), default=2000,
                        help="training steps of the 4-layer variant (with --deep)")
    parser.add_argument("--deep-seeds", type=seed_arg, nargs="+", default=list(PAPER_SEEDS),
                        help="seeds of the 4-layer variant, one run each (with --deep; default: the paper's)")
    parser.add_argument("--deep-device", type=device_arg, default="cpu",
                        help="device for the deep variant (cuda recommended)")
    parser.add_argument("--threads", type=count_arg(), default=None, help="torch CPU threads")
    parser.add_argument("--jobs", type=count_arg(), default=1, help="processes for the sticky seeds (one thread each)")
    parser.add_argument("--frames", type=Path, nargs="+", default=[],
                        help="wind-tunnel run folders (one per seed): frame-precision curves and dissociation ratio")
    parser.add_argument("--frames-only", action="store_true", help="skip the laws and the sticky chain")
    parser.add_argument("--out", type=out_file_arg, default=None, help="write the results as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines (the tables are still printed)")
    return parser


def _fmt(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def _law_lines(results: dict) -> list[str]:
    laws = results["laws"]
    lines = [f"Gradient laws vs autograd (float64, worst relative error over {results['law_cases']} random shapes):",
             "", "| gradient | attention only | + readout & CE |", "|---|---|---|"]
    for name in sorted(set(laws["attention"]) | set(laws["readout_ce"])):
        cells = [f"{laws[k][name]:.1e}" if name in laws[k] else "–" for k in ("attention", "readout_ce")]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return lines


def _sticky_lines(s: dict) -> list[str]:
    lines = ["", f"Sticky chain, single head, {len(s['seeds'])} seeds, {s['n_steps']} steps; H(Y'|Y) = "
             f"{_fmt(s['entropy_floor'])} nats; exact Bayes-filter CE {_fmt(s['bayes_loss_mean'])} (training chain), "
             f"{_fmt(s['bayes_heldout_loss_mean'])} (fresh chain) nats:", "",
             "| optimiser | final loss (mean ± sd) | held-out loss | final entropy | accuracy | steps to SGD final "
             "(per seed) | speed-up (geomean, 95% CI) | authors' pooled speed-up | paired t (p) vs SGD |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, row in s["methods"].items():
        base = (f"| {m} | {_fmt(row['final_loss_mean'], 4)} ± {_fmt(row['final_loss_sd'], 4)} | "
                f"{_fmt(row['heldout_loss_mean'], 4)} | {_fmt(row['final_entropy_mean'], 4)} | "
                f"{_fmt(row['final_accuracy_mean'])} |")
        if m == "sgd":
            lines.append(base + f" {s['n_steps']} | 1 | 1 | – |")
        else:
            steps = ", ".join("never" if x is None else str(x) for x in row["steps_to_sgd_final"])
            lo, hi = row["speedup_ci95"]
            lines.append(base + f" {steps} | {_fmt(row['speedup_geomean'], 2)} ({_fmt(lo, 2)}–{_fmt(hi, 2)}) | "
                         f"{_fmt(row['speedup_pooled_authors'], 2)} | {_fmt(row['paired_t'], 2)} "
                         f"({row['paired_p']:.1e}) |")
    lines += ["", "Value manifold over training (mean over seeds): PC1 share of x W_V / cross-validated R² of the "
              "predictive entropy from the value / sd of that entropy (nats)", "",
              "| step | " + " | ".join(s["methods"]) + " |", "|---" * (len(s["methods"]) + 1) + "|"]
    first = next(iter(s["methods"].values()))["manifold"]
    for i, step in enumerate(first["step"]):
        cells = [f"{_fmt(r['manifold']['pc1_share'][i], 2)} / {_fmt(r['manifold']['entropy_r2'][i], 2)} / "
                 f"{_fmt(r['manifold']['entropy_sd'][i], 3)}" for r in s["methods"].values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def _deep_lines(deep: list[dict]) -> list[str]:
    lines = ["", "Deep variant (4 layers, AdamW), evaluated on a fresh chain:", "",
             "| seed | steps | test loss | test entropy | accuracy | Bayes-filter test CE | H(Y'|Y) | s |",
             "|---|---|---|---|---|---|---|---|"]
    for d in deep:
        lines.append(f"| {d['seed']} | {d['n_steps']} | {_fmt(d['test_loss'], 4)} | {_fmt(d['test_entropy'], 4)} | "
                     f"{_fmt(d['test_accuracy'])} | {_fmt(d['bayes_test_loss'], 4)} | {_fmt(d['entropy_floor'])} | "
                     f"{d['seconds']:.0f} |")
    return lines


def _frame_lines(frames: list[dict], summary: dict) -> list[str]:
    metrics = FRAME_METRICS + PRECISION_METRICS
    lines = ["", "Frame vs precision: step at which each metric stays 90% of the way to its final value", "",
             "| run | " + " | ".join(metrics) + " | frame step | precision step | ratio |",
             "|---" * (len(metrics) + 4) + "|"]
    for f in frames:
        lines.append(f"| {Path(f['run']).name} | " + " | ".join(str(f["settle"][m]) for m in metrics)
                     + f" | {f['frame_step']:.0f} | {f['precision_step']:.0f} | {_fmt(f['ratio'], 2)} |")
    lines.append(f"\nDissociation ratio (geomean over {summary['n']} runs, 95% CI): {_fmt(summary['geomean'], 2)} "
                 f"({_fmt(summary['lo'], 2)}–{_fmt(summary['hi'], 2)})")
    return lines


def markdown_tables(results: dict) -> str:
    """Markdown tables of a ``run_dynamics`` result (whichever sections it has) and the wall times."""
    lines = _law_lines(results) if results.get("laws") else []
    if results.get("sticky"):
        lines += _sticky_lines(results["sticky"])
    if results.get("deep"):
        lines += _deep_lines(results["deep"])
    if results.get("frames"):
        lines += _frame_lines(results["frames"], results["frames_summary"])
    times = ", ".join(f"{k} {v:.0f} s" for k, v in results["seconds"].items() if v)
    lines += ["", f"Wall time: {times} ({results['threads']} torch thread(s))."]
    return "\n".join(lines)


def run_dynamics(args: argparse.Namespace) -> dict:
    """Everything ``interp-bayes dynamics`` measures, as one JSON-ready dict."""
    if args.threads:
        torch.set_num_threads(args.threads)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
    res: dict = {"threads": torch.get_num_threads(), "config": {k: str(v) for k, v in vars(args).items()},
                 "law_cases": args.law_cases, "seconds": {}}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        res["seconds"][name] = time.perf_counter() - clock
        clock = time.perf_counter()

    if not args.frames_only:
        res["laws"] = law_check(args.law_cases)
        lap("laws")
        say(f"gradient laws: worst relative error {max(max(v.values()) for v in res['laws'].values()):.1e}")
        res["sticky"] = sticky_comparison(args.seeds, T=args.T, n_steps=args.steps, record_every=args.record_every,
                                          jobs=args.jobs, progress=say)
        lap("sticky")
    if args.deep:
        res["deep"] = []
        for seed in args.deep_seeds:
            res["deep"].append(train_deep(seed, T=args.T, n_steps=args.deep_steps, device=args.deep_device))
            say(f"deep seed {seed}: test loss {res['deep'][-1]['test_loss']:.4f} ({res['deep'][-1]['seconds']:.0f} s)")
        lap("deep")
    if args.frames:
        res["frames"] = [frame_precision_run(run) for run in args.frames]
        res["frames_summary"] = ratio_interval([f["ratio"] for f in res["frames"]])
        lap("frames")
    return res


def dynamics_main(args: argparse.Namespace) -> int:
    """Entry point for ``interp-bayes dynamics``: run, print the markdown tables, optionally write JSON."""
    results = run_dynamics(args)
    print(markdown_tables(results))
    if args.out is not None:
        from ..report.dynamics_page import build_dynamics_page

        atomic_write_text(args.out, json.dumps(results, indent=1, default=float))

        print(f"page: {build_dynamics_page(results, args.out.with_suffix('.html'))}")
    return 0
