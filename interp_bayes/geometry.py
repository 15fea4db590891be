"""Geometry of value vectors: PCA shares and rank correlations (statistics in float64)."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats


def _as_f64(x) -> np.ndarray:
    return x.double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def standardise(x) -> np.ndarray:
    """Each column to zero mean and unit variance across prompts; constant columns are left at zero."""
    x = _as_f64(x)
    sd = x.std(axis=0, ddof=1)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def pca(x, *, standardize: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(explained-variance ratios, components [k, d], scores [n, k]) of the rows of ``x`` via SVD."""
    x = standardise(x) if standardize else _as_f64(x) - _as_f64(x).mean(axis=0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    var = s**2
    return var / var.sum(), vt, x @ vt.T


def spearman(a, b) -> float:
    return float(stats.spearmanr(_as_f64(a), _as_f64(b)).statistic)


def manifold_summary(values, entropy) -> dict:
    """PC1 and PC1+PC2 shares of the standardised values, and Spearman rho of the PC1 score with entropy."""
    ratios, _, scores = pca(values)
    return dict(pc1_share=float(ratios[0]), pc12_share=float(ratios[:2].sum()),
                spearman_pc1_entropy=spearman(scores[:, 0], entropy), n_prompts=int(len(scores)),
                dim=int(_as_f64(values).shape[1]))
