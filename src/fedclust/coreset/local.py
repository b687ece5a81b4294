"""Node maths: pure functions over one node's own points.

* :func:`point_sum` — the global-mean round (sum and count);
* :func:`local_spectrum` — disPCA's local step: top-t₁ singular values and
  right singular vectors of the centred data (Liang et al. 2014, Alg. 1);
* :func:`local_solution` — a constant-factor local k-means solution B_i
  (k-means++ then Lloyd) and every point's cost m_p = d(p, B_i)²;
* :func:`coreset_portion` — the node's part S_i ∪ B_i of the distributed
  coreset (Balcan, Ehrlich & Liang 2013, Algorithm 1) or of COMBINE.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from ..core.kmeans import assign, kmeans_plusplus, lloyd
from ..core.random import sklearn_seed
from .messages import CoresetPortion, LocalSpectrum, PointSum

__all__ = ["point_sum", "local_spectrum", "top_right_singular", "local_solution",
           "coreset_portion", "balcan_budget", "combine_budget", "sign_flip"]

# Randomized SVD pays off once the matrix is large and t is a small part of its rank.
_RANDOMIZED_MIN_SIDE = 200
_RANDOMIZED_MAX_FRACTION = 0.25


def point_sum(X: np.ndarray) -> PointSum:
    """Sum (d,) and count of the node's points (8 (d + 1) bytes)."""
    return PointSum(total=X.sum(axis=0, dtype=np.float64),
                    n_points=np.asarray(X.shape[0], dtype=np.int64))


