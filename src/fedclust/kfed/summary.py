"""The default server's device summary: a ladder of local k-means runs.

A device sends its local centers, counts and scatter at the first k_z of
:func:`summary_ladder` whose local clusters hide at most :data:`SUMMARY_HIDDEN_SHARE` of
its own scatter (:func:`summary_kmeans_stacked`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..core.exceptions import ValidationError
from .batched import n_uniforms
from .local import local_kmeans, local_kmeans_stacked, local_scatter, local_scatter_stacked
from .local_auto import MIN_POINTS_PER_LOCAL_CLUSTER

__all__ = ["summary_size", "SUMMARY_CENTERS_PER_CLUSTER", "SUMMARY_HIDDEN_SHARE",
           "SUMMARY_MAX_BYTES", "summary_cap", "summary_ladder", "summary_kmeans_stacked"]


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
