"""The control axes of an intervention (Paper III §4.6, methods §3.8): directions drawn to be compared with the
true entropy axis.

Controls, each a seeded family of draws (one generator per (seed, family, layer, draw)):

- ``isotropic``: Gaussian directions orthogonalised against the true axis (the paper's control; such a direction
  carries about 1/d of the variance, so it is weak);
- ``matched``: random directions orthogonal to the true axis with exactly the true axis' projected variance
  (a rotation between a direction drawn in the top principal subspace and an isotropic one);
- ``pcs``: the other leading principal components (2..k), as raw-space readouts like the PC1 axis.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..core.errors import InterventionError
from ..model.edits import orthonormal_rows, unit_direction
from ..stats import as_float64
from ..stats.pca import pca


def _generator(seed: int, family: str, layer: int, draw: int) -> np.random.Generator:
    """One generator per (seed, family, layer, draw); a negative layer index is a distinct non-negative word."""
    return np.random.default_rng(np.random.SeedSequence([seed % 2**32, sum(map(ord, family)), layer % 2**32, draw]))


def _orthogonal(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    v = v - (v @ u) * u
    return v / np.linalg.norm(v)


def isotropic_axes(u, n: int, *, layer: int, seed: int, start: int = 0) -> np.ndarray:
    """[n, dim] Gaussian unit directions orthogonal to ``u``: draws ``start`` .. ``start + n - 1``."""
    u = as_float64(unit_direction(u))
    return np.stack([_orthogonal(_generator(seed, "isotropic", layer, i).standard_normal(len(u)), u)
                     for i in range(start, start + n)])


def matched_axes(values, u, n: int, *, layer: int, seed: int, top: int = 10,
                 start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """([n, dim] unit directions orthogonal to ``u``, [n] their projected variance / u's) over ``values``: draws
    ``start`` .. ``start + n - 1`` (each from its own generator, so a later batch extends an earlier one).

    Each draw rotates a random direction g of the top-``top`` principal subspace orthogonal to u (variance >= the
    target) towards an isotropic h orthogonal to both (variance below it; drawn among the weakest directions when an
    isotropic one is above the target) until the variance matches, by bisection.
    When no direction orthogonal to u carries u's variance (u is the top principal direction), each draw is a
    random direction in the top three principal directions orthogonal to u: as strong as the data allows, still
    distinct draws, and the ratio, below 1, says so.
    """
    x = as_float64(values)
    x = x - x.mean(axis=0)
    u = as_float64(unit_direction(u))
    proj = np.eye(len(u)) - np.outer(u, u)
    cov = x.T @ x / (len(x) - 1)
    target = u @ cov @ u
    evals, vecs = np.linalg.eigh(proj @ cov @ proj)  # variance orthogonal to u, ascending
    feasible = evals[-1] >= target
    basis = vecs[:, ::-1][:, :top if feasible else 3]
    out = []
    for i in range(start, start + n):
        rng = _generator(seed, "matched", layer, i)
        g = _orthogonal(basis @ rng.standard_normal(basis.shape[1]), u)
        if not feasible:
            out.append(g)
            continue
        if g @ cov @ g < target:
            g = vecs[:, -1]  # the strongest direction orthogonal to u carries at least the target
        h = _orthogonal(_orthogonal(rng.standard_normal(len(u)), u), g)
        if h @ cov @ h > target:  # an isotropic direction is too strong here: rotate towards the weakest ones
            h = _orthogonal(_orthogonal(vecs[:, 1:4] @ rng.standard_normal(3), u), g)
        lo, hi = 0.0, np.pi / 2
        for _ in range(60):
            mid = (lo + hi) / 2
            r = np.cos(mid) * g + np.sin(mid) * h
            lo, hi = (mid, hi) if r @ cov @ r > target else (lo, mid)
        out.append(np.cos(lo) * g + np.sin(lo) * h)
    out = np.stack(out)
    return out, np.einsum("nd,de,ne->n", out, cov, out) / target


def _orthonormalise(frame: np.ndarray, against: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``frame`` [k, dim] made orthonormal (QR), first orthogonal to the orthonormal rows of ``against``."""
    if against is not None:
        frame = frame - (frame @ against.T) @ against
    return np.linalg.qr(frame.T)[0].T


def isotropic_subspaces(basis, n: int, *, layer: int, seed: int) -> np.ndarray:
    """[n, k, dim] Gaussian k-dimensional frames orthogonal to the span of ``basis`` ([k, dim])."""
    q = orthonormal_rows(basis, torch.float64).numpy()
    return np.stack([_orthonormalise(_generator(seed, "isotropic-subspace", layer, i).standard_normal(q.shape),
                                     q) for i in range(n)])


def matched_subspaces(values, basis, n: int, *, layer: int, seed: int, top: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """([n, k, dim] orthonormal frames orthogonal to span(basis), [n] their total projected variance / the true
    subspace's) over ``values``: the k-dimensional version of ``matched_axes``.

    Each draw rotates a random k-frame G of the top principal subspace orthogonal to the true one towards an
    isotropic frame H orthogonal to both (cos t G + sin t H stays orthonormal) until the total variance matches, by
    bisection (H is drawn among the weakest directions instead when an isotropic frame is above the target); when even
    the strongest orthogonal k-frame carries less than the target, the draw is a random frame in the top k + 2
    orthogonal principal directions and the ratio, below 1, says so."""
    x = as_float64(values)
    x = x - x.mean(axis=0)
    q = orthonormal_rows(basis, torch.float64).numpy()
    k, d = q.shape
    cov = x.T @ x / (len(x) - 1)
    target = np.trace(q @ cov @ q.T)
    proj = np.eye(d) - q.T @ q
    evals, vecs = np.linalg.eigh(proj @ cov @ proj)
    feasible = evals[::-1][:k].sum() >= target
    top_dirs = vecs[:, ::-1][:, :max(top, k) if feasible else k + 2]  # [d, m]
    variance = lambda f: np.trace(f @ cov @ f.T)  # noqa: E731
    out = []
    for i in range(n):
        rng = _generator(seed, "matched-subspace", layer, i)
        g = _orthonormalise(rng.standard_normal((k, top_dirs.shape[1])) @ top_dirs.T, q)
        if not feasible:
            out.append(g)
            continue
        if variance(g) < target:
            g = vecs[:, ::-1][:, :k].T  # the strongest orthogonal k-frame carries at least the target
        h = _orthonormalise(rng.standard_normal((k, d)), np.vstack([q, g]))
        if variance(h) > target:  # an isotropic frame is too strong here: rotate towards the weakest directions
            h = _orthonormalise(rng.standard_normal((k, k + 2)) @ vecs[:, k:2 * k + 2].T, np.vstack([q, g]))
        lo, hi = 0.0, np.pi / 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if variance(np.cos(mid) * g + np.sin(mid) * h) > target else (lo, mid)
        out.append(np.cos(lo) * g + np.sin(lo) * h)
    out = np.stack(out)
    return out, np.array([variance(f) for f in out]) / target


def pc_axes(values, k: int = 4) -> np.ndarray:
    """[k-1, dim] principal components 2..k of the standardised values, carried back to raw space as readouts."""
    x = as_float64(values)
    sd = x.std(axis=0, ddof=1)
    _, comps, _ = pca(x)
    dirs = comps[1:k] / np.where(sd > 0, sd, 1.0)
    return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)


ControlDraw = Callable[..., tuple[np.ndarray, np.ndarray | None]]


# The control families, each drawn per layer: name -> draw(fit values, true axis u, n, layer=, seed=, start=)
# returning draws start .. start + n - 1 as ([n, dim] unit directions, [n] their projected variance / u's, or None
# where the family does not match variance). Adding a family is one entry; run_interventions takes family -> number
# of draws.
CONTROL_FAMILIES: dict[str, ControlDraw] = {
    "isotropic": lambda values, u, n, *, layer, seed, start=0: (
        isotropic_axes(u, n, layer=layer, seed=seed, start=start), None),
    "matched": lambda values, u, n, *, layer, seed, start=0: matched_axes(values, u, n, layer=layer, seed=seed,
                                                                          start=start),
    "pcs": lambda values, u, n, *, layer, seed, start=0: (pc_axes(values, start + n + 1)[start:], None),
}
# The families that are seeded draws from a distribution, i.e. a Monte-Carlo null: drawn sequentially, their count
# a cap (``run_interventions``); the others (the leading PCs) are fixed directions, all run.
RANDOM_FAMILIES = ("isotropic", "matched")


FULL_CONTROLS = {"isotropic": 20, "matched": 20, "pcs": 3}  # the paper's protocol


def control_directions(values, u, controls: dict[str, int], *, layer: int, seed: int,
                       start: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """family -> ([n, dim] control directions, [n] variance ratios or None) for one layer, for every family of
    ``controls`` (name -> number of draws) with at least one draw: draws ``start`` .. ``start + n - 1``."""
    unknown = sorted(set(controls) - set(CONTROL_FAMILIES))
    if unknown:
        raise InterventionError(f"Unknown control famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                                f"choose from {', '.join(CONTROL_FAMILIES)}.")
    return {fam: CONTROL_FAMILIES[fam](values, u, n, layer=layer, seed=seed, start=start)
            for fam, n in controls.items() if n > 0}
