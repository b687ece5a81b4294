"""k-FED's messages: local centers up, label maps down."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["LocalCenters", "LabelMap"]


@dataclass(frozen=True)
class LocalCenters(Message):
    """k-FED device -> server: the k_z local centers and their point counts.

    Bytes: ``k_z * d * itemsize + k_z * 8``.
    """

    centers: np.ndarray  # (k_z, d) float
    counts: np.ndarray   # (k_z,) int64, >= 1
    schema: ClassVar = {"centers": (FLOAT, 2), "counts": (INT, 1)}
    kind: ClassVar[str] = "local_centers"

    def validate(self, sender: str) -> None:
        k_z = self.centers.shape[0]
        if k_z == 0 or self.centers.shape[1] == 0:
            reject(sender, f"local_centers has an empty centers array of shape {self.centers.shape}")
        if self.counts.shape != (k_z,):
            reject(sender, f"counts has shape {self.counts.shape} but there are {k_z} centers")
        if (self.counts < 1).any():
            reject(sender, f"counts must all be >= 1, got {self.counts.tolist()}")

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        C, N = stacked["centers"], stacked["counts"]   # (B, k_z, d), (B, k_z)
        return (C.shape[1] > 0 and C.shape[2] > 0 and N.shape == C.shape[:2]
                and bool((N >= 1).all()))


@dataclass(frozen=True)
class LabelMap(Message):
    """Server -> device: global cluster of each of the device's local centers (k_z,)."""

    global_labels: np.ndarray
    schema: ClassVar = {"global_labels": (INT, 1)}
    kind: ClassVar[str] = "label_map"

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        return True
