"""The robust-regression pipeline's messages (the stage-3 reply is FL's ``ModelUpdate``).

Bytes (float64, p = d + 1 with the intercept):

* :class:`LocalERM` (device -> server, stage 1, once): ``8 p + 8``;
* :class:`ClusterParams` (server -> each machine, its own message in every
  stage-3 round, and once at the end): its cluster's model and index, ``8 p + 8``;
* :class:`fedclust.fl.messages.ModelUpdate` (device -> server, each stage-3
  round): ``8 p + 24``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["LocalERM", "ClusterParams"]


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
