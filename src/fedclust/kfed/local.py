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
from typing import Callable

import numpy as np

from .batched import (top_eigvecs, lloyd_batch, n_uniforms, projection_batch,
                      spectral_kmeans_batch, spectral_seed_batch)
from ..core.random import sklearn_seed
from ..core.validation import check_array, check_int
from ..core.exceptions import ValidationError
from .messages import LocalCenters

__all__ = ["LocalKMeansResult", "local_kmeans", "local_kmeans_many", "local_kmeans_stacked",
           "top_right_singular_vectors", "use_randomized_svd", "local_scatter",
           "local_scatter_stacked"]

# Devices with min(n, d) above this (and well above k) use a randomized SVD.
_EXACT_SVD_MAX = 400


@dataclass(frozen=True)
class LocalKMeansResult:
    """What one device computes: its message and its own point labels (kept local)."""

    message: LocalCenters
    labels: np.ndarray  # (n,) int64, local cluster of every point
    n_iter: int
    raw_points: bool  # True when the centers are the device's raw points (opt-in only)


def use_randomized_svd(n: int, d: int, k: int) -> bool:
    return min(n, d) > _EXACT_SVD_MAX and 4 * k < min(n, d)


def top_right_singular_vectors(A: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Top-k right singular vectors of A as a (d, k) matrix.

    Eigendecomposition of the smaller Gram matrix for small matrices;
    scikit-learn's ``randomized_svd`` (seeded from ``rng``) when ``min(n, d)``
    is large compared with k.
    """
    n, d = A.shape
    if not use_randomized_svd(n, d, k):
        return projection_batch(A[None], k)[0]
    from sklearn.utils.extmath import randomized_svd

    _, _, Vt = randomized_svd(A, k, n_oversamples=10, n_iter=4, random_state=sklearn_seed(rng))
    return Vt.T


def local_kmeans(X: np.ndarray, n_clusters: int, rng: np.random.Generator, *,
                 max_iter: int = 300, tol: float = 1e-4, project: bool = True,
                 allow_raw_points: bool = False, device: str = "device",
                 uniforms: np.ndarray | None = None) -> LocalKMeansResult:
    """Run k-FED's device step on one device's data.

    Parameters
    ----------
    X : ndarray of shape (n, d)
        The device's points. Never leaves the device.
    n_clusters : int
        k_z, the number of local clusters.
    rng : numpy.random.Generator
        The device's own random stream (k-means++ uniforms unless ``uniforms``
        is given; the randomized SVD of a large device).
    max_iter, tol : int, float
        Lloyd stopping rules (labels unchanged, or squared center shift <= tol
        times the mean feature variance).
    project : bool, default=True
        Do the spectral projection (step 1). Skipped automatically when d <= k_z.
    allow_raw_points : bool, default=False
        When the device has n <= k_z points, its "centers" would be its raw
        points. That is refused unless this is True (the authors' code does it
        silently, which leaks data).
    device : str
        Name used in error messages.
    uniforms : ndarray of shape (n_uniforms(k),), optional
        The k-means++ uniforms, when the caller draws them itself (k-FED's
        protocol takes them from :func:`fedclust.core.random.device_uniforms`).

    Returns
    -------
    LocalKMeansResult
        ``message`` (k_z centers + counts, ``k_z*(d+1)*8`` bytes for float64)
        and the device-local ``labels``.

    Notes
    -----
    Cost: one Gram eigendecomposition O(n d min(n, d)) (randomized SVD
    O(n d k) for large devices) plus Lloyd iterations of O(n d k_z) each.
    Runs through :func:`fedclust.local.batched.spectral_kmeans_batch` with one
    device, so batched and single runs agree.
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
    theta = _spectral_seed(X, k, rng, project=project, uniforms=uniforms)
    centers, labels, counts, n_iter = lloyd_batch(X[None], theta[None], max_iter=max_iter, tol=tol)
    return checked_result(centers[0], labels[0], counts[0], int(n_iter[0]), k, X, device)


