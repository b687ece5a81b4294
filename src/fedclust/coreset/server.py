"""Coordinator maths (on a general graph every node runs it on the same flooded inputs).

* :func:`global_mean` — the centring round;
* :func:`combine_spectra` — disPCA's global step: the top eigenvectors of
  Σ_i E_i D_i² E_iᵀ, i.e. the top right singular vectors of the stacked
  D_i E_iᵀ, **sorted by decreasing eigenvalue**;
* :func:`solve_weighted_kmeans` — weighted k-means on the coreset
  (k-means++ seeding, several inits, Lloyd).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.linalg

from ..core.kmeans import assign, kmeans_plusplus, lloyd
from ..core.random import server_rng
from ..core.threads import one_blas_thread
from .local import sign_flip
from .messages import LocalSpectrum, PointSum

__all__ = ["global_mean", "combine_spectra", "solve_weighted_kmeans", "SOLVER_ROUND"]

#: server-stream index of the coreset solve (init r uses SOLVER_ROUND + r)
SOLVER_ROUND = 1000


def global_mean(sums: Sequence[PointSum]) -> tuple[np.ndarray, int]:
    """Global mean (d,) and total count from the nodes' sums (node order does not matter
    beyond floating-point summation, which is done in the given order)."""
    n = int(sum(int(s.n_points) for s in sums))
    total = np.sum([s.total for s in sums], axis=0)
    return (total / n if n else np.zeros_like(total)), n


def combine_spectra(spectra: Sequence[LocalSpectrum], n_components: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Top ``n_components`` principal directions (t, d) and singular values (t,).

    Stacks ``D_i E_iᵀ`` of every node ((Σ t₁) × d) and takes its exact SVD:
    its right singular vectors are the eigenvectors of Σ_i E_i D_i² E_iᵀ and
    LAPACK returns them by **decreasing** singular value. O((Σ t₁)² d).
    ``t`` is capped at the rank available, ``min(Σ t₁, d)``.
    """
    d = spectra[0].components.shape[1]
    stacked = np.concatenate([s.singular_values[:, None] * s.components for s in spectra])
    t = min(int(n_components), stacked.shape[0], d)
    if t == 0:
        return np.zeros((0, d)), np.zeros(0)
    with one_blas_thread():   # small: threads only add contention
        _, sv, Vt = scipy.linalg.svd(stacked, full_matrices=False, check_finite=False)
    return sign_flip(Vt[:t]), sv[:t]


def solve_weighted_kmeans(points: np.ndarray, weights: np.ndarray, k: int, seed: int, *,
                          n_init: int = 5, max_iter: int = 300, tol: float = 1e-4
                          ) -> tuple[np.ndarray, float]:
    """Weighted k-means on a coreset: best of ``n_init`` (k-means++ + Lloyd) runs.

    Negative weights (the local-center corrections ``|P_b| − Σ w_q``) are
    **clipped at 0** for the solve: k-means++ needs a distribution and a
    Lloyd mean with a negative total weight is undefined. The clipped weights
    over-count a little (Σ max(w, 0) ≥ N); the coreset itself keeps the signed
    weights. Init r draws from ``server_rng(seed, SOLVER_ROUND + r)``, so every
    node that solves with the same seed gets the same centers.

    Returns ``(centers (k, t), cost)`` with ``cost`` the clipped-weight cost.
    O(n_init · iterations · s k t).
    """
    # One BLAS thread: the coreset is small, threads only add contention (measured 5-10x
    # slower with 2 threads on a loaded 2-core machine), and one thread makes every node's
    # floating-point sums identical.
    with one_blas_thread():
        return _solve(points, weights, k, seed, n_init, max_iter, tol)


def _solve(points, weights, k, seed, n_init, max_iter, tol):
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    pos = w > 0
    X, w = points[pos], w[pos]
    best_centers, best_cost = None, np.inf
    for r in range(int(n_init)):
        rng = server_rng(seed, SOLVER_ROUND + r)
        # fewer coreset points than k: repeat some (Lloyd keeps the duplicates apart or empty)
        init = X[np.resize(kmeans_plusplus(X, min(k, len(X)), rng, weights=w), k)]
        res = lloyd(X, init, weights=w, max_iter=max_iter, tol=tol)
        cost = float(assign(X, res.centers)[1] @ w)
        if cost < best_cost:
            best_centers, best_cost = res.centers, cost
    return best_centers, best_cost
