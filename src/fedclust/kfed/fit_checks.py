"""What a k-FED federation must satisfy before any device computes, checked alike by
``KFed.fit`` and by ``KFed.forget`` on the federation that remains (a forget leaves a model
only where a fresh fit on the remaining data would run)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.exceptions import ValidationError
from .local_auto import MIN_POINTS_PER_LOCAL_CLUSTER

__all__ = ["auto_ranges", "sendable_centers", "check_local_clusters"]


def auto_ranges(sizes: Sequence[int], n_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fedclust.kfed.local_auto.auto_range` of every device size at once: the fewest
    and the most centers (lo, hi) each device may send with ``n_local_clusters="auto"``."""
    n = np.asarray(sizes, dtype=np.int64)
    cap = np.maximum(1, np.minimum(n - 1, n // MIN_POINTS_PER_LOCAL_CLUSTER))
    return np.maximum(1, np.minimum(n_clusters, cap)), np.maximum(1, np.minimum(2 * n_clusters, cap))


def sendable_centers(sizes: Sequence[int], n_clusters: int, k_locals: Sequence[int] | None,
                     *, private: bool) -> list[int]:
    """The most local centers each device may send: its k_z, or with ``n_local_clusters=
    "auto"`` (``k_locals`` None) the top of its :func:`auto_range` (k under privacy)."""
    if k_locals is not None:
        return list(k_locals)
    if private:
        return [n_clusters] * len(sizes)
    return auto_ranges(sizes, n_clusters)[1].tolist()


def check_local_clusters(sizes: Sequence[int], ids: Sequence[int], n_clusters: int,
                         k_locals: Sequence[int], *, auto: bool, private: bool,
                         allow_raw_points: bool, raw_check: Sequence[bool] | None = None
                         ) -> None:
    """Refuse, in one line, a federation whose devices cannot send k centers in all, or a
    device whose local centers would be its raw points (``n_z <= k_z``) unless
    ``allow_raw_points``. ``k_locals``: :func:`sendable_centers`; ``raw_check``: which
    devices to test for raw points (default all)."""
    total = int(np.sum(k_locals, dtype=np.int64))
    if total < n_clusters:
        raise ValidationError(
            f"the devices would send sum(n_local_clusters)={total} centers but "
            f"n_clusters={n_clusters}; need sum k_z >= k (raise n_local_clusters or add devices)")
    if allow_raw_points:
        return
    n = np.asarray(sizes, dtype=np.int64)
    # the fewest a device may send, under "auto" (without privacy); else its k_z
    fewest = auto_ranges(n, n_clusters)[0] if auto and not private else np.asarray(k_locals)
    raw = n <= fewest
    if raw_check is not None:
        raw &= np.asarray(raw_check, dtype=bool)
    if raw.any():
        pos = int(np.argmax(raw))
        raise ValidationError(
            f"device {ids[pos]} has n_z={n[pos]} points but n_local_clusters={fewest[pos]}: its "
            "centers would be its raw points. Lower n_local_clusters for it, drop it, or pass "
            "allow_raw_points=True")
