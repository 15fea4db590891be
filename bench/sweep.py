"""Benchmark: the default sweep's stages, one probe at a time, each beside the FLOP bound at this machine's peak.

Each probe runs as a one-probe ``run_sweep`` on a model loaded once, into a run folder kept for the whole benchmark
(so activation sets are shared between probes as in a sweep, collected by the first that needs them). Per stage it
prints the stage's seconds (its ``stage.json``), the process's CPU seconds over the call, and the seconds its torch
matrix products and attention would take at the float32 matrix-product peak measured in this process
(``bench/interventions.py``'s ``matmul_peak``, on the model's MLP shape; FLOPs counted by torch in a separate
untimed run, ``--flops``). Each probe runs in every float32 mode of ``--modes`` (``model.numerics``; a mode that resolves
like an earlier one on this CPU is run once: on a CPU without oneDNN's path, ``fast`` is IEEE), alternating which
goes first from probe to probe, each into its own run folder, beside the peak measured in each mode; ``--baseline``
also runs every probe with numpy's and scipy's BLAS left at their default thread count (the sweep before
``run.sweep.cpu_threads``). Ratios are against the first mode, side by side in one process.

    python bench/sweep.py --probes axis focusing keys --threads 1 --modes ieee fast
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

    from interp_bayes.model.numerics import float32_mode, resolve_float32

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", nargs="+", help="probe names (default: the sweep's)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=["ieee", "fast"], choices=["auto", "ieee", "fast"],
                        help="float32 modes to time each probe in, side by side (the first is the reference)")
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
    # a mode that resolves like an earlier one would time the same arithmetic twice
    modes = {}
    for mode in args.modes:
        modes.setdefault(resolve_float32(mode, "cpu"), mode)
    peaks = {}
    for resolved in modes:
        with float32_mode(resolved):
            peaks[resolved] = matmul_peak(model)
    print(f"{args.model}: loaded in {load:.1f}s; float32 matrix-product peak at {args.threads} thread(s): "
          + ", ".join(f"{m} {g:.1f} GFLOP/s" for m, g in peaks.items())
          + f"; run folders under {root}", flush=True)
    variants = [(m, config.override(float32=asked), sweep.cpu_threads) for m, asked in modes.items()]
    if args.baseline:
        variants.append(("BLAS free", variants[0][1], free_blas))
    held = sweep.cpu_threads
    results = {}
    for i, name in enumerate(names):
        order = variants if i % 2 == 0 else variants[::-1]  # alternate which goes first
        r = {}
        for label, cfg, threads in order:
            sweep.cpu_threads = threads
            try:
                r[label] = one_probe(cfg, model, name, root / label.replace(" ", "-"))
            finally:
                sweep.cpu_threads = held
        if args.flops:
            r["flops"] = counted(config, model, name, root / f"flops-{name}")
        results[name] = r
        print(f"{name}: " + "; ".join(f"{label}: stage {r[label]['stage']:.1f}s, CPU {r[label]['cpu']:.1f}s"
                                      for label, _, _ in variants), flush=True)

    first = variants[0][0]
    head = "| probe | " + " | ".join(f"{label}: stage s | CPU s" + ("" if label == first else " | stage ratio")
                                     for label, _, _ in variants) + " |" + \
        (" TFLOP | bound s at peak |" if args.flops else "")
    print("\n" + head + "\n|" + "---|" * (head.count("|") - 1))
    total = {label: dict(stage=0.0, cpu=0.0) for label, _, _ in variants}
    total_flops = 0
    for name, r in [*results.items(), ("all", None)]:
        cells = [name]
        for label, _, _ in variants:
            v = r[label] if r else total[label]
            if r:
                total[label]["stage"] += v["stage"]
                total[label]["cpu"] += v["cpu"]
            cells += [f"{v['stage']:.1f}", f"{v['cpu']:.1f}"]
            if label != first:
                ref = r[first] if r else total[first]
                cells.append(f"{v['stage'] / ref['stage']:.2f}")
        if args.flops:
            flops = r["flops"] if r else total_flops
            total_flops += flops if r else 0
            cells += [f"{flops / 1e12:.3f}", f"{flops / 1e9 / peaks[next(iter(peaks))]:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
