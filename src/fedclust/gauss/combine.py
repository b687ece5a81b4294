"""Combine the server's mixture components into clusters (``combine=`` of
:class:`~fedclust.FedGaussClustering`): a last step on the merged model, no extra round.

**By unimodality** (:func:`combine_unimodal`; Hennig (2010), "Methods for merging Gaussian
mixture components", Adv. Data Anal. Classif. 4; Ray & Lindsay (2005), Ann. Stat. 33).
Every critical point of a mixture of two Gaussians lies on its ridgeline
x*(a) = [(1 - a) C1^-1 + a C2^-1]^-1 [(1 - a) C1^-1 m1 + a C2^-1 m2], a in [0, 1], so two
clusters, weighted by their counts, have one mode exactly when the density along that
curve has one maximum. While such a pair exists, the closest one (Bhattacharyya distance)
becomes one cluster. A pair the density separates into two modes stays apart, so a model
without unimodal pairs is left as it is.

**By entropy** (:func:`combine_by_entropy`; Baudry, Raftery, Celeux, Lo & Gottardo (2010),
"Combining mixture components for clustering", J. Comput. Graph. Stat. 19(2)). Two
components k, l are combined when the entropy of the posterior assignments,

    Ent(K) = - sum_i sum_k t_ik log t_ik,

drops the most by replacing their posteriors with the sum ``t_k + t_l``; then the next
pair, down to one cluster. The number of clusters is the change point of Ent(K) against K
(a continuous two-segment linear fit, least squares over the break): before it each
combination removes much entropy (components that describe one cluster), after it little.
The fit always finds a break, so this rule always combines something once there are
three components or more.

The server holds no rows, so the sum over rows is an expectation under the model,
``N sum_k w_k E_{x ~ N(mu_k, Sigma_k)}[-sum_l t_l(x) log t_l(x)]``, estimated with the
same ``n_points`` quasi-random points per component (an unscrambled Sobol sequence mapped
through the normal quantile: deterministic, no random state, so the result depends only
on the model). The posteriors are the model's own (:meth:`ClusterSet.log_scores`, what
``predict_proba`` uses). Either way a combined cluster is stored as one Gaussian with the
exact pooled statistics (n, mean, scatter) of its components, like every merge of the
server, and the step depends only on the merged model, so ``forget`` stays exact.
Work (entropy): O(K^2 n_points D^2) for the posteriors and O(K^3 n_points) for the
combinations (the pair scores are kept; a combination rescores one column against the
others).
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax, xlogy
from scipy.stats import norm, qmc

from .model import ClusterSet
from .stats import merge_clusters

__all__ = ["combine_by_entropy", "combine_unimodal", "model_points", "model_posteriors",
           "entropy_path", "change_point"]

#: quasi-random points per component (a power of two keeps Sobol's balance)
N_POINTS = 256
#: points on the ridgeline where the unimodality of a pair is checked
N_ALPHA = 201
#: posteriors below this add nothing measurable to a pair's entropy drop
_TINY = 1e-12


def model_points(cs: ClusterSet, n_points: int = N_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Quasi-random points drawn from every component of ``cs`` and their weights.

    Returns
    -------
    points : ndarray of shape (C * n_points, D)
        Rows ``k * n_points`` to ``(k + 1) * n_points - 1`` come from component ``k``
        (the same Sobol points mapped through its mean and covariance).
    weight : ndarray of shape (C * n_points,)
        ``n_k / n_points``: summing ``weight * f(point)`` estimates the sum of ``f`` over
        the rows the model describes.
    """
    C, D = cs.C, cs.D
    sobol = qmc.Sobol(D, scramble=False)
    sobol.fast_forward(1)   # the first point is 0 (an infinite quantile)
    z = norm.ppf(sobol.random(n_points))
    cov = cs.covariance(np.arange(C))
    pts = np.empty((C * n_points, D))
    for k in range(C):
        root = np.linalg.cholesky(cov[k]) if cs.full else np.diag(np.sqrt(cov[k]))
        pts[k * n_points:(k + 1) * n_points] = cs.mu[k] + z @ root.T
    return pts, np.repeat(cs.n[:C] / n_points, n_points)


