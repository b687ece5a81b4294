"""Private column moments for the federated preprocessing (point level, central DP).

Bounds: a public range ``[low_j, high_j]`` per column, the user's. Raw
columns come in their own units (years, mg/dl, counts) before any scaling, so
one Euclidean norm bound would be set by the widest column and would drown
the others in its noise; a per-column range is also what a data dictionary
states publicly. Every non-missing value is clipped to its range on the site
(a missing value stays missing and only counts as a row).

Release (one Gaussian mechanism, added once by the server to the pooled
statistics): with ``c = (low + high) / 2``, ``w = (high - low) / 2`` and
``u = (x - c) / w`` in ``[-1, 1]``, the vector

    (rows, count_j, Σ u_j, Σ (u_j² - 1/2))   for j = 1..d, sums over non-missing values

One row adds ``(1, 1, u_j, u_j² - 1/2)`` over its present columns, so the L2
sensitivity under adding or removing a row is ``sqrt(1 + 2.25 d)``. Mean,
variance and row count follow by post-processing (mean inside its range,
counts at least 1, variance floored at its own noise level and capped at
``w²``, the largest variance a column inside its range can have).

Device level (one whole site): the server computes each site's vector above
from its exact moments and scales it down to norm ``site_rows·sqrt(1 + 2.25 d)``
(:func:`clip_sites`), the norm of ``site_rows`` rows with every value at a
range's edge; that is the sensitivity. Scaling keeps a site's means and
variances and only shrinks its weight in the pooled ones; with no site
clipped the statistics are the pooled ones exactly.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from .accounting import Release
from .mechanisms import gaussian

__all__ = ["column_ranges", "clip_columns", "column_moments_release", "noisy_column_moments",
           "clip_sites", "check_site_rows", "PREPROCESS_STREAM", "WHAT"]

#: key of the server's noise stream for the preprocessing release (distinct from
#: the algorithms' round keys, so a noise_seed never reuses a stream)
PREPROCESS_STREAM = 1 << 20
WHAT = "preprocess: rows, per-column counts, sums and sums of squares"


def column_ranges(bounds: Any, d: int, columns: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``bounds`` (d, 2) of public (low, high) per column -> (low, high) arrays, checked."""
    if bounds is None:
        raise ValidationError("privacy: FederatedPreprocessor needs bounds, a public (low, high) "
                              "range per column (DP never reads the data to set it); got None")
    try:
        B = np.asarray(bounds, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValidationError(f"privacy: bounds={bounds!r} must be a (d, 2) array of numbers "
                              "(low, high) per column") from None
    if B.shape != (d, 2):
        # one-hot columns stand in place of their categorical column, so the order is not
        # the file's: name the columns one range is expected for, in order
        order = (f", in this order: {', '.join(map(str, columns))}" if len(columns) == d
                 else "")
        raise ValidationError(f"privacy: bounds has shape {B.shape}; the data has {d} columns, "
                              f"so it must be ({d}, 2): (low, high) per column{order}")
    bad = ~(np.isfinite(B).all(axis=1) & (B[:, 0] < B[:, 1]))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        name = repr(columns[j]) if j < len(columns) else str(j)
        raise ValidationError(f"privacy: bounds of column {name} are {B[j].tolist()}; they must "
                              "be finite with low < high")
    return B[:, 0].copy(), B[:, 1].copy()


def clip_columns(X: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, int]:
    """Non-missing values clipped to ``[low_j, high_j]``; (X, count of clipped values).

    ``X`` itself is returned (no copy) when nothing is outside its range.
    """
    with np.errstate(invalid="ignore"):
        over = (X < low) | (X > high)  # NaN compares False: stays missing
    n = int(over.sum())
    if n == 0:
        return X, 0
    return np.where(over, np.clip(X, low, high), X), n


def column_moments_release(d: int, site_rows: int | None = None) -> Release:
    """The preprocessing's one release (see the module docstring); ``site_rows``:
    device level, a site weighs at most that many rows."""
    rows = 1.0 if site_rows is None else float(site_rows)
    return Release(WHAT + (" (device level)" if site_rows is not None else ""),
                   rows * math.sqrt(1.0 + 2.25 * d))


def check_site_rows(site_rows: Any) -> int:
    if isinstance(site_rows, bool) or not isinstance(site_rows, (int, np.integer)) \
            or site_rows < 1:
        raise ValidationError(f"privacy: site_rows={site_rows!r} must be an int >= 1")
    return int(site_rows)


def clip_sites(replies: Sequence[Any], low: np.ndarray, high: np.ndarray, site_rows: int
               ) -> list[Any]:
    """Device level: every site's (rows, count, total, m2) scaled by one factor so that its
    release vector has norm at most ``site_rows·sqrt(1 + 2.25 d)``; replies inside the
    bound are returned unchanged (the same objects). The scaled m2 is about the pooled
    weighted mean's centre ``c``: Σ(x − c)² scales, so m2 = f Σ(x − c)² − f n (mean − c)²
    is the same as f m2 — the site's variance is kept."""
    d = len(low)
    c, w = (low + high) / 2.0, (high - low) / 2.0
    bound = site_rows * math.sqrt(1.0 + 2.25 * d)
    out = []
    for r in replies:
        n = r.count.astype(np.float64)
        S = (r.total - c * n) / w
        mz = np.divide(r.total, n, out=np.zeros(d), where=n > 0)
        R = (r.m2 + n * (mz - c) ** 2) / (w * w) - 0.5 * n
        norm = math.sqrt(float(r.n_rows) ** 2 + float(n @ n) + float(S @ S) + float(R @ R))
        if norm <= bound:
            out.append(r)
            continue
        f = bound / norm
        out.append(_Scaled(count=n * f, total=r.total * f, m2=r.m2 * f,
                           n_rows=float(r.n_rows) * f))
    return out


class _Scaled:
    """A site's column moments with a fractional weight (server side only)."""

    def __init__(self, *, count, total, m2, n_rows):
        self.count, self.total, self.m2, self.n_rows = count, total, m2, n_rows


def noisy_column_moments(n_rows: int, count: np.ndarray, total: np.ndarray, m2: np.ndarray,
                         low: np.ndarray, high: np.ndarray, std: float,
                         rng: np.random.Generator) -> dict[str, Any]:
    """Pooled exact statistics of the clipped data -> released (noisy) mean, var, counts.

    ``m2`` is the pooled sum over non-missing values of squared deviations from
    the pooled mean. Returns ``mean``, ``var`` (over rows, imputed cells at the
    mean), ``count`` and ``n_rows`` (rounded), and ``var_floor``.
    """
    d = len(count)
    c, w = (low + high) / 2.0, (high - low) / 2.0
    count = count.astype(np.float64)
    mean = total / count
    # the statistic of the mechanism, in range units
    S = (total - c * count) / w
    R = (m2 + count * (mean - c) ** 2) / (w * w) - 0.5 * count
    noisy = gaussian(np.concatenate([[float(n_rows)], count, S, R]), std, rng)
    rows_t = max(float(noisy[0]), 1.0)
    count_raw = noisy[1:1 + d]
    S_t = noisy[1 + d:1 + 2 * d]
    R_t = noisy[1 + 2 * d:]
    # post-processing: counts >= 1, the mean inside its range, var at most the largest
    # variance the range allows and at least its noise level (or that largest variance)
    count_t = np.maximum(count_raw, 1.0)  # not capped at rows: that would bias full columns
    mean_t = np.clip(c + w * S_t / count_t, low, high)
    Q_t = w * w * (R_t + 0.5 * count_raw)     # Σ (x - c)^2, released
    m2_t = Q_t - count_t * (mean_t - c) ** 2
    floor = w * w * std / rows_t              # std of the Q noise, per row
    var_t = np.clip(m2_t / rows_t, np.minimum(floor, w * w), w * w)  # w²: a range's largest
    return {"mean": mean_t, "var": var_t, "count": np.rint(np.minimum(count_t, rows_t)).astype(np.int64),
            "n_rows": int(round(rows_t)), "var_floor": floor}
