"""How many clusters a cloud of states has, against a null with none: k-means silhouettes beside Gaussian clouds.

For k = 2..``k_max``, k-means (``sklearn.cluster.KMeans``) on the standardised rows and the mean silhouette of
the partition (``sklearn.metrics.silhouette_score``); the best k is the one with the highest silhouette. The null
is a Gaussian cloud with the data's mean and covariance and as many rows, put through the same search: one
ellipsoid, so whatever best silhouette it reaches is what k-means finds in structureless data of that shape. The
number of clusters is the best k when its silhouette lies above the null's 95% range, else 1; the p-value of the
best silhouette is against the null draws as drawn (``permutation.p_value``).
"""

from __future__ import annotations

# sklearn is imported inside functions: it takes about a second to load, and only these functions need it
import numpy as np
from threadpoolctl import threadpool_limits

from .arrays import as_float64
from .pca import standardise
from .permutation import p_value
from .resample import interval


def _best_silhouette(z: np.ndarray, k_max: int, seed: int) -> tuple[int, float, list[float]]:
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    scores = []
    for k in range(2, k_max + 1):
        labels = KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(z)
        scores.append(float(silhouette_score(z, labels)) if len(np.unique(labels)) > 1 else float("nan"))
    best = int(np.nanargmax(scores))
    return best + 2, scores[best], scores


def cluster_count(x, *, k_max: int = 8, n_null: int = 20, max_rows: int = 1000, seed: int = 0) -> dict:
    """The number of clusters of the rows of ``x`` [n, d] with its Gaussian null (see the module docstring); at most
    ``max_rows`` rows, drawn without replacement by ``seed``, enter the search (silhouettes cost n^2)."""
    x = as_float64(x)
    rng = np.random.default_rng(seed)
    if len(x) > max_rows:
        x = x[rng.choice(len(x), max_rows, replace=False)]
    z = standardise(x)
    cov = np.cov(z, rowvar=False)
    with threadpool_limits(limits=1):
        best_k, best, scores = _best_silhouette(z, k_max, seed)
        null = [_best_silhouette(rng.multivariate_normal(np.zeros(z.shape[1]), cov, size=len(z),
                                                         method="eigh"), k_max, seed)[1] for _ in range(n_null)]
    null_range = interval(null)
    return dict(n_clusters=best_k if best > null_range[1] else 1, best_k=best_k, silhouette=best,
                silhouettes={k: s for k, s in zip(range(2, k_max + 1), scores)}, null_range=null_range,
                null_mean=float(np.mean(null)), p=p_value(best, null), n_null=n_null, n=int(len(z)))


def cluster_alignment(x, labels: dict[str, np.ndarray], k: int, *, seed: int = 0) -> dict[str, float]:
    """How far the k-means partition of the rows of ``x`` into ``k`` clusters (standardised, as ``cluster_count``
    searches) is each of ``labels`` (name -> [n] labels): the adjusted Rand index, 1 for the same partition, 0 for
    one no closer than chance."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    with threadpool_limits(limits=1):
        parts = KMeans(n_clusters=k, n_init=3, random_state=seed).fit_predict(standardise(x))
    return {name: float(adjusted_rand_score(np.asarray(lab), parts)) for name, lab in labels.items()}
