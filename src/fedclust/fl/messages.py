"""What crosses the wire in federated learning: model parameters down, updates up.

Bytes (float64 parameters, p = ``model.n_params``):

* :class:`ModelParams` (server -> device, FedAvg): ``8 p``;
* :class:`ModelSet` (server -> device, IFCA: all k models): ``8 k p``;
* :class:`ClusterModel` (server -> device, k-FED + FedAvg: one cluster's model
  and which (device, local cluster) pairs train it): ``8 p + 8 + 16 m`` for m pairs;
* :class:`ModelUpdate` (device -> server): ``8 p + 24`` (parameters, cluster,
  sample count, loss before training);
* :class:`LossReport` (device -> server, power-of-choice candidates): ``16``;
* :class:`ServeModels` (server -> device after training, k-FED + FedAvg with
  ``routing="gate"``): the device's k-FED label map and the final models of its
  m clusters, ``8 k_z + 8 m + 8 m p``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject

__all__ = ["ModelParams", "ModelSet", "ClusterModel", "ModelUpdate", "LossReport", "ServeModels",
           "SummedUpdate", "NoisyUpdate"]


@dataclass(frozen=True)
class ModelParams(Message):
    """Server -> device: one model's flat parameters (p,)."""

    params: np.ndarray
    schema: ClassVar = {"params": (FLOAT, 1)}
    kind: ClassVar[str] = "fl_model"

    def validate(self, sender: str) -> None:
        if self.params.size == 0:
            reject(sender, "fl_model has no parameters")


@dataclass(frozen=True)
class ModelSet(Message):
    """Server -> device: k models' flat parameters (k, p) (IFCA's broadcast)."""

    params: np.ndarray
    schema: ClassVar = {"params": (FLOAT, 2)}
    kind: ClassVar[str] = "fl_models"

    def validate(self, sender: str) -> None:
        if self.params.size == 0:
            reject(sender, f"fl_models has an empty array of shape {self.params.shape}")


@dataclass(frozen=True)
class ClusterModel(Message):
    """Server -> devices of one cluster: its model (p,), its index, and who trains it on what.

    ``members[j]`` trains on the points of its local cluster ``local_index[j]``
    (k-FED's local labels); a device listed twice trains on both local clusters.
    """

    params: np.ndarray       # (p,)
    cluster: np.ndarray      # () int64
    members: np.ndarray      # (m,) int64 device ids
    local_index: np.ndarray  # (m,) int64 local cluster of that device
    schema: ClassVar = {"params": (FLOAT, 1), "cluster": (INT, 0), "members": (INT, 1),
                        "local_index": (INT, 1)}
    kind: ClassVar[str] = "fl_cluster_model"

    def validate(self, sender: str) -> None:
        if self.members.shape != self.local_index.shape:
            reject(sender, f"members {self.members.shape} and local_index "
                           f"{self.local_index.shape} differ in shape")


@dataclass(frozen=True)
class ModelUpdate(Message):
    """Device -> server: locally trained parameters, the model they belong to, n_z, loss before."""

    params: np.ndarray     # (p,) float
    cluster: np.ndarray    # () int64: IFCA's choice / k-FED cluster; 0 for FedAvg
    n_samples: np.ndarray  # () int64 >= 1
    loss: np.ndarray       # () float: local loss of the received model, before training
    schema: ClassVar = {"params": (FLOAT, 1), "cluster": (INT, 0), "n_samples": (INT, 0),
                        "loss": (FLOAT, 0)}
    kind: ClassVar[str] = "fl_update"

    def validate(self, sender: str) -> None:
        if int(self.n_samples) < 1:
            reject(sender, f"n_samples={int(self.n_samples)} must be >= 1")
        if int(self.cluster) < 0:
            reject(sender, f"cluster={int(self.cluster)} must be >= 0")


