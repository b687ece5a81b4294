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
from typing import Any

import numpy as np

from .exceptions import ValidationError
from .validation import check_float

__all__ = ["coordinate_mean", "trimmed_mean", "coordinate_median", "aggregate", "AGGREGATORS"]

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
    if w.shape != (X.shape[0],) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
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
