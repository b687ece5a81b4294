"""Edge cutting: cluster by the connected components of a threshold graph (k not needed).

Connect two points when they are within ``threshold`` of each other, drop the
points with fewer than ``min_degree`` neighbours (isolated Byzantine points),
and call every connected component of what remains a cluster. When machines
hold many samples their ERMs concentrate tightly around the cluster centres,
the intra-cluster distances are far below the separation, and this recovers
the honest clustering exactly (Ghosh et al. 2019, Appendix C).

**Threshold rule (decision).** ``threshold="auto"`` takes twice the median,
over points, of the distance to the ``min_degree``-th nearest neighbour — a
scale that honest points share and that a minority of outliers cannot move.
Pass a number to set it (the paper tunes it).

Graph and components: :func:`scipy.sparse.csgraph.connected_components` over
the radius-neighbours graph of scikit-learn (k-d / ball tree; O(n log n) in low
dimension, O(n²) at worst).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.sparse.csgraph import connected_components
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.neighbors import NearestNeighbors

from ..core.estimators import KMeansScoreMixin
from ..core.exceptions import NotFittedError, ValidationError
from ..core.kmeans import assign
from ..core.robust import geometric_median
from ..core.validation import check_array, check_float, check_int, check_n_features

__all__ = ["EdgeCutting"]


class EdgeCutting(KMeansScoreMixin, ClusterMixin, BaseEstimator):
    """Threshold-graph clustering that drops low-degree points.

    Parameters
    ----------
    threshold : float or "auto", default="auto"
        Edge length limit τ (see the module docstring for "auto").
    min_degree : int, default=2
        Points with fewer neighbours within τ are outliers (label -1).
    n_clusters : int or None, default=None
        Keep only the ``n_clusters`` largest components (the rest -> -1);
        ``None`` keeps every component of at least ``min_cluster_size`` points.
    min_cluster_size : int, default=2
        Smaller components are outliers (label -1).

    Attributes
    ----------
    labels_ : ndarray (n,)
        Component of every point, largest first; -1 for outliers.
    cluster_centers_ : ndarray (c, d)
        Geometric median of every kept component.
    n_clusters_ : int
    threshold_ : float
    n_iter_ : int
        Always 1 (one pass; kept for the common clusterer API).
    """

    def __init__(self, threshold: float | str = "auto", *, min_degree: int = 2,
                 n_clusters: int | None = None, min_cluster_size: int = 2):
        self.threshold = threshold
        self.min_degree = min_degree
        self.n_clusters = n_clusters
        self.min_cluster_size = min_cluster_size

    def fit(self, X: Any, y: None = None) -> "EdgeCutting":
        """Cluster the rows of X (n, d)."""
        X = check_array(X, "X").astype(np.float64, copy=False)
        n = X.shape[0]
        min_degree = check_int(self.min_degree, "min_degree", min_value=0)
        if min_degree > n - 1:
            raise ValidationError(f"X has {n} sample(s) but min_degree={min_degree} needs at "
                                  f"least {min_degree + 1}")
        min_size = check_int(self.min_cluster_size, "min_cluster_size", min_value=1)
        k = None if self.n_clusters is None else check_int(self.n_clusters, "n_clusters",
                                                            min_value=1, max_value=n)
        nn = NearestNeighbors().fit(X)
        if isinstance(self.threshold, str):
            if self.threshold != "auto":
                raise ValidationError(f"threshold={self.threshold!r} must be a number or 'auto'")
            q = max(1, min_degree)
            if n < 2:
                tau = 0.0
            else:
                dist, _ = nn.kneighbors(X, n_neighbors=min(q + 1, n))
                tau = 2.0 * float(np.median(dist[:, -1]))
        else:
            tau = check_float(self.threshold, "threshold", min_value=0.0)
        G = nn.radius_neighbors_graph(X, radius=tau, mode="connectivity")
        G.setdiag(0)
        G.eliminate_zeros()
        degree = np.asarray(G.sum(axis=1)).ravel()
        keep = degree >= min_degree
        labels = np.full(n, -1, dtype=np.int64)
        idx = np.flatnonzero(keep)
        if len(idx):
            _, comp = connected_components(G[idx][:, idx], directed=False)
            sizes = np.bincount(comp)
            # largest first; ties by the smallest point index (order-free up to ties)
            first = np.full(len(sizes), n)
            np.minimum.at(first, comp, idx)
            order = sorted(range(len(sizes)), key=lambda c: (-sizes[c], first[c]))
            order = [c for c in order if sizes[c] >= min_size]
            if k is not None:
                order = order[:k]
            relabel = np.full(len(sizes), -1, dtype=np.int64)
            relabel[order] = np.arange(len(order))
            labels[idx] = relabel[comp]
        c = int(labels.max()) + 1
        if c == 0:
            raise ValidationError(
                f"edge cutting found no cluster at threshold={tau:.4g} with "
                f"min_degree={min_degree}; raise the threshold or lower min_degree")
        self.cluster_centers_ = np.array([geometric_median(X[labels == j]) for j in range(c)])
        self.labels_ = labels
        self.n_clusters_ = c
        self.threshold_ = tau
        self.n_iter_ = 1
        self.n_features_in_ = X.shape[1]
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Nearest cluster centre of every row of X (never -1)."""
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError("this EdgeCutting is not fitted yet; call fit(X) first")
        X = check_n_features(check_array(X, "X"), self)
        return assign(X.astype(np.float64, copy=False), self.cluster_centers_)[0]
