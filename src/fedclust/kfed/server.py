"""Server step of k-FED: aggregate the devices' local centers into k clusters.

Dennis, Li & Smith, ICML 2021, Algorithm 2 (and the workshop poster's
union-find variant). Input: every participating device's k_z centers (and
counts). Output: k final centers and, for every device center, its global
cluster. The server never sees a raw point.

Methods (``method=``):

``"farthest-lloyd1"`` (default, the paper)
    M <- the centers of one device; add the device center farthest from M
    until |M| = k; then **one** Lloyd round over all device centers from M.
``"farthest-lloyd"`` (the authors' code)
    Same start, Lloyd until the assignment is stable.
``"single-linkage"`` (the poster)
    Union the closest pair of centers until k sets remain. Done exactly via a
    Euclidean minimum spanning tree (Borůvka with blockwise BLAS distances), so
    memory is O(N) for N = Σ k_z centers; no N x N matrix is ever built.
``"weighted-kmeans++"`` (ours, the default of :class:`fedclust.KFed`)
    Weighted k-means on the device centers, each weighted by its count (the
    points behind it): :func:`weighted_starts` (10 to 100) greedy weighted k-means++
    starts, weighted Lloyd to convergence from each, the lowest weighted cost kept. The weighted cost of
    the device centers plus their within-cluster scatter is the pooled data's
    k-means cost when every local cluster goes to one final center, so this
    minimises (locally) the pooled cost that one round can see. Unlike the
    paper's server it does not give an outlying center or a small device a
    final cluster of its own, and it does not stop after one Lloyd step. The
    k-means++ candidates are drawn by keys of (seed, device id, center, start, step),
    so that a device's removal moves no other draw: a forget follows the fit's trace
    instead of running the step again (:mod:`fedclust.kfed.keyed`).
    ``"weighted-kmeans++-keyed"`` names the same server.
``"kmeans++"`` (ours, not in the paper)
    ``KMEANS_PP_INIT`` k-means++ starts drawn from the server's stream, Lloyd to
    convergence from each, the lowest inertia kept. Farthest-first gives an
    outlying device center (noise, a device whose local split followed another
    structure) a final cluster of its own; k-means++ seeding rarely does. The
    same one-shot communication; O(n_init N k d) per Lloyd round.

Which device seeds M (``first_device=``): ``"widest"`` (default) takes the
device with the most centers, ties broken by the largest minimum distance
between its own centers — its centers are the most likely to lie in distinct
clusters, and the choice does not depend on device order; ``"random"`` draws
one from the server's stream; an int picks that position.

Every device center's global label is its nearest final center, so the
induced clustering, ``predict`` and the assignment of late devices agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.cluster.hierarchy import DisjointSet

from ..core.exceptions import ValidationError
from ..core.kmeans import assign, kmeans_plusplus, lloyd, weighted_kmeans
from ..core.threads import one_blas_thread
from .explain import explanation_warning
from .robust_server import Distrust, distrusted_centers, relabel, robust_means

__all__ = ["AggregationResult", "aggregate_centers", "explanation_warning",
           "weighted_starts",
           "farthest_first", "assign_to_centers", "pick_first_device",
           "single_linkage", "SERVER_METHODS"]

SERVER_METHODS = ("farthest-lloyd1", "farthest-lloyd", "single-linkage", "kmeans++",
                  "weighted-kmeans++", "weighted-kmeans++-keyed")
#: the paper's server (Dennis, Li & Smith 2021); every paper reproduction names it
PAPER_SERVER = "farthest-lloyd1"
#: servers that always weight device centers by their counts
WEIGHTED_SERVERS = ("weighted-kmeans++", "weighted-kmeans++-keyed")
#: servers whose draws are keyed by device id, by name: :mod:`fedclust.kfed.keyed`
#: (which builds on this module) registers its step here when the wing is imported
KEYED_SERVERS: dict[str, Any] = {}
#: k-means++ starts of the ``"kmeans++"`` server (scikit-learn's KMeans default before 1.4)
KMEANS_PP_INIT = 10
#: the most weighted k-means++ starts of the default (count-weighted) servers: on
#: overlapping real data the weighted cost of the device centers has many local minima
#: within 1 % of each other and 10 starts often miss the lowest
WEIGHTED_PP_INIT = 100
#: ... while N k (device centers times clusters, the distances of one Lloyd round) summed
#: over the starts stays within this; never fewer than KMEANS_PP_INIT starts
WEIGHTED_START_BUDGET = 1_000_000


def weighted_starts(n_centers: int, k: int) -> int:
    """Weighted k-means++ starts of the default servers on ``n_centers`` device centers:
    ``WEIGHTED_START_BUDGET // (N k)`` between ``KMEANS_PP_INIT`` and ``WEIGHTED_PP_INIT``
    (100 starts up to N k = 10⁴, 10 from N k = 10⁵ on), so that small federations get
    many starts for the cost of a few rounds of a large one."""
    return int(min(WEIGHTED_PP_INIT, max(KMEANS_PP_INIT,
                                         WEIGHTED_START_BUDGET // max(1, n_centers * k))))
#: above this many device centers the k-means++ server seeds on a lightweight coreset and
#: runs blocked Lloyd (:func:`fedclust.core.kmeans.weighted_kmeans`)
LARGE_N = 100_000


@dataclass(frozen=True)
class AggregationResult:
    """Final centers (k, d), the global label of every device's centers, and diagnostics."""

    centers: np.ndarray
    center_labels: list[np.ndarray]
    seed_device: int | None
    n_iter: int
    #: with ``trim > 0``: which centers were left out (:mod:`fedclust.kfed.robust_server`)
    distrust: Distrust | None = None


