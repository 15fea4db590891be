"""Grid executors: the wall time of a 4-cell grid (2 tiny models x 2 seeds, toy-sized probes) on a local Ray cluster
of N workers against the local executor (one cell after another), as a ratio, and Ray's per-cell overhead.

Measured side by side in one process, each executor on a fresh output folder:
``python bench/grid.py [--workers N] [--work K]`` (K scales the manifold probe's resampling, to make cells longer).
Every cell uses one torch thread, so N workers use N cores. Ray's start (``ray.init``) is timed apart; the Ray run
includes its workers' first imports (torch, transformers, TransformerLens), which the local executor paid once in
this process before its timing (printed too, for the ratio a command line sees). The per-cell overhead is the
difference of the two executors on the same grid when every stage is cached (warm Ray workers): what Ray adds to
each cell beyond the work itself.
"""

from __future__ import annotations

import time

START = time.perf_counter()  # before torch and the rest: the local executor's one-time import is timed from here

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_worker_niceness", "0")  # Ray renices its workers to 15: on a shared machine they would
# yield to every other process, while the local executor runs at normal priority; compare like with like

import torch

from interp_bayes.run.grid import run_grid
from interp_bayes.model.loading import load_model
from interp_bayes.model.testing import TOY_PROBES, make_tiny_model, write_toy_recipes

def toy_grid(root: Path, work: int = 1) -> dict:
    """Two tiny models (Llama with GQA, GPT-NeoX) and the toy recipes under ``root``; the grid without ``out``."""
    models = []
    for family in ("llama3", "pythia"):
        make_tiny_model(family, root / f"tiny-{family}")
        models.append(str(root / f"tiny-{family}"))
    return dict(name="bench", models=models, probes=write_toy_recipes(root / "probes", work), seeds=[0, 1],
                config=dict(prompts="basic", threads=1, quiet=True))


def numbers(run) -> list[str]:
    """Every cell's rows and data (timing rows aside), as canonical text."""
    out = []
    for cell in run.cells:
        for rows in sorted(cell.folder.glob("probes/*/rows.json")):
            kept = [r for r in json.loads(rows.read_text()) if r["unit"] != "s"]
            out.append(json.dumps([kept, json.loads((rows.parent / "data.json").read_text())], sort_keys=True))
    return out


def timed(grid: dict, out: Path, **kw):
    start = time.perf_counter()
    run = run_grid(dict(grid, config=dict(grid["config"], out=str(out))), quiet=True, **kw)
    return run, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--work", type=int, default=1, help="scale of the manifold probe's resampling (default 1)")
    args = parser.parse_args()
    import ray

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="bench-grid-"))
    grid = toy_grid(root, args.work)
    load_model(grid["models"][0])  # imports transformers and TransformerLens here, outside the timings
    t_import = time.perf_counter() - START
    seq, t_seq = timed(grid, root / "local")
    start = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, object_store_memory=128 * 2**20)
    t_init = time.perf_counter() - start
    par, t_ray = timed(grid, root / "ray", executor="ray")
    warm, t_warm = timed(grid, root / "ray-warm", executor="ray")  # fresh folder, workers already imported
    _, t_seq_cached = timed(grid, root / "local")
    _, t_ray_cached = timed(grid, root / "ray", executor="ray")
    ray.shutdown()
    n = len(seq.cells)
    same = numbers(seq) == numbers(par) == numbers(warm)
    print(f"grid: {n} cells (2 tiny models x 2 seeds), {len(TOY_PROBES)} probes each (work x{args.work}), 1 torch "
          f"thread per cell; Ray cluster of {args.workers} CPUs; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"local executor, sequential:   {t_seq:6.1f} s ({seq.computed} stages computed)")
    print(f"ray executor, {args.workers} workers:       {t_ray:6.1f} s ({par.computed} stages computed; ray.init "
          f"{t_init:.1f} s more)")
    print(f"speed-up sequential / ray:    {t_seq / t_ray:6.2f}x (as a command line sees it, the local executor's "
          f"one import ({t_import:.1f} s) against ray.init: {(t_seq + t_import) / (t_ray + t_init):.2f}x)")
    print(f"ray again, warm workers:      {t_warm:6.1f} s ({warm.computed} stages computed): speed-up "
          f"{t_seq / t_warm:.2f}x")
    print(f"all cached, local / ray:      {t_seq_cached:6.2f} s / {t_ray_cached:.2f} s")
    print(f"ray overhead per cell (warm): {(t_ray_cached - t_seq_cached) / n:6.2f} s")
    print(f"cell compute inside workers:  {sum(c.seconds for c in par.cells):6.1f} s summed (local: "
          f"{sum(c.seconds for c in seq.cells):.1f} s)")
    print("per cell, local / ray (s): " + ", ".join(f"{a.seconds:.1f} / {b.seconds:.1f}"
                                                   for a, b in zip(seq.cells, par.cells)))
    print(f"metrics identical (local vs ray): {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
