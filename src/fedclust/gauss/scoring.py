"""Prediction rules: Gaussian likelihood (default) or the paper's membership gamma.

``likelihood``: log p(x | cluster i) + log n_i = -(d_M^2 + log det Sigma_i)/2 + log n_i
(up to a constant); a class scores the log-sum-exp of its clusters, so
``predict_proba`` is the posterior of a Gaussian mixture per class.
``gamma``: log gamma_i = -d_M^2 / D (Ožbot & Škrjanc eq. 1); a class scores its
best cluster (eq. 2) and ``predict_proba`` normalises the classes' gammas.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp, softmax

from .model import ClusterSet

__all__ = ["class_log_scores", "proba", "log_density"]


def class_log_scores(cs: ClusterSet, X: np.ndarray, rule: str) -> np.ndarray:
    """(N, M) class scores; -inf for a class without clusters."""
    L = cs.log_scores(X, rule)
    out = np.full((X.shape[0], cs.n_classes), -np.inf)
    cls = cs.cls[:cs.C]
    for c in range(cs.n_classes):
        k = cls == c
        if k.any():
            out[:, c] = logsumexp(L[:, k], axis=1) if rule == "likelihood" else L[:, k].max(axis=1)
    return out


def proba(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of log scores (rows sum to 1; -inf columns get 0)."""
    return softmax(scores, axis=1)


def log_density(cs: ClusterSet, X: np.ndarray) -> np.ndarray:
    """(N,) log density of every row under the model as a Gaussian mixture: weights
    n_i / sum n, means mu_i and the scoring covariances (:meth:`ClusterSet.scoring_precisions`;
    with ``pooled_shrinkage=0`` the model's (S_i + n0 Sigma_0) / (n_i + n0 - 1))."""
    L = cs.log_scores(X, "likelihood")   # -(d2 + log det) / 2 + log n_i
    n = cs.n[:cs.C]
    return logsumexp(L, axis=1) - np.log(n.sum()) - 0.5 * cs.D * np.log(2.0 * np.pi)
