"""Benchmark: ``model.collect.token_values`` reading its values alone (``read(..., "all", distribution=False)``)
against the same readings beside the next-token distribution (``read(..., "all")``: what it ran before, unembedding
and scoring every position), on SmolLM2-135M by default: the values at the ``spread5`` layers (those of the
on-manifold interventions) of the 64 prompts of ``bench/extract.py`` (24-48 tokens).

The two alternate batch by batch (one equal-length batch per call) in one process, several repeats, and the median
ratio is printed in wall-clock time and in this process's CPU time (the steadier on a shared machine); the readings
are checked equal first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract import MAX_LEN, MIN_LEN, bench_prompts, interleaved  # noqa: E402  (bench/ is no package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m", help="alias or local HF folder (default smollm2-135m)")
    parser.add_argument("--layers", default="spread5", help="layer spec, as a recipe's (default spread5)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import interp_bayes as ib
    from interp_bayes.core.layers import resolve_layers
    from interp_bayes.model.read import length_batches, read

    model = ib.load_model(args.model)
    layers = resolve_layers(args.layers, model.cfg.n_layers, "spread5")
    sites = [(layer, "v") for layer in layers]
    prompts = bench_prompts(model.tokenizer)
    groups = [[prompts[i] for i in idx] for idx in length_batches(prompts, None)]
    runs = {"distribution": lambda b: read(model, groups[b], sites, "all"),
            "alone": lambda b: read(model, groups[b], sites, "all", distribution=False)}
    for b in range(len(groups)):  # warm-up, and the same readings both ways
        with_dist, alone = runs["distribution"](b), runs["alone"](b)
        assert all(torch.equal(alone.reading("v", layer), with_dist.reading("v", layer)) for layer in layers)
    times = interleaved(runs, len(groups), args.repeats)
    print(f"{args.model}: values at layers {layers} of {model.cfg.n_layers}, every position of {len(prompts)} prompts "
          f"({MIN_LEN}-{MAX_LEN} tokens) in {len(groups)} equal-length batches, {args.threads} thread(s), "
          f"{args.repeats} repeats, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for clock, by_run in times.items():
        med = {k: statistics.median(v) for k, v in by_run.items()}
        ratios = [a / d for a, d in zip(by_run["alone"], by_run["distribution"])]
        print(f"{clock}: with the distribution {med['distribution']:.3f} s, readings alone {med['alone']:.3f} s, "
              f"ratio {med['alone'] / med['distribution']:.3f} (repeats {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
