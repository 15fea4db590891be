"""Geometry of value vectors, keys and attention, each number beside an empirical null and an interval.

Statistics are float64 numpy. PCA is of the *standardised* values (each coordinate z-scored across prompts), as in
Paper III; with n prompts far fewer than d coordinates the share a random cloud puts on PC1 is set by n, not d, so
every share is reported beside two empirical nulls (methods.md §3.6):

- ``permuted``: each coordinate shuffled independently across prompts (keeps every marginal, breaks covariance);
- ``gaussian``: independent Gaussian coordinates with the data's per-coordinate variances and the same n and d
  (after standardisation, an isotropic cloud): the share expected from sampling noise alone.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ..core.errors import ConfigError
from . import as_float64, bootstrap, interval, is_constant
from .arrays import ranks, thin_svd
from .sequential import BATCH, sequential_tests

CAP_NULL = 1000  # null clouds at most: a value far outside its null settles after about 550 (two-sided, 5%, 1e-3)


def standardise(x) -> np.ndarray:
    """Each column to zero mean and unit variance across rows; constant columns are left at zero."""
    x = as_float64(x)
    sd = x.std(axis=0, ddof=1)
    return (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0)


def pca(x, *, standardize: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(explained-variance ratios, components [k, d], scores [n, k]) of the rows of ``x`` via SVD."""
    x = standardise(x) if standardize else as_float64(x) - as_float64(x).mean(axis=0)
    _, s, vt = thin_svd(x)
    var = s**2
    return var / var.sum(), vt, x @ vt.T


def spectrum(x, *, standardize: bool = True) -> np.ndarray:
    """Eigenvalues of the (standardised) covariance, descending; via the n x n Gram matrix when d > n (fast)."""
    x = standardise(x) if standardize else as_float64(x) - as_float64(x).mean(axis=0)
    gram = x @ x.T if x.shape[1] > x.shape[0] else x.T @ x
    ev = np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)
    return ev / (x.shape[0] - 1)


def shares(ev: np.ndarray) -> tuple[float, float]:
    """PC1 and PC1+PC2 shares of a spectrum."""
    total = ev.sum()
    return float(ev[0] / total), float(ev[:2].sum() / total)


def participation_ratio(ev: np.ndarray, top: int | None = None) -> float:
    """(sum lambda)^2 / sum lambda^2: the effective number of dimensions (``top`` keeps the leading eigenvalues)."""
    ev = ev[:top] if top else ev
    return float(ev.sum() ** 2 / (ev**2).sum())