def sign_flip(V: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (a deterministic sign)."""
    if V.size == 0:
        return V
    idx = np.argmax(np.abs(V), axis=1)
    signs = np.sign(V[np.arange(V.shape[0]), idx])
    signs[signs == 0] = 1.0
    return V * signs[:, None]


def top_right_singular(A: np.ndarray, t: int, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Top ``t`` singular values (t,) and right singular vectors (t, d) of ``A`` (n, d).

    scikit-learn's ``randomized_svd`` when ``min(n, d) > 200`` and ``t`` is at
    most a quarter of it (O(n d t)); LAPACK's exact SVD otherwise
    (O(n d min(n, d))). ``t`` is capped at ``min(n, d)``; signs follow
    :func:`sign_flip`.
    """
    n, d = A.shape
    t = min(int(t), n, d)
    if t == 0:
        return np.zeros(0), np.zeros((0, d))
    side = min(n, d)
    if side > _RANDOMIZED_MIN_SIDE and t <= _RANDOMIZED_MAX_FRACTION * side:
        from sklearn.utils.extmath import randomized_svd

        # two power iterations suffice for the decaying spectra of real data (Halko et al.
        # 2011); 6 cost 3x the time on MNIST nodes for no change in the clustering cost
        _, s, Vt = randomized_svd(A, t, n_oversamples=max(10, t // 4), n_iter=2,
                                  random_state=sklearn_seed(rng))
    else:
        _, s, Vt = scipy.linalg.svd(A, full_matrices=False, check_finite=False)
        s, Vt = s[:t], Vt[:t]
    return s.astype(np.float64), sign_flip(Vt.astype(np.float64))


def local_spectrum(X: np.ndarray, mean: np.ndarray | None, n_local: int,
                   rng: np.random.Generator) -> LocalSpectrum:
    """disPCA local step: top ``n_local`` singular values and right vectors of X − mean.

    Bytes: ``8 t₁ (d + 1)`` with ``t₁ = min(n_local, n_i, d)``.
    """
    A = np.asarray(X, dtype=np.float64)
    if mean is not None:
        A = A - mean
    s, Vt = top_right_singular(A, n_local, rng)
    return LocalSpectrum(singular_values=s, components=Vt)


def local_solution(Z: np.ndarray, k: int, rng: np.random.Generator, *, max_iter: int = 20
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local k-means solution B_i: k-means++ seeding (an O(log k) approximation in
    expectation) refined by at most ``max_iter`` Lloyd rounds.

    Returns ``(centers (k_i, t), labels (n_i,), costs (n_i,))`` with
    ``k_i = min(k, n_i)`` and ``costs[p] = d(p, B_i)²``. O(n_i k t) per round.
    """
    n = Z.shape[0]
    if n == 0:
        return np.zeros((0, Z.shape[1])), np.zeros(0, np.int64), np.zeros(0)
    k_i = min(int(k), n)
    init = Z[kmeans_plusplus(Z, k_i, rng)]
    res = lloyd(Z, init, max_iter=max_iter)
    labels, _ = assign(Z, res.centers)
    # exact differences, not the BLAS expansion: a point on its center must cost 0, not 1e-15
    costs = ((Z - res.centers[labels]) ** 2).sum(axis=1)
    # a center that is the mean of identical points is off by rounding (~1e-32): that is 0
    costs[costs <= 1e-24 * max(float((Z * Z).sum(axis=1).max()), 1e-300)] = 0.0
    return res.centers, labels, costs.astype(np.float64)


def coreset_portion(Z: np.ndarray, centers: np.ndarray, labels: np.ndarray, costs: np.ndarray,
                    n_samples: int, ratio: float | None, rng: np.random.Generator
                    ) -> CoresetPortion:
    """The node's coreset part S_i ∪ B_i.

    Draws ``n_samples`` points i.i.d. with probability ``m_p / c_i`` (uniform
    when the node's cost is 0 but it still has a budget); a drawn point q gets
    weight ``ratio / prob_q`` (Balcan et al.: ``ratio = Σ_j c_j / (t c_i)``, so
    ``w_q = Σ_j c_j / (t m_q)``; COMBINE and the uniform case: ``ratio =
    1 / t_i``-like normalisers chosen by the caller; ``None`` means
    ``1 / n_samples``). Each local center b gets ``|P_b| − Σ_{q ∈ P_b} w_q``
    (possibly negative). A node with ``n_i <= n_samples`` sends all its points
    with weight 1. Weights add up to ``n_i`` exactly.
    """
    n, t = Z.shape
    if n == 0:
        return CoresetPortion(points=np.zeros((0, t)), weights=np.zeros(0),
                              n_points=np.asarray(0, dtype=np.int64))
    if n <= n_samples:
        return CoresetPortion(points=np.array(Z, dtype=np.float64), weights=np.ones(n),
                              n_points=np.asarray(n, dtype=np.int64))
    k_i = centers.shape[0]
    sizes = np.bincount(labels, minlength=k_i).astype(np.float64)
    if n_samples == 0:
        keep = sizes > 0
        return CoresetPortion(points=np.array(centers[keep], dtype=np.float64),
                              weights=sizes[keep], n_points=np.asarray(n, dtype=np.int64))
    total = float(costs.sum())
    prob = costs / total if total > 0 else np.full(n, 1.0 / n)
    if ratio is None:
        ratio = 1.0 / n_samples
    idx = rng.choice(n, size=n_samples, replace=True, p=prob)
    w = ratio / prob[idx]
    center_w = sizes - np.bincount(labels[idx], weights=w, minlength=k_i)
    keep = center_w != 0
    points = np.concatenate([Z[idx], centers[keep]]).astype(np.float64, copy=False)
    weights = np.concatenate([w, center_w[keep]])
    return CoresetPortion(points=points, weights=weights, n_points=np.asarray(n, dtype=np.int64))


def balcan_budget(cost: float, n_points: int, total_cost: float, total_points: int,
                  coreset_size: int) -> tuple[int, float]:
    """Node i's sample size t_i and weight ratio in Balcan et al.'s Algorithm 1.

    ``t_i = ⌈t c_i / Σ c_j⌉`` and ratio ``Σ c_j / (t c_i)``; when every cost is 0,
    uniform sampling: ``t_i = ⌈t n_i / N⌉``, ratio ``N / (t n_i)``. Σ t_i may
    exceed t by up to the number of nodes (the rounding).
    """
    if n_points == 0:
        return 0, 1.0
    if total_cost > 0:
        if cost <= 0:
            return 0, 1.0
        return math.ceil(coreset_size * cost / total_cost), total_cost / (coreset_size * cost)
    return (math.ceil(coreset_size * n_points / total_points),
            total_points / (coreset_size * n_points))


def combine_budget(n_points: int, coreset_size: int, n_nodes: int) -> tuple[int, float]:
    """COMBINE: an independent local coreset of size ⌈t / n⌉ (ratio 1 / t_i)."""
    t_i = math.ceil(coreset_size / max(n_nodes, 1))
    return (t_i, 1.0 / t_i) if n_points else (0, 1.0)
