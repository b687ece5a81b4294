"""Awasthi–Sheffet local k-means for a *stack* of same-shaped devices at once.

Many small devices (say 10⁵ phones with 20 points each) make per-device Python
overhead dominate; here B devices of equal (n, d, k) run as one vectorised
pass: batched Gram eigendecompositions, batched k-means++, batched Lloyd.
:func:`fedclust.local.local_kmeans` calls this with B = 1, so a device gets the
same result whether it runs alone or in a batch (up to BLAS rounding).

Randomness: k-means++ consumes a fixed number of uniforms per device,
``1 + (k - 1) * trials``, drawn up front from the device's own stream and used
by inverse-CDF sampling, so batching cannot change which points are picked.
"""

from __future__ import annotations

import numpy as np

from ..core.kmeans import relocate_empty_centers, update_centers

__all__ = ["n_uniforms", "spectral_kmeans_batch", "spectral_seed_batch", "projection_batch",
           "kmeanspp_batch", "lloyd_batch"]


#: S_r smaller than this fraction of an average cluster (n / k) is too small to trust.
MIN_FILTERED_FRACTION = 0.1


def n_trials(k: int) -> int:
    """Candidates per k-means++ step (scikit-learn's 2 + log k)."""
    return 2 + int(np.log(k))


def n_uniforms(k: int) -> int:
    """Uniform draws k-means++ consumes for k centers."""
    return 1 + (k - 1) * n_trials(k)


