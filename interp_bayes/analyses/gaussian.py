"""Beliefs about a Gaussian (Sarfati et al. 2026): calibration of a model's predictive and whether the belief states
lie on a curved manifold (where the posterior's mean and spread are decodable: ``stats.probe.scalar_probes``).

- ``predictive_calibration``: the model's next-number distribution (renormalised over the number tokens) against
  the exact discretised predictive: KL(exact || model) in bits, and the predictive mean and sd of each, per number
  of observations n and pooled; intervals are percentile bootstraps over sequences (the unit of independence),
  the KL's null is the model's predictive of another sequence with the same n (is the prediction specific to the
  numbers shown?), the correlations' null permutes within n.
- ``manifold_curvature``: the linear dimension of the states (PCA of the standardised readings: components for
  90% / 95% of the variance, participation ratio) against a nonlinear one (Isomap; Tenenbaum et al. 2000): the
  residual variance 1 - r^2 between the distances a d-dimensional embedding keeps and the distances it should keep
  (Euclidean for PCA, graph geodesics for Isomap). On a flat cloud Isomap's geodesics are Euclidean distances and
  the two residual variances agree; on a curved manifold Isomap unrolls what PCA needs extra dimensions for, so
  ``curvature_gap`` = rv_PCA(d) - rv_Isomap(d) is positive. Null: the same statistics on Gaussian clouds with
  the data's covariance and n (flat by construction, the same sampling noise and kNN-graph bias).
"""

from __future__ import annotations

# sklearn (Isomap) is imported inside the one function that embeds a cloud: the calibration rows do not need it
from typing import Any

import numpy as np
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import pdist

from ..stats import (as_float64, bootstrap_means, bootstrap_pearson, interval, permutations, sequential_test,
    sequential_tests)
from ..stats.info import kl_from_probs, normal_kl
from ..stats.arrays import thin_svd
from ..stats.pca import participation_ratio, standardise
from ..stats.sequential import BATCH

SHARES = (0.9, 0.95)  # variance shares whose PCA dimension is reported