def aggregate_centers(centers: Sequence[np.ndarray], n_clusters: int, *,
                      counts: Sequence[np.ndarray] | None = None,
                      method: str = "farthest-lloyd1", weighted: bool = False,
                      first_device: str | int = "widest",
                      rng: np.random.Generator | None = None,
                      max_iter: int = 300, tol: float = 1e-4,
                      trim: float = 0.0, device_ids: Sequence[int] | None = None,
                      seed: int | None = None) -> AggregationResult:
    """Cluster the devices' local centers into ``n_clusters`` global clusters.

    Parameters
    ----------
    centers : sequence of ndarray (k_z, d)
        One array per participating device (validated messages).
    n_clusters : int
        k. Requires Σ k_z >= k.
    counts : sequence of ndarray (k_z,), optional
        Points behind each center; used as Lloyd weights when ``weighted``.
    method, first_device : see the module docstring.
    weighted : bool, default=False
        Weight device centers by their counts (the paper does not);
        ``"weighted-kmeans++"`` always does.
    rng : Generator, optional
        The server's stream (only ``first_device="random"`` draws from it).
    device_ids, seed : the devices' ids (one per array of ``centers``) and the run's seed;
        ``"weighted-kmeans++"`` keys its k-means++ draws by them
        (:mod:`fedclust.kfed.keyed`; without them: the devices' positions and a seed
        drawn from ``rng``).
    trim : float in [0, 0.5), default=0
        Fraction of devices that may be Byzantine: uncorroborated centers are
        left out and final centers are trimmed means
        (:mod:`fedclust.kfed.robust_server`). 0 is the paper's server.

    Returns
    -------
    AggregationResult

    Notes
    -----
    Farthest-first costs O(N k d) for N = Σ k_z; each Lloyd round O(N k d);
    single-linkage O(N² d log N) time and O(N) memory.
    """
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) \
            or n_clusters < 1:
        raise ValidationError(f"n_clusters={n_clusters!r} must be an integer >= 1")
    sizes = list(map(len, centers))
    total = sum(sizes)
    if total < n_clusters:
        raise ValidationError(
            f"the devices sent {total} local centers in all (sum of k_z over "
            f"{len(sizes)} devices) but n_clusters={n_clusters}; need sum k_z >= k")
    if trim > 0:
        return _aggregate_robust(centers, n_clusters, counts=counts, method=method,
                                 weighted=weighted, first_device=first_device, rng=rng,
                                 max_iter=max_iter, tol=tol, trim=trim, device_ids=device_ids,
                                 seed=seed)
    C = np.concatenate(centers, axis=0)
    w = None
    if weighted or method in WEIGHTED_SERVERS:
        if counts is None:
            raise ValidationError("weighted=True needs the devices' counts")
        w = np.concatenate(counts).astype(C.dtype)
    offsets = np.cumsum([0] + sizes)
    seed_device = None
    n_iter = 0
    if method == "single-linkage":
        labels = single_linkage(C, n_clusters)
        final = _weighted_means(C, labels, n_clusters, w)
    elif method in ("farthest-lloyd1", "farthest-lloyd"):
        # k matrix-vector products and a few (N, k) distance blocks: BLAS threads only
        # add wake-ups here (measured 3-4x slower with 2 threads on a busy 2-core machine)
        with one_blas_thread():
            seed_device = pick_first_device(centers, first_device, rng, stacked=C)
            c_sq = (C * C).sum(axis=1)   # the rows' squared norms, as assign and lloyd take them
            init_idx = farthest_first(C, n_clusters, start=np.arange(offsets[seed_device],
                                                                     offsets[seed_device + 1]),
                                      x_sq=c_sq)
            res = lloyd(C, C[init_idx], weights=w,
                        max_iter=1 if method == "farthest-lloyd1" else max_iter, tol=tol,
                        x_sq=c_sq)
        final, labels, n_iter = res.centers, res.labels, res.n_iter
    elif method == "kmeans++":
        if rng is None:
            raise ValidationError("method='kmeans++' needs the server's random stream (rng)")
        if len(C) > LARGE_N:  # millions of device centers: coreset seeds, blocked Lloyd
            best = weighted_kmeans(C, n_clusters, rng, weights=w, max_iter=max_iter, tol=tol)
        else:
            best = None
            c_sq = (C * C).sum(axis=1)   # the same for every start (same bits)
            c_var = C.var(axis=0).mean() if C.shape[0] > 1 else 0.0
            for _ in range(KMEANS_PP_INIT):
                res = lloyd(C, C[kmeans_plusplus(C, n_clusters, rng, weights=w, x_sq=c_sq)],
                            weights=w, max_iter=max_iter, tol=tol, x_sq=c_sq, x_var=c_var)
                if best is None or res.inertia < best.inertia:
                    best = res
        final, labels, n_iter = best.centers, best.labels, best.n_iter
    elif method in KEYED_SERVERS:
        if device_ids is None:   # a direct call: the devices' positions key the draws
            device_ids = list(range(len(centers)))
        if seed is None:
            if rng is None:
                raise ValidationError(f"method={method!r} needs the run's seed or the server's "
                                      "random stream (rng)")
            seed = int(rng.integers(0, 2**63 - 1))
        res = KEYED_SERVERS[method](C, n_clusters, w, centers, device_ids, seed,
                                    max_iter=max_iter, tol=tol)
        final, labels, n_iter = res.centers, res.labels, res.n_iter
    else:
        raise ValidationError(f"method={method!r} is not supported; choose one of {list(SERVER_METHODS)}")
    # int64 whatever k: these travel to the devices, and the blocked Lloyd gives the smallest type
    labels = labels.astype(np.int64, copy=False)
    if len(set(sizes)) == 1:   # every device sent as many: one copy, its rows
        center_labels = list(labels.reshape(len(sizes), sizes[0]).copy())
    else:
        center_labels = [labels[offsets[z]:offsets[z + 1]].copy() for z in range(len(sizes))]
    return AggregationResult(final, center_labels, seed_device, n_iter)


