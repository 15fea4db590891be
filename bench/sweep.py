"""Benchmark: the default sweep's stages, one probe at a time, each beside the FLOP bound at this machine's peak.

Each probe runs as a one-probe ``run_sweep`` on a model loaded once, into a run folder kept for the whole benchmark
(so activation sets are shared between probes as in a sweep, collected by the first that needs them). Per stage it
prints the stage's seconds (its ``stage.json``), the process's CPU seconds over the call, and the seconds its torch
matrix products and attention would take at the float32 matrix-product peak measured in this process
(``bench/interventions.py``'s ``matmul_peak``, on the model's MLP shape; FLOPs counted by torch in a separate
untimed run, ``--flops``). ``--baseline`` also runs every probe with numpy's and scipy's BLAS left at their default
thread count (the sweep before ``run.sweep.cpu_threads``), alternating which variant goes first from probe to probe,
each into its own run folder: the ratio of the two is the before/after of that change, side by side in one process.

    python bench/sweep.py --probes axis focusing keys --threads 1 --baseline
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

@contextmanager
def free_blas(threads: int | None):
    """The sweep's threads before ``cpu_threads``: torch's set, BLAS left at its default."""
    if threads:
        torch.set_num_threads(threads)
    yield


def one_probe(config, model, probe: str, out: Path) -> dict:
    """Run ``probe`` alone into the run folder under ``out``: its stage seconds, and the call's wall and CPU seconds."""
    from interp_bayes.core.store import read_json
    from interp_bayes.run.sweep import run_sweep

    wall, cpu = time.perf_counter(), time.process_time()
    run = run_sweep(config.override(probes=[probe], out=str(out)), model=model)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stage = read_json(run.folder / "probes" / probe / "stage.json")["seconds"]
    return dict(stage=stage, wall=wall, cpu=cpu)


def counted(config, model, probe: str, out: Path) -> int:
    """torch's FLOP count of ``probe`` run alone into a run folder of its own (activation sets included)."""
    from interp_bayes.run.sweep import run_sweep
    from interventions import counted_flops

    return counted_flops(lambda: run_sweep(config.override(probes=[probe], out=str(out)), model=model))


def main() -> None:
    from interp_bayes.model.loading import load_model
    from interp_bayes.run import sweep
    from interp_bayes.run.config import SweepConfig
    from interventions import matmul_peak

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", nargs="+", help="probe names (default: the sweep's)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", action="store_true", help="also time each probe with BLAS at its default")
    parser.add_argument("--flops", action="store_true", help="count each probe's FLOPs (one more, untimed, run)")
    parser.add_argument("--out", default=None, help="folder for the run folders (default: a temporary one)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    root = Path(args.out or tempfile.mkdtemp(prefix="bench-sweep-"))
    config = SweepConfig(model=args.model, threads=args.threads, quiet=True)
    names = args.probes or [p.name for p in sweep.load_probes(config)]
    t = time.perf_counter()
    model = load_model(args.model)
    load = time.perf_counter() - t
    peak = matmul_peak(model)
    print(f"{args.model}: loaded in {load:.1f}s; float32 matrix-product peak {peak:.1f} GFLOP/s at {args.threads} "
          f"thread(s); run folders under {root}", flush=True)
    held = sweep.cpu_threads
    results = {}
    for i, name in enumerate(names):
        variants = ["held", "free"] if args.baseline else ["held"]
        if i % 2:
            variants.reverse()
        r = {}
        for variant in variants:
            sweep.cpu_threads = held if variant == "held" else free_blas
            try:
                r[variant] = one_probe(config, model, name, root / variant)
            finally:
                sweep.cpu_threads = held
        if args.flops:
            r["flops"] = counted(config, model, name, root / f"flops-{name}")
        results[name] = r
        line = f"{name}: stage {r['held']['stage']:.1f}s, CPU {r['held']['cpu']:.1f}s"
        if "free" in r:
            line += f"; BLAS at its default: stage {r['free']['stage']:.1f}s, CPU {r['free']['cpu']:.1f}s"
        print(line, flush=True)

    head = "| probe | stage s | CPU s |" + (" before: stage s | CPU s | stage ratio | CPU ratio |" if args.baseline
                                           else "") + (" TFLOP | bound s at peak |" if args.flops else "")
    print("\n" + head + "\n|" + "---|" * (head.count("|") - 1))
    total = dict(stage=0.0, cpu=0.0, fstage=0.0, fcpu=0.0, flops=0)
    for name, r in results.items():
        h = r["held"]
        cells = [name, f"{h['stage']:.1f}", f"{h['cpu']:.1f}"]
        total["stage"] += h["stage"]
        total["cpu"] += h["cpu"]
        if "free" in r:
            f = r["free"]
            cells += [f"{f['stage']:.1f}", f"{f['cpu']:.1f}", f"{h['stage'] / f['stage']:.2f}",
                      f"{h['cpu'] / f['cpu']:.2f}"]
            total["fstage"] += f["stage"]
            total["fcpu"] += f["cpu"]
        if "flops" in r:
            cells += [f"{r['flops'] / 1e12:.3f}", f"{r['flops'] / 1e9 / peak:.1f}"]
            total["flops"] += r["flops"]
        print("| " + " | ".join(cells) + " |")
    cells = ["all", f"{total['stage']:.1f}", f"{total['cpu']:.1f}"]
    if args.baseline:
        cells += [f"{total['fstage']:.1f}", f"{total['fcpu']:.1f}", f"{total['stage'] / total['fstage']:.2f}",
                  f"{total['cpu'] / total['fcpu']:.2f}"]
    if args.flops:
        cells += [f"{total['flops'] / 1e12:.3f}", f"{total['flops'] / 1e9 / peak:.1f}"]
    print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
