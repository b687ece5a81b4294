"""Scores of the robust pipeline: estimation error (Hungarian-matched) and misclustering."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["estimation_error", "misclustering_rate", "match_clusters"]


def match_clusters(estimated: Any, truth: Any) -> np.ndarray:
    """For every true vector (k, p) the index of its estimated vector (c, p).

    Hungarian matching on Euclidean distances when c >= k; with fewer
    estimates, the true vectors left over go to their nearest estimate.
    """
    E = np.asarray(estimated, dtype=np.float64)
    T = np.asarray(truth, dtype=np.float64)
    D = np.sqrt(((T[:, None, :] - E[None, :, :]) ** 2).sum(axis=2))   # (k, c)
    rows, cols = linear_sum_assignment(D)
    out = D.argmin(axis=1)
    out[rows] = cols
    return out


def estimation_error(estimated: Any, truth: Any) -> float:
    """``max_j ||ŵ_π(j) - w*_j||`` under the matching of :func:`match_clusters` (the paper's
    Figure 2b metric)."""
    E = np.asarray(estimated, dtype=np.float64)
    T = np.asarray(truth, dtype=np.float64)
    pi = match_clusters(E, T)
    return float(np.linalg.norm(E[pi] - T, axis=1).max())


def misclustering_rate(pred: Any, truth: Any) -> float:
    """Fraction of honest machines (``truth >= 0``) put in the wrong cluster, under the best
    one-to-one matching of labels; a machine labelled < 0 (judged Byzantine) counts as wrong."""
    pred = np.asarray(pred, dtype=np.int64)
    truth = np.asarray(truth, dtype=np.int64)
    honest = truth >= 0
    p, t = pred[honest], truth[honest]
    if not len(t):
        return 0.0
    pl = np.unique(p[p >= 0])
    tl = np.unique(t)
    if not len(pl):
        return 1.0
    C = np.array([[np.sum((t == a) & (p == b)) for b in pl] for a in tl])
    rows, cols = linear_sum_assignment(-C)
    return float(1.0 - C[rows, cols].sum() / len(t))
