"""Arrays in, arrays out: float64 conversion and the rounding threshold every statistic shares."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

CONSTANT_RTOL = 1e-9  # a spread below this fraction of the values' scale is rounding noise, not variation


def as_float64(x) -> np.ndarray:
    """A float64 numpy array of ``x`` (a torch tensor on any device, a list or an array)."""
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        return x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def is_constant(x, rtol: float = CONSTANT_RTOL) -> bool:
    """True when ``x`` varies by no more than rounding noise: its range is at most ``rtol`` of its largest
    magnitude (an exact test, ``np.ptp(x) > 0``, lets through vectors constant up to 1e-16)."""
    x = as_float64(x)
    return bool(np.ptp(x) <= rtol * np.abs(x).max()) if x.size else True


def thin_svd(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD. LAPACK's divide-and-conquer driver (gesdd, numpy's) now and then fails to converge on a benign
    finite matrix (seen on SmolLM2's layer-24 residuals, and on a cross-fitted decoding design of 200 x 576 whose
    rank is 187); the slower gesvd driver then takes over."""
    try:
        return np.linalg.svd(x, full_matrices=False)
    except np.linalg.LinAlgError:
        from scipy.linalg import svd

        return svd(x, full_matrices=False, lapack_driver="gesvd")


def ranks(v) -> np.ndarray:
    """Average ranks of ``v`` with values equal up to rounding tied (``snap``): the one ranking behind every
    Spearman correlation of the toolkit, so one pair gives one rho wherever it is computed."""
    return rankdata(snap(as_float64(v)))


def snap(v: np.ndarray) -> np.ndarray:
    """Values equal up to rounding made exactly equal (12 significant digits of the largest magnitude), so that
    ties stay ties: ranks, and centring within strata, would otherwise turn 1e-16 noise into variation."""
    scale = np.abs(v).max() if v.size else 0.0
    return np.round(v / scale, 12) * scale if scale > 0 else v
