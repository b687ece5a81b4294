"""``n_local_clusters="auto"``: the k-FED device step with the k_z its own data support.

Every k_z of :func:`auto_range` runs the device step of :mod:`fedclust.kfed.local`, and the
device keeps the k_z of highest :func:`kmeans_bic` (X-means' score).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.exceptions import ValidationError
from ..core.validation import check_array, check_int
from .batched import n_uniforms, nested_projections, spectral_kmeans_batch
from .local import (DeviceStacker, LocalKMeansResult, checked_result, local_kmeans,
                    local_scatter, use_randomized_svd)
from .messages import LocalCenters

__all__ = ["MIN_POINTS_PER_LOCAL_CLUSTER", "kmeans_bic", "auto_range", "local_kmeans_auto",
           "local_kmeans_auto_many"]

#: ``n_local_clusters="auto"``: a device never makes local clusters of fewer points than this
#: on average (k_z <= n_z / 5): smaller ones are dominated by noise and their centers come
#: close to individual rows.
MIN_POINTS_PER_LOCAL_CLUSTER = 5


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
    stack = DeviceStacker(Xs, chunk, names)
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
                        checked_result(C[i], L[i], N[i], int(it[i]), k, Xa[i], names[s + z])
                    continue
                sc = kmeans_bic(n, d, N[i], float(inertia[i]))
                if best[z] is None or sc > score[z]:
                    score[z] = sc
                    best[z] = LocalKMeansResult(LocalCenters(C[i], N[i].astype(np.int64)),
                                                L[i].astype(np.int64), int(it[i]), False)
        out.extend(best)
    return out
