"""Server maths of federated learning: aggregation of updates, IFCA's per-cluster averages,
client selection (random, power-of-choice, k-FED-filtered power-of-choice).

Pure functions over validated messages' arrays. Aggregation is
:func:`fedclust.core.robust.aggregate` (coordinate-wise mean / trimmed mean /
median), so FedAvg here and the robust wing's rounds share one rule set.

McMahan et al., "Communication-efficient learning of deep networks from
decentralized data", AISTATS 2017; Ghosh et al., "An efficient framework for
clustered federated learning", NeurIPS 2020; Cho, Wang & Joshi, "Client
selection in federated learning: convergence analysis and power-of-choice
selection strategies", 2020.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.robust import AGGREGATORS, aggregate

__all__ = ["aggregate_updates", "average_per_cluster", "sample_candidates", "select_by_loss",
           "select_random", "cluster_local_centers", "AGGREGATORS", "SELECTIONS", "KFED_SERVERS"]

SELECTIONS = ("random", "pow-d", "kfed-pow-d")
#: how the server clusters the devices' local centers: k-means++ restarts + Lloyd, or the
#: k-FED paper's farthest-first + one Lloyd step (:func:`fedclust.kfed.server.aggregate_centers`)
KFED_SERVERS = ("kmeans++", "farthest-lloyd1")


def aggregate_updates(params_list: Any, weights: Any = None, aggregator: str = "mean",
                      beta: float = 0.1) -> np.ndarray:
    """Combine m devices' parameter (or gradient) vectors (m, p) into one (p,).

    ``weights`` (m,) are the devices' sample counts for FedAvg's weighted mean
    (``None``: equal weights); ``aggregator`` in ``("mean", "trimmed-mean",
    "median")`` (coordinate-wise; ``beta`` is the trimmed fraction per side).
    O(m p) for the mean, O(m log m p) for the others.
    """
    if aggregator not in AGGREGATORS:
        raise ValidationError(f"aggregator={aggregator!r} must be one of {list(AGGREGATORS)}")
    return aggregate(np.asarray(params_list, dtype=np.float64), aggregator, weights=weights,
                     beta=beta)


def average_per_cluster(params: np.ndarray, clusters: Sequence[int], previous: np.ndarray, *,
                        weights: Any = None, aggregator: str = "mean",
                        beta: float = 0.1) -> np.ndarray:
    """IFCA's / clustered FedAvg's server step: aggregate each cluster's updates.

    ``params`` (m, p) updates, ``clusters`` (m,) the model each belongs to,
    ``previous`` (k, p) the models sent this round; a cluster nobody chose
    keeps its previous model. Returns (k, p).
    """
    clusters = np.asarray(clusters, dtype=np.int64)
    out = np.array(previous, dtype=np.float64, copy=True)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    for j in np.unique(clusters):
        sel = clusters == j
        out[j] = aggregate_updates(params[sel], None if w is None else w[sel], aggregator, beta)
    return out


def select_random(ids: Sequence[int], m: int, rng: np.random.Generator) -> list[int]:
    """m devices uniformly without replacement (FedAvg's baseline), sorted."""
    ids = np.asarray(sorted(ids))
    if m >= len(ids):
        return ids.tolist()
    return sorted(rng.choice(ids, size=m, replace=False).tolist())


def sample_candidates(ids: Sequence[int], sizes: Sequence[int], d: int,
                      rng: np.random.Generator) -> list[int]:
    """Power-of-choice step 1: d candidates without replacement, probability ∝ data size."""
    ids = np.asarray(sorted(ids))
    if d >= len(ids):
        return ids.tolist()
    p = np.asarray(sizes, dtype=np.float64)
    return sorted(rng.choice(ids, size=d, replace=False, p=p / p.sum()).tolist())


def select_by_loss(losses: dict[int, float], m: int,
                   clusters: dict[int, int] | None = None) -> list[int]:
    """Power-of-choice step 2: the m candidates with the highest local loss.

    With ``clusters`` (device -> k-FED cluster; the k-FED-filtered variant of
    the k-FED paper's Figure 4) at most one device per cluster is taken first,
    highest loss first; if fewer than m clusters are represented the rest are
    filled by loss. Ties break by device id. Returns sorted ids.
    """
    order = sorted(losses, key=lambda z: (-losses[z], z))
    if clusters is None:
        return sorted(order[:m])
    chosen, seen = [], set()
    for z in order:
        c = clusters.get(z, -1 - z)  # an unclustered device is its own cluster
        if c not in seen:
            seen.add(c)
            chosen.append(z)
        if len(chosen) == m:
            return sorted(chosen)
    rest = [z for z in order if z not in set(chosen)]
    return sorted(chosen + rest[:m - len(chosen)])


def cluster_local_centers(centers: Sequence[np.ndarray], n_clusters: int,
                          rng: np.random.Generator, *,
                          max_iter: int = 300) -> tuple[np.ndarray, list[np.ndarray]]:
    """The ``kfed_server="kmeans++"`` step: k-FED's ``"kmeans++"`` server
    (:func:`fedclust.kfed.server.aggregate_centers`: 10 k-means++ starts, Lloyd to
    convergence, the lowest inertia kept) on the devices' local centers.

    ``centers``: one (k_z, d) array per device. Returns the (k, d) global centers and,
    per device, the (k_z,) global label of each of its local centers. Unlike the
    paper's farthest-first start, an outlying local center (a device whose local
    split followed the digits rather than the rotations) cannot claim a cluster of
    its own.
    """
    from ..kfed.server import aggregate_centers

    agg = aggregate_centers([np.asarray(c, dtype=np.float64) for c in centers], n_clusters,
                            method="kmeans++", rng=rng, max_iter=max_iter)
    return agg.centers, [lab.astype(np.int64) for lab in agg.center_labels]
