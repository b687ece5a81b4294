"""Exact, mergeable statistics (river / Birch style) for evolving Gaussian clusters.

Everything here is a pure function over arrays:

* global per-feature statistics ``(count, mean, m2)`` merged with Chan's
  pairwise formula (the pooled variance of the union, exactly);
* cluster statistics ``(n, mu, S)`` (S the scatter matrix sum (x - mu)(x - mu)^T)
  merged exactly: ``S_pq = S_p + S_q + n_p n_q / n_pq (mu_p - mu_q)(mu_p - mu_q)^T``;
* packing of a symmetric scatter into its upper triangle (what crosses the wire);
* the default scale rule (:func:`feature_variances`, :func:`prior_variances`).

Chan, Golub & LeVeque, "Algorithms for computing the sample variance", 1983.
"""

from __future__ import annotations

import numpy as np

__all__ = ["merge_moments", "moments", "merge_clusters", "pack_scatter", "unpack_scatter",
           "feature_variances", "prior_variances", "neighbour_variance", "psd_violation", "class_moments",
           "merge_class_moments", "fisher_scores", "fisher_mask"]


def moments(X: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(count, mean, m2) of the rows of X; m2 = sum of squared deviations per feature."""
    n = X.shape[0]
    if n == 0:
        return 0, np.zeros(X.shape[1]), np.zeros(X.shape[1])
    mean = X.mean(axis=0)
    return n, mean, ((X - mean) ** 2).sum(axis=0)


def merge_moments(a: tuple[float, np.ndarray, np.ndarray],
                  b: tuple[float, np.ndarray, np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
    """Chan's exact merge of two (count, mean, m2) triples."""
    na, ma, sa = a
    nb, mb, sb = b
    if na == 0:
        return nb, np.array(mb, dtype=float), np.array(sb, dtype=float)
    if nb == 0:
        return na, np.array(ma, dtype=float), np.array(sa, dtype=float)
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), sa + sb + delta ** 2 * (na * nb / n)


