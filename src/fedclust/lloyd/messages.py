"""Distributed Lloyd's messages: a point sample to seed, centers down, cluster sums up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["CenterBroadcast", "ClusterSums", "PointSample"]


@dataclass(frozen=True)
class CenterBroadcast(Message):
    """Server -> devices: the current global centers (k, d)."""

    centers: np.ndarray
    schema: ClassVar = {"centers": (FLOAT, 2)}
    kind: ClassVar[str] = "center_broadcast"


@dataclass(frozen=True)
class ClusterSums(Message):
    """Distributed Lloyd device -> server: per-center sums (k, d), counts (k,), local cost ()."""

    sums: np.ndarray
    counts: np.ndarray
    cost: np.ndarray
    schema: ClassVar = {"sums": (FLOAT, 2), "counts": (INT, 1),
                         "cost": (FLOAT, 0)}
    kind: ClassVar[str] = "cluster_sums"

    def validate(self, sender: str) -> None:
        if self.counts.shape != (self.sums.shape[0],):
            reject(sender, f"counts has shape {self.counts.shape} for {self.sums.shape[0]} sums")
        if (self.counts < 0).any():
            reject(sender, "counts must be >= 0")
        if float(self.cost) < 0:
            reject(sender, f"cost={float(self.cost)} must be >= 0")


@dataclass(frozen=True)
class PointSample(Message):
    """Device -> server: a uniform sample of raw points and the device size.

    Only the distributed-Lloyd *baseline* uses it (to seed k-means++); k-FED
    never sends raw points.
    """

    points: np.ndarray   # (m, d)
    n_points: np.ndarray  # () int64: device size, to weight the sample
    schema: ClassVar = {"points": (FLOAT, 2), "n_points": (INT, 0)}
    kind: ClassVar[str] = "point_sample"

    def validate(self, sender: str) -> None:
        if int(self.n_points) < self.points.shape[0]:
            reject(sender, f"n_points={int(self.n_points)} is smaller than the sample size "
                          f"{self.points.shape[0]}")
