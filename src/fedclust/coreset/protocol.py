"""Distributed PCA + distributed coreset k-means as one protocol (the star case).

Rounds (those that apply, in order):

``means``     node -> server: sum (d,) and count — global centring (8 (d+1) bytes up);
``spectrum``  server -> node: the mean (8 d); node -> server: top-t₁ singular
              values and right vectors of its centred data (8 t₁ (d+1));
``costs``     server -> node: V (8 t d); node -> server: local cost c_i and n_i (16);
``coreset``   server -> node: Σc_j, N, t, #nodes (32); node -> server: S_i ∪ B_i
              (8 s_i (t'+1) + 8 with t' = t, or d without PCA);
final         server -> node: the k centers in the original space (8 k d).

The server solves weighted k-means on the union and lifts the centers back
(``mean + C V``). On a general graph (:mod:`fedclust.coreset.graph`) the same
client steps run and every node applies :meth:`server_step` to the flooded
replies itself. ``pca_only`` stops after ``spectrum`` (:class:`DistributedPCA`).

Balcan, Ehrlich & Liang, NIPS 2013 (Algorithm 1); Liang, Balcan,
Kanchanapally & Woodruff, NIPS 2014 (disPCA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from ..core.kmeans import assign
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog
from ..core.random import device_rng
from ..core.validation import check_choice, check_int
from .local import (balcan_budget, coreset_portion, combine_budget, local_solution,
                    local_spectrum, point_sum)
from .messages import (Budget, CoresetPortion, FinalCenters, GlobalMean, LocalCost,
                       LocalSpectrum, PointSum, Projection)
from .server import combine_spectra, global_mean, solve_weighted_kmeans

__all__ = ["CoresetProtocol", "CoresetResult", "METHODS"]

METHODS = ("coreset", "combine")


@dataclass
class CoresetResult:
    """Outcome of a run. Arrays that do not apply are empty (e.g. no PCA: ``components`` (0, d))."""

    centers: np.ndarray           # (k, d) original space ((0, d) when pca_only)
    reduced_centers: np.ndarray   # (k, t) where the solve ran
    coreset_points: np.ndarray    # (s, t)
    coreset_weights: np.ndarray   # (s,) signed
    coreset_owner: np.ndarray     # (s,) node id of each coreset row
    mean: np.ndarray              # (d,) centring mean ((0,) when not centred)
    components: np.ndarray        # (t, d) principal directions, decreasing
    singular_values: np.ndarray   # (t,)
    n_points: int
    solver_cost: float
    log: RunLog = field(default_factory=RunLog)


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    plan: list[str]
    step: int = 0
    n_features: int | None = None
    mean: np.ndarray | None = None
    n_points: int = 0
    counts: dict[int, int] = field(default_factory=dict)
    components: np.ndarray | None = None
    singular_values: np.ndarray | None = None
    costs: dict[int, tuple[float, int]] = field(default_factory=dict)
    portions: dict[int, CoresetPortion] = field(default_factory=dict)


class CoresetProtocol(Protocol):
    """Distributed (PCA +) coreset k-means. Parameters as in :class:`DistributedKMeans`.

    ``n_components=None`` skips PCA; ``pca_only=True`` runs only the PCA rounds.
    """

    name = "coreset"
    reply_types = {"means": PointSum, "spectrum": LocalSpectrum, "costs": LocalCost,
                   "coreset": CoresetPortion}
    not_summable_reason = "the server clusters the union of the devices' coreset points"

    def __init__(self, n_clusters: int, coreset_size: int, *, n_components: int | None = None,
                 local_components: int | None = None, center: bool = True,
                 method: str = "coreset", n_init: int = 5, local_max_iter: int = 20,
                 max_iter: int = 300, n_features: int | None = None, pca_only: bool = False):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.coreset_size = check_int(coreset_size, "coreset_size", min_value=1)
        self.n_components = (None if n_components is None
                             else check_int(n_components, "n_components", min_value=1))
        self.local_components = (self.n_components if local_components is None
                                 else check_int(local_components, "local_components", min_value=1))
        self.center = bool(center)
        self.method = check_choice(method, "method", METHODS)
        self.n_init = check_int(n_init, "n_init", min_value=1)
        self.local_max_iter = check_int(local_max_iter, "local_max_iter", min_value=1)
        self.max_iter = check_int(max_iter, "max_iter", min_value=1)
        self.n_features = None if n_features is None else check_int(n_features, "n_features",
                                                                    min_value=1)
        self.pca_only = bool(pca_only)
        if self.pca_only and self.n_components is None:
            raise ValidationError("pca_only=True needs n_components")

    # -- config round trip (0 stands for None: Flower configs hold no None) --
    def config(self) -> dict[str, Any]:
        return {"n_clusters": self.n_clusters, "coreset_size": self.coreset_size,
                "n_components": self.n_components or 0,
                "local_components": self.local_components or 0, "center": self.center,
                "method": self.method, "n_init": self.n_init,
                "local_max_iter": self.local_max_iter, "max_iter": self.max_iter,
                "n_features": self.n_features or 0, "pca_only": self.pca_only}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "CoresetProtocol":
        cfg = {k: (None if k in ("n_components", "local_components", "n_features") and v == 0
                   else v) for k, v in dict(config).items()}
        return cls(cfg.pop("n_clusters"), cfg.pop("coreset_size"), **cfg)

    @property
    def uses_pca(self) -> bool:
        return self.n_components is not None

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        plan = []
        if self.uses_pca:
            plan += (["means"] if self.center else []) + ["spectrum"]
        if not self.pca_only:
            plan += ["costs", "coreset"]
        return _State(tuple(int(z) for z in device_ids), int(seed), plan,
                      n_features=self.n_features)

    def next_request(self, state: _State) -> Request | None:
        if state.step >= len(state.plan):
            return None
        action = state.plan[state.step]
        payload: Message | None = None
        if action == "spectrum" and self.center:
            payload = GlobalMean(mean=state.mean)
        elif action == "costs" and self.uses_pca:
            payload = Projection(components=state.components)
        elif action == "coreset":
            payload = Budget(
                total_cost=np.asarray(sum(c for c, _ in state.costs.values()), dtype=np.float64),
                total_points=np.asarray(sum(n for _, n in state.costs.values()), dtype=np.int64),
                coreset_size=np.asarray(self.coreset_size, dtype=np.int64),
                n_nodes=np.asarray(len(state.costs), dtype=np.int64))
        return Request(round=state.step, action=action, payload=payload)

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        expected = self.reply_types[request.action]
        if not isinstance(reply, expected):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {expected.kind}, got {type(reply).__name__}")
        d = state.n_features
        if isinstance(reply, PointSum) and d is not None and reply.total.shape != (d,):
            raise IncompatibleMessageError(
                f"device {device_id}: sum has shape {reply.total.shape}, expected ({d},)")
        if isinstance(reply, LocalSpectrum):
            if d is not None and reply.components.shape[1] != d:
                raise IncompatibleMessageError(
                    f"device {device_id}: components have {reply.components.shape[1]} features, "
                    f"expected {d}")
            if reply.components.shape[0] > self.local_components:
                raise IncompatibleMessageError(
                    f"device {device_id}: sent {reply.components.shape[0]} components but "
                    f"local_components={self.local_components}")
        n_known = state.counts.get(device_id)
        if isinstance(reply, (LocalCost, CoresetPortion)):
            if isinstance(reply, CoresetPortion):
                n_known = state.costs.get(device_id, (0.0, None))[1]
            if n_known is not None and int(reply.n_points) != n_known:
                raise IncompatibleMessageError(
                    f"device {device_id}: n_points={int(reply.n_points)} but it reported "
                    f"{n_known} before")
        if isinstance(reply, CoresetPortion):
            width = self.reduced_dim(state)
            if width is not None and reply.points.shape[1] != width:
                raise IncompatibleMessageError(
                    f"device {device_id}: coreset points have {reply.points.shape[1]} "
                    f"columns, expected {width}")
            limit = self._row_limit(state, device_id, request.payload)
            if reply.points.shape[0] > limit:
                raise IncompatibleMessageError(
                    f"device {device_id}: sent {reply.points.shape[0]} coreset points, more "
                    f"than its budget allows ({limit})")

    def reduced_dim(self, state: _State) -> int | None:
        return state.components.shape[0] if self.uses_pca else state.n_features

    def _row_limit(self, state: _State, device_id: int, budget: Budget) -> int:
        if device_id not in state.costs:
            raise IncompatibleMessageError(
                f"device {device_id}: sent a coreset portion without a cost in the costs round")
        cost, n = state.costs[device_id]
        t_i, _ = self.budget(cost, n, budget)
        return n if n <= t_i else t_i + self.n_clusters

    def budget(self, cost: float, n: int, budget: Budget) -> tuple[int, float]:
        if self.method == "combine":
            return combine_budget(n, int(budget.coreset_size), int(budget.n_nodes))
        return balcan_budget(cost, n, float(budget.total_cost), int(budget.total_points),
                             int(budget.coreset_size))

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        ids = sorted(replies)
        if request.action == "means":
            sums = [replies[z] for z in ids]
            state.mean, state.n_points = global_mean(sums)
            state.counts = {z: int(replies[z].n_points) for z in ids}
            state.n_features = state.n_features or state.mean.shape[0]
        elif request.action == "spectrum":
            spectra = [replies[z] for z in ids]
            state.n_features = state.n_features or spectra[0].components.shape[1]
            state.components, state.singular_values = combine_spectra(spectra, self.n_components)
            if state.components.shape[0] == 0:
                raise TooFewReplies("every node that replied is empty: nothing to project")
        elif request.action == "costs":
            state.costs = {z: (float(replies[z].cost), int(replies[z].n_points)) for z in ids}
            state.n_points = sum(n for _, n in state.costs.values())
            if state.n_points == 0:
                raise TooFewReplies("every node that replied is empty: nothing to cluster")
        else:
            state.portions = {z: replies[z] for z in ids}
        state.step += 1

    def finish(self, state: _State, log: RunLog) -> CoresetResult:
        d = state.n_features or 0
        mean = state.mean if (self.uses_pca and self.center) else np.zeros(0)
        comps = state.components if self.uses_pca else np.zeros((0, d))
        svals = state.singular_values if self.uses_pca else np.zeros(0)
        if self.pca_only:
            t = comps.shape[0]
            return CoresetResult(np.zeros((0, d)), np.zeros((0, t)), np.zeros((0, t)),
                                 np.zeros(0), np.zeros(0, np.int64), mean, comps, svals,
                                 int(state.n_points), 0.0, log)
        ids = sorted(state.portions)
        points = np.concatenate([state.portions[z].points for z in ids])
        weights = np.concatenate([state.portions[z].weights for z in ids])
        owner = np.concatenate([np.full(len(state.portions[z].weights), z, dtype=np.int64)
                                for z in ids])
        if not (weights > 0).any():
            raise TooFewReplies("the coreset is empty: no node sent a usable portion")
        n_held = int((weights > 0).sum())
        if n_held < self.n_clusters:
            raise TooFewReplies(
                f"the coreset of the {len(ids)} replying devices holds {n_held} points but "
                f"n_clusters={self.n_clusters}")
        reduced, cost = solve_weighted_kmeans(points, weights, self.n_clusters, state.seed,
                                              n_init=self.n_init, max_iter=self.max_iter)
        centers = self.lift(reduced, mean, comps)
        return CoresetResult(centers, reduced, points, weights, owner, mean, comps, svals,
                             int(state.n_points), cost, log)

    def lift(self, reduced: np.ndarray, mean: np.ndarray, comps: np.ndarray) -> np.ndarray:
        """Centers back in the original space: ``mean + C V`` (C itself without PCA)."""
        if not self.uses_pca:
            return reduced
        out = reduced @ comps
        return out + mean if mean.size else out

    def final_message(self, result: CoresetResult, device_id: int) -> Message | None:
        return None if self.pca_only else FinalCenters(centers=result.centers)

    # -- client ------------------------------------------------------------
    def _reduce(self, X: np.ndarray, state: dict[str, np.ndarray]) -> np.ndarray:
        """The node's points in the solve space: ``(X − mean) Vᵀ`` (X itself without PCA)."""
        if "reduced" in state:
            return state["reduced"]
        Z = np.asarray(X, dtype=np.float64)
        if self.uses_pca:
            if "mean" in state:
                Z = Z - state["mean"]
            Z = Z @ state["components"].T
            state["reduced"] = Z   # t columns: cheap to keep for the coreset round
        return Z

    def client_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        rng = device_rng(seed, device_id, request.round)
        if request.action == "means":
            return point_sum(X)
        if request.action == "spectrum":
            mean = None if request.payload is None else request.payload.mean
            if mean is not None:
                state["mean"] = np.asarray(mean, dtype=np.float64)
            return local_spectrum(X, mean, self.local_components, rng)
        if request.action == "costs":
            if request.payload is not None:
                state["components"] = np.asarray(request.payload.components, dtype=np.float64)
            centers, labels, costs = local_solution(self._reduce(X, state), self.n_clusters, rng,
                                                    max_iter=self.local_max_iter)
            state.update(local_centers=centers, local_labels=labels, local_costs=costs)
            return LocalCost(cost=np.asarray(float(costs.sum()), dtype=np.float64),
                             n_points=np.asarray(X.shape[0], dtype=np.int64))
        if request.action == "coreset":
            costs = state["local_costs"]
            t_i, ratio = self.budget(float(costs.sum()), X.shape[0], request.payload)
            return coreset_portion(self._reduce(X, state), state["local_centers"],
                                   state["local_labels"], costs, t_i, ratio, rng)
        raise ValidationError(f"the coreset protocol has no client action {request.action!r}")

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None or X.shape[0] == 0:
            return {} if message is None else {"labels": np.zeros(0, dtype=np.int64)}
        return {"labels": assign(np.asarray(X, dtype=np.float64), message.centers)[0]}
