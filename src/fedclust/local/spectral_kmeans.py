"""Device step of k-FED: Awasthi–Sheffet local k-means (k-FED Algorithm 1).

Dennis, Li & Smith, "Heterogeneity for the Win: One-Shot Federated Clustering",
ICML 2021, Algorithm 1; Awasthi & Sheffet, "Improved spectral-norm bounds for
clustering", APPROX 2012.

1. Project the device's data A (n, d) onto its top-k right singular vectors V.
2. Seed k centers on the projection with greedy k-means++.
3. Keep, for every seed ν_r, the points at least 3x closer to ν_r than to every
   other seed (S_r) and take θ_r = mean(A[S_r]) in the full space; an empty S_r
   falls back to ν_r lifted back (ν_r Vᵀ), never NaN.
4. Lloyd on the full-dimensional A from θ until labels stop changing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._kmeans import assign, kmeans_plusplus, lloyd, squared_distances
from .._random import sklearn_seed
from .._validation import check_array, check_int
from ..exceptions import ValidationError
from ..messages import LocalCenters

__all__ = ["LocalKMeansResult", "local_kmeans", "top_right_singular_vectors"]

# Above this many entries in min(n, d) x k work a randomized SVD is cheaper.
_EXACT_SVD_MAX = 400


@dataclass(frozen=True)
class LocalKMeansResult:
    """What one device computes: its message and its own point labels (kept local)."""

    message: LocalCenters
    labels: np.ndarray  # (n,) int64, local cluster of every point
    n_iter: int
    raw_points: bool  # True when the centers are the device's raw points (opt-in only)


def top_right_singular_vectors(A: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Top-k right singular vectors of A as a (d, k) matrix.

    Exact (LAPACK) SVD for small matrices, scikit-learn's ``randomized_svd``
    (seeded from ``rng``) when ``min(n, d)`` is large compared with k.
    """
    n, d = A.shape
    if min(n, d) <= _EXACT_SVD_MAX or k * 4 >= min(n, d):
        if n >= d:
            # Gram eigendecomposition: d x d instead of an n x d SVD.
            w, V = np.linalg.eigh(A.T @ A)
            return V[:, ::-1][:, :k]
        _, _, Vt = np.linalg.svd(A, full_matrices=False)
        return Vt[:k].T
    from sklearn.utils.extmath import randomized_svd

    _, _, Vt = randomized_svd(A, k, n_oversamples=10, n_iter=4, random_state=sklearn_seed(rng))
    return Vt.T


def local_kmeans(X: np.ndarray, n_clusters: int, rng: np.random.Generator, *,
                 max_iter: int = 300, tol: float = 1e-4, project: bool = True,
                 allow_raw_points: bool = False, device: str = "device") -> LocalKMeansResult:
    """Run k-FED's device step on one device's data.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The device's points. Never leaves the device.
    n_clusters : int
        k_z, the number of local clusters.
    rng : numpy.random.Generator
        The device's own random stream.
    max_iter, tol : int, float
        Lloyd stopping rules (labels unchanged, relative center shift <= tol).
    project : bool, default=True
        Do the spectral projection (step 1). Skipped automatically when d <= k_z.
    allow_raw_points : bool, default=False
        When the device has n <= k_z points, its "centers" would be its raw
        points. That is refused unless this is True (the authors' code does it
        silently, which leaks data).
    device : str
        Name used in error messages.

    Returns
    -------
    LocalKMeansResult
        ``message`` (k_z centers + counts, ``k_z*(d+1)*8`` bytes for float64)
        and the device-local ``labels``.

    Notes
    -----
    Cost: one SVD (O(n d min(n, d)) exact, O(n d k) randomized) plus Lloyd
    iterations of O(n d k_z) each.
    """
    X = check_array(X, device)
    k = check_int(n_clusters, "n_local_clusters", min_value=1)
    n, d = X.shape
    if n == 0:
        raise ValidationError(f"{device} has no points")
    if n <= k:
        if not allow_raw_points:
            raise ValidationError(
                f"{device} has n_z={n} points but n_local_clusters={k}: its centers would be its "
                "raw points. Lower n_local_clusters for this device, drop it, or pass "
                "allow_raw_points=True to send the points themselves")
        counts = np.ones(n, dtype=np.int64)
        msg = LocalCenters(centers=X.copy(), counts=counts)
        return LocalKMeansResult(msg, np.arange(n, dtype=np.int64), 0, True)
    theta = _spectral_seed(X, k, rng, project=project)
    res = lloyd(X, theta, max_iter=max_iter, tol=tol)
    counts = res.counts.astype(np.int64)
    if (counts == 0).any():  # only when X has fewer than k distinct points
        distinct = len(np.unique(X, axis=0))
        raise ValidationError(
            f"{device} has only {distinct} distinct points for n_local_clusters={k}; "
            "lower n_local_clusters for this device")
    return LocalKMeansResult(LocalCenters(res.centers, counts), res.labels, res.n_iter, False)


def _spectral_seed(X: np.ndarray, k: int, rng: np.random.Generator, *, project: bool) -> np.ndarray:
    """Steps 1-3: projection, k-means++ on it, 1/3-filtered means in the full space."""
    d = X.shape[1]
    if project and d > k:
        V = top_right_singular_vectors(X, k, rng)
        P = X @ V
    else:
        V = None
        P = X
    seeds = P[kmeans_plusplus(P, k, rng)]
    # S_r: points whose distance to ν_r is <= 1/3 of the distance to every other seed,
    # i.e. squared distances satisfy 9 * d(ν_r)^2 <= d(ν_s)^2 for all s != r.

    D = squared_distances(P, seeds)
    nearest, d1 = assign(P, seeds)
    if k > 1:
        D[np.arange(len(nearest)), nearest] = np.inf
        second = D.min(axis=1)
        keep = 9.0 * d1 <= second
    else:
        keep = np.ones(len(nearest), dtype=bool)
    theta = np.empty((k, d), dtype=X.dtype)
    for r in range(k):
        members = keep & (nearest == r)
        if members.any():
            theta[r] = X[members].mean(axis=0)
        else:
            theta[r] = seeds[r] @ V.T if V is not None else seeds[r]
    return theta
