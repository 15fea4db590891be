"""Benchmark: last-layer entropy-neuron ablations through the head's affine form against rerunning the head.

``analyses.neurons.ablation_effects`` gets each ablated residual's logits from the clean ones (its ``_AffineHead``: one
unembedding per batch, elementwise work per ablation). The baseline, timed alternately in the same process, is
what it did before: the final norm and the unembedding rerun on every ablated residual at every position. Both
compute the same per-prompt effects (the maximum difference is printed). The sweep's setting: ``entropy_neurons``'
96 prompts of the default pool and 5 candidates + 10 random neurons of the last layer, on SmolLM2-135M and on a
random-init Llama of Qwen2.5-0.5B's shape (vocabulary 151,936, where the unembedding dominates). Medians over
repeats, wall and CPU time; one thread by default.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def sweep_prompts(n_prompts: int = 96, seed: int = 42) -> list[str]:
    """The entropy_neurons probe's ablation prompts: its seeded sample of the default prompt pool."""
    from interp_bayes.core.prompts import load_source

    texts = list(load_source("pool")["text"])
    return [texts[i] for i in sorted(np.random.default_rng(seed).choice(len(texts), n_prompts, replace=False))]


@torch.no_grad()
def rerun_head(model, clean: dict, neurons: list[int]) -> dict[int, dict[str, np.ndarray]]:
    """The baseline: the final norm and unembedding rerun on each ablated residual (total and direct)."""
    from interp_bayes.analyses.neurons import _batch_stats, _head, _quiet_scale_edits

    w_out = model.blocks[-1].mlp.W_out.detach()
    means = torch.tensor(clean["means"])
    n = len(clean["token_ids"])
    out = {j: {f"{c}_entropy": np.zeros(n) for c in ("total", "direct")} for j in neurons}
    with _quiet_scale_edits():
        for step, (b, frozen) in enumerate(zip(clean["batches"], clean["scale_tensors"])):
            ids = torch.tensor([clean["token_ids"][i] for i in b])
            resid, post, _ = clean["head_inputs"][step]  # no post-MLP norm on these models
            for j in neurons:
                delta = (means[j] - post[..., j])[..., None] * w_out[j]
                for cond, hook in (("total", lambda t, hook: t.clone()),
                                   ("direct", lambda t, hook, s=frozen: s.clone())):
                    entropy = _batch_stats(_head(model, resid + delta, hook), ids, None)["entropy"].double().numpy()
                    for r, i in enumerate(b):
                        out[j][f"{cond}_entropy"][i] = (entropy[r] - clean["entropy"][i]).sum()
    return out


def bench_model(model, name: str, repeats: int, n_prompts: int) -> None:
    from interp_bayes.analyses.neurons import ablation_effects, final_norm_run

    prompts = sweep_prompts(n_prompts)
    rng = np.random.default_rng(0)
    neurons = sorted(rng.choice(model.cfg.d_mlp, size=15, replace=False).tolist())
    clean = final_norm_run(model, prompts, keep_head_inputs=True)
    runs = {"affine": lambda: ablation_effects(model, prompts, neurons, clean=clean, progress=False).per_neuron,
            "rerun": lambda: rerun_head(model, clean, neurons)}
    results, times = {}, {"wall": {k: [] for k in runs}, "cpu": {k: [] for k in runs}}
    for _ in range(repeats):
        for key, fn in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            results[key] = fn()
            times["wall"][key].append(time.perf_counter() - wall)
            times["cpu"][key].append(time.process_time() - cpu)
    diff = max(np.abs(results["affine"][j][k] - results["rerun"][j][k]).max()
               for j in neurons for k in ("total_entropy", "direct_entropy"))
    print(f"{name}: {len(prompts)} prompts, {sum(map(len, clean['token_ids']))} tokens, 15 neurons x 2 conditions, "
          f"vocabulary {model.cfg.d_vocab}; max |difference| of summed entropy effects {diff:.2e} bits")
    for clock, by in times.items():
        med = {k: statistics.median(v) for k, v in by.items()}
        ratios = ", ".join(f"{a / r:.3f}" for a, r in zip(by["affine"], by["rerun"]))
        print(f"  {clock}: affine head {med['affine']:.2f}s | rerun head {med['rerun']:.2f}s | ratio "
              f"{med['affine'] / med['rerun']:.3f} (repeats {ratios})", flush=True)


def main() -> None:
    from interventions import bench_models, model_parser

    parser = model_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=96, help="ablation prompts (the probe's 96 by default)")
    args = parser.parse_args()
    for name, model in bench_models(args):
        bench_model(model, name, args.repeats, args.prompts)


if __name__ == "__main__":
    main()