def _aggregate_robust(centers, n_clusters, *, counts, method, weighted, first_device, rng,
                      max_iter, tol, trim, device_ids=None, seed=None) -> AggregationResult:
    """``trim > 0``: the plain server on the corroborated centers, then trimmed means."""
    distrust = distrusted_centers(centers, trim, n_clusters)
    sizes = [len(c) for c in centers]
    offsets = np.cumsum([0] + sizes)
    keep = [distrust.keep[offsets[z]:offsets[z + 1]] for z in range(len(centers))]
    kept_devices = [z for z in range(len(centers)) if keep[z].any()]
    kept = [centers[z][keep[z]] for z in kept_devices]
    # one device is one witness per group: its rows in a group share one unit of weight
    # (times its counts when ``weighted``), so k' identical lies weigh as one
    share = distrust.device_weights(np.repeat(np.arange(len(centers)), sizes))
    share = [share[offsets[z]:offsets[z + 1]][keep[z]] for z in kept_devices]
    if weighted:
        if counts is None:
            raise ValidationError("weighted=True needs the devices' counts")
        share = [w * counts[z][keep[z]] for w, z in zip(share, kept_devices)]
    kept_counts = share
    if sum(len(c) for c in kept) < n_clusters:
        raise ValidationError(
            f"only {sum(len(c) for c in kept)} device centers are corroborated by enough devices "
            f"for trim={trim}, fewer than n_clusters={n_clusters}")
    if isinstance(first_device, (int, np.integer)) and not isinstance(first_device, bool):
        first_device = kept_devices.index(int(first_device)) if int(first_device) in kept_devices \
            else "widest"
    plain = aggregate_centers(kept, n_clusters, counts=kept_counts, method=method,
                              weighted=True, first_device=first_device, rng=rng,
                              max_iter=max_iter, tol=tol, seed=seed,
                              device_ids=None if device_ids is None
                              else [device_ids[z] for z in kept_devices])
    Ck = np.concatenate(kept, axis=0)
    wk = np.concatenate(kept_counts).astype(float)
    final = robust_means(Ck, np.concatenate(plain.center_labels), plain.centers,
                         min(trim, 0.49), wk)
    C = np.concatenate(centers, axis=0)
    labels = relabel(C.astype(final.dtype, copy=False), final)
    seed = None if plain.seed_device is None else kept_devices[plain.seed_device]
    return AggregationResult(final, [labels[offsets[z]:offsets[z + 1]] for z in range(len(sizes))],
                             seed, plain.n_iter, distrust)


