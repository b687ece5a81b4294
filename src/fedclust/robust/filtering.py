"""Iterative filtering: a robust mean in many dimensions (an optional estimator).

Diakonikolas, Kamath, Kane, Li, Moitra & Stewart, "Robust estimators in high
dimensions without the computational intractability" (FOCS 2016); Steinhardt,
Charikar & Valiant (ITCS 2018) for the soft-weight "filter". The coordinate-wise
median and trimmed mean lose a factor √p: each coordinate is fooled a little
and the errors add up. A filter looks for the *direction* in which the
outliers hide instead:

1. weighted mean μ and covariance Σ of the rows (weights start at 1);
2. top eigenpair (λ, v) of Σ;
3. if λ is at most ``threshold`` times the honest spread along v, stop: no
   direction holds enough outlier mass to move μ far; else
4. score every row ``τ_i = (v · (x_i − μ))²`` and shrink its weight,
   ``w_i ← w_i (1 − τ_i / max τ)`` (the row with the largest score drops to
   0), and go back to 1.

**Decision (the honest spread).** The theory assumes a known covariance bound
(e.g. Σ ≼ σ² I). A server does not know σ, and honest gradients are not
isotropic, so the spread along v is estimated from the data: the squared
normalised MAD of the projections ``v · x_i`` of the rows still in play
(breakdown 1/2). For Gaussian honest rows the ratio variance / MAD² is about
1 in every direction; a group of outliers far along v inflates the variance
and not the MAD. ``threshold=3`` leaves room for the top eigenvalue's upward
bias on small samples (clean Gaussian rows: the filter stops at once or
after removing little weight; tested).

O(iterations · (m p² + p³)) with a dense eigendecomposition (p up to a few
hundred; at most m iterations since each zeroes one row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.linalg import eigh

from ..core.exceptions import ValidationError
from ..core.validation import check_array, check_float, check_int

__all__ = ["iterative_filtering"]

_MAD_TO_SD = 1.4826


def iterative_filtering(X: Any, weights: Any = None, *, threshold: float = 3.0,
                        max_iter: int | None = None,
                        return_weights: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Robust mean (p,) of the rows of X (m, p) by iterative filtering (module docstring).

    Parameters
    ----------
    X : array-like (m, p)
    weights : array-like (m,), optional
        Non-negative starting weights (sample counts); default 1 each.
    threshold : float, default=3.0
        Stop when the top weighted variance is at most ``threshold`` x the MAD
        variance of the projections on its direction (> 1).
    max_iter : int, optional
        Default m (each iteration zeroes at least one row's weight).
    return_weights : bool, default=False
        Also return the final weights (m,) (0: filtered out).

    Returns
    -------
    mean : ndarray (p,)
    weights : ndarray (m,), only with ``return_weights``
    """
    X = check_array(X, "X").astype(np.float64, copy=False)
    m, p = X.shape
    threshold = check_float(threshold, "threshold", min_value=1.0, min_inclusive=False)
    max_iter = m if max_iter is None else check_int(max_iter, "max_iter", min_value=0)
    if weights is None:
        w = np.ones(m)
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (m,) or not np.isfinite(w).all() or (w < 0).any() or not w.sum() > 0:
            raise ValidationError(
                f"weights must be {m} finite non-negative numbers with a positive sum, got "
                f"shape {w.shape}")
        w = w.copy()
    for _ in range(max_iter):
        live = w > 0
        if live.sum() < 3:
            break
        mu = w @ X / w.sum()
        C = X - mu
        S = (C * w[:, None]).T @ C / w.sum()
        lam, vec = eigh(S, subset_by_index=[p - 1, p - 1])
        v = vec[:, 0]
        proj = C @ v
        live_proj = proj[live]
        spread = (_MAD_TO_SD * np.median(np.abs(live_proj - np.median(live_proj)))) ** 2
        if lam[0] <= threshold * spread or lam[0] <= 0.0:
            break
        tau = proj ** 2
        top = tau[live].max()
        w = np.where(live, w * (1.0 - tau / top), 0.0)
        w[w < 0] = 0.0
    mean = w @ X / w.sum()
    return (mean, w) if return_weights else mean
