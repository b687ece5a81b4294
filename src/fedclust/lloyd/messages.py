"""Distributed Lloyd's messages: a point sample or moments and candidates to seed,
centers down, cluster sums up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["CenterBroadcast", "RadiusBroadcast", "ClusterSums", "PointSample", "Moments", "CandidateBroadcast",
           "NoisyMoments", "NoisyClusterSums"]


@dataclass(frozen=True)
class CenterBroadcast(Message):
    """Server -> devices: the current global centers (k, d)."""

    centers: np.ndarray
    schema: ClassVar = {"centers": (FLOAT, 2)}
    kind: ClassVar[str] = "center_broadcast"


@dataclass(frozen=True)
class RadiusBroadcast(Message):
    """Server -> devices, private Lloyd rounds: the current centers (k, d) and the
    trust radius () the devices clip every ``x − c`` to (and scale their noise by)."""

    centers: np.ndarray
    radius: np.ndarray
    schema: ClassVar = {"centers": (FLOAT, 2), "radius": (FLOAT, 0)}
    kind: ClassVar[str] = "radius_broadcast"

    def validate(self, sender: str) -> None:
        r = float(self.radius)
        if not (r > 0 and np.isfinite(r)):
            reject(sender, f"radius={r} must be a finite number > 0")


@dataclass(frozen=True)
class ClusterSums(Message):
    """Distributed Lloyd device -> server: per-center sums (k, d), counts (k,), local cost ().

    Counts are int64, or float64 when device-level privacy scaled the device's
    contribution; the cost is 0 under privacy (it is not released).
    """

    sums: np.ndarray
    counts: np.ndarray
    cost: np.ndarray
    schema: ClassVar = {"sums": (FLOAT, 2), "counts": (INT + FLOAT, 1),
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


@dataclass(frozen=True)
class Moments(Message):
    """Device -> server: count (), sum (d,) and second-moment matrix Σ x xᵀ (d, d)
    of the device's clipped points (``(d^2 + d + 1) 8`` bytes)."""

    n: np.ndarray
    s: np.ndarray
    Q: np.ndarray
    schema: ClassVar = {"n": (FLOAT, 0), "s": (FLOAT, 1), "Q": (FLOAT, 2)}
    kind: ClassVar[str] = "moments"

    def validate(self, sender: str) -> None:
        d = self.s.shape[0]
        if self.Q.shape != (d, d):
            reject(sender, f"Q has shape {self.Q.shape} for a sum of {d} features")
        if float(self.n) < 0:
            reject(sender, f"n={float(self.n)} must be >= 0")


@dataclass(frozen=True)
class CandidateBroadcast(Message):
    """Server -> devices: mean (d,), subspace basis (d, p) and M candidate
    coordinates in it (M, p); devices send per-candidate sums back."""

    mean: np.ndarray
    basis: np.ndarray
    coords: np.ndarray
    schema: ClassVar = {"mean": (FLOAT, 1), "basis": (FLOAT, 2), "coords": (FLOAT, 2)}
    kind: ClassVar[str] = "candidate_broadcast"


@dataclass(frozen=True)
class NoisyMoments(Message):
    """Device -> server, distributed DP noise: :class:`Moments` plus the device's share
    of the Gaussian noise, and ``n_devices = 1`` (summed: how many devices' noise
    the sum holds). Noisy entries may be negative. ``(d^2 + d + 2) 8`` bytes."""

    n: np.ndarray
    s: np.ndarray
    Q: np.ndarray
    n_devices: np.ndarray
    schema: ClassVar = {"n": (FLOAT, 0), "s": (FLOAT, 1), "Q": (FLOAT, 2), "n_devices": (INT, 0)}
    kind: ClassVar[str] = "noisy_moments"

    def validate(self, sender: str) -> None:
        d = self.s.shape[0]
        if self.Q.shape != (d, d):
            reject(sender, f"Q has shape {self.Q.shape} for a sum of {d} features")
        if int(self.n_devices) < 1:
            reject(sender, f"n_devices={int(self.n_devices)} must be >= 1")


@dataclass(frozen=True)
class NoisyClusterSums(Message):
    """Device -> server, distributed DP noise: per-center sums (k, d) and counts (k,)
    with the device's share of the Gaussian noise (so counts may be negative), the
    cost as in :class:`ClusterSums` (0 unless ε = ∞), and ``n_devices = 1``.
    ``(k (d + 1) + 2) 8`` bytes."""

    sums: np.ndarray
    counts: np.ndarray
    cost: np.ndarray
    n_devices: np.ndarray
    schema: ClassVar = {"sums": (FLOAT, 2), "counts": (FLOAT, 1), "cost": (FLOAT, 0),
                        "n_devices": (INT, 0)}
    kind: ClassVar[str] = "noisy_cluster_sums"

    def validate(self, sender: str) -> None:
        if self.counts.shape != (self.sums.shape[0],):
            reject(sender, f"counts has shape {self.counts.shape} for {self.sums.shape[0]} sums")
        if int(self.n_devices) < 1:
            reject(sender, f"n_devices={int(self.n_devices)} must be >= 1")
