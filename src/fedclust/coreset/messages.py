"""What crosses the wire in distributed PCA + distributed coreset k-means.

Up (node -> coordinator, or flooded to every node on a general graph):
:class:`PointSum` (global-mean round), :class:`LocalSpectrum` (disPCA),
:class:`LocalCost` (costs round), :class:`CoresetPortion` (coreset round).
Down (star only): :class:`GlobalMean`, :class:`Projection`, :class:`Budget`,
:class:`FinalCenters`. Every array is float64 or int64, so the paper's
*words* are ``bytes / 8``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["PointSum", "LocalSpectrum", "LocalCost", "CoresetPortion", "GlobalMean",
           "Projection", "Budget", "FinalCenters", "WORD_BYTES"]

#: bytes of one word (every array of this family is 8-byte)
WORD_BYTES = 8


@dataclass(frozen=True)
class PointSum(Message):
    """Node -> coordinator: the sum (d,) of its points and their count (for the global mean).

    Bytes: ``8 (d + 1)``.
    """

    total: np.ndarray     # (d,) float64
    n_points: np.ndarray  # () int64
    schema: ClassVar = {"total": (FLOAT, 1), "n_points": (INT, 0)}
    kind: ClassVar[str] = "coreset_point_sum"

    def validate(self, sender: str) -> None:
        if int(self.n_points) < 0:
            reject(sender, f"n_points={int(self.n_points)} must be >= 0")
        if int(self.n_points) == 0 and np.any(self.total != 0):
            reject(sender, "an empty node sent a non-zero sum")


@dataclass(frozen=True)
class LocalSpectrum(Message):
    """Node -> coordinator: top singular values (t1,) and right singular vectors (t1, d).

    Bytes: ``8 t1 (d + 1)``; an empty node sends t1 = 0.
    """

    singular_values: np.ndarray  # (t1,) float64, >= 0, non-increasing
    components: np.ndarray       # (t1, d) float64
    schema: ClassVar = {"singular_values": (FLOAT, 1), "components": (FLOAT, 2)}
    kind: ClassVar[str] = "coreset_local_spectrum"

    def validate(self, sender: str) -> None:
        t1 = self.singular_values.shape[0]
        if self.components.shape[0] != t1:
            reject(sender, f"{self.components.shape[0]} components for {t1} singular values")
        if (self.singular_values < 0).any():
            reject(sender, "singular values must be >= 0")
        if t1 > 1 and (np.diff(self.singular_values) > 1e-9 * self.singular_values[0]).any():
            reject(sender, "singular values must be sorted in non-increasing order")


@dataclass(frozen=True)
class LocalCost(Message):
    """Node -> coordinator: cost c_i of its local k-means solution and its size n_i (16 bytes)."""

    cost: np.ndarray      # () float64 >= 0
    n_points: np.ndarray  # () int64 >= 0
    schema: ClassVar = {"cost": (FLOAT, 0), "n_points": (INT, 0)}
    kind: ClassVar[str] = "coreset_local_cost"

    def validate(self, sender: str) -> None:
        if float(self.cost) < 0:
            reject(sender, f"cost={float(self.cost)} must be >= 0")
        if int(self.n_points) < 0:
            reject(sender, f"n_points={int(self.n_points)} must be >= 0")
        if int(self.n_points) == 0 and float(self.cost) != 0:
            reject(sender, f"an empty node reported cost={float(self.cost)}")


@dataclass(frozen=True)
class CoresetPortion(Message):
    """Node -> coordinator: its part S_i ∪ B_i of the coreset, points (s, t) and weights (s,).

    Weights of sampled points are > 0; weights of local centers are
    ``|P_b| − Σ w_q`` and may be negative. They add up to the node's size
    ``n_points`` exactly (up to rounding), which the receiver checks.
    Bytes: ``8 s (t + 1) + 8``.
    """

    points: np.ndarray    # (s, t) float64
    weights: np.ndarray   # (s,) float64
    n_points: np.ndarray  # () int64
    schema: ClassVar = {"points": (FLOAT, 2), "weights": (FLOAT, 1), "n_points": (INT, 0)}
    kind: ClassVar[str] = "coreset_portion"

    def validate(self, sender: str) -> None:
        s = self.points.shape[0]
        if self.weights.shape != (s,):
            reject(sender, f"weights have shape {self.weights.shape} for {s} points")
        n = int(self.n_points)
        if n < 0:
            reject(sender, f"n_points={n} must be >= 0")
        total = float(self.weights.sum()) if s else 0.0
        scale = float(np.abs(self.weights).sum()) if s else 0.0
        if abs(total - n) > 1e-6 * max(n, scale, 1.0):
            reject(sender, f"weights add up to {total:.6g} but the node has n_points={n}")


@dataclass(frozen=True)
class GlobalMean(Message):
    """Coordinator -> nodes: the global mean (d,) used for centring."""

    mean: np.ndarray
    schema: ClassVar = {"mean": (FLOAT, 1)}
    kind: ClassVar[str] = "coreset_global_mean"


@dataclass(frozen=True)
class Projection(Message):
    """Coordinator -> nodes: the top principal directions V (t, d), rows sorted descending."""

    components: np.ndarray
    schema: ClassVar = {"components": (FLOAT, 2)}
    kind: ClassVar[str] = "coreset_projection"


@dataclass(frozen=True)
class Budget(Message):
    """Coordinator -> nodes: Σ_j c_j, Σ_j n_j, the coreset size t and the number of nodes.

    Node i derives its own t_i = ⌈t c_i / Σ c_j⌉ (32 bytes for all nodes alike).
    """

    total_cost: np.ndarray    # () float64
    total_points: np.ndarray  # () int64
    coreset_size: np.ndarray  # () int64
    n_nodes: np.ndarray       # () int64
    schema: ClassVar = {"total_cost": (FLOAT, 0), "total_points": (INT, 0),
                        "coreset_size": (INT, 0), "n_nodes": (INT, 0)}
    kind: ClassVar[str] = "coreset_budget"


@dataclass(frozen=True)
class FinalCenters(Message):
    """Coordinator -> nodes: the k centers in the original space (k, d)."""

    centers: np.ndarray
    schema: ClassVar = {"centers": (FLOAT, 2)}
    kind: ClassVar[str] = "coreset_final_centers"
