"""k-FED's messages: local centers up, label maps down."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["LocalCenters", "LocalSummary", "LabelMap", "FinalCenters"]


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
class LocalSummary(LocalCenters):
    """k-FED device -> server: local centers, counts and each local cluster's scatter.

    ``scatter[j]`` is the sum of squared distances of cluster j's points to its
    center; the server uses it only to judge how well the final centers explain
    every local cluster (``run_log_.warnings``), reading a negative value as 0, so
    a device lying about it can change the warning and nothing else.
    Bytes: ``k_z * (d * itemsize + 16)``.
    """

    scatter: np.ndarray = None  # type: ignore[assignment]  # (k_z,) float, >= 0
    schema: ClassVar = {"centers": (FLOAT, 2), "counts": (INT, 1), "scatter": (FLOAT, 1)}
    kind: ClassVar[str] = "local_summary"

    def validate(self, sender: str) -> None:
        super().validate(sender)
        if self.scatter.shape != self.counts.shape:
            reject(sender, f"scatter has shape {self.scatter.shape} but there are "
                   f"{self.counts.shape[0]} centers")


    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        S = stacked["scatter"]
        return super().validate_many(stacked) and S.shape == stacked["counts"].shape


@dataclass(frozen=True)
class FinalCenters(Message):
    """Server -> device: the k final centers (k, d); the device labels each point by the
    nearest one (the default server's labelling, so ``labels_`` equals ``predict``)."""

    centers: np.ndarray
    schema: ClassVar = {"centers": (FLOAT, 2)}
    kind: ClassVar[str] = "kfed_final_centers"

    def validate(self, sender: str) -> None:
        if self.centers.shape[0] == 0 or not np.isfinite(self.centers).all():
            reject(sender, f"final centers must be a finite non-empty array, shape "
                   f"{self.centers.shape}")

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        return bool(np.isfinite(stacked["centers"]).all())


@dataclass(frozen=True)
class LabelMap(Message):
    """Server -> device: global cluster of each of the device's local centers (k_z,)."""

    global_labels: np.ndarray
    schema: ClassVar = {"global_labels": (INT, 1)}
    kind: ClassVar[str] = "label_map"

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        return True
