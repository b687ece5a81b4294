"""Robust aggregation of vectors, shared by several families.

Coordinate-wise rules (mean, trimmed mean, median) combine model updates in
FedAvg-style rounds (:mod:`fedclust.fl`) and the Byzantine-robust gradient
rounds and clustering of :mod:`fedclust.robust`; k-FED's robust server uses
them too. They live here because more than one wing needs them.

Yin, Chen, Ramchandran & Bartlett, "Byzantine-robust distributed learning:
towards optimal statistical rates", ICML 2018 (coordinate-wise median and
trimmed mean); Ghosh, Hong, Yin & Ramchandran, "Robust federated learning in a
heterogeneous environment" (2019).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from .exceptions import ValidationError
from .validation import check_float, check_int

__all__ = ["coordinate_mean", "trimmed_mean", "coordinate_median", "geometric_median",
           "aggregate", "AGGREGATORS"]

AGGREGATORS = ("mean", "trimmed-mean", "median")


def _check_vectors(X: Any, weights: Any) -> tuple[np.ndarray, np.ndarray | None]:
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValidationError(f"expected a non-empty (m, p) array of vectors, got shape {X.shape}")
    if not np.isfinite(X).all():
        raise ValidationError("vectors to aggregate contain NaN or inf")
    if weights is None:
        return X, None
    w = np.asarray(weights, dtype=float)
    if w.shape != (X.shape[0],) or not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
        raise ValidationError(
            f"weights must be {X.shape[0]} finite non-negative numbers with a positive sum, "
            f"got shape {w.shape}")
    return X, w


def coordinate_mean(X: Any, weights: Any = None) -> np.ndarray:
    """(Weighted) mean of the rows of X (m, p) -> (p,)."""
    X, w = _check_vectors(X, weights)
    return X.mean(axis=0) if w is None else (w @ X) / w.sum()


def trimmed_mean(X: Any, beta: float, weights: Any = None) -> np.ndarray:
    """Coordinate-wise β-trimmed mean of the rows of X (m, p) -> (p,).

    In every coordinate the ``floor(β m)`` smallest and largest values are
    dropped and the rest averaged. With ``weights``, β is a fraction of the
    total weight: each coordinate's sorted values lose weight β·W from each end
    (partially for the boundary value) and the weighted mean of what remains
    is returned; unit weights give the unweighted rule exactly when β·m is an
    integer. ``0 <= β < 0.5``.
    """
    beta = check_float(beta, "beta", min_value=0.0)
    if beta >= 0.5:
        raise ValidationError(f"beta={beta} must be < 0.5 (nothing would be left to average)")
    X, w = _check_vectors(X, weights)
    m = X.shape[0]
    if w is None:
        b = int(math.floor(beta * m))
        S = np.sort(X, axis=0)
        return S[b:m - b].mean(axis=0)
    order = np.argsort(X, axis=0, kind="stable")
    S = np.take_along_axis(X, order, axis=0)
    W = w[order]                                   # (m, p): weight of each sorted value
    total = w.sum()
    cut = beta * total
    hi_edge = np.cumsum(W, axis=0)                 # cumulative weight up to and incl. each value
    lo_edge = hi_edge - W
    # weight kept of each value: its overlap with [cut, total - cut]
    kept = np.clip(np.minimum(hi_edge, total - cut) - np.maximum(lo_edge, cut), 0.0, None)
    return (kept * S).sum(axis=0) / kept.sum(axis=0)


def coordinate_median(X: Any, weights: Any = None) -> np.ndarray:
    """Coordinate-wise median of the rows of X (m, p) -> (p,); weighted: the lower weighted median
    averaged with the upper one where the cumulative weight hits exactly half."""
    X, w = _check_vectors(X, weights)
    if w is None:
        return np.median(X, axis=0)
    order = np.argsort(X, axis=0, kind="stable")
    S = np.take_along_axis(X, order, axis=0)
    c = np.cumsum(w[order], axis=0)
    half = 0.5 * w.sum()
    lo = np.argmax(c >= half - 1e-12 * half, axis=0)
    hi = np.argmax(c > half + 1e-12 * half, axis=0)
    cols = np.arange(X.shape[1])
    return 0.5 * (S[lo, cols] + S[hi, cols])


def aggregate(X: Any, rule: str = "mean", *, weights: Any = None, beta: float = 0.1) -> np.ndarray:
    """Combine the rows of X with ``rule`` in :data:`AGGREGATORS` (``beta`` for the trimmed mean)."""
    if rule == "mean":
        return coordinate_mean(X, weights)
    if rule == "trimmed-mean":
        return trimmed_mean(X, beta, weights)
    if rule == "median":
        return coordinate_median(X, weights)
    raise ValidationError(f"aggregator={rule!r} must be one of {list(AGGREGATORS)}")


def geometric_median(X: Any, weights: Any = None, *, eps: float = 1e-12, max_iter: int = 1000,
                     tol: float = 1e-12) -> np.ndarray:
    """(Weighted) geometric median of the rows of X (m, p) -> (p,).

    The minimiser of ``sum_i w_i ||z - x_i||``. Breakdown point 1/2: fewer than
    half the weight, placed anywhere, moves it a bounded distance.

    The method:

    1. *Collinear points* (rank-1 after centring, including one repeated
       point): the problem is one-dimensional and the answer is the weighted
       median along the line, computed exactly (the midpoint of the median
       interval when the weight splits evenly; a data row, bit for bit, when
       the median is attained at one).
    2. Otherwise Weiszfeld's iteration ``z <- sum(w_i x_i / d_i) / sum(w_i / d_i)``
       with ``d_i = max(||z - x_i||, eps * scale)`` (the ε-smoothing that keeps
       it defined when ``z`` lands on a data point; Pillutla, Kakade & Harchaoui
       2019), started at the coordinate-wise median and stopped when a step
       moves less than ``tol * scale`` (``scale``: the mean distance of the
       rows to their mean).
    3. *Data-point check*: the row nearest the iterate is returned exactly
       when it satisfies the optimality condition
       ``||sum_{x_i != x_j} w_i (x_j - x_i)/||x_j - x_i|| || <= W_j`` (``W_j``
       the weight sitting on it) — e.g. a point holding half the weight or more.

    Parameters
    ----------
    X : array-like (m, p)
        Finite vectors (a 1-D array is m scalars).
    weights : array-like (m,), optional
        Non-negative weights with a positive sum; zero-weight rows are ignored.
    eps : float, default=1e-12
        Smoothing floor on distances, relative to the data scale.
    max_iter : int, default=1000
        Weiszfeld iterations (a ``RuntimeWarning`` if the test is not met).
    tol : float, default=1e-12
        Convergence test on the step length, relative to the data scale.

    Notes
    -----
    O(m p) per iteration; Weiszfeld converges linearly away from data points.
    Weiszfeld (1937); Vardi & Zhang (2000); Ghosh, Hong, Yin & Ramchandran
    (2019), Algorithm 2 (the center estimate inside trimmed k-means).
    """
    eps = check_float(eps, "eps", min_value=0.0)
    tol = check_float(tol, "tol", min_value=0.0)
    max_iter = check_int(max_iter, "max_iter", min_value=1)
    X, w = _check_vectors(X, weights)
    if w is not None:
        keep = w > 0
        X, w = X[keep], w[keep]
    else:
        w = np.ones(X.shape[0])
    return _geometric_median(X, w, eps, max_iter, tol)[0]


def _geometric_median(X: np.ndarray, w: np.ndarray, eps: float, max_iter: int,
                      tol: float) -> tuple[np.ndarray, int]:
    """Clean input (finite, positive weights); returns (median, Weiszfeld iterations)."""
    m = X.shape[0]
    if m == 1:
        return X[0].copy(), 0
    mean = (w @ X) / w.sum()
    C = X - mean
    scale = float(np.sqrt((C * C).sum(axis=1)).mean())
    if scale == 0.0:                      # every row is the same point
        return X[0].copy(), 0
    # rank-1 test on the centred rows: the second singular value is ~0
    s = np.linalg.svd(C, compute_uv=False) if C.shape[1] > 1 else np.array([1.0])
    if len(s) < 2 or s[1] <= 1e-12 * s[0]:
        return _median_on_line(X, w, C, mean), 0
    z = coordinate_median(X, w)
    floor = eps * scale
    n_iter = 0
    converged = False
    for n_iter in range(1, max_iter + 1):
        D = X - z
        dist = np.sqrt(np.einsum("ij,ij->i", D, D))
        inv = w / np.maximum(dist, floor)
        z_new = (inv @ X) / inv.sum()
        step = float(np.linalg.norm(z_new - z))
        z = z_new
        if step <= tol * scale:
            converged = True
            break
    j = int(np.argmin(((X - z) ** 2).sum(axis=1)))
    if _is_optimal_at_point(X, w, j):
        return X[j].copy(), n_iter
    if not converged:
        warnings.warn(f"geometric_median: Weiszfeld did not meet tol={tol} in "
                      f"max_iter={max_iter} iterations", RuntimeWarning, stacklevel=3)
    return z, n_iter


def _is_optimal_at_point(X: np.ndarray, w: np.ndarray, j: int) -> bool:
    """Subgradient test: 0 is in the subdifferential of the objective at row j."""
    D = X[j] - X
    dist = np.sqrt(np.einsum("ij,ij->i", D, D))
    same = dist == 0.0
    pull = ((w[~same] / dist[~same])[:, None] * D[~same]).sum(axis=0)
    return bool(np.linalg.norm(pull) <= w[same].sum() * (1.0 + 1e-12))


def _median_on_line(X: np.ndarray, w: np.ndarray, C: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Exact weighted median of collinear rows: the 1-D weighted median along their line."""
    far = int(np.argmax((C * C).sum(axis=1)))
    u = C[far] / np.linalg.norm(C[far])
    t = C @ u
    order = np.argsort(t, kind="stable")
    cw = np.cumsum(w[order])
    half = 0.5 * cw[-1]
    lo = order[int(np.searchsorted(cw, half * (1 - 1e-12)))]
    hi = order[int(np.searchsorted(cw, half * (1 + 1e-12), side="right"))] if (
        cw[-1] > half * (1 + 1e-12)) else lo
    if t[lo] == t[hi]:
        return X[lo].copy()               # attained at a data row: return it bit for bit
    return 0.5 * (X[lo] + X[hi])          # even split: the midpoint of the median interval
