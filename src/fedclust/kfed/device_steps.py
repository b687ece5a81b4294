"""k-FED's device side (:class:`KFedDeviceSteps`, mixed into
:class:`~fedclust.kfed.protocol.KFedProtocol`): a device's local k-means (or its summary
for the default server, or its private centers), the vectorised steps of many devices at
once, and each device's labels from the server's final message."""

from __future__ import annotations

from operator import attrgetter, methodcaller
from typing import Mapping, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.kmeans import assign
from ..core.messages import Message, StackedReplies
from ..core.protocol import Request
from ..core.random import device_rng, device_uniforms
from ..core.validation import check_array
from ..privacy import clip_points, noise_rng
from ..privacy import kmeans as pk
from ..privacy.mechanisms import DEVICE
from .batched import n_uniforms
from .local import local_kmeans, local_scatter
from .local_auto import local_kmeans_auto
from .messages import FinalCenters, LabelMap, LocalCenters, LocalSummary
from .server import assign_to_centers
from .stacked_steps import ACTION, gather_label_maps, label_by_centers, stacked_steps
from .summary import summary_kmeans_stacked, summary_ladder

__all__ = ["KFedDeviceSteps"]


class KFedDeviceSteps:
    """The device steps of k-FED, mixed into its protocol (which holds the settings they
    read: ``n_clusters``, ``k_local``/``k_sent``, ``local_auto``, ``summarise``,
    ``local_max_iter``, ``tol``, ``allow_raw_points``, ``privacy`` and ``plan``)."""

    def client_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action != ACTION:
            raise ValidationError(f"k-FED has no client action {request.action!r}")
        k = self.k_local(device_id)
        if self.plan is not None:
            return self._private_step(request, X, k, device_id, seed, state)
        k = self.k_sent(k, len(X), X.shape[1] if np.ndim(X) == 2 else None)
        if self.local_auto:
            res = local_kmeans_auto(X, self.n_clusters, device_rng(seed, device_id, request.round),
                                    max_iter=self.local_max_iter, tol=self.tol,
                                    allow_raw_points=self.allow_raw_points,
                                    device=f"device {device_id}")
            state["local_labels"] = res.labels
            return self.summary_reply(res.message, X, res.labels)
        if self.summarise and len(X) > k:   # the default server's summary, refined per device
            X = check_array(X, f"device {device_id}")
            ladder = summary_ladder(len(X), X.shape[1], self.n_clusters, start=k)
            [(_, C, N, L, S)] = summary_kmeans_stacked(
                X[None], ladder, device_uniforms(seed, [device_id], request.round,
                                                 n_uniforms(ladder[-1])),
                lambda _: device_rng(seed, device_id, request.round),
                max_iter=self.local_max_iter, tol=self.tol, devices=[f"device {device_id}"])
            state["local_labels"] = L[0]
            return LocalSummary(centers=C[0], counts=N[0].astype(np.int64), scatter=S[0])
        res = local_kmeans(X, k, device_rng(seed, device_id, request.round),
                           max_iter=self.local_max_iter, tol=self.tol,
                           allow_raw_points=self.allow_raw_points, device=f"device {device_id}",
                           uniforms=device_uniforms(seed, [device_id], request.round,
                                                    n_uniforms(k))[0])
        state["local_labels"] = res.labels
        return self.summary_reply(res.message, X, res.labels)

    def summary_reply(self, msg: LocalCenters, X: np.ndarray, labels: np.ndarray) -> LocalCenters:
        """The reply: with the default server, the centers plus each local cluster's scatter."""
        if not self.summarise:
            return msg
        return LocalSummary(centers=msg.centers, counts=msg.counts,
                            scatter=local_scatter(X, msg.centers, labels))

    def _private_step(self, request: Request, X: np.ndarray, k: int, device_id: int, seed: int,
                      state: dict[str, np.ndarray]) -> LocalCenters:
        """DP local centers: clip, then noisy moments and candidate sums on the device."""
        X = check_array(X, f"device {device_id}")
        Xc, n_clipped = clip_points(X, float(self.privacy.data_bound))
        rng = device_rng(seed, device_id, request.round)
        centers, counts = pk.private_local_centers(
            Xc, k, self.privacy, self.plan.releases, rng,
            noise_rng(self.privacy.noise_seed, DEVICE, device_id, request.round),
            seed=int(rng.integers(0, 2**31 - 1)))
        state["local_labels"] = assign_to_centers(X, centers.astype(X.dtype, copy=False))
        state["n_clipped"] = np.asarray(n_clipped, dtype=np.int64)
        return LocalCenters(centers=centers.astype(X.dtype, copy=False),
                            counts=np.maximum(np.rint(counts), 1).astype(np.int64))

    def client_steps(self, request: Request, devices: Mapping[int, np.ndarray], *, seed: int,
                     states: Mapping[int, dict[str, np.ndarray]]):
        """Vectorised device steps: devices of one shape and one k_z run as a batch."""
        batches, out = self._steps_stacked(request, devices, seed=seed, states=states)
        for batch in batches:
            out.update(zip(batch.ids, batch.messages()))
        return out

    def client_steps_stacked(self, request: Request, devices: Mapping[int, np.ndarray], *,
                             seed: int, states: Mapping[int, dict[str, np.ndarray]]):
        """Devices of one shape and one k_z run as a batch; tiny devices' replies come back
        column-wise (:class:`~fedclust.core.messages.StackedReplies`)."""
        if type(self).client_steps is not KFedDeviceSteps.client_steps:   # a subclass's own steps
            return [], self.client_steps(request, devices, seed=seed, states=states)
        return self._steps_stacked(request, devices, seed=seed, states=states)

    def _steps_stacked(self, request: Request, devices: Mapping[int, np.ndarray], *,
                       seed: int, states: Mapping[int, dict[str, np.ndarray]]):
        one_by_one = lambda devs: super(KFedDeviceSteps, self).client_steps(   # noqa: E731
            request, devs, seed=seed, states=states)
        if request.action != ACTION or self.plan is not None:
            return [], one_by_one(devices)
        return stacked_steps(self, request, devices, seed=seed, states=states,
                             one_by_one=one_by_one)

    def client_finish_stacked(self, batch: StackedReplies, devices: Sequence[np.ndarray],
                              states: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """:meth:`client_finish` of every device of a checked batch of final messages (row i
        to ``devices[i]``, ``states[i]``): label maps gathered for all devices at once."""
        local = list(map(methodcaller("get", "local_labels"), states))
        if (batch.message_type is not LabelMap
                or type(self).client_finish is not KFedDeviceSteps.client_finish
                or set(map(type, local)) != {np.ndarray}
                or len(set(map(attrgetter("shape"), local))) != 1 or local[0].ndim != 1):
            return [self.client_finish(m, X, s)
                    for m, X, s in zip(batch.messages(), devices, states)]
        return gather_label_maps(batch.arrays["global_labels"], local, states)

    def client_finish_shared(self, message: Message | None, devices: Sequence[np.ndarray],
                             states: Sequence[dict[str, np.ndarray]]
                             ) -> list[dict[str, np.ndarray]]:
        """:meth:`client_finish` of one final message that every device of ``devices`` got
        (row i to ``devices[i]``, ``states[i]``): the final centers label the rows of small
        devices stacked in chunks, one BLAS pass per chunk split back per device (the
        labels of :meth:`client_finish`, without one call per device)."""
        if (not isinstance(message, FinalCenters)
                or type(self).client_finish is not KFedDeviceSteps.client_finish):
            return [self.client_finish(message, X, s) for X, s in zip(devices, states)]
        return label_by_centers(np.asarray(message.centers), devices, states)

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None or "local_labels" not in state:
            return {}
        if isinstance(message, FinalCenters):   # nearest final center, as predict
            C = np.asarray(message.centers)
            out = {"labels": assign(np.asarray(X, dtype=C.dtype), C)[0]}
        else:
            out = {"labels": np.asarray(message.global_labels)[state["local_labels"]]}
        if "n_clipped" in state:
            out["n_clipped"] = state["n_clipped"]
        return out
