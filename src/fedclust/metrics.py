"""Clustering quality: k-means cost, matched accuracy, ARI, NMI.

``matched_accuracy`` is the "accuracy" of the k-FED paper (Dennis, Li, Smith,
ICML 2021, Table 1): predicted clusters are matched one-to-one to true classes
by the Hungarian algorithm on the contingency table, and the fraction of points
whose matched class equals their true class is reported. Numbers of clusters
and classes may differ; unmatched clusters count as wrong.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn import metrics as _skm

from .core.kmeans import sum_by_label, assign
from .core.validation import check_array
from .core.exceptions import ValidationError

__all__ = [
    "kmeans_cost",
    "partition_cost",
    "cost_ratio",
    "match_labels",
    "matched_accuracy",
    "misclustering_rate",
    "adjusted_rand",
    "normalized_mutual_info",
    "clustering_report",
    "summarize_test_accuracy",
]


def _check_labels(y: Any, name: str) -> np.ndarray:
    """A non-empty 1-D label array (any hashable numeric/str values)."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValidationError(
            f"{name} must be 1-D (one label per point), got shape {arr.shape}; "
            "use .ravel() on a column vector")
    if arr.shape[0] == 0:
        raise ValidationError(f"{name} is empty: give at least one label")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ValidationError(f"{name} contains NaN or inf; labels must be finite")
    return arr


def _check_label_pair(y_true: Any, y_pred: Any) -> tuple[np.ndarray, np.ndarray]:
    a = _check_labels(y_true, "y_true")
    b = _check_labels(y_pred, "y_pred")
    if a.shape[0] != b.shape[0]:
        raise ValidationError(
            f"y_true has {a.shape[0]} labels but y_pred has {b.shape[0]}; "
            "they must label the same points")
    return a, b


def _check_X(X: Any) -> np.ndarray:
    X = check_array(X, "X")
    if X.shape[0] == 0:
        raise ValidationError("X has 0 rows: give at least one point")
    return X


def _check_centers(centers: Any, d: int, name: str = "centers") -> np.ndarray:
    C = check_array(centers, name)
    if C.shape[0] == 0:
        raise ValidationError(f"{name} has 0 rows: give at least one center")
    if C.shape[1] != d:
        raise ValidationError(
            f"{name} has {C.shape[1]} features but X has {d}; they must match")
    return C


def kmeans_cost(X: Any, centers: Any, sample_weight: Any = None) -> float:
    """k-means cost: sum of squared distances of each point to its nearest center.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)
    sample_weight : array-like of shape (n,), optional
        Non-negative weight of every point (default 1).

    Returns
    -------
    float
        ``sum_i w_i * min_j ||x_i - c_j||^2``. O(n k d) time, memory O(block k).
    """
    X = _check_X(X)
    C = _check_centers(centers, X.shape[1])
    _, mind = assign(X.astype(np.float64, copy=False), C.astype(np.float64, copy=False))
    if sample_weight is None:
        return float(mind.sum())
    w = check_array(sample_weight, "sample_weight", ndim=1, dtype=np.float64)
    if w.shape[0] != X.shape[0]:
        raise ValidationError(
            f"sample_weight has {w.shape[0]} entries but X has {X.shape[0]} rows")
    if (w < 0).any():
        raise ValidationError(
            f"sample_weight has a negative entry {w.min()}; weights must be >= 0")
    return float(mind @ w)


def partition_cost(X: Any, labels: Any) -> float:
    """k-means cost of a given partition, each part represented by its own mean.

    Parameters
    ----------
    X : array-like of shape (n, d)
    labels : array-like of shape (n,)
        Part of every point (any values; parts need not be 0..k-1).

    Returns
    -------
    float
        ``sum_parts sum_{i in part} ||x_i - mean(part)||^2`` (the oracle cost
        ``phi*`` of the k-FED paper's Fig. 2 when ``labels`` are the oracle).
    """
    X = _check_X(X).astype(np.float64, copy=False)
    lab = _check_labels(labels, "labels")
    if lab.shape[0] != X.shape[0]:
        raise ValidationError(
            f"labels has {lab.shape[0]} entries but X has {X.shape[0]} rows")
    _, inv = np.unique(lab, return_inverse=True)
    inv = inv.ravel()
    k = int(inv.max()) + 1
    counts = np.bincount(inv, minlength=k).astype(np.float64)
    sums = sum_by_label(X, inv, k, np.zeros((k, X.shape[1])))
    means = sums / counts[:, None]
    # Direct residuals (no expansion): exact even for far-from-origin data.
    resid = X - means[inv]
    return float(np.einsum("ij,ij->", resid, resid))


