"""The messages of federated preprocessing (:mod:`fedclust.sites.preprocess`).

One counted round (:class:`ColumnMoments` up, :class:`PooledTransform` down), or
its summed form for secure aggregation (:class:`ColumnSums`, then
:class:`ColumnCentre` down and :class:`ColumnSquares` up). Each site message
checks its own shapes and signs (:meth:`validate`) before the server reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["ColumnMoments", "ColumnSums", "ColumnCentre", "ColumnSquares", "PooledTransform"]


@dataclass(frozen=True)
class ColumnMoments(Message):
    """Site -> server: per column, non-missing count, sum, centred sum of squares; row count.

    Bytes: ``24 d + 8``.
    """

    count: np.ndarray   # (d,) int64
    total: np.ndarray   # (d,) float
    m2: np.ndarray      # (d,) float, sum over non-missing of (x - site mean)^2
    n_rows: np.ndarray  # () int64
    schema: ClassVar = {"count": (INT, 1), "total": (FLOAT, 1), "m2": (FLOAT, 1),
                        "n_rows": (INT, 0)}
    kind: ClassVar[str] = "column_moments"

    def validate(self, sender: str) -> None:
        d = self.count.shape[0]
        if self.total.shape != (d,) or self.m2.shape != (d,):
            reject(sender, f"count, total and m2 must have one shape, got {self.count.shape}, "
                           f"{self.total.shape}, {self.m2.shape}")
        if (self.count < 0).any() or (self.count > self.n_rows).any() or self.n_rows < 1:
            reject(sender, f"counts must lie in 0..n_rows={int(self.n_rows)}")
        if (self.m2 < 0).any():
            reject(sender, "m2 (a sum of squares) must be >= 0")


@dataclass(frozen=True)
class ColumnSums(Message):
    """Site -> server (summed form): per column non-missing count and sum; row count.

    Bytes: ``16 d + 8``. Every field is a plain sum over sites.
    """

    count: np.ndarray   # (d,) int64
    total: np.ndarray   # (d,) float
    n_rows: np.ndarray  # () int64
    schema: ClassVar = {"count": (INT, 1), "total": (FLOAT, 1), "n_rows": (INT, 0)}
    kind: ClassVar[str] = "column_sums"

    def validate(self, sender: str) -> None:
        if self.total.shape != self.count.shape:
            reject(sender, f"count and total must have one shape, got {self.count.shape}, "
                           f"{self.total.shape}")
        if (self.count < 0).any() or (self.count > self.n_rows).any() or self.n_rows < 1:
            reject(sender, f"counts must lie in 0..n_rows={int(self.n_rows)}")


@dataclass(frozen=True)
class ColumnCentre(Message):
    """Server -> site (summed form): the centre of the squared deviations (``8 d`` bytes)."""

    centre: np.ndarray
    schema: ClassVar = {"centre": (FLOAT, 1)}
    kind: ClassVar[str] = "column_centre"


@dataclass(frozen=True)
class ColumnSquares(Message):
    """Site -> server (summed form): per column the sum over non-missing values of
    ``(x - centre)**2``, and the row count (``8 d + 8`` bytes)."""

    sq: np.ndarray      # (d,) float
    n_rows: np.ndarray  # () int64
    schema: ClassVar = {"sq": (FLOAT, 1), "n_rows": (INT, 0)}
    kind: ClassVar[str] = "column_squares"

    def validate(self, sender: str) -> None:
        if (self.sq < 0).any():
            reject(sender, "sq (a sum of squares) must be >= 0")
        if self.n_rows < 1:
            reject(sender, f"n_rows={int(self.n_rows)} must be >= 1")


@dataclass(frozen=True)
class PooledTransform(Message):
    """Server -> site: the pooled column means and scales (``16 d`` bytes)."""

    mean: np.ndarray
    scale: np.ndarray
    schema: ClassVar = {"mean": (FLOAT, 1), "scale": (FLOAT, 1)}
    kind: ClassVar[str] = "pooled_transform"
