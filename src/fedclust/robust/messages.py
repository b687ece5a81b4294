"""The robust-regression pipeline's messages (the stage-3 reply is FL's ``ModelUpdate``).

Bytes (float64, p = d + 1 with the intercept):

* :class:`LocalERM` (device -> server, stage 1, once): ``8 p + 8``;
* :class:`ClusterParams` (server -> the machines of one cluster, in the first
  stage-3 iteration, and to each machine at the end): its cluster's model and
  index, ``8 p + 8``;
* :class:`ClusterModels` (server -> every machine in stage 3, each later
  iteration): all c models, ``8 c p``, plus ``16 a`` for the a machines that
  missed the first iteration and have not been told their cluster;
* :class:`fedclust.fl.messages.ModelUpdate` (device -> server, each stage-3
  round): ``8 p + 24``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["LocalERM", "ClusterParams", "ClusterModels"]


@dataclass(frozen=True)
class LocalERM(Message):
    """Device -> server: the device's empirical risk minimiser ``[w, b]`` (p,) and its n."""

    coef: np.ndarray       # (p,) float
    n_samples: np.ndarray  # () int64 >= 1
    schema: ClassVar = {"coef": (FLOAT, 1), "n_samples": (INT, 0)}
    kind: ClassVar[str] = "robust_erm"

    def validate(self, sender: str) -> None:
        if self.coef.size < 2:
            reject(sender, f"robust_erm needs at least one weight and the intercept, got "
                           f"{self.coef.size} values")
        if int(self.n_samples) < 1:
            reject(sender, f"n_samples={int(self.n_samples)} must be >= 1")

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        return stacked["coef"].shape[1] >= 2 and bool((stacked["n_samples"] >= 1).all())


@dataclass(frozen=True)
class ClusterParams(Message):
    """Server -> the devices of one cluster: its model ``[w, b]`` (p,) and its index."""

    params: np.ndarray   # (p,) float
    cluster: np.ndarray  # () int64 >= 0
    schema: ClassVar = {"params": (FLOAT, 1), "cluster": (INT, 0)}
    kind: ClassVar[str] = "robust_cluster_params"

    def validate(self, sender: str) -> None:
        if self.params.size == 0 or int(self.cluster) < 0:
            reject(sender, f"robust_cluster_params: empty params or cluster={int(self.cluster)}")


@dataclass(frozen=True)
class ClusterModels(Message):
    """Server -> every machine still in stage 3, once per round: all clusters' models
    ``params`` (c, p), and the cluster of the machines that have not yet confirmed theirs
    (``ids`` (a,), ``clusters`` (a,); empty unless some missed the first iteration). Each
    machine keeps its cluster in its private state and trains that cluster's model."""

    params: np.ndarray    # (c, p) float
    ids: np.ndarray       # (a,) int64 machine ids
    clusters: np.ndarray  # (a,) int64 in 0..c-1
    schema: ClassVar = {"params": (FLOAT, 2), "ids": (INT, 1), "clusters": (INT, 1)}
    kind: ClassVar[str] = "robust_cluster_models"

    def validate(self, sender: str) -> None:
        c = self.params.shape[0]
        if c == 0 or self.params.shape[1] == 0:
            reject(sender, f"robust_cluster_models: empty params of shape {self.params.shape}")
        if self.ids.shape != self.clusters.shape:
            reject(sender, f"robust_cluster_models: {self.ids.size} ids but "
                           f"{self.clusters.size} clusters")
        if self.clusters.size and (self.clusters.min() < 0 or self.clusters.max() >= c):
            reject(sender, f"robust_cluster_models: cluster index outside 0..{c - 1}")
