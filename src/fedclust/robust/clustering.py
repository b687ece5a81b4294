"""Outlier-robust Lloyd: trimmed k-means and k-geomedians (and plain Lloyd for reference).

All three share one loop — assign every point (outliers included) to its
nearest centre, then recompute each centre with a *center rule* — and differ
only in the rule:

* :class:`TrimmedKMeans` — the paper's Algorithm 2: the cluster's geometric
  median ``g``; keep the points within a radius ``r`` of ``g``; the centre is
  the mean of the kept points (``g`` itself when none is kept). Or, with
  ``center="trimmed-mean"``, the coordinate-wise β-trimmed mean.
* :class:`KGeomedians` — the centre is the geometric median.
* :class:`KMeansLloyd` — the (weighted) mean: classical Lloyd, the non-robust
  reference of the paper's Figure 2a, with the same history and init options.

**Radius rule (decision).** The paper's radius is "a constant times the noise
scale", which a server does not know. The default (``radius_rule="pooled"``)
estimates one noise scale for all clusters — the median, over *all* points, of
the distance to their own cluster's geometric median — and keeps the points
within ``r = radius * scale`` (``radius=3``). The median is a robust scale
estimate (breakdown 1/2 of all points), and pooling matters: Byzantine points
need not spread evenly, and a cluster where they are the majority would
inflate a per-cluster scale and keep them (measured on the real-data benchmark,
where shifted batches gather around the most central class: max centre error
0.47 per-cluster vs 0.10 pooled). For sub-Gaussian clusters in d dimensions the
honest distances concentrate around ``σ√d``, so a factor 3 keeps essentially
all of them (in d = 1, 95.7%) while a point three typical radii away is
dropped. The price: clusters with very different noise scales share one
radius. ``radius_rule="median"`` uses each cluster's own median distance,
``"quantile"`` keeps the ``radius``-quantile of the distances (a fixed
fraction), and ``"fixed"`` takes ``radius`` as the absolute radius (the
paper's "constant times a known noise scale").

An empty cluster keeps its previous centre (relocating it to the farthest
point, as scikit-learn does, would hand it to an outlier).

Ghosh, Hong, Yin & Ramchandran, "Robust federated learning in a heterogeneous
environment", 2019 (Algorithm 2; §6.1 k-geomedians).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClusterMixin

from ..core.estimators import KMeansScoreMixin
from ..core.exceptions import NotFittedError, ValidationError
from ..core.kmeans import assign
from ..core.random import RandomState, root_seed, server_rng
from ..core.robust import coordinate_mean, geometric_median, trimmed_mean
from .init import coincident_groups
from ..core.validation import (check_array, check_choice, check_float, check_int,
                               check_n_features)
from .init import INITS, robust_init_groups
from .offaxis import off_axis_trimmed_mean

__all__ = ["TrimmedKMeans", "KGeomedians", "KMeansLloyd", "RADIUS_RULES"]

RADIUS_RULES = ("pooled", "median", "quantile", "fixed")


def _weighted_quantile(values: np.ndarray, w: np.ndarray | None, q: float) -> float:
    if w is None:
        return float(np.quantile(values, q))
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(w[order])
    pos = int(np.searchsorted(cw, q * cw[-1] * (1 - 1e-12)))
    return float(values[order][min(pos, len(values) - 1)])


class _RobustLloyd(KMeansScoreMixin, ClusterMixin, BaseEstimator):
    """The shared loop (see the module docstring); subclasses define :meth:`_center`.

    ``duplicates="once"`` (default for the robust estimators): rows that
    coincide (closer than :data:`fedclust.robust.init.COINCIDE` x the data's
    spread) share one unit of weight, since estimates from independent machines
    never coincide and identical reports are collusion or copies, not
    witnesses. ``"weight"`` counts every row (then repeating a row equals
    weighting it, scikit-learn's invariance).
    """

    #: False for the non-robust Lloyd baseline, which always counts every row
    coincident_once: bool = True

    def __init__(self, n_clusters: int = 8, *, init: Any = "k-means++", max_iter: int = 100,
                 duplicates: str = "once", random_state: RandomState = None):
        self.n_clusters = n_clusters
        self.init = init
        self.max_iter = max_iter
        self.duplicates = duplicates
        self.random_state = random_state

    # -- the rule -----------------------------------------------------------
    def _check_rule(self) -> None:
        """Validate the center-rule parameters (subclasses)."""

    def _center(self, X: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(centre (d,), kept mask (n_j,)) of one cluster's points."""
        raise NotImplementedError

    # -- fit ----------------------------------------------------------------
    def fit(self, X: Any, y: None = None, *, sample_weight: Any = None,
            init_labels: Any = None) -> "_RobustLloyd":
        """Cluster the rows of X (n, d).

        ``init_labels`` (n,) in ``0..k-1`` starts from those groups' centres
        (the paper's "x% correct" start) instead of ``init``.
        """
        X = check_array(X, "X")
        n = X.shape[0]
        k = check_int(self.n_clusters, "n_clusters", min_value=1, max_value=n)
        max_iter = check_int(self.max_iter, "max_iter", min_value=1)
        self._check_rule()
        w = None
        if sample_weight is not None:
            w = np.asarray(sample_weight, dtype=np.float64)
            if w.shape == (n,) and np.isfinite(w).all() and (w >= 0).all() and w.sum() == 0:
                raise ValidationError("sample_weight is all zero; at least one weight must be "
                                      "positive")
            if w.shape != (n,) or not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
                raise ValidationError(
                    f"sample_weight must be {n} finite non-negative numbers with a positive "
                    f"sum, got shape {w.shape}")
        X = X.astype(np.float64, copy=False)
        check_choice(self.duplicates, "duplicates", ("once", "weight"))
        if self.coincident_once and self.duplicates == "once":
            # identical reports from several machines are one witness (see robust.init)
            spot = coincident_groups(X)
            share = 1.0 / np.bincount(spot)[spot]
            if (share < 1).any():
                w = share if w is None else w * share
        history: list[np.ndarray] = []
        if init_labels is not None:
            lab = np.asarray(init_labels)
            if lab.shape != (n,) or lab.dtype.kind not in "iu" or (lab < 0).any() or (
                    lab >= k).any():
                raise ValidationError(
                    f"init_labels must be {n} integers in 0..{k - 1}, got shape {lab.shape}")
            lab = lab.astype(np.int64)
            empty = np.setdiff1d(np.arange(k), lab)
            centers = (self._initial_centers(X, k)[0] if len(empty)
                       else np.zeros((k, X.shape[1])))
            self._update(X, w, lab, centers, np.ones(n, dtype=bool))
            history.append(lab)
        spare = np.zeros((0, X.shape[1]))
        self.suspect_mask_ = np.zeros(n, dtype=bool)
        if init_labels is None:
            centers, spare, self.suspect_mask_ = self._initial_centers(X, k)
        labels = history[-1] if history else None
        kept = np.ones(n, dtype=bool)
        centers_hist = [centers.copy()]
        converged = False
        n_iter = 0
        full = None
        for n_iter in range(1, max_iter + 1):
            # spare centres (groups beyond k, :func:`fedclust.robust.init.supported_groups`)
            # hold their members out of the k clusters: they are outliers
            new_full = assign(X, np.vstack([centers, spare]))[0]
            out = new_full >= k
            new_labels = np.where(out, assign(X, centers)[0], new_full) if out.any() \
                else new_full
            out |= self._minority_suspects(new_labels, k)
            if full is not None and np.array_equal(new_full, full) or (
                    full is None and labels is not None and np.array_equal(new_labels, labels)):
                converged = True
                n_iter -= 1
                break
            labels, full = new_labels, new_full
            history.append(labels)
            self._update(X, w, np.where(out, -1, labels), centers, kept)
            kept[out] = False
            for e in range(len(spare)):
                if (full == k + e).any():
                    spare[e] = X[full == k + e].mean(axis=0)
            centers_hist.append(centers.copy())
        self._final_centers(X, w, labels, centers, kept)
        self.cluster_centers_ = centers
        self.labels_ = labels
        self.inlier_mask_ = kept
        self.n_iter_ = n_iter
        self.converged_ = converged
        self.labels_history_ = history
        self.centers_history_ = centers_hist
        self.n_features_in_ = X.shape[1]
        return self

    def _final_centers(self, X: np.ndarray, w: np.ndarray | None, labels: np.ndarray,
                       centers: np.ndarray, kept: np.ndarray) -> None:
        """Last centre estimate once the labels are final (in place; default: unchanged)."""

    def _update(self, X: np.ndarray, w: np.ndarray | None, labels: np.ndarray,
                centers: np.ndarray, kept: np.ndarray) -> None:
        """Centre step in place; a cluster with no point keeps its centre."""
        for j in range(centers.shape[0]):
            sel = labels == j
            if sel.any():
                centers[j], kept[sel] = self._center(X[sel], None if w is None else w[sel])

    #: keep the spare centres of groups beyond k (False: the non-robust Lloyd)
    uses_spare: bool = True

    def _minority_suspects(self, labels: np.ndarray, k: int) -> np.ndarray:
        """Suspect points (a group beyond k) that are a minority of the cluster absorbing them:
        held out of it — a smaller group the over-segmentation found apart from the cluster's
        own is not part of it (where suspects are the majority, they are the cluster)."""
        sus = self.suspect_mask_
        out = np.zeros(len(labels), dtype=bool)
        if not self.uses_spare or not sus.any():
            return out
        for j in range(k):
            members = labels == j
            n_sus = int((sus & members).sum())
            if 0 < 2 * n_sus < int(members.sum()):
                out |= sus & members
        return out

    def _initial_centers(self, X: np.ndarray, k: int
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(centres (k, d), spare centres (e, d), suspect (n,))`` (none for given centres)."""
        init = self.init
        if isinstance(init, str):
            check_choice(init, "init", INITS)
            rng = server_rng(root_seed(self.random_state), 0)
            centers, spare, suspect = robust_init_groups(X, k, init, rng)
            return centers, (spare if self.uses_spare else spare[:0]), suspect
        C = check_array(init, "init")
        if C.shape != (k, X.shape[1]):
            raise ValidationError(
                f"init has shape {C.shape}; expected (n_clusters, n_features) = {(k, X.shape[1])}")
        return (C.astype(np.float64, copy=True), np.zeros((0, X.shape[1])),
                np.zeros(len(X), dtype=bool))

    # -- use ----------------------------------------------------------------
    def predict(self, X: Any) -> np.ndarray:
        """Nearest centre of every row of X."""
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(X) first")
        X = check_n_features(check_array(X, "X"), self)
        return assign(X.astype(np.float64, copy=False), self.cluster_centers_)[0]


class TrimmedKMeans(_RobustLloyd):
    """Trimmed k-means (Ghosh et al. 2019, Algorithm 2): Lloyd with a trimmed centre step.

    Parameters
    ----------
    n_clusters : int, default=8
    center : {"radius", "trimmed-mean"}, default="radius"
        ``"radius"``: geometric median, keep the points within the radius,
        mean of the kept ones (the paper). ``"trimmed-mean"``: coordinate-wise
        ``beta``-trimmed mean of the cluster.
    radius_rule : {"pooled", "median", "quantile", "fixed"}, default="pooled"
        How the radius is set (see the module docstring for the decision).
    radius : float, default=3.0
        Multiple of the median distance to the geometric medians (``"pooled"``:
        over all points; ``"median"``: within the cluster), the kept quantile in
        (0, 1] (``"quantile"``) or the absolute radius (``"fixed"``).
    beta : float, default=0.1
        Trim fraction per side for ``center="trimmed-mean"`` (0 <= beta < 0.5).
    init : {"k-means++", "pairwise"} or ndarray (k, d), default="k-means++"
        Robust initialisation (:mod:`fedclust.robust.init`) or given centres.
    max_iter : int, default=100
    random_state : int, Generator or None

    Attributes
    ----------
    cluster_centers_ : ndarray (k, d)
    labels_ : ndarray (n,)
    inlier_mask_ : ndarray (n,) bool
        Points kept by the last centre step (False: trimmed as outliers, or held
        by a spare group beyond k, :func:`fedclust.robust.init.supported_groups`).
    suspect_mask_ : ndarray (n,) bool
        Points of a group beyond the k best-supported ones (a colluding group),
        whether held out or absorbed by a cluster (stage 3 trims at least their
        share of that cluster).
    n_iter_ : int
        Centre updates performed.
    converged_ : bool
        Labels stopped changing before ``max_iter``.
    labels_history_ : list of ndarray (n,)
        Labels at every iteration (the first: ``init_labels`` when given).
    centers_history_ : list of ndarray (k, d)

    Notes
    -----
    One iteration costs O(n k d) for the assignment plus O(n d · T_W) for the
    Weiszfeld geometric medians (T_W iterations).
    """

    def __init__(self, n_clusters: int = 8, *, center: str = "radius",
                 radius_rule: str = "pooled", radius: float = 3.0, beta: float = 0.1,
                 init: Any = "k-means++", max_iter: int = 100, duplicates: str = "once",
                 random_state: RandomState = None):
        super().__init__(n_clusters, init=init, max_iter=max_iter, duplicates=duplicates,
                         random_state=random_state)
        self.center = center
        self.radius_rule = radius_rule
        self.radius = radius
        self.beta = beta

    def _check_rule(self) -> None:
        check_choice(self.center, "center", ("radius", "trimmed-mean"))
        check_choice(self.radius_rule, "radius_rule", RADIUS_RULES)
        hi = 1.0 if self.radius_rule == "quantile" else None
        check_float(self.radius, "radius", min_value=0.0, max_value=hi,
                    min_inclusive=self.radius_rule == "fixed")
        beta = check_float(self.beta, "beta", min_value=0.0)
        if beta >= 0.5:
            raise ValidationError(f"beta={beta} must be < 0.5")

    def _final_centers(self, X, w, labels, centers, kept) -> None:
        # Once the labels are final, a cluster's centre is the mean of its kept points
        # trimmed along their largest deviation where a tight group sits off-centre inside
        # the radius (:func:`.offaxis.off_axis_trimmed_mean`): liars between two clusters or
        # next to one would pull the plain mean by their share times their offset. Not in
        # the Lloyd steps: there a cluster is still a mixture, the rule would fire on the
        # other clusters' members and move the centre to a median of the mixture.
        if self.center != "radius":
            return
        r = self.radius if self.radius_rule in ("median", "pooled") else 3.0
        for j in range(centers.shape[0]):
            sel = (labels == j) & kept
            if sel.any():
                agg = off_axis_trimmed_mean(X[sel], 0.0, r, None if w is None else w[sel])[0]
                if agg is not None:
                    centers[j] = agg

    def _update(self, X, w, labels, centers, kept) -> None:
        if self.center != "radius" or self.radius_rule != "pooled":
            return super()._update(X, w, labels, centers, kept)
        # one noise scale for all clusters: the median over all points of the distance to
        # their cluster's geometric median (a cluster taken over by outliers cannot inflate it)
        present = [j for j in range(centers.shape[0]) if (labels == j).any()]
        dist = np.zeros(len(X))
        geo = {}
        for j in present:
            sel = labels == j
            geo[j] = geometric_median(X[sel], None if w is None else w[sel])
            dist[sel] = np.sqrt(((X[sel] - geo[j]) ** 2).sum(axis=1))
        r = self.radius * _weighted_quantile(dist, w, 0.5)
        for j in present:
            sel = labels == j
            keep = dist[sel] <= r
            if w is not None:
                keep &= w[sel] > 0
            kept[sel] = keep
            centers[j] = coordinate_mean(X[sel][keep], None if w is None else w[sel][keep]) \
                if keep.any() else geo[j]

    def _center(self, X, w):
        if self.center == "trimmed-mean":
            return trimmed_mean(X, self.beta, w), np.ones(len(X), dtype=bool)
        g = geometric_median(X, w)
        dist = np.sqrt(((X - g) ** 2).sum(axis=1))
        if self.radius_rule in ("median", "pooled"):
            r = self.radius * _weighted_quantile(dist, w, 0.5)
        elif self.radius_rule == "quantile":
            r = _weighted_quantile(dist, w, self.radius)
        else:
            r = self.radius
        keep = dist <= r
        if w is not None:
            keep &= w > 0
        if not keep.any():
            return g, keep
        return coordinate_mean(X[keep], None if w is None else w[keep]), keep


class KGeomedians(_RobustLloyd):
    """k-geomedians: Lloyd whose centre step is the geometric median of the cluster.

    Trimmed k-means without the trimming (Ghosh et al. 2019, §6.1). Parameters
    and attributes as :class:`TrimmedKMeans` (``inlier_mask_`` is all True).
    """

    def _center(self, X, w):
        return geometric_median(X, w), np.ones(len(X), dtype=bool)


class KMeansLloyd(_RobustLloyd):
    """Classical Lloyd (mean centres) with the same init options and history: the non-robust
    reference (scikit-learn's ``KMeans`` from the same ``init`` gives the same labels)."""

    coincident_once = False
    uses_spare = False

    def _center(self, X, w):
        return coordinate_mean(X, w), np.ones(len(X), dtype=bool)