def _sqdist(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(B, n, d) x (B, m, d) -> (B, n, m) squared distances, clipped at 0."""
    D = (np.einsum("bnd,bnd->bn", X, X)[:, :, None] - 2.0 * (X @ C.transpose(0, 2, 1))
         + np.einsum("bmd,bmd->bm", C, C)[:, None, :])
    np.maximum(D, 0.0, out=D)
    return D


def projection_batch(X: np.ndarray, k: int) -> np.ndarray:
    """Top-k right singular vectors of every device, (B, d, k), via the smaller Gram matrix."""
    B, n, d = X.shape
    if n >= d:
        _, V = np.linalg.eigh(X.transpose(0, 2, 1) @ X)       # ascending eigenvalues
        return V[:, :, ::-1][:, :, :k]
    w, U = np.linalg.eigh(X @ X.transpose(0, 2, 1))            # (B, n, n)
    w, U = w[:, ::-1][:, :k], U[:, :, ::-1][:, :, :k]
    s = np.sqrt(np.maximum(w, 0.0))
    V = X.transpose(0, 2, 1) @ U                               # (B, d, k) = Aᵀ U = V S
    tiny = s <= s[:, :1] * 1e-12
    return np.where(tiny[:, None, :], 0.0, V / np.where(tiny, 1.0, s)[:, None, :])


def _inverse_cdf(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row-wise sampling: p (B, n) non-negative weights, u (B, t) in [0, 1) -> indices (B, t)."""
    cum = np.cumsum(p, axis=1)
    idx = (cum[:, None, :] <= (u * cum[:, -1:])[:, :, None]).sum(axis=2)
    return np.minimum(idx, p.shape[1] - 1)


def kmeanspp_batch(P: np.ndarray, k: int, uniforms: np.ndarray) -> np.ndarray:
    """Greedy k-means++ (as scikit-learn) on every device; returns (B, k) row indices."""
    B, n, _ = P.shape
    T = n_trials(k)
    rows = np.arange(B)
    idx = np.empty((B, k), dtype=np.int64)
    idx[:, 0] = _inverse_cdf(np.ones((B, n)), uniforms[:, :1])[:, 0]
    closest = _sqdist(P, P[rows, idx[:, 0]][:, None, :])[:, :, 0]
    chosen = np.zeros((B, n), dtype=bool)
    chosen[rows, idx[:, 0]] = True
    for c in range(1, k):
        p = closest.copy()
        flat = p.sum(axis=1) <= 0  # every point sits on a center: pick among unchosen rows
        if flat.any():
            p[flat] = (~chosen[flat]).astype(p.dtype)
        u = uniforms[:, 1 + (c - 1) * T: 1 + c * T]
        cand = _inverse_cdf(p, u)                                  # (B, T)
        d_cand = np.minimum(closest[:, :, None],
                            _sqdist(P, P[rows[:, None], cand]))   # (B, n, T)
        best = d_cand.sum(axis=1).argmin(axis=1)
        idx[:, c] = cand[rows, best]
        closest = d_cand[rows, :, best]
        chosen[rows, idx[:, c]] = True
    return idx


def _means(X: np.ndarray, labels: np.ndarray, k: int, mask: np.ndarray | None = None):
    """Per-device sums (B, k, d) and counts (B, k) of the points with each label."""
    onehot = (labels[:, :, None] == np.arange(k)[None, None, :]).astype(X.dtype)
    if mask is not None:
        onehot *= mask[:, :, None]
    return onehot.transpose(0, 2, 1) @ X, onehot.sum(axis=1)


def lloyd_batch(X: np.ndarray, init: np.ndarray, *, max_iter: int, tol: float):
    """Lloyd on every device from ``init`` with the stopping rules of
    :func:`fedclust._kmeans.lloyd`; converged devices are frozen.

    Returns centers (B, k, d), labels (B, n), counts (B, k), n_iter (B,).
    """
    B, n, d = X.shape
    k = init.shape[1]
    centers = init.astype(X.dtype, copy=True)
    abs_tol = tol * X.var(axis=1).mean(axis=1) if n > 1 else np.zeros(B)
    labels = np.full((B, n), -1, dtype=np.int64)
    active = np.ones(B, dtype=bool)
    n_iter = np.zeros(B, dtype=np.int64)
    for it in range(1, max_iter + 1):
        a = np.flatnonzero(active)
        if len(a) == 0:
            break
        Xa, Ca = X[a], centers[a]
        D = _sqdist(Xa, Ca)
        new = D.argmin(axis=2)
        same = (new == labels[a]).all(axis=1)
        active[a[same]] = False           # labels unchanged: converged at the previous round
        keep = ~same
        a, Xa, Ca, new, D = a[keep], Xa[keep], Ca[keep], new[keep], D[keep]
        if len(a) == 0:
            break
        n_iter[a] = it
        sums, counts = _means(Xa, new, k)
        upd = np.where(counts[:, :, None] > 0, sums / np.maximum(counts, 1)[:, :, None], Ca)
        for j in np.flatnonzero((counts == 0).any(axis=1)):
            if n >= k:  # rare: move empty centers to far points, exactly as the serial Lloyd
                mind = D[j, np.arange(n), new[j]]
                upd[j], new[j], counts[j] = relocate_empty_centers(Xa[j], new[j].copy(), upd[j], counts[j].copy(),
                                                      mind, None)
        shift = ((upd - Ca) ** 2).sum(axis=(1, 2))
        centers[a] = upd
        labels[a] = new
        active[a[shift <= abs_tol[a]]] = False
    D = _sqdist(X, centers)
    labels = D.argmin(axis=2)
    counts = (labels[:, :, None] == np.arange(k)[None, None, :]).sum(axis=1)
    return centers, labels, counts, np.maximum(n_iter, 1)


def spectral_kmeans_batch(X: np.ndarray, k: int, uniforms: np.ndarray, *, max_iter: int = 300,
                          tol: float = 1e-4, project: bool = True,
                          V: np.ndarray | None = None):
    """Algorithm 1 of k-FED for B devices: X (B, n, d), uniforms (B, n_uniforms(k)).

    ``V`` (B, d, k) may be given (e.g. from a randomized SVD of a large device).
    Returns centers (B, k, d), labels (B, n), counts (B, k), n_iter (B,).
    """
    theta = spectral_seed_batch(X, k, uniforms, project=project, V=V)
    return lloyd_batch(X, theta, max_iter=max_iter, tol=tol)


def spectral_seed_batch(X: np.ndarray, k: int, uniforms: np.ndarray, *, project: bool = True,
                        V: np.ndarray | None = None) -> np.ndarray:
    """Steps 1-3 of Algorithm 1 (projection, k-means++, ⅓-filtered means): θ (B, k, d)."""
    B, n, d = X.shape
    if project and d > k:
        if V is None:
            V = projection_batch(X, k)
        P = X @ V
    else:
        V, P = None, X
    seed_idx = kmeanspp_batch(P, k, uniforms)
    rows = np.arange(B)[:, None]
    seeds = P[rows, seed_idx]                                  # (B, k, kp)
    D = _sqdist(P, seeds)
    nearest = D.argmin(axis=2)
    if k > 1:
        d1 = np.take_along_axis(D, nearest[:, :, None], axis=2)[:, :, 0]
        np.put_along_axis(D, nearest[:, :, None], np.inf, axis=2)
        keep = 9.0 * d1 <= D.min(axis=2)  # ‖Â_i − ν_r‖ ≤ ⅓‖Â_i − ν_s‖ for every s ≠ r
    else:
        keep = np.ones((B, n), dtype=bool)
    sums, counts = _means(X, nearest, k, keep)
    # A filtered set S_r with only a handful of points gives a θ_r that sits on
    # those points in the full space, and Lloyd then keeps them as a near-singleton
    # cluster (seen when clusters overlap, c <= 5). Such θ_r use the whole
    # projected Voronoi cell of ν_r instead; an empty cell falls back to ν_r Vᵀ.
    min_size = max(2.0, MIN_FILTERED_FRACTION * n / k)
    cell_sums, cell_counts = _means(X, nearest, k)
    small = counts < min_size
    sums = np.where(small[:, :, None], cell_sums, sums)
    counts = np.where(small, cell_counts, counts)
    lifted = seeds @ V.transpose(0, 2, 1) if V is not None else seeds
    return np.where(counts[:, :, None] > 0, sums / np.maximum(counts, 1)[:, :, None], lifted)
