"""Naive distributed Lloyd: the many-round baseline k-FED is compared with.

Round 0 (``"sample"``): every device sends ``points_per_device`` uniformly
drawn raw points and its size; the server seeds k centers by weighted k-means++ on the
pooled sample. (This baseline shares raw points to start; k-FED never does.)
Rounds 1.. (``"lloyd"``): the server broadcasts k centers (``k d 8`` bytes per
device); each device returns per-center sums, counts and its cost
(``k (d + 1) 8 + 8`` bytes); the server averages. Stops when the global cost
improves by at most ``tol`` (relative) or after ``max_rounds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.kmeans import assign, kmeans_plusplus
from ..core.random import device_rng, server_rng
from ..core.validation import check_float, check_int
from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import Message
from .messages import CenterBroadcast, ClusterSums, PointSample
from ..core.protocol import Protocol, Request, RunLog

__all__ = ["DistributedLloydProtocol", "DistributedLloydResult"]


@dataclass
class DistributedLloydResult:
    centers: np.ndarray
    cost_history: list[float]   # global cost of the centers broadcast in each Lloyd round
    n_rounds: int
    converged: bool
    log: RunLog = field(default_factory=RunLog)


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    centers: np.ndarray | None = None
    costs: list[float] = field(default_factory=list)
    converged: bool = False


class DistributedLloydProtocol(Protocol):
    """Multi-round distributed Lloyd with counted communication."""

    name = "distributed-lloyd"
    reply_types = {"sample": PointSample, "lloyd": ClusterSums}
    #: the Lloyd rounds' sums, counts and costs are only added up: secure aggregation
    #: can hide each device's (the seeding sample of raw points cannot be summed)
    summed_actions = frozenset({"lloyd"})

    def __init__(self, n_clusters: int, *, points_per_device: int = 10,
                 max_rounds: int = 100, tol: float = 1e-4):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.points_per_device = check_int(points_per_device, "points_per_device", min_value=1)
        self.max_rounds = check_int(max_rounds, "max_rounds", min_value=1)
        self.tol = check_float(tol, "tol", min_value=0.0)

    def config(self) -> dict[str, Any]:
        return {"n_clusters": self.n_clusters, "points_per_device": self.points_per_device,
                "max_rounds": self.max_rounds, "tol": self.tol}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "DistributedLloydProtocol":
        cfg = dict(config)
        return cls(cfg.pop("n_clusters"), **cfg)

    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(device_ids), int(seed))

    def next_request(self, state: _State) -> Request | None:
        if state.round == 0:
            return Request(0, "sample")
        if state.converged or state.round > self.max_rounds:
            return None
        return Request(state.round, "lloyd", CenterBroadcast(state.centers))

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        if request.action == "lloyd" and reply.sums.shape != state.centers.shape:
            raise IncompatibleMessageError(
                f"device {device_id}: sums have shape {reply.sums.shape}, expected "
                f"{state.centers.shape}")

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if not replies:
            raise ValidationError(f"no device replied in round {request.round}")
        ids = sorted(replies)
        if request.action == "sample":
            pts = np.concatenate([replies[z].points for z in ids])
            w = np.concatenate([np.full(len(replies[z].points),
                                        int(replies[z].n_points) / max(len(replies[z].points), 1))
                                for z in ids])
            if len(pts) < self.n_clusters:
                raise ValidationError(
                    f"the pooled sample has {len(pts)} points for n_clusters={self.n_clusters}")
            state.centers = pts[kmeans_plusplus(pts, self.n_clusters, server_rng(state.seed),
                                                weights=w)]
        else:
            sums = sum(replies[z].sums for z in ids)
            counts = sum(replies[z].counts for z in ids)
            cost = float(sum(float(replies[z].cost) for z in ids))
            new = state.centers.copy()
            nz = counts > 0
            new[nz] = sums[nz] / counts[nz, None]
            prev = state.costs[-1] if state.costs else math.inf
            state.costs.append(cost)
            state.converged = math.isfinite(prev) and prev - cost <= self.tol * prev
            state.centers = new
        state.round += 1

    def finish(self, state: _State, log: RunLog) -> DistributedLloydResult:
        return DistributedLloydResult(state.centers, state.costs, state.round, state.converged, log)

    def final_message(self, result: DistributedLloydResult, device_id: int) -> Message | None:
        return CenterBroadcast(result.centers)

    def client_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action == "sample":
            n = len(X)
            m = min(n, self.points_per_device)
            rng = device_rng(seed, device_id, request.round)
            idx = rng.choice(n, size=m, replace=False)
            return PointSample(points=X[idx].copy(), n_points=np.asarray(n, dtype=np.int64))
        if request.action == "lloyd":
            C = request.payload.centers.astype(X.dtype, copy=False)
            labels, mind = assign(X, C)
            k = C.shape[0]
            sums = np.zeros_like(C)
            np.add.at(sums, labels, X)
            counts = np.bincount(labels, minlength=k).astype(np.int64)
            return ClusterSums(sums=sums, counts=counts, cost=np.asarray(float(mind.sum())))
        raise ValidationError(f"distributed Lloyd has no client action {request.action!r}")

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None:
            return {}
        return {"labels": assign(X, message.centers.astype(X.dtype, copy=False))[0]}
