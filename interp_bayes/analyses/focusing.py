"""Attention focusing: the final query's attention entropy per layer, with intervals."""

from __future__ import annotations

import numpy as np
import torch

from ..stats import as_float64, beyond, bootstrap_mean_draws, bootstrap_means
from ..stats.sequential import BATCH


def attention_focusing(attn_entropy: dict[int, torch.Tensor], *, groups=None, n_boot: int = 1000,
                       seed: int = 0) -> dict:
    """Per-layer attention entropy of the final query (bits), averaged over heads after taking entropies, then
    over prompts, with bootstrap intervals over prompts (whole ``groups`` of them where given); and the reduction
    from the first to the last layer, whose interval is drawn in batches until it is settled on one side of 0
    (``stats.beyond``; ``n_boot`` the cap): ``reduction_test`` records the decision and the draws used."""
    layers = sorted(attn_entropy)
    per_prompt = np.stack([as_float64(attn_entropy[layer]).mean(axis=1) for layer in layers])  # [layers, n]
    mean, low, high = bootstrap_means(per_prompt.T, groups, n_boot=n_boot, seed=seed)
    rng = np.random.default_rng([seed, 1])
    ends = per_prompt[[0, -1]].T  # [n, 2]: the first and last layer

    def reductions(b: int) -> np.ndarray:
        m = bootstrap_mean_draws(ends, groups, n_boot=b, seed=rng)
        return (m[:, 0] - m[:, 1]) / m[:, 0]

    test = beyond(reductions, 0.0, "above", cap=n_boot, batch=min(BATCH, n_boot))
    return dict(layers=layers, mean_entropy=mean.tolist(),
                ci=[[float(a), float(b)] for a, b in zip(low, high)],
                reduction=float((mean[0] - mean[-1]) / mean[0]), reduction_ci=[float(x) for x in test.null],
                reduction_test=test.as_dict(), n_prompts=int(per_prompt.shape[1]))
