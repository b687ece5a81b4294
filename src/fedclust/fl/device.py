"""The device side of the FL rounds (:class:`fedclust.fl.protocol.FLProtocol`): the round
actions a device answers, the inputs its k-FED round clusters (:func:`feature_map`) and
its local steps (a loss report, k-FED's device step, local training).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import Message
from ..core.protocol import Request
from ..core.random import device_rng, server_rng
from .client import choose_cluster, local_update
from .messages import LossReport, ModelSet, ModelUpdate
from .models import Model

__all__ = ["FLDeviceSteps", "FEATURE_MAPS", "feature_map", "TRAIN", "LOSS", "KFED"]

#: the round actions: train, report a loss (or a size), k-FED's device step
TRAIN, LOSS, KFED = "fl_train", "fl_loss", "fl_kfed"
FEATURE_MAPS = ("raw", "random-projection", "hidden")
PROJ_BRANCH = 499   # server_rng round index of the shared random projection (see .protocol)


def feature_map(kind: str, X: np.ndarray, *, seed: int, dim: int,
                model: Model | None = None) -> np.ndarray:
    """The inputs k-FED clusters: raw X, X @ R for a shared Gaussian R (d, dim), or an MLP's
    hidden layer (the first FedAvg round's model)."""
    if kind == "raw":
        return X
    if kind == "random-projection":
        R = server_rng(seed, PROJ_BRANCH).standard_normal((X.shape[1], dim)) / math.sqrt(dim)
        return X @ R
    if model is None or not hasattr(model, "hidden"):
        raise ValidationError("feature_map='hidden' needs an MLP model and the first round's "
                              "parameters")
    return model.hidden(X)


class FLDeviceSteps:
    """A device's steps in the FL rounds, mixed into :class:`~fedclust.fl.protocol.FLProtocol`
    (which holds the settings they read: the model kind through ``_scratch``, the local
    training settings, ``kfed_map``, ``feature_dim``, ``plan`` and ``privacy``)."""

    def _device_data(self, data: Any, device_id: int) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(data, tuple) or len(data) != 2:
            raise ValidationError(f"device {device_id}: supervised protocol needs (X, y) data")
        X, y = np.asarray(data[0], dtype=np.float64), np.asarray(data[1])
        if X.shape[0] == 0:
            raise ValidationError(f"device {device_id} has no samples")
        if not np.isfinite(X).all():
            raise ValidationError(f"device {device_id}: X contains NaN or inf")
        self._scratch.check_data(X, y, f"device {device_id}")
        return X, y

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        X, y = self._device_data(X, device_id)
        model = self._scratch
        if request.action == LOSS:
            if request.payload is None:
                return LossReport(loss=np.float64(0.0), n_samples=np.int64(len(y)))
            if isinstance(request.payload, ModelSet):  # IFCA: the loss of the best of k
                loss = float(choose_cluster(model, request.payload.params, X, y)[1].min())
                return LossReport(loss=np.float64(loss), n_samples=np.int64(len(y)))
            model.set_params(request.payload.params)
            return LossReport(loss=np.float64(model.loss(X, y)), n_samples=np.int64(len(y)))
        if request.action == KFED:
            if self.kfed_map == "hidden":
                if request.payload is None:
                    raise ValidationError(f"device {device_id}: feature_map='hidden' needs the "
                                          "first round's model")
                model.set_params(request.payload.params)
            F = feature_map(self.kfed_map, X, seed=seed, dim=self.feature_dim, model=model)
            return self._kfed().client_step(Request(request.round, "local_centers"), F,
                                            device_id=device_id, seed=seed, state=state)
        if request.action != TRAIN:
            raise ValidationError(f"{self.name} has no client action {request.action!r}")
        return self._train(request, X, y, device_id=device_id, seed=seed, state=state)

    def _local(self, params, X, y, device_id, seed, round_index, cluster: int = 0,
               loss: float | None = None) -> ModelUpdate:
        new, n, loss = local_update(self._scratch, params, X, y, mode=self.local_mode,
                                    epochs=self.local_epochs, batch_size=self.batch_size,
                                    lr=self.lr, rng=device_rng(seed, device_id, round_index),
                                    loss_before=loss)
        if self.plan is not None and self.privacy.private:
            loss, n = 0.0, 1   # neither is released under privacy: the device keeps them
        return ModelUpdate(params=new, cluster=np.int64(cluster), n_samples=np.int64(n),
                           loss=np.float64(loss))

    def _train(self, request, X, y, *, device_id, seed, state) -> Message:
        return self._local(request.payload.params, X, y, device_id, seed, request.round)
