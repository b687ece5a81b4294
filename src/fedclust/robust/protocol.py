"""The three-stage robust clustered regression (or classification) as one supervised protocol.

Round 0 (``action="robust_erm"``): every machine fits its ERM — least squares
(``loss="squared"``) or logistic (``loss="logistic"``) — and sends it once
(:class:`~.messages.LocalERM`, ``8 (d + 1) + 8`` bytes). The server clusters
the ERMs robustly (stage 2, :func:`.server.cluster_erms`). Then, for
``rounds`` iterations, one transport round each: every member machine receives
its own cluster's model and index (:class:`~.messages.ClusterParams`, a
per-device payload of the round: ``8 p + 8`` bytes, not all c models) and
answers with :func:`fedclust.fl.client.local_update` — one gradient step
(``optimizer="gd"``) or ``local_steps`` full-batch steps (``"fedavg"``) — as
FL's :class:`~fedclust.fl.messages.ModelUpdate`; the server combines each
cluster's replies with the robust rule (stage 3, :func:`.server.robust_step`).
So ``1 + rounds`` transport rounds in all. Machines judged Byzantine in stage 2 (label -1) are not
asked again. Finally every machine is told its cluster's model
(:class:`~.messages.ClusterParams`).

Ghosh, Hong, Yin & Ramchandran, "Robust federated learning in a heterogeneous
environment", 2019 (Algorithm 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog
from ..core.random import device_rng
from ..core.validation import check_choice, check_float, check_int
from ..fl.client import local_update
from ..fl.messages import ModelUpdate
from ..fl.models import LinearRegression, LogisticRegression
from .local import local_erm, local_logistic_erm
from .messages import ClusterParams, LocalERM
from .server import (CLUSTERINGS, OPTIMIZERS, STAGE3_AGGREGATORS, cluster_erms,
                     off_axis_trimmed_mean, robust_step, share_beta)

__all__ = ["RobustRegressionProtocol", "RobustRegressionResult"]

ERM = "robust_erm"
STEP = "robust_step"
LOSSES = ("squared", "logistic")


@dataclass
class RobustRegressionResult:
    """Outcome (server side). ``coef`` (c, p) final models ``[w, b]``; ``device_ids`` /
    ``clusters`` (m,) each machine's cluster (-1: judged Byzantine; -2: no ERM received);
    ``erms`` (m, p) the stage-1 ERMs (zeros where none); ``cluster_history`` (T + 1, m'):
    stage-2 labels per iteration over the machines that sent an ERM (``erm_ids``);
    ``initial_coef`` (c, p) stage-2 centres; ``round_loss`` (rounds, c): per stage-3 round
    and cluster, the median over members of the local loss before the step; ``round_beta``
    (rounds, c): the trim fraction the trimmed mean used (``adaptive_beta``; NaN: no step)."""

    coef: np.ndarray
    device_ids: np.ndarray
    clusters: np.ndarray
    erms: np.ndarray
    erm_ids: np.ndarray
    cluster_history: np.ndarray
    clustering_iterations: int
    initial_coef: np.ndarray
    round_loss: np.ndarray
    round_beta: np.ndarray
    log: RunLog = field(default_factory=RunLog)


@dataclass
class _State:
    ids: tuple[int, ...]
    seed: int
    req: int = 0
    phase: str = "erm"
    erms: dict = field(default_factory=dict)
    clusters: dict = field(default_factory=dict)
    suspect: dict = field(default_factory=dict)
    models: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    initial: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    history: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    n_iter: int = 0
    step: int = 0
    asked: dict = field(default_factory=dict)
    flags: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    betas: list = field(default_factory=list)
    #: cluster -> stage-3 rounds in which none of its members gave a valid reply
    idle: dict = field(default_factory=dict)


class RobustRegressionProtocol(Protocol):
    """Robust clustered linear (``loss="squared"``) or logistic (``loss="logistic"``)
    regression. Parameters as in :class:`fedclust.robust.RobustClusteredRegression`."""

    name = "robust-regression"
    # each round needs only the device's rows and the broadcast model
    rejoin_actions = frozenset({ERM, STEP})
    reply_types = {ERM: LocalERM, STEP: ModelUpdate}
    supervised = True

    def __init__(self, *, n_clusters: int, n_features: int, clustering: str = "trimmed-kmeans",
                 optimizer: str = "gd", aggregator: str = "trimmed-mean", beta: float = 0.1,
                 rounds: int = 20, lr: float = 0.1, local_steps: int = 5, l2: float = 0.0,
                 fit_intercept: bool = True, radius: float = 3.0, init: str = "k-means++",
                 max_iter: int = 100, drop_outliers: bool = True, adaptive_beta: bool = True,
                 loss: str = "squared"):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.clustering = check_choice(clustering, "clustering", CLUSTERINGS)
        self.optimizer = check_choice(optimizer, "optimizer", OPTIMIZERS)
        self.aggregator = check_choice(aggregator, "aggregator", STAGE3_AGGREGATORS)
        self.beta = check_float(beta, "beta", min_value=0.0)
        if self.beta >= 0.5:
            raise ValidationError(f"beta={self.beta} must be < 0.5")
        self.rounds = check_int(rounds, "rounds", min_value=0)
        self.lr = check_float(lr, "lr", min_value=0.0, min_inclusive=False)
        self.local_steps = check_int(local_steps, "local_steps", min_value=1)
        self.l2 = check_float(l2, "l2", min_value=0.0)
        self.fit_intercept = bool(fit_intercept)
        self.radius = check_float(radius, "radius", min_value=0.0, min_inclusive=False)
        self.init = check_choice(init, "init", ("pairwise", "k-means++"))
        self.max_iter = check_int(max_iter, "max_iter", min_value=1)
        self.drop_outliers = bool(drop_outliers)
        self.adaptive_beta = bool(adaptive_beta)
        self.loss = check_choice(loss, "loss", LOSSES)

    def config(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "n_clusters", "n_features", "clustering", "optimizer", "aggregator", "beta", "rounds",
            "lr", "local_steps", "l2", "fit_intercept", "radius", "init", "max_iter",
            "drop_outliers", "adaptive_beta", "loss")}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RobustRegressionProtocol":
        return cls(**dict(config))

    @property
    def n_params(self) -> int:
        return self.n_features + 1

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(sorted(int(z) for z in device_ids)), int(seed))

    def next_request(self, state: _State) -> Request | None:
        if state.phase == "erm":
            state.phase = "erm-sent"
            return self._req(state, ERM, None, None)
        if state.phase != "steps" or state.step >= self.rounds:
            return None
        # one round for every cluster: each member gets its own cluster's model
        own = {j: ClusterParams(params=state.models[j].copy(), cluster=np.int64(j))
               for j in range(state.models.shape[0])}
        members = tuple(z for z, c in sorted(state.clusters.items()) if c >= 0)
        if not members:   # every machine judged Byzantine: no stage 3 to run
            return None
        payloads = {z: own[state.clusters[z]] for z in members}
        # a round nobody answered stops the run (the transport names why); a cluster
        # none of whose members answered keeps its model, as the run log says
        return self._req(state, STEP, None, members, payloads=payloads)

    def _req(self, state, action, payload, devices, allow_empty: bool = False,
             payloads=None) -> Request:
        state.req += 1
        return Request(round=state.req - 1, action=action, payload=payload, devices=devices,
                       allow_empty=allow_empty, payloads=payloads)

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        want = self.reply_types[request.action]
        if not isinstance(reply, want):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {want.kind}, got {type(reply).__name__}")
        vec = reply.coef if isinstance(reply, LocalERM) else reply.params
        if vec.shape != (self.n_params,):
            raise IncompatibleMessageError(
                f"device {device_id}: sent {vec.shape[0]} parameters but the model has "
                f"d + 1 = {self.n_params}")
        if isinstance(reply, ModelUpdate) and int(reply.cluster) != state.clusters.get(device_id):
            raise IncompatibleMessageError(
                f"device {device_id}: answered for cluster {int(reply.cluster)} but is in "
                f"cluster {state.clusters.get(device_id)}")

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if request.action == ERM:
            self._cluster(state, replies)
            return
        r = state.step
        state.step += 1
        todo = range(state.models.shape[0])
        for j in todo:
            ids = sorted(z for z in replies if state.clusters[z] == j)
            if not ids:
                if any(c == j for c in state.clusters.values()):
                    state.idle.setdefault(j, []).append(r)
                continue
            U = np.array([replies[z].params for z in ids], dtype=np.float64)
            # trim at least the share of a group beyond k that this cluster absorbed
            beta = share_beta(sum(state.suspect.get(z, False) for z in ids), len(ids),
                              self.beta) if self.adaptive_beta else self.beta
            state.models[j], state.betas[r][j], flagged = robust_step(
                state.models[j], U, optimizer=self.optimizer, lr=self.lr,
                aggregator=self.aggregator, beta=beta, adaptive=self.adaptive_beta,
                radius=self.radius)
            for z, f in zip(ids, flagged):
                state.asked[z] = state.asked.get(z, 0) + 1
                state.flags[z] = state.flags.get(z, 0) + int(f)
            state.losses[r][j] = float(np.median([float(replies[z].loss) for z in ids]))

    def _cluster(self, state: _State, replies: Mapping[int, Message]) -> None:
        ids = sorted(replies)
        W = np.array([replies[z].coef for z in ids], dtype=np.float64)
        state.erms = dict(zip(ids, W))
        if len(ids) < self.n_clusters:
            raise TooFewReplies(
                f"only {len(ids)} machines sent an ERM but n_clusters={self.n_clusters}")
        out = cluster_erms(W, self.n_clusters, self.clustering, seed=state.seed,
                           radius=self.radius, beta=self.beta, init=self.init,
                           max_iter=self.max_iter, drop_outliers=self.drop_outliers)
        state.clusters = {z: int(c) for z, c in zip(ids, out.labels)}
        if out.suspect is not None:
            state.suspect = {z: bool(f) for z, f in zip(ids, out.suspect)}
        state.models = np.array(out.centers, dtype=np.float64)
        if self.adaptive_beta and self.aggregator == "trimmed-mean":
            # a tight off-centre minority inside a cluster's radius pulls its centre; start
            # stage 3 from the members' ERMs trimmed along their largest deviation instead
            for j in range(state.models.shape[0]):
                sel = out.labels == j
                agg, _, _ = off_axis_trimmed_mean(W[sel], self.beta, self.radius)
                if agg is not None:
                    state.models[j] = agg
        state.initial = state.models.copy()
        state.history = out.history.astype(np.int64)
        state.n_iter = out.n_iter
        c = state.models.shape[0]
        state.losses = [[float("nan")] * c for _ in range(self.rounds)]
        state.betas = [[float("nan")] * c for _ in range(self.rounds)]
        state.phase = "steps"

    def finish(self, state: _State, log: RunLog) -> RobustRegressionResult:
        for j, rounds in sorted(state.idle.items()):
            members = [z for z, c in sorted(state.clusters.items()) if c == j]
            log.warnings.append(
                f"robust: cluster {j} got no valid update in {len(rounds)} of {self.rounds} "
                f"stage-3 rounds (first: round {rounds[0] + 1}; its machines {members} dropped, "
                "failed or were rejected, see the run log): its model is the one from before "
                "those rounds")
        if not any(c >= 0 for c in state.clusters.values()) and state.clusters:
            log.warnings.append("robust: every machine's ERM was judged Byzantine in stage 2: "
                                "stage 3 did not run; the models are the stage-2 centres")
        for z in sorted(state.clusters):
            if state.clusters[z] < 0:
                log.distrusted[z] = (f"machine {z}: its ERM lies outside every cluster's "
                                     "trimming radius (stage 2); left out of stage 3")
            elif 2 * state.flags.get(z, 0) > state.asked.get(z, 0) > 0:
                log.distrusted[z] = (
                    f"machine {z}: its update was an outlier of its cluster in "
                    f"{state.flags[z]} of {state.asked[z]} stage-3 rounds (trimmed)")
        ids = np.array(state.ids, dtype=np.int64)
        erms = np.zeros((len(ids), self.n_params))
        clusters = np.full(len(ids), -2, dtype=np.int64)
        for pos, z in enumerate(state.ids):
            if z in state.erms:
                erms[pos] = state.erms[z]
                clusters[pos] = state.clusters[z]
        return RobustRegressionResult(
            coef=state.models, device_ids=ids, clusters=clusters, erms=erms,
            erm_ids=np.array(sorted(state.erms), dtype=np.int64),
            cluster_history=state.history, clustering_iterations=int(state.n_iter),
            initial_coef=state.initial,
            round_loss=np.array(state.losses, dtype=np.float64).reshape(
                len(state.losses), state.models.shape[0]),
            round_beta=np.array(state.betas, dtype=np.float64).reshape(
                len(state.betas), state.models.shape[0]),
            log=log)

    def final_message(self, result: RobustRegressionResult, device_id: int) -> Message | None:
        pos = np.flatnonzero(result.device_ids == device_id)
        if not len(pos) or result.clusters[pos[0]] < 0:
            return None
        j = int(result.clusters[pos[0]])
        return ClusterParams(params=result.coef[j].copy(), cluster=np.int64(j))

    # -- client ------------------------------------------------------------
    def _model(self) -> LinearRegression | LogisticRegression:
        if self.loss == "logistic":
            return LogisticRegression(self.n_features, l2=self.l2)
        return LinearRegression(self.n_features, l2=self.l2)

    def _data(self, model: LinearRegression | LogisticRegression, data: Any,
              device_id: int) -> tuple[np.ndarray, np.ndarray]:
        if not (isinstance(data, (tuple, list)) and len(data) == 2):
            raise ValidationError(f"machine {device_id}: expected (X, y), got {type(data).__name__}")
        X = np.asarray(data[0], dtype=np.float64)
        y = np.asarray(data[1], dtype=np.float64)
        return model.check_data(X, y, owner=f"machine {device_id}")

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        model = self._model()
        Xd, y = self._data(model, X, device_id)
        if request.action == ERM:
            erm = local_logistic_erm if self.loss == "logistic" else local_erm
            coef = erm(Xd, y, l2=self.l2, fit_intercept=self.fit_intercept,
                       owner=f"machine {device_id}")
            return LocalERM(coef=coef, n_samples=np.int64(Xd.shape[0]))
        if request.action != STEP:
            raise ValidationError(f"robust-regression has no client action {request.action!r}")
        msg = request.payload
        if not isinstance(msg, ClusterParams):
            raise ValidationError(f"machine {device_id}: a stage-3 step needs its cluster's "
                                  f"model, got {type(msg).__name__}")
        j = int(msg.cluster)
        if msg.params.shape != (self.n_params,):
            raise ValidationError(f"machine {device_id}: the server sent {msg.params.size} "
                                  f"parameters but the model has d + 1 = {self.n_params}")
        params = msg.params
        gd = self.optimizer == "gd"
        new, n, loss = local_update(
            model, params, Xd, y, mode="gd" if gd else "sgd",
            epochs=1 if gd else self.local_steps, batch_size=Xd.shape[0], lr=self.lr,
            rng=None if gd else device_rng(seed, device_id, request.round))
        if not self.fit_intercept:
            new[-1] = params[-1]
        return ModelUpdate(params=new, cluster=np.asarray(j, dtype=np.int64),
                           n_samples=np.int64(n), loss=np.float64(loss))

    def client_finish(self, message: Message | None, X: Any,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None:
            return {}
        return {"coef": np.asarray(message.params), "cluster": np.asarray(message.cluster)}