def _moments(p: np.ndarray, support: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = p @ support
    return mean, np.sqrt(np.clip(p @ support**2 - mean**2, 0.0, None))


def predictive_calibration(model_logprobs, exact, support, *, groups, strata, n_boot: int = 1000,
                           n_null: int = 1000, seed: int = 0) -> dict[Any, dict[str, Any]]:
    """``calibration_table`` of a model's distribution over number tokens: ``model_logprobs`` [N, J] (natural log,
    renormalised over the J number tokens) against ``exact`` [N, J], ``support`` [J] the numbers the tokens stand
    for; the reference is a uniform predictor over the J numbers."""
    lp, p, x = as_float64(model_logprobs), as_float64(exact), as_float64(support)
    m_mean, m_sd = _moments(np.exp(lp), x)
    e_mean, e_sd = _moments(p, x)
    return calibration_table(kl_from_probs(p, lp), lambda perm: kl_from_probs(p, lp[perm]),
                             dict(mean=(m_mean, e_mean), sd=(m_sd, e_sd)), groups=groups, strata=strata,
                             reference=kl_from_probs(p, np.full_like(p, -np.log(p.shape[1]))), n_boot=n_boot,
                             n_null=n_null, seed=seed)


def normal_calibration(model_mean, model_sd, exact_mean, exact_sd, *, groups, strata, n_boot: int = 1000,
                       n_null: int = 1000, seed: int = 0) -> dict[Any, dict[str, Any]]:
    """``calibration_table`` of one-dimensional Gaussian beliefs (the Kalman tunnel's head against the exact
    filter); the reference is the exact belief of another row of the same stratum (the null's mean)."""
    mm, ms, em, es = (as_float64(a) for a in (model_mean, model_sd, exact_mean, exact_sd))
    return calibration_table(normal_kl(em, es, mm, ms), lambda perm: normal_kl(em, es, mm[perm], ms[perm]),
                             dict(mean=(mm, em), sd=(ms, es)), groups=groups, strata=strata, reference=None,
                             n_boot=n_boot, n_null=n_null, seed=seed)


def calibration_table(kl, kl_permuted, pairs: dict[str, tuple], *, groups, strata, reference=None,
                      n_boot: int = 1000, n_null: int = 1000, seed: int = 0) -> dict[Any, dict[str, Any]]:
    """Per stratum (each level, and ``"all"``): the mean of the per-row ``kl`` [N] (bits) with a bootstrap interval
    over ``groups`` and a null (``kl_permuted(perm)``: each row scored with the model's belief of another row of
    its stratum: is the belief specific to the data shown? drawn in batches until every level's KL is settled
    against it, ``stats.sequential_tests``, ``n_null`` the cap; ``test`` per level); for each of ``pairs``
    (name -> (model [N], exact [N])) the mean error model - exact with its interval and the Pearson r with its
    interval and a within-stratum permutation null (the permutations the KL's tests drew); ``reference`` [N]: a
    reference predictor's KL, averaged."""
    groups, strata = np.asarray(groups), np.asarray(strata)
    perms = permutations(len(kl), n_null, np.random.default_rng(seed), strata)  # [n_null, N], drawn in order
    levels = [*np.unique(strata).tolist(), "all"]
    sels = [np.ones(len(kl), bool) if level == "all" else strata == level for level in levels]
    drawn: list[np.ndarray] = []

    def draw(b):  # the mean permuted KL of every level for the next b permutations: [b, levels]
        drawn.extend(kl_permuted(perm) for perm in perms[len(drawn):len(drawn) + b])
        return np.stack([[row[sel].mean() for sel in sels] for row in drawn[-b:]])

    # a within-stratum permutation maps each stratum onto itself, so one set of permutations serves every level
    tests = sequential_tests(draw, [kl[sel].mean() for sel in sels], cap=n_null, batch=min(BATCH, n_null))
    perms = perms[:len(drawn)]  # the correlations' nulls read the same permutations
    out: dict[Any, dict[str, Any]] = {}
    for level, sel, test in zip(levels, sels, tests):
        g = groups[sel]
        errors = np.column_stack([kl[sel], *(m[sel] - e[sel] for m, e in pairs.values())])
        mean, low, high = bootstrap_means(errors, g, n_boot=n_boot, seed=seed)
        res: dict[str, Any] = dict(n=int(sel.sum()), n_groups=int(len(np.unique(g))))
        res["kl_bits"] = dict(value=float(mean[0]), ci=[float(low[0]), float(high[0])], null=list(test.null),
                              test=test.as_dict())
        if reference is not None:
            res["kl_reference_bits"] = float(as_float64(reference)[sel].mean())
        for i, (name, (model_v, exact_v)) in enumerate(pairs.items(), start=1):
            with np.errstate(invalid="ignore", divide="ignore"):
                r = float(np.corrcoef(model_v[sel], exact_v[sel])[0, 1])
                r_null = [np.corrcoef(model_v[perm][sel], exact_v[sel])[0, 1] for perm in perms]
            res[name] = dict(error=float(mean[i]), error_ci=[float(low[i]), float(high[i])], r=r,
                             r_ci=interval(bootstrap_pearson(model_v[sel], exact_v[sel], g, n_boot=n_boot,
                                                             seed=seed)),
                             r_null=interval(r_null), model=float(model_v[sel].mean()),
                             exact=float(exact_v[sel].mean()))
        out[level] = res
    return out




def _residual_variance(target: np.ndarray, kept: np.ndarray) -> float:
    """1 - r^2 between two condensed distance vectors (Tenenbaum et al.'s residual variance)."""
    r = np.corrcoef(target, kept)[0, 1]
    return float(1.0 - r**2) if np.isfinite(r) else float("nan")


def _geometry(z: np.ndarray, d_max: int, n_neighbors: int) -> dict[str, Any]:
    """The statistics of one cloud z [n, D] (already standardised)."""
    from sklearn.manifold import Isomap

    zc = z - z.mean(0)
    _, s, vt = thin_svd(zc)
    ev = s**2 / (len(z) - 1)
    cum = np.cumsum(ev) / ev.sum()
    out: dict[str, Any] = {f"pca_dim_{int(round(100 * q))}": int(np.searchsorted(cum, q) + 1) for q in SHARES}
    out["participation_ratio"] = participation_ratio(ev)
    scores = zc @ vt[:d_max].T
    full = pdist(zc)
    iso = Isomap(n_neighbors=n_neighbors, n_components=d_max).fit(zc)
    # a kNN graph in pieces is joined by sklearn with straight edges between the pieces: those geodesics are guesses
    out["graph_components"] = int(connected_components(iso.nbrs_.kneighbors_graph(zc), directed=False)[0])
    n = len(z)
    geodesic = iso.dist_matrix_[np.triu_indices(n, 1)]  # the same pair order as pdist
    emb = iso.embedding_
    out["rv_pca"] = [_residual_variance(full, pdist(scores[:, :d])) for d in range(1, d_max + 1)]
    out["rv_isomap"] = [_residual_variance(geodesic, pdist(emb[:, :d])) for d in range(1, d_max + 1)]
    return out


def manifold_curvature(x, *, d: int = 2, d_max: int = 6, n_neighbors: int = 10, n_null: int = 1000,
                       standardize: bool = True, strata=None, seed: int = 0) -> dict[str, Any]:
    """Linear (PCA) against nonlinear (Isomap) dimension of the rows of ``x`` [n, dim], with a matched-Gaussian
    null (see the module docstring). ``d``: the embedding dimension of the headline ``curvature_gap`` (2: a
    Gaussian belief has two parameters). Returns the data's statistics (``rv_pca``, ``rv_isomap`` per d = 1..d_max,
    ``pca_dim_90``, ``pca_dim_95``, ``participation_ratio``, ``curvature_gap``, ``graph_components``: the pieces
    of the kNN graph, 1 when every geodesic is a path through the data), ``test``: the curvature gap against the
    matched Gaussian clouds, drawn in batches until settled (``stats.sequential_test``, two-sided, ``n_null`` the
    cap; ``n_null`` in the result: the clouds drawn), and ``null``: each scalar's 95% interval over those clouds.
    ``standardize``: z-score each coordinate first (the toolkit's PCA convention for model readings; the null
    clouds are treated the same way). ``strata`` [n]: each
    null cloud is drawn stratum by stratum with that stratum's mean and covariance (a flat cloud with the data's
    clusters, e.g. one per number of examples shown), so clustering alone does not count as curvature."""
    if not 1 <= d <= d_max:
        raise ValueError(f"d={d} must lie in 1..d_max={d_max}.")
    prep = standardise if standardize else (lambda a: as_float64(a) - as_float64(a).mean(0))
    z = prep(x)
    data = _geometry(z, d_max, n_neighbors)
    rng = np.random.default_rng(seed)
    draws = []
    members = [np.arange(len(z))] if strata is None else [np.flatnonzero(np.asarray(strata) == s)
                                                          for s in np.unique(strata)]

    def scalars(g: dict) -> dict[str, float]:
        return dict(pca_dim_90=g["pca_dim_90"], pca_dim_95=g["pca_dim_95"],
                    participation_ratio=g["participation_ratio"], rv_pca=g["rv_pca"][d - 1],
                    rv_isomap=g["rv_isomap"][d - 1], curvature_gap=g["rv_pca"][d - 1] - g["rv_isomap"][d - 1])

    def draw(b):
        for _ in range(b):
            # rows N(mean_s, cov_s) per stratum s (one stratum: the data's covariance), a flat cloud or flat clusters
            fake = np.empty_like(z)
            for rows in members:
                dev = z[rows] - z[rows].mean(0)
                fake[rows] = z[rows].mean(0) + rng.standard_normal((len(rows), len(rows))) @ dev / np.sqrt(len(rows))
            draws.append(scalars(_geometry(prep(fake), d_max, n_neighbors)))
        return [g["curvature_gap"] for g in draws[-b:]]

    gap = scalars(data)["curvature_gap"]
    test = sequential_test(draw, gap, cap=n_null, batch=min(BATCH, n_null)).as_dict() if n_null > 0 else None
    out = dict(data, **scalars(data), d=d, n=int(len(z)), n_neighbors=n_neighbors, n_null=len(draws),
               null_kind="matched Gaussian" if strata is None else "matched Gaussian per stratum", test=test)
    nan2 = [float("nan")] * 2  # no clouds drawn (``n_null=0``: the data's statistics alone)
    out["null"] = {k: interval([g[k] for g in draws]) if draws else nan2 for k in scalars(data)}
    return out
