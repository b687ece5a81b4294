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

from .batched import (top_eigvecs, lloyd_batch, n_uniforms, nested_projections,
                      projection_batch, spectral_kmeans_batch, spectral_seed_batch)
from ..core.random import sklearn_seed
from ..core.validation import check_array, check_int
from ..core.exceptions import ValidationError
from .messages import LocalCenters

__all__ = ["LocalKMeansResult", "local_kmeans", "local_kmeans_many", "local_kmeans_stacked",
           "top_right_singular_vectors", "local_kmeans_auto", "kmeans_bic", "local_scatter",
           "local_scatter_stacked", "auto_range", "MIN_POINTS_PER_LOCAL_CLUSTER",
           "local_kmeans_auto_many", "summary_size", "SUMMARY_CENTERS_PER_CLUSTER",
           "SUMMARY_HIDDEN_SHARE", "SUMMARY_MAX_BYTES", "summary_cap", "summary_ladder",
           "summary_kmeans_stacked"]

#: ``n_local_clusters="auto"``: a device never makes local clusters of fewer points than this
#: on average (k_z <= n_z / 5): smaller ones are dominated by noise and their centers come
#: close to individual rows.
MIN_POINTS_PER_LOCAL_CLUSTER = 5

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
    return _result(centers[0], labels[0], counts[0], int(n_iter[0]), k, X, device)


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


def _result(centers, labels, counts, n_iter, k, X, device) -> LocalKMeansResult:
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
    stack = _Stacker(Xs, chunk, names, check_finite=not gram)
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
            _result(C[i], L[i], N[i], int(it[i]), k, Xb[i], names[s + i])
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


class _Stacker:
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


def kmeans_bic(n: int, d: int, counts: np.ndarray, inertia: float) -> float:
    """BIC of a k-means solution read as spherical Gaussians with one shared variance.

    X-means' score (Pelleg & Moore, ICML 2000): log-likelihood
    ``Σ_j n_j log(n_j / n) − n d/2 log(2π σ²) − d (n − k)/2`` with
    ``σ² = inertia / (d (n − k))``, minus ``p/2 log n`` for ``p = k d + k``
    free parameters (k means, k − 1 weights, one variance). Larger is better.
    """
    k = len(counts)
    if n <= k:
        return -np.inf
    var = max(inertia / (d * (n - k)), np.finfo(float).tiny)
    nj = counts[counts > 0].astype(float)
    loglik = float(nj @ np.log(nj / n)) - n * d / 2 * np.log(2 * np.pi * var) - d * (n - k) / 2
    return loglik - (k * d + k) / 2 * np.log(n)


