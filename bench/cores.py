"""Benchmark: two cores used as two torch threads in one process, or as two one-thread worker processes.

The sweep's work is of two sorts: forward passes (matrix products, which torch threads well) and statistics on
small float64 arrays (bootstraps, permutations: many small products and Python between them). For each, the same
total work runs (a) in this process at ``--threads`` threads and (b) split in halves over that many worker
processes at one thread each, started together behind a barrier once their model is loaded; the ratio (b)/(a) of
the wall times says which use of the cores is faster for that sort of work (issue 37 item 2).

    python bench/cores.py --model smollm2-135m --batches 24
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from interp_bayes.stats.pca import shares, spectrum

PROMPT_TOKENS = 39  # a SULA prompt's length on SmolLM2
BATCH = 16


def forward_work(model, batches: int) -> None:
    """``batches`` forward passes of BATCH prompts, as the sweep's readers and edited runs batch them."""
    ids = torch.randint(100, 1000, (BATCH, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for _ in range(batches):
            model(ids)


def stats_work(rounds: int) -> None:
    """``rounds`` bootstrap draws of the PC shares of a [873, 576] float64 array (the pool's value vectors)."""
    x = np.random.default_rng(0).standard_normal((873, 576))
    rng = np.random.default_rng(1)
    for _ in range(rounds):
        shares(spectrum(x[rng.integers(0, len(x), len(x))]))


def _load(name: str):
    from interp_bayes.model.loading import load_model

    return load_model(name)


def _worker(kind: str, name: str, amount: int, barrier, out) -> None:
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        model = _load(name) if kind == "forward" else None
        barrier.wait()
        t = time.perf_counter()
        forward_work(model, amount) if kind == "forward" else stats_work(amount)
        out.put(time.perf_counter() - t)


def in_processes(kind: str, name: str, amount: int, workers: int) -> float:
    """Wall seconds of ``amount`` units split evenly over ``workers`` one-thread processes, from the moment all are
    loaded to the last one's end."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(kind, name, amount // workers, barrier, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    barrier.wait()
    t = time.perf_counter()
    for _ in procs:
        out.get()
    wall = time.perf_counter() - t
    for p in procs:
        p.join()
    return wall


def in_threads(kind: str, model, amount: int, threads: int) -> float:
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    with threadpool_limits(limits=threads, user_api="blas"):
        t = time.perf_counter()
        forward_work(model, amount) if kind == "forward" else stats_work(amount)
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2, help="threads of (a), and worker processes of (b)")
    ap.add_argument("--batches", type=int, default=24, help="forward batches in all")
    ap.add_argument("--rounds", type=int, default=40, help="bootstrap draws in all")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    model = _load(args.model)
    print(f"{args.threads} threads in one process (a) against {args.threads} one-thread processes (b), same work, "
          f"best of {args.repeats}")
    for kind, amount in (("forward", args.batches), ("stats", args.rounds)):
        a = min(in_threads(kind, model, amount, args.threads) for _ in range(args.repeats))
        b = min(in_processes(kind, args.model, amount, args.threads) for _ in range(args.repeats))
        one = in_threads(kind, model, amount // args.threads, 1)
        print(f"{kind:8s} (a) {a:7.2f} s   (b) {b:7.2f} s   (b)/(a) {b / a:.3f}   "
              f"one thread, 1/{args.threads} of the work: {one:.2f} s (threads' speed-up {one * args.threads / a:.2f}, "
              f"processes' {one * args.threads / b:.2f})")


if __name__ == "__main__":
    main()
