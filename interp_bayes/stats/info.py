"""Information measures over the last axis, in bits unless ``unit="nats"``; one argument convention for every
divergence:

    kl(p, q) = sum_i p_i log(p_i / q_i),  i.e. KL(p || q): the first argument is the distribution the expectation is
    taken under (the exact posterior, or the edited model), the second the one it is scored against.

Each function keeps the arithmetic its former copies used (``0 log 0 = 0`` through ``xlogy`` or a mask), so the
numbers they gave are unchanged; the dtype is the caller's (float64 where the caller casts first).
"""

from __future__ import annotations

import math

import numpy as np
import torch

LN2 = math.log(2.0)  # nats per bit
UNITS = {"bits": LN2, "nats": 1.0}


def _per(unit: str) -> float:
    if unit not in UNITS:
        raise ValueError(f"Unknown information unit {unit!r}; use 'bits' or 'nats'.")
    return UNITS[unit]


def entropy(p, unit: str = "bits"):
    """Shannon entropy of probabilities ``p`` (torch or numpy; zeros allowed: 0 log 0 = 0)."""
    if isinstance(p, torch.Tensor):
        h = -torch.special.xlogy(p, p).sum(-1)
        return h if unit == "nats" else h / _per(unit)
    with np.errstate(divide="ignore", invalid="ignore"):  # numpy: log2 directly, as its callers always have
        if _per(unit) == LN2:
            return -np.where(p > 0, p * np.log2(p), 0.0).sum(-1)
        return -np.where(p > 0, p * np.log(p), 0.0).sum(-1)


def entropy_of_log_probs(logp: torch.Tensor, unit: str = "bits") -> torch.Tensor:
    """Shannon entropy of a log-probability tensor (a ``log_softmax``'s output)."""
    terms = logp.exp()
    if terms.requires_grad:
        terms = terms * logp
    else:  # in place, the same arithmetic: one [..., vocab] tensor fewer to allocate (no graph keeps exp's output)
        terms.mul_(logp)
    h = -terms.sum(-1)
    return h if unit == "nats" else h / _per(unit)


def kl(logp: torch.Tensor, logq: torch.Tensor, unit: str = "bits") -> torch.Tensor:
    """KL(p || q) from log-probabilities of both (see the module docstring for the convention)."""
    d = (logp.exp() * (logp - logq)).sum(-1)
    return d if unit == "nats" else d / _per(unit)


def kl_from_probs(p, logq, unit: str = "bits") -> np.ndarray:
    """KL(p || q), float64 numpy, with ``p`` as probabilities (an exact posterior: its zeros contribute 0 even where
    q is 0 too) and ``q`` as log-probabilities (a model's ``log_softmax``)."""
    p, logq = np.asarray(p, dtype=np.float64), np.asarray(logq, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - logq), 0.0)
    return terms.sum(-1) / _per(unit)


def gaussian_kl(mean0: torch.Tensor, chol0: torch.Tensor, mean1: torch.Tensor, chol1: torch.Tensor,
                unit: str = "bits") -> torch.Tensor:
    """KL(N(mean0, L0 L0^T) || N(mean1, L1 L1^T)) from lower Cholesky factors, batched over leading axes
    (differentiable: the Kalman tunnel's training loss calls it with the model's factor)."""
    trace = torch.linalg.solve_triangular(chol1, chol0, upper=False).pow(2).sum((-1, -2))  # tr(P1^-1 P0)
    maha = torch.linalg.solve_triangular(chol1, (mean1 - mean0)[..., None], upper=False).pow(2).sum((-1, -2))
    diag0, diag1 = torch.diagonal(chol0, dim1=-2, dim2=-1), torch.diagonal(chol1, dim1=-2, dim2=-1)
    logdet = 2 * (diag1.abs().log() - diag0.abs().log()).sum(-1)
    d = 0.5 * (trace + maha - mean0.shape[-1] + logdet)
    return d if unit == "nats" else d / _per(unit)


def normal_kl(mean0, sd0, mean1, sd1, unit: str = "bits") -> np.ndarray:
    """KL(N(mean0, sd0^2) || N(mean1, sd1^2)) of one-dimensional normals, elementwise, float64 numpy."""
    mean0, sd0, mean1, sd1 = (np.asarray(a, dtype=np.float64) for a in (mean0, sd0, mean1, sd1))
    return (np.log(sd1 / sd0) + (sd0**2 + (mean0 - mean1) ** 2) / (2 * sd1**2) - 0.5) / _per(unit)