def bootstrap_shares(x, *, groups=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """Bootstrap over prompts (rows; whole ``groups`` of rows where given, e.g. a wind tunnel's sequences) of the
    PC1 and PC1+PC2 shares: mean and 95% percentile interval.

    As in Paper III's Table 1. Biased upward when prompts are fewer than coordinates: a resample repeats about a
    third of its rows, and repeated rows add spurious shared variance; ``resample_shares`` avoids that."""
    x = as_float64(x)
    dist, low, high = bootstrap(lambda idx: np.array(shares(spectrum(x[idx]))), len(x), groups, n_boot=n_boot,
                                seed=seed)
    return dict(pc1_mean=float(dist[:, 0].mean()), pc1_ci=[float(low[0]), float(high[0])],
                pc12_mean=float(dist[:, 1].mean()), pc12_ci=[float(low[1]), float(high[1])], n_boot=n_boot)


def resample_shares(x, draws: list) -> dict:
    """PC1 and PC1+PC2 shares over fresh prompt sets ``x[idx]`` for each index array in ``draws`` (e.g. new
    stratified samples from a larger pool): mean and 95% range. Unlike the bootstrap, no prompt is ever
    duplicated within a set, and duplicated rows inflate PCA shares when prompts are fewer than coordinates."""
    x = as_float64(x)
    out = np.array([shares(spectrum(x[np.asarray(idx)])) for idx in draws])
    return dict(pc1_mean=float(out[:, 0].mean()), pc1_ci=interval(out[:, 0]), pc12_mean=float(out[:, 1].mean()),
                pc12_ci=interval(out[:, 1]), n_resample=len(draws))


def sequential_null(draw, observed, cap: int) -> tuple[list[dict], list[float]]:
    """Null statistics drawn in batches (``draw(b)`` -> [b, m]) until each column's two-sided test of ``observed``
    ([m]) is settled (``sequential.sequential_tests``; ``cap`` draws at most): (each column's test, with its null's
    95% range and the draws it used; each column's null mean over those draws)."""
    kept = []

    def batch(b: int) -> np.ndarray:
        kept.append(np.asarray(draw(b), dtype=np.float64).reshape(b, -1))
        return kept[-1]

    tests = sequential_tests(batch, observed, cap=cap, batch=min(BATCH, cap))
    out = np.concatenate(kept)
    means = []
    for j, t in enumerate(tests):
        col = out[:, j][np.isfinite(out[:, j])][:t.draws]
        means.append(float(col.mean()) if len(col) else float("nan"))
    return [t.as_dict() for t in tests], means


def null_shares(x, kind: str = "permuted", *, n_draws: int = CAP_NULL, seed: int = 0) -> dict:
    """PC1 and PC1+PC2 shares of null clouds matched to ``x`` (see the module docstring), drawn in batches until
    the test of ``x``'s own shares against them is settled (``sequential_null``; ``n_draws`` the cap): per share its
    null mean, 95% range and test (the draws used among them)."""
    x = as_float64(x)
    rng = np.random.default_rng(seed)
    n, d = x.shape
    sd = x.std(axis=0, ddof=1)
    if kind not in ("permuted", "gaussian"):
        raise ConfigError(f"Unknown null kind '{kind}'; choose 'permuted' or 'gaussian'.")

    def cloud() -> np.ndarray:
        if kind == "permuted":  # each column shuffled on its own
            return rng.permuted(x, axis=0)
        return rng.standard_normal((n, d)) * sd

    tests, means = sequential_null(lambda b: [shares(spectrum(cloud())) for _ in range(b)], shares(spectrum(x)),
                                   n_draws)
    out = dict(kind=kind)
    for which, t, mean in zip(("pc1", "pc12"), tests, means):
        out.update({f"{which}_mean": mean, f"{which}_range": list(t["null"]), f"{which}_test": t})
    return out


def correlations(a, b) -> dict:
    """Pearson r and Spearman rho of two 1-D arrays (rho: Pearson of ``arrays.ranks``, ties up to rounding tied, as
    in ``deconfounded_correlation``); NaN, with the reason, when either is constant up to rounding (a correlation
    of rounding noise would be a number that means nothing)."""
    a, b = as_float64(a), as_float64(b)
    flat = [name for name, x in (("first", a), ("second", b)) if is_constant(x)]
    if flat:
        return dict(pearson=float("nan"), spearman=float("nan"),
                    reason=f"the {' and '.join(flat)} input is constant up to rounding")
    return dict(pearson=float(stats.pearsonr(a, b).statistic),
                spearman=float(stats.pearsonr(ranks(a), ranks(b)).statistic))


def spearman(a, b) -> float:
    return correlations(a, b)["spearman"]


def mean_abs_offdiag_cos(w: np.ndarray) -> np.ndarray:
    """[heads, d, k] -> mean |cos| between the k columns of each head: [heads]."""
    cols = w / np.linalg.norm(w, axis=1, keepdims=True)
    gram = np.abs(np.einsum("hdi,hdj->hij", cols, cols))
    k = w.shape[2]
    return (gram.sum(axis=(1, 2)) - np.trace(gram, axis1=1, axis2=2)) / (k * (k - 1))


def key_orthogonality_null(d_model: int, d_head: int, observed: float, *, n_draws: int = CAP_NULL,
                           seed: int = 0) -> dict:
    """The same score for Gaussian W_K of the same shape, drawn in batches until the test of ``observed`` (the
    claim's score, e.g. the median over heads) against it is settled (``sequential_null``; ``n_draws`` the cap):
    the null mean, 95% range and test (the draws used among them), and the analytic large-d value
    sqrt(2 / (pi d_model)) (the right dimension for column cosines in R^d_model)."""
    rng = np.random.default_rng(seed)
    (test,), (mean,) = sequential_null(
        lambda b: mean_abs_offdiag_cos(rng.standard_normal((b, d_model, d_head)))[:, None], [observed], n_draws)
    return dict(mean=mean, range=list(test["null"]), test=test, analytic=math.sqrt(2 / (math.pi * d_model)))
