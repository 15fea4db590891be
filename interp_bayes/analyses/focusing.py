"""Attention focusing: the final query's attention entropy per layer, with intervals."""

from __future__ import annotations

import numpy as np
import torch

from ..stats import as_float64, bootstrap


def attention_focusing(attn_entropy: dict[int, torch.Tensor], *, groups=None, n_boot: int = 1000,
                       seed: int = 0) -> dict:
    """Per-layer attention entropy of the final query (bits), averaged over heads after taking entropies, then
    over prompts, with bootstrap intervals over prompts (whole ``groups`` of them where given); and the reduction
    from the first to the last layer."""
    layers = sorted(attn_entropy)
    per_prompt = np.stack([as_float64(attn_entropy[layer]).mean(axis=1) for layer in layers])  # [layers, n]
    mean = per_prompt.mean(axis=1)

    def stat(idx):  # per-layer means, then the first-to-last reduction
        m = per_prompt[:, idx].mean(axis=1)
        return np.append(m, (m[0] - m[-1]) / m[0])

    _, low, high = bootstrap(stat, per_prompt.shape[1], groups, n_boot=n_boot, seed=seed)
    return dict(layers=layers, mean_entropy=mean.tolist(),
                ci=[[float(a), float(b)] for a, b in zip(low[:-1], high[:-1])],
                reduction=float((mean[0] - mean[-1]) / mean[0]), reduction_ci=[float(low[-1]), float(high[-1])],
                n_prompts=int(per_prompt.shape[1]))
