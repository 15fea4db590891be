"""Wind-tunnel throughput: training steps per second for each preset, and task generation (sequences per second,
exact posteriors included) as a ratio to what training consumes. Generation must never be the bottleneck (>= 10).

Measured side by side in one process: ``python bench/windtunnel.py [--threads N] [--steps N]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from interp_bayes.windtunnel.configs import PRESETS, build_model, make_config, make_task, n_params
from interp_bayes.windtunnel.train import make_optimizer, train_step


def time_training(task: str, preset: str, steps: int) -> tuple[float, int, int]:
    """(steps per second, batch size, parameters) of ``steps`` optimiser steps after one warm-up step."""
    cfg = make_config(task, preset)
    the_task = make_task(cfg)
    model = build_model(cfg, the_task).train()
    opt, sched = make_optimizer(model, cfg)
    rng = np.random.default_rng(0)
    batches = [the_task.sample(cfg.batch_size, seed=rng) for _ in range(steps + 1)]
    train_step(model, opt, sched, batches[0], cfg, the_task)
    start = time.perf_counter()
    for batch in batches[1:]:
        train_step(model, opt, sched, batch, cfg, the_task)
    return steps / (time.perf_counter() - start), cfg.batch_size, n_params(model)


def time_generation(task: str, preset: str, seconds: float = 1.0) -> float:
    """Sequences per second generated with their exact posteriors, in training-sized batches."""
    cfg = make_config(task, preset)
    the_task, rng, n, start = make_task(cfg), np.random.default_rng(1), 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += the_task.sample(cfg.batch_size, seed=rng).input_ids.shape[0]
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="timed steps for cpu presets (paper presets: 3)")
    parser.add_argument("--presets", nargs="+", default=["cpu", "paper"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads: {args.threads}")
    print(f"{'task':<10} {'preset':<10} {'params':>10} {'batch':>5} {'steps/s':>8} {'train seq/s':>11} "
          f"{'gen seq/s':>10} {'gen/train':>9}")
    worst = float("inf")
    for task in PRESETS:
        for preset in (p for p in args.presets if p in PRESETS[task]):  # sticky-* exist for the HMM only
            sps, batch, count = time_training(task, preset, args.steps if preset != "paper" else 3)
            gen = time_generation(task, preset)
            ratio = gen / (sps * batch)
            worst = min(worst, ratio)
            print(f"{task:<10} {preset:<10} {count:>10,} {batch:>5} {sps:>8.2f} {sps * batch:>11.0f} {gen:>10.0f} "
                  f"{ratio:>9.0f}")
    print(f"generation / training consumption, worst case: {worst:.0f}x ({'ok' if worst >= 10 else 'BOTTLENECK'})")


if __name__ == "__main__":
    main()
