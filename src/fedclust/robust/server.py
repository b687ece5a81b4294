"""Server maths of the robust pipeline: stage 2 (cluster the ERMs) and stage 3 (one robust step).

Pure functions over validated messages' arrays. Stage 3 aggregation is
:func:`fedclust.fl.server.aggregate_updates` (coordinate-wise mean / trimmed
mean / median): the robust rounds and FedAvg share one rule set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.cluster import KMeans

from ..core.random import server_rng, sklearn_seed
from ..core.robust import AGGREGATORS, geometric_median, trimmed_mean
from ..fl.server import aggregate_updates
from .clustering import KGeomedians, TrimmedKMeans
from .edge_cutting import EdgeCutting
from .filtering import iterative_filtering
from .offaxis import beta_for, off_axis_group, off_axis_trimmed_mean  # noqa: F401

__all__ = ["ErmClustering", "cluster_erms", "robust_step", "adaptive_beta", "outlier_share",
           "share_beta",
           "STAGE3_AGGREGATORS", "CLUSTERINGS", "OPTIMIZERS"]

CLUSTERINGS = ("trimmed-kmeans", "kgeomedians", "edge-cutting", "kmeans")
#: stage-3 rules: FL's coordinate-wise ones plus iterative filtering
STAGE3_AGGREGATORS = AGGREGATORS + ("filter",)
OPTIMIZERS = ("gd", "fedavg")


@dataclass
class ErmClustering:
    """Stage-2 outcome: ``labels`` (m,) (-1: judged Byzantine / outlier), ``centers`` (c, p),
    ``history`` (T + 1, m) labels per iteration, ``n_iter``, ``suspect`` (m,) bool: members
    of a group beyond the k best-supported ones (stage 3 trims at least their share)."""

    labels: np.ndarray
    centers: np.ndarray
    history: np.ndarray
    n_iter: int
    suspect: np.ndarray | None = None


def cluster_erms(W: np.ndarray, n_clusters: int, method: str, *, seed: int,
                 radius: float = 3.0, beta: float = 0.1, init: str = "k-means++",
                 max_iter: int = 100, drop_outliers: bool = True) -> ErmClustering:
    """Cluster the machines' ERMs W (m, p) with ``method`` in :data:`CLUSTERINGS`.

    ``"trimmed-kmeans"`` marks the machines outside the last trimming radius
    -1 when ``drop_outliers``, and (as ``"kgeomedians"`` does) the members of a
    spare group beyond k (:func:`fedclust.robust.init.supported_groups`: a
    colluding group smaller than every honest cluster); ``"edge-cutting"``
    marks its low-degree points -1; ``"kmeans"`` labels every machine. ``"kmeans"`` is
    the non-robust reference a user would reach for: scikit-learn's k-means++
    (10 restarts, best inertia) and Lloyd.
    """
    if method == "kmeans":
        km = KMeans(n_clusters, n_init=10, random_state=sklearn_seed(server_rng(seed, 0))).fit(W)
        lab = km.labels_.astype(np.int64)
        return ErmClustering(lab, km.cluster_centers_, lab[None, :], int(km.n_iter_))
    if method == "edge-cutting":
        ec = EdgeCutting(n_clusters=n_clusters).fit(W)
        lab = ec.labels_
        return ErmClustering(lab, ec.cluster_centers_, lab[None, :], 1)
    if method == "kgeomedians":
        est = KGeomedians(n_clusters, init=init, max_iter=max_iter, random_state=seed)
    else:
        est = TrimmedKMeans(n_clusters, radius=radius, init=init, max_iter=max_iter,
                            random_state=seed)
    est.fit(W)
    lab = est.labels_.copy()
    if drop_outliers:
        lab[~est.inlier_mask_] = -1
    return ErmClustering(lab, est.cluster_centers_, np.array(est.labels_history_), est.n_iter_,
                         est.suspect_mask_.copy())


def outlier_share(V: np.ndarray, radius: float = 3.0) -> tuple[float, np.ndarray]:
    """``(share, flagged)``: the rows of V (m, p) farther than ``radius`` x the median distance
    from their geometric median — the trimmed k-means radius rule applied to one round's
    updates. Breakdown 1/2: with fewer than half the rows lying, the geometric median and the
    median distance are set by honest rows, so far lies are flagged however far they go.
    O(m p · T_W)."""
    m = V.shape[0]
    if m < 3:
        return 0.0, np.zeros(m, dtype=bool)
    g = geometric_median(V)
    dist = np.sqrt(((V - g) ** 2).sum(axis=1))
    scale = float(np.median(dist))
    flagged = dist > radius * scale
    return float(flagged.mean()), flagged


def share_beta(n_suspect: int, m: int, beta: float) -> float:
    """Stage-3 trim fraction of a cluster of m members of which ``n_suspect`` belong to a
    group beyond k (:func:`fedclust.robust.init.supported_groups`): at least their share,
    so that every one of them can be trimmed in every coordinate; never below ``beta``."""
    return beta_for(n_suspect, m, beta)


def adaptive_beta(V: np.ndarray, beta: float, radius: float = 3.0) -> float:
    """Trim fraction for one coordinate-wise trimmed mean of the rows of V (m, p).

    ``max(beta, s / m)`` where s rows are flagged by :func:`outlier_share`, so
    that ``floor(beta m) >= s`` rows are dropped at each end of every
    coordinate and all flagged rows can be trimmed even when they sit on one
    side; capped below 1/2. The trimmed mean is exact at breakdown β, so β
    must exceed the liars' share *of this cluster*; a fixed β = α + 0.1 is too
    small where the liars gather next to one cluster (measured: up to 43% of a
    cluster under the ``between`` attack at α = 0.2).
    """
    _, flagged = outlier_share(V, radius)
    return beta_for(int(flagged.sum()), V.shape[0], beta)


def robust_step(params: np.ndarray, updates: np.ndarray, *, optimizer: str, lr: float,
                aggregator: str, beta: float, adaptive: bool = False,
                radius: float = 3.0) -> tuple[np.ndarray, float, np.ndarray]:
    """One stage-3 round of one cluster: ``(new parameters (p,), trim fraction used,
    flagged (m,))``.

    ``"gd"``: the members' gradients ``(params - update_i) / lr`` are combined
    by ``aggregator`` and one step is taken (Yin et al. 2018);
    ``"fedavg"``: the locally trained models are combined by ``aggregator``.
    Unweighted: a Byzantine machine could lie about its sample count.
    ``adaptive`` (trimmed mean only): the trim fraction follows the measured
    share of outlying updates, never below ``beta`` (:func:`adaptive_beta`);
    ``flagged`` marks those updates (all False otherwise).
    ``"filter"``: :func:`fedclust.robust.filtering.iterative_filtering`.
    """
    V = (params[None, :] - updates) / lr if optimizer == "gd" else updates
    b = beta
    flagged = np.zeros(V.shape[0], dtype=bool)
    agg = None
    if adaptive and aggregator == "trimmed-mean":
        _, flagged = outlier_share(V, radius)
        b = beta_for(int(flagged.sum()), V.shape[0], beta)
        agg, b_off, off = off_axis_trimmed_mean(V, b, radius)
        if agg is not None:
            flagged, b = flagged | off, b_off
    if agg is None:
        agg = (iterative_filtering(V) if aggregator == "filter"
               else aggregate_updates(V, None, aggregator, b))
    return (params - lr * agg if optimizer == "gd" else agg), b, flagged