def assign_to_centers(local_centers: np.ndarray, final_centers: np.ndarray) -> np.ndarray:
    """Global label of a (late or new) device's centers: nearest final center, O(k_z k d)."""
    return assign(local_centers, final_centers)[0]


def pick_first_device(centers: Sequence[np.ndarray], first_device: Any,
                      rng: np.random.Generator | None,
                      stacked: np.ndarray | None = None) -> int:
    """Position of the device whose centers seed farthest-first; ``stacked``: the centers
    already concatenated (read in place when every device sent as many)."""
    n_dev = len(centers)
    if isinstance(first_device, (int, np.integer)) and not isinstance(first_device, bool):
        if not 0 <= first_device < n_dev:
            raise ValidationError(f"first_device={first_device} is out of range for {n_dev} devices")
        return int(first_device)
    if first_device == "random":
        if rng is None:
            raise ValidationError('first_device="random" needs the server rng')
        return int(rng.integers(n_dev))
    if first_device != "widest":
        raise ValidationError(
            f"first_device={first_device!r} must be 'widest', 'random' or a device position")
    sizes = np.fromiter(map(len, centers), np.int64, n_dev)
    top = np.flatnonzero(sizes == sizes.max())
    if sizes.max() < 2:
        return int(top[0])
    # smallest distance between two centers of the same device, for all devices at once
    if stacked is not None and len(top) == n_dev:   # every device ties: no second copy
        S = stacked.reshape(n_dev, int(sizes[0]), -1)
    else:
        S = np.stack([centers[z] for z in top])                   # (m, k_z, d)
    sq = np.einsum("mkd,mkd->mk", S, S)
    D = sq[:, :, None] - 2.0 * (S @ S.transpose(0, 2, 1)) + sq[:, None, :]
    D[:, np.arange(S.shape[1]), np.arange(S.shape[1])] = np.inf
    return int(top[int(np.argmax(D.min(axis=(1, 2))))])