def merge_clusters(n_p: np.ndarray, mu_p: np.ndarray, S_p: np.ndarray,
                   n_q: np.ndarray, mu_q: np.ndarray, S_q: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled (n, mu, S) of cluster pairs (broadcast over a leading axis).

    ``S`` is (..., D, D) for full scatter or (..., D) for its diagonal.
    """
    n = n_p + n_q
    w = (n_q / n)[..., None]
    delta = mu_q - mu_p
    mu = mu_p + w * delta
    c = (n_p * n_q / n)[..., None]
    if S_p.ndim == mu_p.ndim + 1:
        S = S_p + S_q + c[..., None] * delta[..., :, None] * delta[..., None, :]
    else:
        S = S_p + S_q + c * delta ** 2
    return n, mu, S


def pack_scatter(S: np.ndarray) -> np.ndarray:
    """(c, D, D) symmetric -> (c, D(D+1)/2) upper triangle, row-major."""
    D = S.shape[-1]
    iu = np.triu_indices(D)
    return np.ascontiguousarray(S[:, iu[0], iu[1]])


def unpack_scatter(P: np.ndarray, D: int) -> np.ndarray:
    """Inverse of :func:`pack_scatter` (the result is exactly symmetric)."""
    iu = np.triu_indices(D)
    S = np.zeros((P.shape[0], D, D), dtype=P.dtype)
    S[:, iu[0], iu[1]] = P
    S[:, iu[1], iu[0]] = P
    return S


def psd_violation(S: np.ndarray) -> float:
    """How far the symmetric matrices S (c, D, D) or diagonals (c, D) are from PSD.

    Returns the largest ``-lambda_min / max(1, trace)`` (<= ~1e-12 for an honest scatter).
    """
    if S.shape[0] == 0:
        return 0.0
    if S.ndim == 2:
        low = S.min(axis=1)
        tr = S.sum(axis=1)
    else:
        low = np.linalg.eigvalsh(S)[:, 0]
        tr = np.trace(S, axis1=1, axis2=2)
    return float(np.max(-low / np.maximum(1.0, np.abs(tr))))


def feature_variances(count: float, m2: np.ndarray, floor: float) -> np.ndarray:
    """Per-feature variances of the data seen so far, floored feature by feature.

    A feature's variance is kept unless it is below ``floor`` times the median
    positive variance (constant or near-constant features); it is never compared
    with the *mean* variance, which one huge raw feature dominates (Breast cancer:
    raw variances span 1e-7 .. 1e5). With no data (count 0) or no positive
    variance at all, unit variances are used.
    """
    D = m2.shape[0]
    if count <= 0:
        return np.ones(D)
    var = np.asarray(m2, dtype=float) / count
    pos = var[var > 0]
    if pos.size == 0:
        return np.ones(D)
    low = floor * float(np.median(pos))
    return np.maximum(var, max(low, np.finfo(float).tiny * 1e10))


def prior_variances(var: np.ndarray, *, volume_fraction: float | None, n_r: float | None
                    ) -> np.ndarray:
    """Diagonal of a new cluster's covariance Sigma_0.

    Default (``n_r`` is None): Sigma_0 = r * diag(var) with r = volume_fraction^(2/D),
    so that the new cluster's volume (sqrt det) is ``volume_fraction`` times the
    volume of the global Gaussian, whatever D. The authors' rule
    ``diag(var / N_r)`` is used when ``n_r`` is given.
    """
    if n_r is not None:
        return var / n_r
    D = var.shape[0]
    return var * float(volume_fraction) ** (2.0 / D)


def neighbour_variance(X: np.ndarray, var: np.ndarray, n_query: int = 256) -> float:
    """Local scale of the rows X, per dimension, in units of the feature variances ``var``.

    The median over (at most ``n_query``, evenly spaced) rows of the squared distance to
    the ceil(sqrt(n) / 2)-th nearest other row, with every feature divided by its standard
    deviation, divided by D. O(n_query n D) time, O(n_query n) memory in blocks.
    """
    n, D = X.shape
    Z = X / np.sqrt(var)
    k = min(n - 1, max(1, int(np.ceil(0.5 * np.sqrt(n)))))
    rows = np.unique(np.linspace(0, n - 1, min(n, n_query)).astype(np.int64))
    q = Z[rows]
    zz = np.einsum("ij,ij->i", Z, Z)
    d2 = np.einsum("ij,ij->i", q, q)[:, None] + zz[None, :] - 2.0 * (q @ Z.T)
    d2[np.arange(rows.size), rows] = np.inf  # not its own neighbour
    kth = np.partition(np.maximum(d2, 0.0), k - 1, axis=1)[:, k - 1]
    return max(float(np.median(kth)) / D, np.finfo(float).tiny)


def class_moments(X: np.ndarray, y: np.ndarray, M: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class (count (M,), mean (M, D), m2 (M, D)) of the rows of X; y in 0..M-1."""
    D = X.shape[1]
    counts = np.bincount(y, minlength=M).astype(np.int64)
    means = np.zeros((M, D))
    m2 = np.zeros((M, D))
    for c in np.flatnonzero(counts):
        _, means[c], m2[c] = moments(X[y == c])
    return counts, means, m2


def merge_class_moments(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chan's exact merge, class by class, of two per-class (count, mean, m2) triples."""
    na, ma, sa = (np.asarray(v, dtype=float) for v in a)
    nb, mb, sb = (np.asarray(v, dtype=float) for v in b)
    n = na + nb
    safe = np.where(n > 0, n, 1.0)[:, None]
    delta = mb - ma
    mean = np.where(n[:, None] > 0, ma + delta * (nb[:, None] / safe), 0.0)
    m2 = sa + sb + delta ** 2 * (na * nb)[:, None] / safe
    return n.astype(np.int64), mean, m2


def fisher_scores(counts: np.ndarray, means: np.ndarray, m2: np.ndarray) -> np.ndarray:
    """Fisher score of every feature: between-class over within-class scatter.

    F_d = sum_c n_c (mu_cd - mu_d)^2 / sum_c m2_cd (mu_d the overall mean); a
    feature constant within every class but differing between classes scores inf,
    a feature constant everywhere 0.
    """
    n = np.asarray(counts, dtype=float)
    N = n.sum()
    if N <= 0:
        return np.zeros(means.shape[1])
    mu = (n[:, None] * means).sum(axis=0) / N
    between = (n[:, None] * (means - mu) ** 2).sum(axis=0)
    within = np.asarray(m2, dtype=float).sum(axis=0)
    tiny = np.finfo(float).tiny
    # a ratio beyond the largest float is the inf it overflows to
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        F = np.where(within > tiny, between / np.maximum(within, tiny),
                     np.where(between > tiny, np.inf, 0.0))
    return F


def fisher_mask(F: np.ndarray, kappa_f: float) -> np.ndarray:
    """Features with a Fisher score >= kappa_f x the best score (at least one is kept)."""
    if kappa_f <= 0 or F.size == 0:
        return np.ones(F.size, dtype=bool)
    best = float(np.max(F))
    if not best > 0:
        return np.ones(F.size, dtype=bool)
    keep = F >= kappa_f * best if np.isfinite(best) else np.isinf(F)
    return keep