def auto_range(n: int, n_clusters: int) -> tuple[int, int]:
    """The k_z that ``n_local_clusters="auto"`` tries on a device of n points: ``lo..hi``.

    ``lo = min(k, n // MIN_POINTS_PER_LOCAL_CLUSTER)``: a device never sends fewer than k
    centers unless it is too small, because the server can merge local clusters that
    split one group but can never split a local cluster that merged two (its points
    all get one label). ``hi = min(2k, n // MIN_POINTS_PER_LOCAL_CLUSTER)``: more local
    clusters than k only when the device's own data support them (BIC).
    """
    cap = max(1, min(n - 1, n // MIN_POINTS_PER_LOCAL_CLUSTER))
    return max(1, min(n_clusters, cap)), max(1, min(2 * n_clusters, cap))


#: the default server's summary: the fewest local centers a device sends per final cluster
SUMMARY_CENTERS_PER_CLUSTER = 2

#: the default server's summary: a device refines its local k-means until the scatter of its
#: local clusters (the part of its cost the server cannot see) is at most this share of its
#: own total scatter about its mean. Chosen on four natural federations (heart-hospital,
#: autism-country, autism-relation, diabetes-sex; docs/kfed.md) by the pooled cost.
SUMMARY_HIDDEN_SHARE = 0.25

#: the most bytes a device's summary takes ((d + 2) 8 per center: float64 center, int64
#: count, float64 scatter), unless 2k centers take more. At 32 KiB the autism sites of
#: 300-700 rows in about 100 columns sent 24-40 centers of 8-18 rows, which straddle the
#: pooled clusters about as often as 6 centers do, and the server landed in basins of low ARI
#: at the pooled cost (docs/kfed.md); 8 KiB is 10 centers at d = 100, 68 at d = 13.
SUMMARY_MAX_BYTES = 8192


def summary_size(n: int, n_clusters: int, d: int | None = None) -> int:
    """The fewest local centers a device of n points (in d dimensions) sends to the default
    server.

    ``min(n // MIN_POINTS_PER_LOCAL_CLUSTER, SUMMARY_CENTERS_PER_CLUSTER * k)`` (at least
    1, below n): the first rung of :func:`summary_ladder` and the top of
    :func:`auto_range`. A summary coarser than 2k can merge groups the server cannot split.
    Given d, at most :data:`SUMMARY_MAX_BYTES` worth of centers where 2k take more (many
    final clusters, few held per device: the ladder refines from there while the device's
    local clusters hide more than a quarter of its scatter).
    """
    cap = max(1, min(n - 1, n // MIN_POINTS_PER_LOCAL_CLUSTER))
    per_cluster = SUMMARY_CENTERS_PER_CLUSTER * n_clusters
    if d is not None:
        per_cluster = min(per_cluster, _centers_in_budget(d))
    return min(cap, per_cluster)


def _centers_in_budget(d: int) -> int:
    """How many ``(d + 2) 8``-byte centers (float64 center, int64 count, float64 scatter)
    :data:`SUMMARY_MAX_BYTES` holds, at least 1."""
    return max(1, SUMMARY_MAX_BYTES // ((d + 2) * 8))


def summary_cap(n: int, d: int, n_clusters: int) -> int:
    """The most local centers a device of n points in d dimensions sends to the default
    server: ``SUMMARY_MAX_BYTES`` worth of ``(d + 2) 8``-byte centers, at least
    :func:`summary_size` ``(2**62, k)`` (2k), and never more than ``n // 5`` (a local
    cluster averages at least :data:`MIN_POINTS_PER_LOCAL_CLUSTER` points)."""
    per_bytes = max(SUMMARY_CENTERS_PER_CLUSTER * n_clusters, _centers_in_budget(d))
    return min(per_bytes, max(1, min(n - 1, n // MIN_POINTS_PER_LOCAL_CLUSTER)))


def summary_ladder(n: int, d: int, n_clusters: int, start: int | None = None) -> list[int]:
    """The k_z a device tries for the default server, in order: ``start`` (default
    :func:`summary_size`), doubled until :func:`summary_cap`, the cap last."""
    cap = summary_cap(n, d, n_clusters)
    k = summary_size(n, n_clusters, d) if start is None else start
    if k >= cap:
        return [k]
    ladder = []
    while k < cap:
        ladder.append(k)
        k *= 2
    return ladder + [cap]


def summary_kmeans_stacked(Xs: list[np.ndarray] | np.ndarray, ladder: list[int],
                           uniforms: np.ndarray,
                           rngs: list[np.random.Generator] | Callable[[int], np.random.Generator],
                           *, max_iter: int = 300, tol: float = 1e-4,
                           devices: list[str] | None = None, max_batch_elements: int = 1 << 23,
                           hidden_share: float | None = None):
    """The default server's summary for devices of one shape (n, d): the first k_z of
    ``ladder`` whose local clusters' scatter is at most ``hidden_share`` (default
    :data:`SUMMARY_HIDDEN_SHARE`) of the device's total scatter about its mean (the last
    rung otherwise).

    Why: the server minimises the count-weighted cost of the device centers plus their
    scatter q. At any final centers C that is the pooled cost of the points with every
    local cluster sent whole to one center, at least the pooled cost at C and at most
    ``2 sqrt(q S(C))`` above it (S(C) the weighted cost of the centers; triangle inequality
    and Cauchy–Schwarz), and exactly it when no final boundary cuts a local cluster. A
    smaller q shrinks that error wherever it is, so the server ranks the basins of the
    pooled cost as the pooled data do; the device measures q against its own scatter
    because that needs nothing from the others.

    Each rung runs :func:`local_kmeans_stacked` on the devices still refining, k-means++
    on the first ``n_uniforms(k_z)`` of the device's ``uniforms`` (B, n_uniforms(ladder[-1]))
    row. Returns one ``(index, centers, counts, labels, scatter)`` per rung that some device
    stopped at: ``index`` (m,) the devices (positions in ``Xs``), centers (m, k_z, d),
    counts (m, k_z) int64, labels (m, n) int64, scatter (m, k_z).
    """
    B = len(Xs)
    names = devices or [f"device {i}" for i in range(B)]
    rng_of = rngs if callable(rngs) else rngs.__getitem__
    hidden_share = SUMMARY_HIDDEN_SHARE if hidden_share is None else hidden_share
    total = _total_scatter(Xs)
    active, prev = np.arange(B), None
    out = []
    for r, k in enumerate(ladder):
        part = Xs[active] if isinstance(Xs, np.ndarray) else [Xs[i] for i in active]
        U = uniforms[active, :n_uniforms(k)]
        C, N, L, ok = _summary_rung(part, k, U, lambda j: rng_of(int(active[j])),
                                    [names[i] for i in active], max_iter, tol,
                                    max_batch_elements, raise_errors=r == 0)
        if not ok.all():   # fewer distinct points than k_z: the device keeps its last rung
            pi, pC, pN, pL, pS = prev
            out.append((pi[~ok], pC[~ok], pN[~ok], pL[~ok], pS[~ok]))
            active, part = active[ok], [x for x, o in zip(part, ok) if o]
            C, N, L = C[ok], N[ok], L[ok]
            if len(active) == 0:
                break
        S = (local_scatter_stacked(part, C, L) if isinstance(part, np.ndarray) else
             np.stack([local_scatter(X, c, lab) for X, c, lab in zip(part, C, L)]))
        done = (S.sum(axis=1) <= hidden_share * total[active]) | (r == len(ladder) - 1)
        if done.any():
            out.append((active[done], C[done], N[done], L[done], S[done]))
        active, prev = active[~done], (active[~done], C[~done], N[~done], L[~done], S[~done])
        if len(active) == 0:
            break
    return out


#: devices per block of :func:`_total_scatter` (bounds its temporaries)
_SCATTER_BLOCK = 4096


def _total_scatter(Xs: list[np.ndarray] | np.ndarray) -> np.ndarray:
    """Every device's scatter about its own mean, (B,): ``((X - X.mean(axis=0)) ** 2).sum()``
    of each device, stacked devices in blocks (the same sums in the same order: the mean
    adds the rows one after another, the total pairwise over the device's n·d values)."""
    if not isinstance(Xs, np.ndarray):
        return np.array([float(((X - X.mean(axis=0)) ** 2).sum()) for X in Xs])
    out = np.empty(len(Xs))
    for s in range(0, len(Xs), _SCATTER_BLOCK):
        Xb = Xs[s:s + _SCATTER_BLOCK]
        R = Xb - Xb.mean(axis=1, keepdims=True)
        R *= R
        out[s:s + len(Xb)] = R.sum(axis=(1, 2))
    return out


def _summary_rung(part, k, U, rng_of, names, max_iter, tol, max_batch_elements, *,
                  raise_errors):
    """One rung of :func:`summary_kmeans_stacked`: centers, counts, labels of every device at
    k_z = k, and which devices had k distinct points (the others raise when
    ``raise_errors``, as :func:`local_kmeans` does)."""
    try:
        stacked = local_kmeans_stacked(part, k, rng_of, uniforms=U, max_iter=max_iter, tol=tol,
                                       devices=names, max_batch_elements=max_batch_elements)
        if stacked is not None:
            C, N, L, _ = stacked
            return C, N, L, np.ones(len(C), dtype=bool)
    except ValidationError:
        if raise_errors:
            raise
    res = []
    for j, (X, nm) in enumerate(zip(part, names)):   # large devices, or one lacks k points
        try:
            res.append(local_kmeans(X, k, rng_of(j), max_iter=max_iter, tol=tol, device=nm,
                                    uniforms=U[j]))
        except ValidationError:
            if raise_errors:
                raise
            res.append(None)
    ok = np.array([x is not None for x in res])
    n, d = part[0].shape
    C = np.stack([x.message.centers if x else np.zeros((k, d)) for x in res])
    N = np.stack([x.message.counts if x else np.zeros(k, dtype=np.int64) for x in res])
    L = np.stack([x.labels if x else np.zeros(n, dtype=np.int64) for x in res])
    return C, N, L, ok


def local_kmeans_auto(X: np.ndarray, n_clusters: int, rng: np.random.Generator, *,
                      max_iter: int = 300, tol: float = 1e-4, allow_raw_points: bool = False,
                      device: str = "device") -> LocalKMeansResult:
    """``n_local_clusters="auto"``: the device step with the k_z its own data support.

    Runs :func:`local_kmeans` for every k_z in :func:`auto_range` (from the
    device's stream, in increasing k_z) and keeps the k_z of highest
    :func:`kmeans_bic`. The asymmetry behind the range: under-clustering is
    harmful to k-FED (a local cluster that spans two groups cannot be split by
    the server), over-clustering is cheap (the server merges the pieces; it costs
    ``(d + 2) 8`` bytes per extra center). So the device sends at least k centers
    (fewer only when it holds fewer than ``5 k`` points) and up to 2k when BIC
    says its data have that many spherical groups (non-spherical or uneven
    groups, which one center each describes badly).

    A device of one point would send that point: refused unless ``allow_raw_points``.
    Cost: ``hi − lo + 1`` local k-means runs (at most k + 1).
    """
    X = check_array(X, device)
    n, d = X.shape
    if n == 0:
        raise ValidationError(f"{device} has no points")
    lo, hi = auto_range(n, check_int(n_clusters, "n_clusters", min_value=1))
    best, best_score = None, -np.inf
    for k in range(lo, hi + 1):
        try:
            res = local_kmeans(X, k, rng, max_iter=max_iter, tol=tol, device=device,
                               allow_raw_points=allow_raw_points)
        except ValidationError:   # fewer distinct points than k: larger k cannot do better
            if best is None:
                raise
            break
        inertia = float(local_scatter(X, res.message.centers, res.labels).sum())
        score = kmeans_bic(n, d, res.message.counts, inertia)
        if best is None or score > best_score:
            best, best_score = res, score
    return best


def local_kmeans_auto_many(Xs: list[np.ndarray] | np.ndarray, n_clusters: int,
                           rngs: list[np.random.Generator] | Callable[[int], np.random.Generator],
                           *, max_iter: int = 300, tol: float = 1e-4,
                           allow_raw_points: bool = False, devices: list[str] | None = None,
                           max_batch_elements: int = 1 << 23) -> list[LocalKMeansResult]:
    """:func:`local_kmeans_auto` for many devices of one shape (n, d), vectorised.

    Chooses the same k_z as :func:`local_kmeans_auto` on each device with its
    own ``rng`` (inputs must already be validated): every k_z of
    :func:`auto_range` runs as one batched device step over the devices, on
    the same k-means++ uniforms (the reference draws them from the device's
    stream k_z after k_z, so one draw of their total length gives the same
    numbers), and each device keeps its k_z of highest :func:`kmeans_bic`
    (ties to the smaller k_z; a k_z that leaves a local cluster empty ends the
    device's search, as in the reference). Devices the batch cannot take (one
    point, or large enough for a randomized SVD, whose seed comes from the
    stream between two k_z) run :func:`local_kmeans_auto` one at a time.

    Parameters
    ----------
    Xs : list of ndarray of shape (n, d), or ndarray of shape (B, n, d)
    n_clusters : int
        k, the number of global clusters.
    rngs : list of Generator, or callable ``i -> Generator``
        The devices' own streams.
    max_iter, tol, allow_raw_points
        As in :func:`local_kmeans_auto`.
    devices : list of str, optional
        Names for error messages.
    max_batch_elements : int
        Devices are stacked in chunks of about this many values.

    Returns
    -------
    list of LocalKMeansResult, one per device, in order.
    """
    n, d = Xs[0].shape
    names = devices or [f"device {i}" for i in range(len(Xs))]
    rng_of = rngs if callable(rngs) else rngs.__getitem__
    lo, hi = auto_range(n, check_int(n_clusters, "n_clusters", min_value=1))
    ks = range(lo, hi + 1)
    if n <= hi or any(d > k and use_randomized_svd(n, d, k) for k in ks):
        return [local_kmeans_auto(X, n_clusters, rng_of(i), max_iter=max_iter, tol=tol,
                                  allow_raw_points=allow_raw_points, device=nm)
                for i, (X, nm) in enumerate(zip(Xs, names))]
    offsets = np.cumsum([0] + [n_uniforms(k) for k in ks])
    chunk = max(1, max_batch_elements // (n * max(d, hi)))
    out: list[LocalKMeansResult] = []
    stack = _Stacker(Xs, chunk, names)
    for s in range(0, len(Xs), chunk):
        Xb = stack(s)
        U = np.stack([rng_of(s + i).random(offsets[-1]) for i in range(len(Xb))])
        best: list[LocalKMeansResult | None] = [None] * len(Xb)
        score = np.full(len(Xb), -np.inf)
        searching = np.ones(len(Xb), dtype=bool)
        # one eigendecomposition per device serves every projected k_z (k_z < d)
        Vb = nested_projections(Xb, min(hi, d - 1)) if d > lo else None
        for j, k in enumerate(ks):
            a = np.flatnonzero(searching)
            if len(a) == 0:
                break
            Xa = Xb if len(a) == len(Xb) else Xb[a]
            V = None if d <= k else (Vb if len(a) == len(Xb) else Vb[a])[:, :, :k]
            C, L, N, it = spectral_kmeans_batch(Xa, k, U[a, offsets[j]:offsets[j + 1]],
                                                max_iter=max_iter, tol=tol, V=V)
            resid = Xa - np.take_along_axis(C, L[:, :, None], axis=1)
            inertia = np.einsum("bnd,bnd->b", resid, resid)
            for i, z in enumerate(a):
                if (N[i] == 0).any():     # fewer distinct points than k: larger k cannot do better
                    searching[z] = False
                    if best[z] is None:   # as the reference: the device's own error
                        _result(C[i], L[i], N[i], int(it[i]), k, Xa[i], names[s + z])
                    continue
                sc = kmeans_bic(n, d, N[i], float(inertia[i]))
                if best[z] is None or sc > score[z]:
                    score[z] = sc
                    best[z] = LocalKMeansResult(LocalCenters(C[i], N[i].astype(np.int64)),
                                                L[i].astype(np.int64), int(it[i]), False)
        out.extend(best)
    return out