def model_posteriors(cs: ClusterSet, n_points: int = N_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The model's posteriors (``predict_proba``, shape (C * n_points, C)) at
    :func:`model_points`, and the points' weights."""
    pts, weight = model_points(cs, n_points)
    return softmax(cs.log_scores(pts, "likelihood"), axis=1), weight


def entropy_path(T: np.ndarray, weight: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Baudry et al.'s greedy combinations of the columns of posteriors ``T`` (m, K).

    Returns
    -------
    merges : list of (a, b), length K - 1
        Column ``b`` is added to column ``a`` (a < b) and removed; the indices refer to
        the columns left after the previous combinations.
    entropy : ndarray of shape (K,)
        ``entropy[j]`` is the weighted posterior entropy with ``K - j`` clusters.
    """
    T = np.array(T, float)
    w = np.asarray(weight, float)
    K = T.shape[1]
    own = -(w[:, None] * xlogy(T, T)).sum(axis=0)
    # drop[a, b] (a < b): entropy removed by summing columns a and b; it depends on those
    # two columns only, so a combination changes one row and one column of it
    drop = np.full((K, K), -np.inf)
    for p in range(K - 1):
        drop[p, p + 1:] = _drops(T, w, own, p, np.arange(p + 1, K))
    alive = list(range(K))
    ent = [float(own.sum())]
    merges: list[tuple[int, int]] = []
    while len(alive) > 1:
        p, q = np.unravel_index(int(np.argmax(drop)), drop.shape)
        p, q = int(p), int(q)
        ent.append(ent[-1] - float(drop[p, q]))
        merges.append((alive.index(p), alive.index(q)))
        T[:, p] += T[:, q]
        own[p] = -(w * xlogy(T[:, p], T[:, p])).sum()
        alive.remove(q)
        drop[q, :] = -np.inf
        drop[:, q] = -np.inf
        others = np.array([k for k in alive if k != p], dtype=np.int64)
        if others.size:
            d = _drops(T, w, own, p, others)
            lo, hi = np.minimum(p, others), np.maximum(p, others)
            drop[lo, hi] = d
    return merges, np.array(ent)


def _drops(T: np.ndarray, w: np.ndarray, own: np.ndarray, p: int, others: np.ndarray
           ) -> np.ndarray:
    """Entropy removed by summing column ``p`` with each of the columns ``others``:
    sum_i w_i [(t_p + t_b) log(t_p + t_b) - t_p log t_p - t_b log t_b], over the rows
    where t_p > 1e-12 (elsewhere a row adds less than ~1e-10 of its weight)."""
    rows = T[:, p] > _TINY
    tp = T[rows, p][:, None]
    tb = T[rows][:, others]
    f = xlogy(tp + tb, tp + tb) - xlogy(tp, tp) - xlogy(tb, tb)
    return w[rows] @ f


def change_point(entropy: np.ndarray) -> int:
    """Number of clusters at the change point of ``entropy`` (Ent(K0), ..., Ent(1)).

    A continuous two-segment linear fit of Ent against K, break at an integer K in
    2..K0 - 1, least squares; with fewer than 3 points nothing is combined (K0)."""
    ent = np.asarray(entropy, float)
    K0 = ent.size
    if K0 < 3:
        return K0
    k = np.arange(K0, 0, -1, dtype=float)
    best, best_k = np.inf, K0
    for brk in range(K0 - 1, 1, -1):
        X = np.column_stack([np.ones(K0), k, np.maximum(k - brk, 0.0)])
        coef, *_ = np.linalg.lstsq(X, ent, rcond=None)
        sse = float(((X @ coef - ent) ** 2).sum())
        if sse < best:   # ties: the larger K (fewer combinations)
            best, best_k = sse, brk
    return best_k


def combine_by_entropy(cs: ClusterSet, n_points: int = N_POINTS) -> int:
    """Combine the components of ``cs`` down to the entropy change point, in place.

    Every combined cluster gets the exact pooled (n, mean, scatter) of its components and
    the identity (uid) of the first of them; the others' uids map to it in ``cs.joined``.
    Clustering only (``n_classes = 0``); returns the number of components removed.
    """
    C = cs.C
    if cs.n_classes or C < 3:
        return 0
    T, weight = model_posteriors(cs, n_points)
    merges, ent = entropy_path(T, weight)
    K = change_point(ent)
    groups = [[k] for k in range(C)]
    for p, q in merges[:C - K]:
        groups[p] += groups.pop(q)
    for g in groups:
        g.sort()
        p = g[0]
        for q in g[1:]:
            P, Q = slice(p, p + 1), slice(q, q + 1)
            n, mu, S = merge_clusters(cs.n[P], cs.mu[P], cs.S[P], cs.n[Q], cs.mu[Q], cs.S[Q])
            cs.n[p], cs.mu[p], cs.S[p] = n[0], mu[0], S[0]
            cs.last[p] = max(cs.last[p], cs.last[q])
            cs.joined[int(cs.uid[q])] = int(cs.uid[p])
        if len(g) > 1:
            cs.refresh(np.array([p]))
    keep = np.array(sorted(g[0] for g in groups), dtype=np.int64)
    cs.keep_clusters(keep)
    return C - int(keep.size)


def _ridgeline_unimodal(w1: float, m1: np.ndarray, C1: np.ndarray, w2: float, m2: np.ndarray,
                        C2: np.ndarray, n_alpha: int = N_ALPHA) -> bool:
    """True when the two-component mixture ``w1 N(m1, C1) + w2 N(m2, C2)`` has one mode.

    Ray & Lindsay (2005): every critical point of a two-Gaussian mixture lies on the
    ridgeline x*(a) = [(1 - a) C1^-1 + a C2^-1]^-1 [(1 - a) C1^-1 m1 + a C2^-1 m2],
    a in [0, 1], so the mixture is unimodal exactly when its density along the ridgeline
    has one local maximum (checked on ``n_alpha`` points of a)."""
    P1, P2 = np.linalg.inv(C1), np.linalg.inv(C2)
    a = np.linspace(0.0, 1.0, n_alpha)[:, None, None]
    A = (1.0 - a) * P1 + a * P2
    b = (1.0 - a[:, :, 0]) * (P1 @ m1) + a[:, :, 0] * (P2 @ m2)
    x = np.linalg.solve(A, b[:, :, None])[:, :, 0]
    logs = []
    for w, m, P in ((w1, m1, P1), (w2, m2, P2)):
        d = x - m
        logs.append(np.log(w) + 0.5 * np.linalg.slogdet(P)[1]
                    - 0.5 * np.einsum("id,de,ie->i", d, P, d))
    h = np.logaddexp(*logs)
    step = np.diff(h)
    step = step[np.abs(step) > 1e-12 * (1.0 + np.abs(h).max())]
    if step.size == 0:
        return True
    up = step > 0
    peaks = int((up[:-1] & ~up[1:]).sum()) + int(not up[0]) + int(up[-1])
    return peaks <= 1


def _bhattacharyya(m1, C1, m2, C2) -> float:
    C = 0.5 * (C1 + C2)
    d = m2 - m1
    return float(0.125 * d @ np.linalg.solve(C, d) + 0.5 * (
        np.linalg.slogdet(C)[1] - 0.5 * (np.linalg.slogdet(C1)[1] + np.linalg.slogdet(C2)[1])))


def combine_unimodal(cs: ClusterSet, n_alpha: int = N_ALPHA) -> int:
    """Combine pairs of components whose two-component mixture is unimodal, in place.

    Hennig (2010), "Methods for merging Gaussian mixture components" (ridgeline
    unimodality, Ray & Lindsay 2005): while some pair of clusters, weighted by their
    counts, has a single mode (:func:`_ridgeline_unimodal`, with the model's covariances),
    the closest such pair (Bhattacharyya distance) becomes one cluster with the pooled
    statistics. Clusters whose mixture has two modes stay apart, so a model without
    such pairs is left as it is. Clustering only; returns the number of merges.
    Work: O(K^2 n_alpha D^3) for the first scores, O(K n_alpha D^3) per merge.
    """
    if cs.n_classes or cs.C < 2:
        return 0
    C0 = cs.C
    merges = 0
    score = np.full((C0, C0), np.inf)   # Bhattacharyya distance of the unimodal pairs

    def rescore(p: int, others) -> None:
        cov = cs.covariance(np.arange(cs.C))
        for q in others:
            uni = _ridgeline_unimodal(cs.n[p], cs.mu[p], _full(cs, cov[p]), cs.n[q],
                                      cs.mu[q], _full(cs, cov[q]), n_alpha)
            s = _bhattacharyya(cs.mu[p], _full(cs, cov[p]), cs.mu[q], _full(cs, cov[q])) \
                if uni else np.inf
            score[min(p, q), max(p, q)] = s

    for p in range(C0 - 1):
        rescore(p, range(p + 1, C0))
    alive = np.ones(C0, bool)
    while np.isfinite(score).any():
        p, q = np.unravel_index(int(np.argmin(score)), score.shape)
        p, q = int(p), int(q)
        P, Q = slice(p, p + 1), slice(q, q + 1)
        n, mu, S = merge_clusters(cs.n[P], cs.mu[P], cs.S[P], cs.n[Q], cs.mu[Q], cs.S[Q])
        cs.n[p], cs.mu[p], cs.S[p] = n[0], mu[0], S[0]
        cs.last[p] = max(cs.last[p], cs.last[q])
        cs.joined[int(cs.uid[q])] = int(cs.uid[p])
        cs.refresh(np.array([p]))
        alive[q] = False
        cs.n[q] = 0.0
        score[q, :] = np.inf
        score[:, q] = np.inf
        merges += 1
        rescore(p, [k for k in np.flatnonzero(alive) if k != p])
    cs.keep_clusters(np.flatnonzero(alive))
    return merges


def _full(cs: ClusterSet, cov: np.ndarray) -> np.ndarray:
    return cov if cs.full else np.diag(cov)
