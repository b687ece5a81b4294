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
from ..fl.server import aggregate_updates
from .clustering import KGeomedians, TrimmedKMeans
from .edge_cutting import EdgeCutting

__all__ = ["ErmClustering", "cluster_erms", "robust_step", "CLUSTERINGS", "OPTIMIZERS"]

CLUSTERINGS = ("trimmed-kmeans", "kgeomedians", "edge-cutting", "kmeans")
OPTIMIZERS = ("gd", "fedavg")


@dataclass
class ErmClustering:
    """Stage-2 outcome: ``labels`` (m,) (-1: judged Byzantine / outlier), ``centers`` (c, p),
    ``history`` (T + 1, m) labels per iteration, ``n_iter``."""

    labels: np.ndarray
    centers: np.ndarray
    history: np.ndarray
    n_iter: int


def cluster_erms(W: np.ndarray, n_clusters: int, method: str, *, seed: int,
                 radius: float = 3.0, beta: float = 0.1, init: str = "k-means++",
                 max_iter: int = 100, drop_outliers: bool = True) -> ErmClustering:
    """Cluster the machines' ERMs W (m, p) with ``method`` in :data:`CLUSTERINGS`.

    ``"trimmed-kmeans"`` marks the machines outside the last trimming radius
    -1 when ``drop_outliers``; ``"edge-cutting"`` marks its low-degree points
    -1; ``"kgeomedians"`` and ``"kmeans"`` label every machine. ``"kmeans"`` is
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
    if drop_outliers and method == "trimmed-kmeans":
        lab[~est.inlier_mask_] = -1
    return ErmClustering(lab, est.cluster_centers_, np.array(est.labels_history_), est.n_iter_)


def robust_step(params: np.ndarray, updates: np.ndarray, *, optimizer: str, lr: float,
                aggregator: str, beta: float) -> np.ndarray:
    """One stage-3 round of one cluster: new parameters (p,) from the members' updates (m, p).

    ``"gd"``: the members' gradients ``(params - update_i) / lr`` are combined
    by ``aggregator`` and one step is taken (Yin et al. 2018);
    ``"fedavg"``: the locally trained models are combined by ``aggregator``.
    Unweighted: a Byzantine machine could lie about its sample count.
    """
    if optimizer == "gd":
        grads = (params[None, :] - updates) / lr
        return params - lr * aggregate_updates(grads, None, aggregator, beta)
    return aggregate_updates(updates, None, aggregator, beta)
