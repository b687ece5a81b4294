"""k-FED refined by distributed Lloyd: the one-shot answer, then r Lloyd rounds from it.

Round 0 is k-FED's (:class:`~fedclust.kfed.protocol.KFedProtocol`, unchanged:
local centers up, the server groups them). Rounds 1..r are distributed Lloyd
rounds (:class:`~fedclust.lloyd.protocol.DistributedLloydProtocol` started from
the k-FED centers, ``init=<array>``): the server broadcasts the k centers
(``k d 8`` bytes per device), each device returns per-center sums, counts and
its cost (``k (d + 1) 8 + 8`` bytes), the server averages. The Lloyd rounds
stop early when the global cost improves by at most ``tol`` (relative). Every
device finally gets the k centers and labels its points by the nearest one.

Lloyd on the devices' rows is Lloyd on the pooled rows, so r rounds give
scikit-learn's ``KMeans(init=<k-FED centers>, n_init=1, max_iter=r)`` on the
pooled data, and the k-means cost never rises with r.

Refused under privacy (the private Lloyd rounds assume their own start, see
:func:`fedclust.lloyd.protocol.private_start`; a k-FED start noised on every
device is unsound for them) and with ``trim`` (a Lloyd round averages every
device's sums, so a lying device would move the centers at will).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.kmeans import assign
from ..core.messages import Message
from ..core.protocol import Request, RunLog
from ..kfed.messages import FinalCenters
from ..kfed.protocol import (ACTION, REFINED, KFedProtocol, KFedResult, KFedState,
                             check_refine_rounds)
from ..kfed.server import assign_to_centers
from .messages import CenterBroadcast, ClusterSums
from .protocol import DistributedLloydProtocol

__all__ = ["RefinedKFedProtocol"]

LLOYD = "lloyd"


@dataclass
class _RefineState:
    kfed: KFedState
    kfed_log: RunLog = field(default_factory=RunLog)
    kfed_result: KFedResult | None = None
    lloyd: Any = None                      # the Lloyd protocol's state
    lloyd_protocol: DistributedLloydProtocol | None = None


class RefinedKFedProtocol(KFedProtocol):
    """k-FED's round, then at most ``refine_rounds`` distributed Lloyd rounds from its
    centers. Other parameters as in :class:`fedclust.KFed`."""

    name = REFINED
    reply_types = {ACTION: KFedProtocol.reply_types[ACTION], LLOYD: ClusterSums}
    # a Lloyd round keeps no shared state on the client: chunks may run in threads
    parallel_safe = True

    def __init__(self, n_clusters: int, n_local_clusters: Any, *, refine_rounds: int = 1,
                 **kw: Any):
        self.refine_rounds = check_refine_rounds(refine_rounds)
        if kw.get("privacy") is not None:
            raise ValidationError(
                "privacy: refine_rounds is not available with privacy: every device would noise "
                "its own local centers, and the private Lloyd rounds need their own start "
                "(fedclust.lloyd.protocol.private_start); use DistributedLloyd(privacy=...)")
        if float(kw.get("trim", 0.0) or 0.0) > 0:
            raise ValidationError(
                f"trim={kw['trim']}: refine_rounds is not available with trim: a Lloyd round "
                "averages every device's sums, so one lying device moves the centers at will")
        super().__init__(n_clusters, n_local_clusters, **kw)
        self.reply_types = {**self.reply_types, LLOYD: ClusterSums}
        self._lloyd_client = DistributedLloydProtocol(
            self.n_clusters, max_rounds=max(self.refine_rounds, 1), tol=self.tol)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "refine_rounds": self.refine_rounds}

    def declared_rounds(self) -> dict[str, int]:
        return {ACTION: 1, LLOYD: self.refine_rounds}

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _RefineState:
        return _RefineState(super().start(device_ids, seed))

    def next_request(self, state: _RefineState) -> Request | None:
        if state.kfed_result is None:
            request = super().next_request(state.kfed)
            if request is not None:
                return request
            state.kfed_result = super().finish(state.kfed, state.kfed_log)
            if self.refine_rounds == 0:
                return None
            state.lloyd_protocol = DistributedLloydProtocol(
                self.n_clusters, init=state.kfed_result.centers, max_rounds=self.refine_rounds,
                tol=self.tol)
            state.lloyd = state.lloyd_protocol.start(state.kfed.device_ids, state.kfed.seed)
            state.lloyd.round = 1   # after k-FED's round 0
        if state.lloyd_protocol is None:
            return None
        return state.lloyd_protocol.next_request(state.lloyd)

    def check_reply(self, state: _RefineState, request: Request, device_id: int,
                    reply: Message) -> None:
        if request.action == LLOYD:
            if not isinstance(reply, ClusterSums):
                raise IncompatibleMessageError(
                    f"device {device_id}: expected cluster sums, got {type(reply).__name__}")
            state.lloyd_protocol.check_reply(state.lloyd, request, device_id, reply)
            return
        super().check_reply(state.kfed, request, device_id, reply)

    def server_step(self, state: _RefineState, request: Request,
                    replies: Mapping[int, Message]) -> None:
        if request.action == LLOYD:
            state.lloyd_protocol.server_step(state.lloyd, request, replies)
        else:
            super().server_step(state.kfed, request, replies)

    def finish(self, state: _RefineState, log: RunLog) -> KFedResult:
        if state.kfed_result is None:   # the run stopped before asking for Lloyd rounds
            self.next_request(state)
        res = state.kfed_result
        k_log = state.kfed_log
        log.rejected.update(k_log.rejected)
        log.distrusted.update(k_log.distrusted)
        log.warnings.extend(k_log.warnings)
        log.participants = [z for z in log.participants if z not in log.rejected]
        if state.lloyd_protocol is None:
            return KFedResult(**{**vars(res), "log": log, "kfed_centers": res.centers})
        centers = state.lloyd.centers.astype(res.centers.dtype, copy=False)   # the data's dtype
        # each device center's group: its nearest final center
        labels = {z: assign_to_centers(np.asarray(c, centers.dtype), centers)
                  for z, c in res.local_centers.items()}
        return KFedResult(
            centers=centers, local_centers=res.local_centers, local_counts=res.local_counts,
            center_labels=labels, seed_device=res.seed_device, n_iter=res.n_iter, log=log,
            kfed_centers=res.centers, cost_history=list(state.lloyd.costs),
            refine_rounds=int(state.lloyd.lloyd_rounds))

    def final_message(self, result: KFedResult, device_id: int) -> Message | None:
        if device_id not in result.center_labels:
            return None
        return FinalCenters(centers=result.centers)

    # -- client ------------------------------------------------------------
    def client_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action == LLOYD:   # distributed Lloyd's own device step
            return self._lloyd_client.client_step(request, X, device_id=device_id, seed=seed,
                                                  state=state)
        return super().client_step(request, X, device_id=device_id, seed=seed, state=state)

    def client_steps(self, request: Request, devices: Mapping[int, np.ndarray], *, seed: int,
                     states: Mapping[int, dict[str, np.ndarray]]):
        if request.action == LLOYD:   # the base loop: one device at a time
            return super(KFedProtocol, self).client_steps(request, devices, seed=seed,
                                                          states=states)
        return super().client_steps(request, devices, seed=seed, states=states)

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not isinstance(message, FinalCenters):
            return {}
        C = np.asarray(message.centers)
        return {"labels": assign(np.asarray(X, dtype=C.dtype), C)[0]}