def cost_ratio(X: Any, centers: Any, reference_centers: Any) -> float:
    """``kmeans_cost(X, centers) / kmeans_cost(X, reference_centers)``.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centers : array-like of shape (k, d)
    reference_centers : array-like of shape (k_ref, d)

    Returns
    -------
    float
        1.0 means as good as the reference; ``inf`` if the reference cost is 0
        and the cost is not (1.0 when both are 0).
    """
    X = _check_X(X)
    num = kmeans_cost(X, centers)
    den = kmeans_cost(X, _check_centers(reference_centers, X.shape[1], "reference_centers"))
    if den == 0.0:
        return 1.0 if num == 0.0 else float("inf")
    return num / den


def _contingency(y_true: np.ndarray, y_pred: np.ndarray):
    classes, ti = np.unique(y_true, return_inverse=True)
    clusters, pi = np.unique(y_pred, return_inverse=True)
    table = np.zeros((len(clusters), len(classes)), dtype=np.int64)
    np.add.at(table, (pi.ravel(), ti.ravel()), 1)
    return table, classes, clusters


def match_labels(y_true: Any, y_pred: Any) -> dict[Any, Any]:
    """Best one-to-one map from predicted clusters to true classes.

    Maximises the number of points whose cluster maps to their class
    (Hungarian algorithm on the contingency table,
    ``scipy.optimize.linear_sum_assignment``).

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n,)

    Returns
    -------
    dict
        ``{cluster: class}`` for ``min(n_clusters, n_classes)`` clusters;
        clusters left without a class (more clusters than classes) are absent.
    """
    a, b = _check_label_pair(y_true, y_pred)
    table, classes, clusters = _contingency(a, b)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return {clusters[r].item(): classes[c].item() for r, c in zip(rows, cols)}


def matched_accuracy(y_true: Any, y_pred: Any) -> float:
    """Fraction of points correctly labelled after the best cluster-class matching.

    Parameters
    ----------
    y_true, y_pred : array-like of shape (n,)

    Returns
    -------
    float in [0, 1]
        Invariant to relabelling clusters or classes. With more clusters than
        classes the surplus clusters count as errors.
    """
    a, b = _check_label_pair(y_true, y_pred)
    table, _, _ = _contingency(a, b)
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum()) / a.shape[0]


def misclustering_rate(y_true: Any, y_pred: Any) -> float:
    """``1 - matched_accuracy(y_true, y_pred)``."""
    return 1.0 - matched_accuracy(y_true, y_pred)


def adjusted_rand(y_true: Any, y_pred: Any) -> float:
    """Adjusted Rand index (``sklearn.metrics.adjusted_rand_score``)."""
    a, b = _check_label_pair(y_true, y_pred)
    return float(_skm.adjusted_rand_score(a, b))


def normalized_mutual_info(y_true: Any, y_pred: Any) -> float:
    """Normalised mutual information (``sklearn.metrics.normalized_mutual_info_score``,
    arithmetic normalisation)."""
    a, b = _check_label_pair(y_true, y_pred)
    return float(_skm.normalized_mutual_info_score(a, b))


def clustering_report(X: Any, y_true: Any, labels: Any, centers: Any,
                      reference_centers: Any = None) -> dict[str, float]:
    """All the usual scores of one clustering in one dict.

    Parameters
    ----------
    X : array-like of shape (n, d)
    y_true : array-like of shape (n,)
        True classes.
    labels : array-like of shape (n,)
        Predicted clusters.
    centers : array-like of shape (k, d)
    reference_centers : array-like of shape (k_ref, d), optional
        Adds ``cost_ratio`` (e.g. against centralised k-means or the oracle).

    Returns
    -------
    dict[str, float]
        Keys ``accuracy``, ``ari``, ``nmi``, ``misclustering_rate``,
        ``kmeans_cost`` and, with a reference, ``cost_ratio``.
    """
    X = _check_X(X)
    a, b = _check_label_pair(y_true, labels)
    if a.shape[0] != X.shape[0]:
        raise ValidationError(
            f"y_true has {a.shape[0]} labels but X has {X.shape[0]} rows")
    acc = matched_accuracy(a, b)
    out = {
        "accuracy": acc,
        "ari": adjusted_rand(a, b),
        "nmi": normalized_mutual_info(a, b),
        "misclustering_rate": 1.0 - acc,
        "kmeans_cost": kmeans_cost(X, centers),
    }
    if reference_centers is not None:
        out["cost_ratio"] = cost_ratio(X, centers, reference_centers)
    return out


def summarize_test_accuracy(device_accuracy: Any, n_test: Any) -> dict[str, float]:
    """The one definition of a run's test accuracy, from each device's accuracy (Z,) and
    number of test rows (Z,): ``test_accuracy`` pooled over every test row (a device's
    accuracy weighted by its rows), the headline of every family; ``test_accuracy_device_mean``
    and ``test_accuracy_std``: mean and spread over the devices with test rows."""
    acc = np.asarray(device_accuracy, dtype=np.float64)
    n = np.asarray(n_test, dtype=np.float64)
    has = n > 0
    return {"test_accuracy": float(acc[has] @ n[has] / n[has].sum()),
            "test_accuracy_device_mean": float(np.mean(acc[has])),
            "test_accuracy_std": float(np.std(acc[has]))}