def _spectral_seed(X: np.ndarray, k: int, rng: np.random.Generator, *,
                   project: bool = True, uniforms: np.ndarray | None = None) -> np.ndarray:
    """θ (k, d), the starting centers of the device's Lloyd (steps 1-3 of Algorithm 1).

    Draws the k-means++ uniforms first, then (large devices only) the
    randomized-SVD seed, in this order, so the batched path sees the same stream.
    """
    n, d = X.shape
    uniforms = rng.random((1, n_uniforms(k))) if uniforms is None else uniforms.reshape(1, -1)
    V = None
    if project and d > k and use_randomized_svd(n, d, k):
        V = top_right_singular_vectors(X, k, rng)[None]
    return spectral_seed_batch(X[None], k, uniforms, project=project, V=V)[0]


def checked_result(centers, labels, counts, n_iter, k, X, device) -> LocalKMeansResult:
    """One device's result of the batched step; a local cluster left empty (fewer than k
    distinct points on the device) raises :class:`ValidationError` naming ``device``."""
    counts = counts.astype(np.int64)
    if (counts == 0).any():  # only when the device has fewer than k distinct points
        distinct = len(np.unique(X, axis=0))
        raise ValidationError(
            f"{device} has only {distinct} distinct points for n_local_clusters={k}; "
            "lower n_local_clusters for this device")
    return LocalKMeansResult(LocalCenters(centers, counts), labels.astype(np.int64), n_iter, False)


def local_kmeans_many(Xs: list[np.ndarray] | np.ndarray, n_clusters: int,
                      rngs: list[np.random.Generator] | Callable[[int], np.random.Generator], *,
                      max_iter: int = 300, tol: float = 1e-4, project: bool = True,
                      devices: list[str] | None = None, uniforms: np.ndarray | None = None,
                      max_batch_elements: int = 1 << 23) -> list[LocalKMeansResult]:
    """:func:`local_kmeans` for many devices of one shape (n, d) and one k, vectorised.

    Gives the same result as calling :func:`local_kmeans` on each device with
    its own ``rng`` and ``uniforms`` (inputs must already be validated, n > k).
    ``rngs`` is a list, or a function ``i -> Generator`` called only for the
    devices that need one (no uniforms given, or large enough for a randomized
    SVD, which fall back to the one-at-a-time path). ``uniforms`` is
    (len(Xs), n_uniforms(k)). ``Xs`` may be one stacked (B, n, d) array.
    """
    stacked = local_kmeans_stacked(Xs, n_clusters, rngs, max_iter=max_iter, tol=tol,
                                   project=project, devices=devices, uniforms=uniforms,
                                   max_batch_elements=max_batch_elements)
    if stacked is None:
        names = devices or [f"device {i}" for i in range(len(Xs))]
        rng_of = rngs if callable(rngs) else rngs.__getitem__
        return [local_kmeans(X, n_clusters, rng_of(i), max_iter=max_iter, tol=tol, device=nm,
                             uniforms=None if uniforms is None else uniforms[i])
                for i, (X, nm) in enumerate(zip(Xs, names))]
    C, N, L, it = stacked
    return [LocalKMeansResult(LocalCenters(c, m), lab, t, False)   # rows are views
            for c, m, lab, t in zip(C, N, L, it.tolist())]


def local_kmeans_stacked(Xs: list[np.ndarray] | np.ndarray, n_clusters: int,
                         rngs: list[np.random.Generator] | Callable[[int], np.random.Generator],
                         *, max_iter: int = 300, tol: float = 1e-4, project: bool = True,
                         devices: list[str] | None = None, uniforms: np.ndarray | None = None,
                         max_batch_elements: int = 1 << 23):
    """:func:`local_kmeans_many` with the results stacked: centers (B, k, d), counts (B, k)
    int64, labels (B, n) int64 and iterations (B,); ``None`` where the devices are large
    enough for a randomized SVD (one device at a time: :func:`local_kmeans_many`)."""
    n, d = Xs[0].shape
    k = n_clusters
    names = devices or [f"device {i}" for i in range(len(Xs))]
    rng_of = rngs if callable(rngs) else rngs.__getitem__
    if project and d > k and use_randomized_svd(n, d, k):
        return None
    U = (np.stack([rng_of(i).random(n_uniforms(k)) for i in range(len(Xs))])
         if uniforms is None else uniforms)
    chunk = _chunk_size(n * max(d, k), max_batch_elements)
    parts = []
    # with a Gram matrix X^T X to compute, its diagonal (each feature's sum of squares) tests
    # the copied chunk for finite values: NaN and inf reach it, and no separate pass is needed
    gram = project and d > k and n >= d
    stack = DeviceStacker(Xs, chunk, names, check_finite=not gram)
    for s in range(0, len(Xs), chunk):
        Xb = stack(s)
        V = None
        if gram:
            G = Xb.transpose(0, 2, 1) @ Xb                     # as projection_batch
            if not np.isfinite(np.einsum("bii->bi", G)).all():
                stack.check(Xb, s)   # names the device with a non-finite value
            V = top_eigvecs(G, k)
            del G
        C, L, N, it = spectral_kmeans_batch(Xb, k, U[s:s + chunk], max_iter=max_iter, tol=tol,
                                            project=project, V=V)
        N, L = N.astype(np.int64), L.astype(np.int64)
        for i in np.flatnonzero((N == 0).any(axis=1)):  # raises, naming the device
            checked_result(C[i], L[i], N[i], int(it[i]), k, Xb[i], names[s + i])
        parts.append((C, N, L, it))
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(p) for p in zip(*parts))


