"""Trimming along a cluster's largest deviation: a tight minority inside the trimming radius.

A group of colluders inside a cluster's radius shifts each coordinate by only a
fraction of its offset, so a coordinate-wise rule keeps part of their pull; along
the leading singular direction of the deviations from the coordinate-wise median
the whole offset shows. Used by the pipeline's stage 3
(:func:`fedclust.robust.server.robust_step`) and by the centre step of
:class:`fedclust.robust.TrimmedKMeans`.
"""

from __future__ import annotations

import numpy as np

from ..core.robust import trimmed_mean

__all__ = ["off_axis_group", "off_axis_trimmed_mean"]


def beta_for(n_flagged: int, m: int, beta: float) -> float:
    """``max(beta, s / m)`` as a fraction with ``floor(fraction m) >= s``, capped below 1/2."""
    s = min(n_flagged, (m - 1) // 2)
    if s == 0 or s <= int(np.floor(beta * m)):
        return beta
    return min((s + 0.5) / m, 0.499999)


def _median(x: np.ndarray, w: np.ndarray | None) -> float:
    """Median of x (m,); with weights w, the median of x with each value repeated w times
    (integer weights give ``np.median`` of the repeated values exactly)."""
    if w is None:
        return float(np.median(x))
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    mid = (cw[-1] - 1.0) / 2.0 if cw[-1] >= 1.0 else cw[-1] / 2.0
    lo = int(np.searchsorted(cw, np.floor(mid), side="right"))
    hi = int(np.searchsorted(cw, np.ceil(mid), side="right"))
    last = len(x) - 1
    return 0.5 * float(x[order][min(lo, last)] + x[order][min(hi, last)])


def off_axis_group(V: np.ndarray, radius: float = 3.0, weights: np.ndarray | None = None
                   ) -> tuple[np.ndarray | None, np.ndarray]:
    """``(basis (p, p) or None, flagged (m,))``: a tight minority off the centre of the rows of
    V (m, p) along the direction of their largest deviation from the coordinate-wise median.

    A group of colluders inside the cluster's radius shifts each coordinate by only a fraction
    of its offset, so coordinate-wise trimming keeps part of their pull; along the leading
    singular direction u of ``V - median`` the whole offset shows. Rows whose projection lies
    beyond ``radius`` x the 1-D MAD scale (normal-consistent) from the projections' median are
    flagged when at least 3 of them lie on one side (a group, not a lone tail point); the
    basis is then u completed to an orthonormal basis (rows), in which the trimmed mean trims
    their share along u. None when no such group is found, so that honest clusters keep the
    coordinate-wise trimmed mean. ``weights`` (m,): a row of weight w counts as w rows
    (medians, the direction and the count of 3). O(m p min(m, p))."""
    m = V.shape[0]
    none = None, np.zeros(m, dtype=bool)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if (m if w is None else w.sum()) < 8:
        return none
    centre = (np.median(V, axis=0) if w is None
              else np.array([_median(V[:, i], w) for i in range(V.shape[1])]))
    D = V - centre
    _, _, Vt = np.linalg.svd(D if w is None else D * np.sqrt(w)[:, None], full_matrices=True)
    t = D @ Vt[0]
    med = _median(t, w)
    mad = 1.4826 * _median(np.abs(t - med), w)
    if not mad > 0:
        return none
    z = (t - med) / mad
    hi, lo = z > radius, z < -radius
    count = (lambda f: f.sum()) if w is None else (lambda f: w[f].sum())
    if max(count(hi), count(lo)) < 3:
        return none
    return Vt, hi | lo


def off_axis_trimmed_mean(V: np.ndarray, beta: float, radius: float = 3.0,
                          weights: np.ndarray | None = None
                          ) -> tuple[np.ndarray | None, float, np.ndarray]:
    """``(aggregate (p,) or None, trim fraction, flagged (m,))``: where :func:`off_axis_group`
    finds a tight off-centre minority in V (m, p), the trimmed mean of V in the basis of its
    largest deviation, trimming at least the flagged share (``max(beta, s / m)``; with
    ``weights`` (m,), the flagged share of the total weight); None (and ``beta``) where it
    finds none."""
    basis, off = off_axis_group(V, radius, weights)
    if basis is None:
        return None, beta, off
    if weights is None:
        b = max(beta, beta_for(int(off.sum()), V.shape[0], beta))
        c = np.median(V, axis=0)
    else:
        w = np.asarray(weights, dtype=np.float64)
        b = min(max(beta, float(w[off].sum() / w.sum())), 0.499999)
        c = np.array([_median(V[:, i], w) for i in range(V.shape[1])])
    return c + basis.T @ trimmed_mean((V - c) @ basis.T, b, weights), b, off
