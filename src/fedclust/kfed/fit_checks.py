"""What a k-FED federation must satisfy before any device computes, checked alike by
``KFed.fit`` and by ``KFed.forget`` on the federation that remains (a forget leaves a model
only where a fresh fit on the remaining data would run)."""

from __future__ import annotations

from typing import Sequence

from ..core.exceptions import ValidationError
from .local_auto import auto_range

__all__ = ["sendable_centers", "check_local_clusters"]


def sendable_centers(sizes: Sequence[int], n_clusters: int, k_locals: Sequence[int] | None,
                     *, private: bool) -> list[int]:
    """The most local centers each device may send: its k_z, or with ``n_local_clusters=
    "auto"`` (``k_locals`` None) the top of its :func:`auto_range` (k under privacy)."""
    if k_locals is not None:
        return list(k_locals)
    return [n_clusters if private else auto_range(n, n_clusters)[1] for n in sizes]


def check_local_clusters(sizes: Sequence[int], ids: Sequence[int], n_clusters: int,
                         k_locals: Sequence[int], *, auto: bool, private: bool,
                         allow_raw_points: bool, raw_check: Sequence[bool] | None = None
                         ) -> None:
    """Refuse, in one line, a federation whose devices cannot send k centers in all, or a
    device whose local centers would be its raw points (``n_z <= k_z``) unless
    ``allow_raw_points``. ``k_locals``: :func:`sendable_centers`; ``raw_check``: which
    devices to test for raw points (default all)."""
    if sum(k_locals) < n_clusters:
        raise ValidationError(
            f"the devices would send sum(n_local_clusters)={sum(k_locals)} centers but "
            f"n_clusters={n_clusters}; need sum k_z >= k (raise n_local_clusters or add devices)")
    if allow_raw_points:
        return
    for pos, (z, n, k_z) in enumerate(zip(ids, sizes, k_locals)):
        if raw_check is not None and not raw_check[pos]:
            continue
        if auto and not private:
            k_z = auto_range(n, n_clusters)[0]   # the fewest it may send
        if n <= k_z:
            raise ValidationError(
                f"device {z} has n_z={n} points but n_local_clusters={k_z}: its centers would "
                "be its raw points. Lower n_local_clusters for it, drop it, or pass "
                "allow_raw_points=True")
