"""Paper III's key-frame score: how orthogonal the columns of each head's W_K are."""

from __future__ import annotations

import numpy as np

from ..stats.pca import mean_abs_offdiag_cos


def key_orthogonality(model) -> np.ndarray:
    """Paper III's key-frame score per layer and key/value head, [n_layers, n_kv_heads].

    For each head the d_head columns of W_K (in R^d_model) are normalised; the score is the mean |cosine| over
    off-diagonal column pairs. Lower is more orthogonal.
    """
    out = []
    for block in model.blocks:
        w = block.attn.W_K.detach().double().cpu()  # [n_kv, d_model, d_head]
        out.append(mean_abs_offdiag_cos(w.numpy()))
    return np.stack(out)