def farthest_first(C: np.ndarray, k: int, *, start: np.ndarray,
                   x_sq: np.ndarray | None = None) -> np.ndarray:
    """Farthest-first traversal (Gonzalez) seeded with the rows ``start``.

    Returns k row indices: ``start`` (or its first k farthest-first points if it
    has more than k) followed by, repeatedly, the row farthest from the chosen set.
    ``x_sq`` (N,): ``(C * C).sum(axis=1)``, when the caller has it (same bits).
    """
    start = np.asarray(start, dtype=np.int64)
    if len(start) >= k:
        # At least k seed centers: traverse within them, beginning at the first.
        if len(start) == k or k == 1:
            return start[:k]
        sub = farthest_first(C[start], k, start=np.zeros(1, dtype=np.int64))
        return start[sub]
    chosen = list(start)
    mind = assign(C, C[start], x_sq)[1]
    mind[start] = -1.0
    sq = np.einsum("ij,ij->i", C, C)
    dist = np.empty_like(mind)
    for _ in range(k - len(start)):
        j = int(np.argmax(mind))
        chosen.append(j)
        # ‖c‖² − 2c·c_j + ‖c_j‖²: one BLAS gemv over C per step, no (N, d) temporary
        np.matmul(C, C[j], out=dist)
        dist *= -2.0
        dist += sq
        dist += sq[j]
        np.minimum(mind, dist, out=mind)
        mind[j] = -1.0
    return np.asarray(chosen, dtype=np.int64)


def _weighted_means(C, labels, k, w):
    weights = np.ones(len(C)) if w is None else w
    tot = np.bincount(labels, weights=weights, minlength=k)
    out = np.zeros((k, C.shape[1]), dtype=C.dtype)
    np.add.at(out, labels, C * weights[:, None])
    return out / tot[:, None]


def single_linkage(C: np.ndarray, k: int) -> np.ndarray:
    """Labels 0..k-1 of single-linkage clustering of the rows of C into k sets.

    Equivalent to the poster's union-find over pairs sorted by distance:
    build the Euclidean MST (Borůvka), keep its N-k shortest edges.
    Components are numbered by their smallest row index.
    """
    N = len(C)
    if k >= N:
        return np.arange(N, dtype=np.int64)
    u, v, wgt = _euclidean_mst(C)
    order = np.argsort(wgt, kind="stable")[: N - k]
    ds = DisjointSet(range(N))
    for e in order:
        ds.merge(int(u[e]), int(v[e]))
    roots = np.array([ds[i] for i in range(N)])
    _, labels = np.unique(roots, return_inverse=True)
    # renumber so that label order follows first appearance (deterministic)
    first = np.full(k, N)
    np.minimum.at(first, labels, np.arange(N))
    rank = np.argsort(np.argsort(first))
    return rank[labels].astype(np.int64)


def _euclidean_mst(C: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Borůvka MST of the complete Euclidean graph on the rows of C, O(N) memory."""
    N = len(C)
    comp = np.arange(N)
    c_sq = (C * C).sum(axis=1)
    block = max(1, (1 << 22) // max(N, 1))
    eu, ev, ew = [], [], []
    ds = DisjointSet(range(N))
    n_comp = N
    while n_comp > 1:
        best_d = np.full(N, np.inf)
        best_j = np.full(N, -1, dtype=np.int64)
        for s in range(0, N, block):
            Cb = C[s:s + block]
            D = c_sq[s:s + block, None] - 2.0 * (Cb @ C.T) + c_sq[None, :]
            D[comp[s:s + block, None] == comp[None, :]] = np.inf
            j = D.argmin(axis=1)
            best_j[s:s + block] = j
            best_d[s:s + block] = D[np.arange(len(j)), j]
        # cheapest outgoing edge of each component
        order = np.lexsort((best_d, comp))
        first_of_comp = order[np.r_[True, comp[order][1:] != comp[order][:-1]]]
        for i in first_of_comp:
            j = int(best_j[i])
            if j >= 0 and not ds.connected(int(i), j):
                ds.merge(int(i), j)
                eu.append(int(i))
                ev.append(j)
                ew.append(max(float(best_d[i]), 0.0))
                n_comp -= 1
        comp = np.array([ds[i] for i in range(N)])
    return np.array(eu), np.array(ev), np.sqrt(np.array(ew))