@dataclass(frozen=True)
class SummedUpdate(Message):
    """Device -> server, FedAvg with secure sums: the fields the server only adds up.

    ``weighted_params = w params`` with ``w = n_samples`` (weighted FedAvg) or 1,
    ``weight = w``, ``loss_sum = n_samples loss`` (local loss before training),
    ``n_samples``, ``n_devices = 1``. The sum over devices gives the average model
    ``sum(weighted_params) / sum(weight)`` and the round's mean loss without any
    device's own values (:mod:`fedclust.core.secure_sum`).
    """

    weighted_params: np.ndarray  # (p,) float
    weight: np.ndarray           # () float >= 0
    loss_sum: np.ndarray         # () float
    n_samples: np.ndarray        # () int64 >= 0
    n_devices: np.ndarray        # () int64 >= 0
    schema: ClassVar = {"weighted_params": (FLOAT, 1), "weight": (FLOAT, 0),
                        "loss_sum": (FLOAT, 0), "n_samples": (INT, 0), "n_devices": (INT, 0)}
    kind: ClassVar[str] = "fl_summed_update"

    def validate(self, sender: str) -> None:
        if float(self.weight) < 0 or int(self.n_samples) < 0 or int(self.n_devices) < 0:
            reject(sender, f"weight={float(self.weight)}, n_samples={int(self.n_samples)} and "
                           f"n_devices={int(self.n_devices)} must be >= 0")


@dataclass(frozen=True)
class NoisyUpdate(Message):
    """Device -> server, DP-FedAvg with secure sums (distributed noise): the device's
    update (its model minus the model it received) clipped to ``clip_norm`` plus its
    share of the Gaussian noise, its count 1 plus noise, and ``n_devices = 1``.

    Summed over devices: the noisy sum of clipped updates and the noisy device
    count of central DP-FedAvg, without the server seeing either exactly
    (:mod:`fedclust.privacy.distributed`). ``8 (p + 2)`` bytes.
    """

    delta: np.ndarray      # (p,) float
    count: np.ndarray      # () float, 1 + noise (may be negative)
    n_devices: np.ndarray  # () int64
    schema: ClassVar = {"delta": (FLOAT, 1), "count": (FLOAT, 0), "n_devices": (INT, 0)}
    kind: ClassVar[str] = "fl_noisy_update"

    def validate(self, sender: str) -> None:
        if int(self.n_devices) < 1:
            reject(sender, f"n_devices={int(self.n_devices)} must be >= 1")


@dataclass(frozen=True)
class LossReport(Message):
    """Device -> server: local loss of the current model and n_z (power-of-choice candidates)."""

    loss: np.ndarray       # () float
    n_samples: np.ndarray  # () int64
    schema: ClassVar = {"loss": (FLOAT, 0), "n_samples": (INT, 0)}
    kind: ClassVar[str] = "fl_loss"

    def validate(self, sender: str) -> None:
        if int(self.n_samples) < 1:
            reject(sender, f"n_samples={int(self.n_samples)} must be >= 1")


@dataclass(frozen=True)
class ServeModels(Message):
    """Server -> device after training: its k-FED label map and the models that serve it.

    ``global_labels[j]``: the cluster of local cluster j (as :class:`~fedclust.kfed.messages.LabelMap`);
    ``params[i]``: the final model of cluster ``clusters[i]`` (the distinct clusters of
    ``global_labels``, ascending).
    """

    global_labels: np.ndarray  # (k_z,) int64
    clusters: np.ndarray       # (m,) int64
    params: np.ndarray         # (m, p) float
    schema: ClassVar = {"global_labels": (INT, 1), "clusters": (INT, 1), "params": (FLOAT, 2)}
    kind: ClassVar[str] = "fl_serve_models"

    def validate(self, sender: str) -> None:
        if self.params.shape[0] != self.clusters.shape[0] or self.clusters.shape[0] == 0:
            reject(sender, f"{self.clusters.shape[0]} clusters for {self.params.shape[0]} models")