#: devices of more values than this are stacked in chunks of about LARGE_BATCH_ELEMENTS
#: values: a chunk the size of a core's cache keeps the dozen passes of the device step
#: (Gram matrix, projection, distances, means) out of main memory (measured 15-20% faster
#: on 1,000 x 100 devices than 64 MB chunks)
_LARGE_DEVICE = 4096
LARGE_BATCH_ELEMENTS = 1 << 20


def _chunk_size(per_device: int, max_batch_elements: int) -> int:
    """Devices per stacked chunk: ``max_batch_elements`` values for small devices, at most
    :data:`LARGE_BATCH_ELEMENTS` for large ones."""
    if per_device > _LARGE_DEVICE:
        max_batch_elements = min(max_batch_elements, LARGE_BATCH_ELEMENTS)
    return max(1, max_batch_elements // per_device)


class DeviceStacker:
    """Chunks of same-shaped devices as (B, n, d) arrays, copied into one reused buffer.

    A fresh stacked chunk of large devices is a fresh large allocation, and its
    page faults cost several times the copy itself; the batched maths only read
    the chunk, and results keep no view of it. A copied chunk is tested for
    non-finite values while the copy is still in cache (a separate pass over each
    device beforehand reads it from memory once more); a non-finite device raises
    :class:`ValidationError` naming it (``names``).
    """

    def __init__(self, Xs, chunk: int, names: list[str] | None = None, *,
                 check_finite: bool = True):
        self.Xs, self.chunk, self.names, self.check_finite = Xs, chunk, names, check_finite
        self.buf = None if isinstance(Xs, np.ndarray) or len(Xs) <= chunk else np.empty(
            (chunk,) + Xs[0].shape, dtype=np.result_type(*Xs[:chunk]))

    def __call__(self, s: int) -> np.ndarray:
        part = self.Xs[s:s + self.chunk]
        if isinstance(part, np.ndarray):
            return part
        out = np.stack(part) if self.buf is None else np.stack(part, out=self.buf[:len(part)])
        if self.check_finite:
            self.check(out, s)
        return out

    def check(self, out: np.ndarray, s: int) -> None:
        """Raise :class:`ValidationError` naming the first device of the chunk ``out``
        (devices ``s, s + 1, ...``) that holds a non-finite value."""
        if not np.isfinite(out).all():
            i = s + int(np.flatnonzero(~np.isfinite(out).all(axis=(1, 2)))[0])
            raise ValidationError(f"{self.names[i] if self.names else f'device {i}'} contains "
                                  "a non-finite value; remove or impute NaN/inf first")


def local_scatter(X: np.ndarray, centers: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Sum of squared distances of each local cluster's points to its center, (k_z,)."""
    resid = X - centers[labels]
    return np.bincount(labels, weights=np.einsum("ij,ij->i", resid, resid),
                       minlength=len(centers)).astype(np.float64)


def local_scatter_stacked(X: np.ndarray, centers: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """:func:`local_scatter` of B devices at once: X (B, n, d), centers (B, k, d), labels
    (B, n) -> (B, k); each device's sums add the same terms in the same order."""
    B, n, d = X.shape
    k = centers.shape[1]
    resid = (X - centers[np.arange(B)[:, None], labels]).reshape(B * n, d)
    flat = (labels + k * np.arange(B)[:, None]).ravel()
    return np.bincount(flat, weights=np.einsum("ij,ij->i", resid, resid),
                       minlength=B * k).astype(np.float64).reshape(B, k)
