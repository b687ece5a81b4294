"""Outlier-robust initialisation of the robust Lloyd variants.

The paper (Ghosh, Hong, Yin & Ramchandran 2019, §5.3) projects the points on
an outlier-robust principal subspace, clusters them there with a pairwise-
distance rule, and hands the labels to trimmed k-means. Here:

* :func:`robust_subspace` — spherical PCA (Locantore et al. 1999): centre the
  points at their geometric median, scale every row to unit length (so no
  single far point dominates the covariance), keep the top right singular
  vectors. A rank-k projection of k well-separated clusters keeps their
  separation and shrinks the noise from ``σ√d`` to ``σ√k``.
* :func:`dense_points` — a point is *dense* when its distance to its q-th
  nearest neighbour (q a quarter of an average cluster's size) is at most twice the
  median such distance; isolated Byzantine points are not dense.
* ``init="k-means++"`` (default) — scikit-learn's k-means (k-means++ seeding,
  10 restarts) over the dense points only, in the projection; the initial
  centres are the groups' means in the original space (random, from the seed).
* ``init="pairwise"`` — :func:`dense_farthest_seeds`: a deterministic
  farthest-point traversal over the dense points (farthest-point seeding over
  *all* points picks the outliers first, which is what breaks plain k-FED).

**Decision.** ``"pairwise"`` was the first default; with many clusters whose
spread is comparable to their separation, farthest-first traversal takes two
extremes of an outer cluster before a central one, and the robust centre steps
cannot repair a missing centre: on the real-data benchmark (digits, k = 10,
alpha = 0.2) it failed in 4 of 20 trials (error ~2.1 = a whole cluster missed),
where k-means++ with restarts on the dense points failed in none of them.
* The paper's experiments also start from labels with a given fraction
  correct: ``fit(X, init_labels=...)`` of the clusterers takes those.
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans
from scipy.sparse import csr_matrix
from scipy.spatial import cKDTree
from scipy.sparse.csgraph import connected_components
from sklearn.neighbors import NearestNeighbors

from ..core.random import sklearn_seed
from ..core.robust import geometric_median

__all__ = ["robust_subspace", "dense_points", "dense_farthest_seeds", "supported_groups",
           "robust_init", "robust_init_groups", "INITS"]

INITS = ("pairwise", "k-means++")


def robust_subspace(X: np.ndarray, n_components: int) -> tuple[np.ndarray, np.ndarray]:
    """Spherical PCA: ``(center (d,), components (r, d))`` with r = min(n_components, d, n).

    O(n d min(n, d)) (one thin SVD).
    """
    center = geometric_median(X)
    C = X - center
    norms = np.linalg.norm(C, axis=1)
    U = C / np.where(norms > 0, norms, 1.0)[:, None]
    r = max(1, min(n_components, X.shape[1], X.shape[0]))
    _, _, Vt = np.linalg.svd(U, full_matrices=False)
    return center, Vt[:r]


#: reports closer than this fraction of the data's spread coincide
COINCIDE = 1e-6


def coincident_groups(P: np.ndarray) -> np.ndarray:
    """Group id (n,) of every row; rows closer than ``COINCIDE`` x the spread of P share one."""
    spread = float(np.sqrt(P.var(axis=0).sum()))
    if spread == 0.0:
        return np.zeros(len(P), dtype=np.int64)
    graph = NearestNeighbors(radius=COINCIDE * spread).fit(P).radius_neighbors_graph(P)
    return connected_components(graph, directed=False)[1]


def dense_points(P: np.ndarray, n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mask, r)``: r (n,) the q-th neighbour distance of every point; mask: ``r <= 2 median(r)``.

    ``q = max(1, floor(n / (4 k)))``: a point inside any cluster holding at
    least a quarter of the fair share n/k has q neighbours close by. Decision:
    q = n/(2k) (the first rule) missed the smallest honest cluster whenever it
    fell below q — n counts the Byzantine machines too, and cluster sizes vary:
    in Fig. 2b, α = 0.2, 2 of 20 trials had a cluster of 10–12 of 100 machines
    with q = 12; it was never seeded and was trimmed whole (26–28% of honest
    machines misclustered). A smaller q makes a colluding group of more than q
    machines "dense", but reports that coincide count as one point
    (:func:`coincident_groups`), so identical lies are never dense however many
    send them; only colluders who add honest-looking noise can pass, and a group
    of those larger than an honest cluster is indistinguishable from one for any
    k-clustering (measured: 20/20 trials perfect under data poisoning and
    collusion at α = 0.1 and 0.2). O(n log n) in low dimension (k-d tree),
    O(n²) at worst.
    """
    n = P.shape[0]
    q = int(min(n - 1, max(1, n // (4 * n_clusters))))
    if n < 2:
        return np.ones(n, dtype=bool), np.zeros(n)
    # Reports that coincide count once: estimates from independent machines never
    # coincide, so a colluding group of identical lies is one witness, not many.
    spot = coincident_groups(P)
    first = np.unique(spot, return_index=True)[1]
    U = P[first]
    if len(U) < 2:
        return np.ones(n, dtype=bool), np.zeros(n)
    qu = int(min(len(U) - 1, q))
    dist, _ = NearestNeighbors(n_neighbors=qu + 1).fit(U).kneighbors(U)
    r = dist[:, -1][np.searchsorted(np.unique(spot), spot)]
    med = float(np.median(r))
    mask = r <= 2.0 * med if med > 0 else r <= med
    return (mask if mask.sum() >= n_clusters else np.ones(n, dtype=bool)), r


def dense_farthest_seeds(P: np.ndarray, n_clusters: int, dense: np.ndarray,
                         r: np.ndarray) -> np.ndarray:
    """Indices (k,) of a farthest-point traversal over the dense points of P.

    The first seed is the densest point (smallest neighbour distance ``r``;
    deterministic), then each next seed is the dense point farthest from the
    seeds so far. O(n k).
    """
    idx = np.flatnonzero(dense)
    Q = P[idx]
    first = int(np.argmin(r[idx]))
    chosen = [first]
    closest = ((Q - Q[first]) ** 2).sum(axis=1)
    for _ in range(1, n_clusters):
        nxt = int(np.argmax(closest))
        chosen.append(nxt)
        closest = np.minimum(closest, ((Q - Q[nxt]) ** 2).sum(axis=1))
    return idx[np.asarray(chosen, dtype=np.int64)]


#: k-means pieces per cluster before the pieces of one cluster are merged again
OVERSEGMENT = 2
#: two pieces are one group when their medians are closer than this x the sum of their radii
MERGE = 1.5
#: ... or when their closest pair is within this x the median nearest-neighbour distance
LINK = 2.0
#: leaving groups out must cut the trimmed k-means cost to at most this fraction (by a third)
SPARE_GAIN = 2.0 / 3.0
#: a point left out of the grouping supports a group within this x its median member distance
#: (the trimming radius of :class:`fedclust.robust.TrimmedKMeans`: the points its centre step
#: would keep). Decision: a Gaussian quantile (chi-square, 1 - 1e-3: 2.35 in the 4-dim
#: projection of k = 3) misses honest tail points at 2.4-3.0, since ERMs are heavier-tailed.
REACH = 3.0


def supported_groups(P: np.ndarray, spot: np.ndarray, n_clusters: int,
                     rng: np.random.Generator, *, extra: np.ndarray | None = None,
                     extra_spot: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(labels (n,), suspect (n,) bool)``. Labels: ``0..k-1`` the k best-supported groups
    of the rows of P, ``k..`` the groups beyond k with at least ``max(3, n / (8k))``
    distinct reports (spare groups), -1 the rest; ``suspect``: the rows of those spare
    groups, also when plain k-means is chosen and absorbs them into a cluster.

    ``extra`` (e, D) with ``extra_spot`` (e,): rows left out of the grouping (the
    points that are not dense, a true cluster's tail among them) that still count as
    support of the nearest group (by distance to its median) when within ``REACH`` x the group's median member
    distance (the trimming radius of the robust Lloyd). Support ranks
    the groups, so a colluding group whose members are all dense must not outrank a
    true cluster of more machines because a few of those lie in its tail.

    k-means (k-means++ seeding, 10 restarts) cuts P into ``OVERSEGMENT x k``
    pieces; pieces whose medians are closer than ``MERGE`` x the sum of their
    radii (median member distance to the piece's median: a per-group robust
    scale), or whose closest pair is within ``LINK`` x the median
    nearest-neighbour distance (a cloud cut in two touches along the cut), are
    one group (union-find). The k groups with the most distinct
    reports (``spot``: coinciding rows count once) are kept: a colluding group
    smaller than every honest cluster is the one left over, instead of taking
    a centre and merging two true clusters. Plain k-means with k clusters
    labels P instead when fewer than k groups are found (clusters closer than
    their spread) or when leaving the other groups out does not cut the
    trimmed k-means cost by a third (``SPARE_GAIN``; squared distances capped at
    ``(3 r)²``, r the pooled median member distance of the chosen groups).
    O(n k d) per k-means iteration plus O(k² d).
    """
    n = len(P)
    K = int(min(n, OVERSEGMENT * n_clusters))
    seed = sklearn_seed(rng)
    lab = KMeans(K, n_init=10, random_state=seed).fit(P).labels_
    pieces = np.unique(lab)
    med = np.array([np.median(P[lab == j], axis=0) for j in pieces])
    rad = np.array([float(np.median(np.linalg.norm(P[lab == j] - m, axis=1)))
                    for j, m in zip(pieces, med)])
    gap = np.sqrt(((med[:, None] - med[None]) ** 2).sum(axis=2))
    close = gap <= MERGE * (rad[:, None] + rad[None, :])
    # or they touch: their closest pair is within LINK x the typical nearest-neighbour distance
    # (a cloud cut in two, however few its points, touches along the cut)
    which = np.searchsorted(pieces, lab)
    nn = cKDTree(P).query(P, k=2)[0][:, 1]
    touch = LINK * float(np.median(nn))
    for a in range(len(pieces)):
        tree = cKDTree(P[which == a])
        dist = tree.query(P[which != a], k=1)[0]
        other = which[which != a]
        for b in np.unique(other[dist <= touch]):
            close[a, b] = close[b, a] = True
    _, group_of_piece = connected_components(csr_matrix(close), directed=False)
    group = group_of_piece[np.searchsorted(pieces, lab)]
    n_groups = int(group.max()) + 1
    if n_groups < n_clusters:
        return (KMeans(n_clusters, n_init=10, random_state=seed).fit(P).labels_.astype(np.int64),
                np.zeros(n, dtype=bool))
    counted = [spot[group == g] for g in range(n_groups)]
    if extra is not None and len(extra):
        gmed = np.array([np.median(P[group == g], axis=0) for g in range(n_groups)])
        grad = np.array([float(np.median(np.linalg.norm(P[group == g] - gmed[g], axis=1)))
                         for g in range(n_groups)])
        dist = np.sqrt(((extra[:, None] - gmed[None]) ** 2).sum(axis=2))
        near = dist.argmin(axis=1)
        within = dist[np.arange(len(extra)), near] <= REACH * grad[near]
        for g in range(n_groups):
            counted[g] = np.concatenate([counted[g], extra_spot[within & (near == g)]])
    support = np.array([len(np.unique(c)) for c in counted])
    size = np.bincount(group, minlength=n_groups)
    order = np.lexsort((-size, -support))
    # a spare group must hold at least an eighth of the fair share n/k (and 3 points): a few
    # points cut off a small cloud are no group of their own
    least = max(3, -(-n // (8 * n_clusters)))
    order = np.concatenate([order[:n_clusters],
                            [g for g in order[n_clusters:] if support[g] >= least]]
                           ).astype(np.int64)
    relabel = np.full(n_groups, -1, dtype=np.int64)
    relabel[order] = np.arange(len(order))
    chosen = relabel[group]
    if n_groups == n_clusters:
        return chosen, np.zeros(n, dtype=bool)
    spare = chosen >= n_clusters
    # Leaving a group out must pay: the k chosen groups replace plain k-means only when they
    # cut the trimmed k-means cost by at least a third (squared distances capped at (3 r)^2, r the
    # pooled median distance of the chosen groups' members to their means). A colluding
    # group beyond k makes plain k-means merge two true clusters (a large cost); a loose
    # group as large as a true cluster (liars spread between two clusters) does not.
    plain = KMeans(n_clusters, n_init=10, random_state=seed).fit(P)
    mine = np.array([P[chosen == j].mean(axis=0) for j in range(n_clusters)])
    inside = chosen >= 0
    r = float(np.median(np.linalg.norm(P[inside & (chosen < n_clusters)]
                                       - mine[chosen[inside & (chosen < n_clusters)]], axis=1)))
    cap = (3.0 * r) ** 2

    def cost(centers: np.ndarray) -> float:
        d2 = ((P[:, None, :] - centers[None]) ** 2).sum(axis=2).min(axis=1)
        return float(np.minimum(d2, cap).sum())

    if cost(mine) <= SPARE_GAIN * cost(plain.cluster_centers_) or _joins_two(
            plain.labels_, chosen, n_clusters):
        return chosen, spare
    return plain.labels_.astype(np.int64), spare


#: a plain k-means cluster holds a group when it holds at least this share of its members
WHOLE = 0.9


def _joins_two(plain: np.ndarray, chosen: np.ndarray, n_clusters: int) -> bool:
    """Whether one cluster of ``plain`` holds (``WHOLE``) two of the k chosen groups.

    The chosen groups were not merged (apart by more than their spread, not touching), so
    a cluster holding two of them whole joins two clusters in order to give a group beyond
    k a centre of its own: plain k-means is then the wrong labelling, however its capped
    cost compares. Liars spread between two clusters are cut in two by plain k-means,
    never held whole next to a true cluster."""
    held = np.zeros(n_clusters, dtype=np.int64)
    for j in range(n_clusters):
        members = plain[chosen == j]
        if not len(members):
            continue
        top = np.bincount(members).argmax()
        held[j] = top if (members == top).mean() >= WHOLE else -1 - j
    return len(np.unique(held)) < n_clusters


def robust_init(X: np.ndarray, n_clusters: int, method: str,
                rng: np.random.Generator) -> np.ndarray:
    """Initial centres (k, d): robust projection, dense points, then ``method`` seeding."""
    return robust_init_groups(X, n_clusters, method, rng)[0]


def robust_init_groups(X: np.ndarray, n_clusters: int, method: str, rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(centres (k, d), spare (e, d), suspect (n,) bool)``: :func:`robust_init`, the means
    of the spare groups beyond k (the robust Lloyd keeps their members out) and the rows of
    every group beyond k (:func:`supported_groups`; ``"k-means++"`` only).

    The projection keeps k + 1 directions, so a group beyond the k clusters (a
    colluding one) stays apart from them in P.
    """
    center, V = robust_subspace(X, n_clusters + 1)
    P = (X - center) @ V.T
    dense, r = dense_points(P, n_clusters)
    if method == "k-means++":
        # the k best-supported groups of the dense points (:func:`supported_groups`): outliers
        # are not dense, so they neither seed nor pull; the centres are the groups' means in X
        idx = np.flatnonzero(dense)
        spot = coincident_groups(P)
        lab, beyond = supported_groups(P[idx], spot[idx], n_clusters, rng,
                                       extra=P[~dense], extra_spot=spot[~dense])
        means = np.array([X[idx[lab == j]].mean(axis=0) for j in range(int(lab.max()) + 1)])
        suspect = np.zeros(len(X), dtype=bool)
        suspect[idx[beyond]] = True
        return means[:n_clusters], means[n_clusters:], suspect
    seeds = dense_farthest_seeds(P, n_clusters, dense, r)
    return X[seeds].copy(), np.zeros((0, X.shape[1])), np.zeros(len(X), dtype=bool)
