"""The FL round machinery (:class:`FLProtocol`); FedAvg in :mod:`.fedavg`, IFCA in
:mod:`.ifca`, k-FED + FedAvg in :mod:`.clustered` (one run = one ``transport.run``).

Rounds (actions; every request names its devices, so bytes are exact):

``fl_loss``  (power-of-choice only) candidates report their local loss of the
    current model (payload :class:`ModelParams`), or, with no payload, just
    their sample count (the size round that pow-d's sampling ∝ n_z needs);
``fl_kfed``  (k-FED + FedAvg, and FedAvg with ``selection="kfed-pow-d"``) one
    k-FED round (:class:`fedclust.kfed.KFedProtocol`'s device step on the raw
    inputs or a feature map), aggregated by the ``kfed_server`` step: k-means++ on
    the local centers (:func:`fedclust.fl.server.cluster_local_centers`, default)
    or the paper's :func:`fedclust.kfed.server.aggregate_centers`;
``fl_train`` the selected devices train what they receive and send a
    :class:`ModelUpdate`: FedAvg one model, IFCA all k models (the device keeps
    the lowest-loss one), k-FED + FedAvg one request per cluster with that
    cluster's model (a device with k' > 1 trains it on the points of its local
    clusters mapped to that cluster).

After training (k-FED + FedAvg) every device gets its k-FED label map, or, with
k' > 1 and a gate routing, :class:`ServeModels` (its clusters' final models) to
fit its gate on (:func:`fedclust.fl.client.fit_gate`).

The base class :class:`FLProtocol` is parameterised entirely by scalars
(model kind and sizes, aggregator, beta, rounds, local mode / epochs / batch /
lr, selection), so another wing can reuse the rounds or write its own with
:func:`fedclust.fl.client.local_update` and
:func:`fedclust.fl.server.aggregate_updates`.

McMahan et al. 2017 (FedAvg); Ghosh et al. 2020 (IFCA); Dennis, Li & Smith,
ICML 2021, §4.2.2 (k-FED + FedAvg, Table 2; client selection, Figure 4);
Cho, Wang & Joshi 2020 (power-of-choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog
from ..core.random import server_rng
from ..core.secure_sum import SUMMED
from ..core.validation import check_choice, check_float, check_int
from ..kfed.protocol import KFedProtocol
from .client import LOCAL_MODES
from .device import FEATURE_MAPS, KFED, LOSS, TRAIN, FLDeviceSteps, feature_map
from .messages import ModelParams, ModelUpdate, NoisyUpdate, SummedUpdate
from .models import MODEL_KINDS, Model, build_model
from .server import AGGREGATORS, SELECTIONS, average_per_cluster, \
    cluster_local_centers, sample_candidates, select_by_loss, select_random
from ..privacy import (DifferentialPrivacy, PrivacyPlan, Release, noise_rng, planned, pop_privacy,
                       privacy_config)
from ..privacy.mechanisms import SERVER, clip_contribution, gaussian

__all__ = ["FLProtocol", "FedAvgProtocol", "FLResult", "FEATURE_MAPS", "feature_map"]

# server_rng round index offsets (499, the shared random projection's, is in .device)
SELECT_BRANCH = 1000   # selection draws
INIT_BRANCH = 500      # model initialisation
KFED_BRANCH = 498      # the k-means++ server step on the local centers
#: privacy-noise stream keys of the secret Poisson sample and of a round nobody was sampled in
POISSON_KEY = 1 << 21
EMPTY_KEY = (1 << 21) + (1 << 20)


@dataclass
class FLResult:
    """Outcome of a FedAvg / IFCA / k-FED + FedAvg run (server side).

    ``models`` (k, p): final parameters (k = 1 for FedAvg). ``center_labels`` /
    ``local_counts``: per device, the cluster of each of its local groups and
    their sizes (k-FED: its local centers; IFCA: its last choice). ``round_*``:
    per FL round, the weighted mean local loss of the received models (before
    training), bytes up / down (including selection probes) and the number of
    devices that trained. ``snapshots``: models every ``snapshot_every`` rounds
    (float32), for test-accuracy curves.
    """

    models: np.ndarray
    centers: np.ndarray
    center_labels: dict[int, np.ndarray]
    local_counts: dict[int, np.ndarray]
    local_centers: dict[int, np.ndarray]
    feature_params: np.ndarray
    round_loss: np.ndarray
    round_bytes_up: np.ndarray
    round_bytes_down: np.ndarray
    round_devices: np.ndarray
    setup_bytes: list
    snapshots: dict[int, np.ndarray]
    log: RunLog = field(default_factory=RunLog)
    #: IFCA with ``n_init > 1``: mean training loss of each start in the last restart round
    restart_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class _State:
    ids: tuple[int, ...]
    seed: int
    models: np.ndarray
    req: int = 0
    fl_round: int = 0
    queue: list = field(default_factory=list)
    sizes: dict = field(default_factory=dict)
    losses: dict = field(default_factory=dict)
    silent: set = field(default_factory=set)
    center_labels: dict = field(default_factory=dict)
    local_counts: dict = field(default_factory=dict)
    local_centers: dict = field(default_factory=dict)
    centers: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    feature_params: np.ndarray = field(default_factory=lambda: np.zeros(0))
    acc: dict = field(default_factory=lambda: {"loss": 0.0, "n": 0, "up": 0, "down": 0, "dev": 0})
    history: dict = field(default_factory=lambda: {"loss": [], "up": [], "down": [], "dev": []})
    setup: list = field(default_factory=lambda: [0, 0])
    snapshots: dict = field(default_factory=dict)
    phase: str = "start"


class FLProtocol(FLDeviceSteps, Protocol):
    """Shared machinery of the FL protocols (not registered itself; see the subclasses).

    Parameters
    ----------
    model : {"mlp", "softmax", "logistic", "linear"}
    n_features, n_classes, n_hidden, l2 : sizes / penalty of the model
    rounds : int
        FL rounds (each: optional selection probe, then training).
    local_mode : {"sgd", "gd"}; local_epochs, batch_size, lr
        The device step (:func:`fedclust.fl.client.local_update`).
    aggregator : {"mean", "trimmed-mean", "median"}; beta : float
        How the server combines updates (coordinate-wise; beta per side).
    weighted : bool
        Weight updates by the devices' sample counts (FedAvg); mean only.
    clients_per_round : int
        m devices per round; 0 = all.
    selection : {"random", "pow-d", "kfed-pow-d"}; n_candidates : int
        Client selection (power-of-choice: d = n_candidates, 0 = 2 m).
    snapshot_every : int
        Keep the models every this many rounds (0: never).
    privacy : DifferentialPrivacy or None
        DP-FedAvg (McMahan et al., ICLR 2018), device level, central DP: the
        server clips each device's update (its model minus the model it
        received) to ``clip_norm``, sums them per model, adds Gaussian noise to
        the sums and to the per-model device counts (one joint release per
        round, sensitivity ``clip_norm·√2``), and moves each model by noisy sum
        ÷ noisy count. Updates are unweighted, devices report no loss.
    sampling : float in (0, 1], default 1
        Under privacy: every live device takes part in a round independently with
        this probability (Poisson sampling), drawn from the privacy-noise stream
        (operating-system entropy, never ``random_state``), so the sample stays
        secret; the rounds are then accounted as ``dp-accounting``'s
        ``PoissonSampledDpEvent`` (amplification by subsampling). A round whose
        sample is empty still releases its noise. Without privacy it is unused.
    """

    supervised = True
    n_models = 1
    # a training or loss round needs only the broadcast models: a device whose node lost
    # its state (restarted, or a resumed Flower run) takes part again at the next one
    rejoin_actions = frozenset({TRAIN, LOSS, KFED})
    not_summable_reason = ("each device's update goes to the model it chose, or a robust "
                           "aggregator needs each update")

    def __init__(self, *, model: str = "mlp", n_features: int, n_classes: int = 10,
                 n_hidden: int = 200, l2: float = 0.0, rounds: int = 30, local_mode: str = "sgd",
                 local_epochs: int = 1, batch_size: int = 32, lr: float = 0.05,
                 aggregator: str = "mean", beta: float = 0.1, weighted: bool = True,
                 clients_per_round: int = 0, selection: str = "random", n_candidates: int = 0,
                 snapshot_every: int = 0, privacy: DifferentialPrivacy | None = None,
                 noise_multipliers: Sequence[float] | None = None, sampling: float = 1.0,
                 **extra: Any):
        self.model = check_choice(model, "model", MODEL_KINDS)
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.n_classes = check_int(n_classes, "n_classes", min_value=1)
        self.n_hidden = check_int(n_hidden, "n_hidden", min_value=1)
        self.l2 = check_float(l2, "l2", min_value=0.0)
        self.rounds = check_int(rounds, "rounds", min_value=1)
        self.local_mode = check_choice(local_mode, "local_mode", LOCAL_MODES)
        self.local_epochs = check_int(local_epochs, "local_epochs", min_value=1)
        self.batch_size = check_int(batch_size, "batch_size", min_value=1)
        self.lr = check_float(lr, "lr", min_value=0.0, min_inclusive=False)
        self.aggregator = check_choice(aggregator, "aggregator", AGGREGATORS)
        self.beta = check_float(beta, "beta", min_value=0.0, max_value=0.49)
        self.weighted = bool(weighted)
        self.clients_per_round = check_int(clients_per_round, "clients_per_round", min_value=0)
        self.selection = check_choice(selection, "selection", SELECTIONS)
        self.n_candidates = check_int(n_candidates, "n_candidates", min_value=0)
        self.snapshot_every = check_int(snapshot_every, "snapshot_every", min_value=0)
        self.sampling = check_float(sampling, "sampling", min_value=0.0, max_value=1.0,
                                    min_inclusive=False)
        self.privacy = privacy
        self._init_extra(**extra)
        self._scratch = self.new_model()
        self.plan: PrivacyPlan | None = None
        if privacy is not None:
            self.plan = self._calibrate(privacy, noise_multipliers)

    def _refuse_private(self, spec: DifferentialPrivacy) -> str | None:
        """Why this configuration has no DP (None: it has)."""
        if spec.unit != "device":
            return ("federated learning has device-level DP only (point level needs "
                    "per-example clipping, DP-SGD); use unit='device'")
        if self.aggregator != "mean":
            return f"aggregator={self.aggregator!r} has no DP version; use 'mean'"
        if self.selection != "random":
            return (f"selection={self.selection!r} reads the devices' losses or a k-FED round "
                    "without DP; use 'random'")
        return None

    def _calibrate(self, spec: DifferentialPrivacy, multipliers) -> PrivacyPlan:
        why = self._refuse_private(spec)
        if why:
            raise ValidationError(f"privacy: {self.name}: {why}")
        spec.require(clip_norm=True, family=self.name)
        releases = [Release("fl round: per-model sums of clipped updates and device counts",
                            float(spec.clip_norm) * math.sqrt(2.0), repeats=self.rounds,
                            sampling=self.sampling)]
        return planned(spec, releases, multipliers, family=f"this {self.name} fit")

    def _init_extra(self, **extra: Any) -> None:
        if extra:
            raise ValidationError(f"unknown parameters {sorted(extra)}")

    def new_model(self) -> Model:
        """A fresh model of this protocol's kind and sizes."""
        return build_model(self.model, self.n_features, max(self.n_classes, 2),
                           n_hidden=self.n_hidden, l2=self.l2)

    # -- config -------------------------------------------------------------
    _KEYS = ("model", "n_features", "n_classes", "n_hidden", "l2", "rounds", "local_mode",
             "local_epochs", "batch_size", "lr", "aggregator", "beta", "weighted",
             "clients_per_round", "selection", "n_candidates", "snapshot_every", "sampling")
    _EXTRA_KEYS: tuple[str, ...] = ()

    def config(self) -> dict[str, Any]:
        cfg = {k: getattr(self, k) for k in self._KEYS + self._EXTRA_KEYS}
        if self.plan is not None:
            cfg.update(privacy_config(self.privacy, self.plan))
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "FLProtocol":
        cfg = dict(config)
        privacy = pop_privacy(cfg)
        if privacy is not None:
            cfg["privacy"] = privacy
        return cls(**cfg)

    # -- server ---------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        init = self.new_model()
        models = np.stack([init.init_params(server_rng(seed, INIT_BRANCH + j))
                           for j in range(self.n_models)])
        if self.n_models > 1 and not hasattr(init, "hidden"):
            # convex models start at 0: break IFCA's symmetry with small noise
            models += 0.01 * server_rng(seed, INIT_BRANCH - 1).standard_normal(models.shape)
        state = _State(tuple(sorted(int(z) for z in device_ids)), int(seed), models)
        state.queue = self._setup_requests(state)
        return state

    def _setup_requests(self, state: _State) -> list:
        """Requests before the first FL round (k-FED, size probe); strings are phases."""
        if self.selection == "kfed-pow-d":
            return ["kfed"]
        if self.selection == "pow-d":
            return ["sizes"]
        return []

    def _m(self, state: _State) -> int:
        return self.clients_per_round or len(state.ids)

    def _live(self, state: _State) -> list[int]:
        return [z for z in state.ids if z not in state.silent]

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a private fit asks of each device, by action: one training
        round per FL round (a private fit selects devices at random: no loss probes)."""
        return {TRAIN: self.rounds}

    def next_request(self, state: _State) -> Request | None:
        while True:
            if state.queue:
                item = state.queue.pop(0)
                req = self._make(state, item) if isinstance(item, str) else item
                if req is None:
                    continue
                state.req += 1
                return req
            if state.fl_round > 0 and state.phase == "train":
                self._close_round(state)
            if state.fl_round >= self.rounds:
                return None
            state.phase = "train"
            state.fl_round += 1
            state.queue = self._round_plan(state)

    def _req(self, state: _State, action: str, payload: Message | None,
             devices: Sequence[int]) -> Request | None:
        devices = tuple(sorted(int(z) for z in devices))
        if not devices:
            return None
        return Request(round=state.req, action=action, payload=payload, devices=devices)

    def _make(self, state: _State, item: str) -> Request | None:
        live = self._live(state)
        if item == "sizes":
            return self._req(state, LOSS, None, live)
        if item == "kfed":
            payload = None if state.feature_params.size == 0 else ModelParams(state.feature_params)
            return self._req(state, KFED, payload, live)
        if item == "hidden":
            return self._req(state, TRAIN, ModelParams(state.models[0]), live)
        if item == "select":
            losses = state.losses
            state.losses = {}
            chosen = select_by_loss(
                losses, self._m(state),
                self._device_clusters(state) if self.selection == "kfed-pow-d" else None)
            return self._train_request(state, chosen)
        raise AssertionError(item)

    def _round_plan(self, state: _State) -> list:
        live = self._live(state)
        if self.plan is not None and self.sampling < 1.0:
            if getattr(self, "noise_devices", 0):
                # every device is asked and flips its own secret coin (see _noisy_update)
                return [self._train_request(state, live)]
            return self._poisson_round(state, live)
        rng = server_rng(state.seed, SELECT_BRANCH + state.fl_round)
        m = self._m(state)
        if self.selection == "random" or m >= len(live):
            return [self._train_request(state, select_random(live, m, rng))]
        d = self.n_candidates or 2 * m
        sizes = [state.sizes.get(z, 1) for z in live]
        cands = sample_candidates(live, sizes, max(d, m), rng)
        return [self._req(state, LOSS, self._probe_payload(state), cands), "select"]

    def _poisson_round(self, state: _State, live: list[int]) -> list:
        """A secret Poisson sample of the live devices (privacy-noise stream)."""
        secret = noise_rng(self.privacy.noise_seed, SERVER, POISSON_KEY + state.fl_round)
        ids = sorted(live)
        chosen = [z for z, u in zip(ids, secret.random(len(ids))) if u < self.sampling]
        if not chosen:   # the release still happens: noise on empty sums
            state.models = self._aggregate({}, state.models, EMPTY_KEY + state.fl_round)
            return []
        return [self._train_request(state, chosen)]

    def _probe_payload(self, state: _State) -> Message:
        """What power-of-choice candidates evaluate their loss on (IFCA: all k models)."""
        return ModelParams(state.models[0])

    def _train_request(self, state: _State, devices: Sequence[int]) -> Request | None:
        return self._req(state, TRAIN, ModelParams(state.models[0]), devices)

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        expected = self.reply_types[request.action]
        if not isinstance(reply, expected):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {expected.kind}, got {type(reply).__name__}")
        if isinstance(reply, (SummedUpdate, NoisyUpdate)):
            p = state.models.shape[1]
            got = (reply.weighted_params if isinstance(reply, SummedUpdate) else reply.delta)
            if got.shape != (p,):
                raise IncompatibleMessageError(
                    f"device {device_id}: sent {got.shape[0]} parameters but the model has {p}")
        if isinstance(reply, ModelUpdate):
            p = state.models.shape[1]
            if reply.params.shape != (p,):
                raise IncompatibleMessageError(
                    f"device {device_id}: sent {reply.params.shape[0]} parameters but the model "
                    f"has {p}")
            if int(reply.cluster) >= len(state.models):
                raise IncompatibleMessageError(
                    f"device {device_id}: cluster={int(reply.cluster)} but there are "
                    f"{len(state.models)} models")
        if request.action == KFED:
            self._kfed().check_reply(None, request, device_id, reply)

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        asked = request.devices or ()
        if SUMMED not in replies:  # a secure sum names nobody; the transport logs failures
            state.silent.update(z for z in asked if z not in replies)
        down = 0 if request.payload is None else request.payload.nbytes * len(asked)
        up = sum(r.nbytes * (int(r.n_devices) if isinstance(r, (SummedUpdate, NoisyUpdate)) else 1)
                 for r in replies.values())
        if state.phase != "train":
            state.setup[0] += up
            state.setup[1] += down
        else:
            state.acc["up"] += up
            state.acc["down"] += down
        if request.action == LOSS:
            for z, r in replies.items():
                state.sizes[z] = int(r.n_samples)
                if request.payload is not None:
                    state.losses[z] = float(r.loss)
        elif request.action == KFED:
            self._kfed_step(state, replies)
        elif state.phase != "train":  # the 'hidden' feature round: one global FedAvg round
            state.feature_params = self._aggregate(replies, state.models[:1])[0]
            state.models[:] = state.feature_params
        else:
            self._train_step(state, request, replies)

    def _aggregate(self, replies: Mapping[int, Message], previous: np.ndarray,
                   round_index: int = 0) -> np.ndarray:
        if self.plan is not None:
            return self._private_aggregate(replies, previous, round_index)
        ids = sorted(replies)
        P = np.stack([replies[z].params for z in ids])
        w = (np.array([int(replies[z].n_samples) for z in ids], dtype=float)
             if self.weighted else None)
        clusters = [int(replies[z].cluster) for z in ids]
        return average_per_cluster(P, clusters, previous, weights=w, aggregator=self.aggregator,
                                   beta=self.beta)

    def _private_aggregate(self, replies: Mapping[int, Message], previous: np.ndarray,
                           round_index: int) -> np.ndarray:
        """DP-FedAvg's server step (see the class docstring); noise on every model, used or not."""
        C = float(self.privacy.clip_norm)
        std = self.plan.releases[0].noise_std
        rng = noise_rng(self.privacy.noise_seed, SERVER, round_index)
        k, p = previous.shape
        sums, counts = np.zeros((k, p)), np.zeros(k)
        for z in sorted(replies):
            j = int(replies[z].cluster)
            (delta,), _ = clip_contribution([replies[z].params - previous[j]], [1.0], C)
            sums[j] += delta
            counts[j] += 1.0
        if std > 0:
            sums = gaussian(sums, std, rng)
            counts = gaussian(counts, std / C, rng)
        out = np.array(previous, dtype=np.float64, copy=True)
        ok = counts > max(1.0, 3.0 * std / C)  # a model with a count lost in noise stays
        out[ok] += sums[ok] / counts[ok, None]
        return out

    def _train_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if replies:
            state.models = self._aggregate(replies, state.models, request.round)
        for z, r in replies.items():
            n = int(r.n_samples)
            state.acc["loss"] += float(r.loss) * n
            state.acc["n"] += n
            state.acc["dev"] += 1
            self._note_choice(state, z, r)

    def _note_choice(self, state: _State, z: int, reply: ModelUpdate) -> None:
        """Remember what a device's reply says about its cluster (IFCA)."""

    def _close_round(self, state: _State) -> None:
        a, h = state.acc, state.history
        released = not (self.plan is not None and self.privacy.private)  # DP: no loss
        h["loss"].append(a["loss"] / a["n"] if a["n"] and released else float("nan"))
        h["up"].append(a["up"])
        h["down"].append(a["down"])
        h["dev"].append(a["dev"])
        state.acc = {"loss": 0.0, "n": 0, "up": 0, "down": 0, "dev": 0}
        r = state.fl_round
        if self.snapshot_every and (r % self.snapshot_every == 0 or r == self.rounds):
            state.snapshots[r] = state.models.astype(np.float32)
        state.phase = "between"

    # -- k-FED inside ---------------------------------------------------------
    n_clusters = 1
    n_local_clusters = 1
    kfed_map = "raw"
    feature_dim = 50
    kfed_server = "farthest-lloyd1"

    def _kfed_dim(self) -> int:
        return {"raw": self.n_features, "random-projection": self.feature_dim,
                "hidden": self.n_hidden}[self.kfed_map]

    def _kfed(self) -> KFedProtocol:
        return KFedProtocol(self.n_clusters, self.n_local_clusters, n_features=self._kfed_dim())

    def _kfed_step(self, state: _State, replies: Mapping[int, Message]) -> None:
        kfed = self._kfed()
        kstate = kfed.start(sorted(replies), state.seed)
        kfed.server_step(kstate, Request(0, "local_centers"), replies)
        res = kfed.finish(kstate, RunLog(participants=sorted(replies)))
        if self.kfed_server == "kmeans++":
            ids = sorted(res.local_centers)
            centers, labels = cluster_local_centers(
                [res.local_centers[z] for z in ids], self.n_clusters,
                server_rng(state.seed, KFED_BRANCH))
            res.centers, res.center_labels = centers, dict(zip(ids, labels))
        state.centers = res.centers
        for z in res.center_labels:
            state.center_labels[z] = res.center_labels[z]
            state.local_counts[z] = res.local_counts[z]
            state.local_centers[z] = res.local_centers[z]
            state.sizes[z] = int(res.local_counts[z].sum())

    @staticmethod
    def _device_clusters(state: _State) -> dict[int, int]:
        """Each device's cluster: the cluster of its largest local group."""
        return {z: int(lab[int(np.argmax(state.local_counts[z]))])
                for z, lab in state.center_labels.items()}

    def finish(self, state: _State, log: RunLog) -> FLResult:
        if state.fl_round > 0 and state.phase == "train":
            self._close_round(state)
        h = state.history
        if self.plan is not None:   # a device's cluster choice and size are not released
            state.center_labels, state.local_counts = {}, {}
        return FLResult(
            models=state.models, centers=state.centers,
            center_labels=dict(state.center_labels), local_counts=dict(state.local_counts),
            local_centers=dict(state.local_centers), feature_params=state.feature_params,
            round_loss=np.asarray(h["loss"], dtype=float),
            round_bytes_up=np.asarray(h["up"], dtype=np.int64),
            round_bytes_down=np.asarray(h["down"], dtype=np.int64),
            round_devices=np.asarray(h["dev"], dtype=np.int64),
            setup_bytes=[int(state.setup[0]), int(state.setup[1])],
            snapshots=dict(state.snapshots), log=log,
            restart_loss=np.asarray(getattr(state, "restart_loss", np.zeros(0)), dtype=float))


# FedAvg, IFCA and k-FED + FedAvg live in their own modules (:mod:`.fedavg`, :mod:`.ifca`,
# :mod:`.clustered`);
# they stay importable from here, resolved on first use since those modules import this one.
_MOVED = {"FedAvgProtocol": "fedavg", "IFCAProtocol": "ifca", "ClusteredFedAvgProtocol": "clustered", "ROUTINGS": "clustered"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from importlib import import_module

        return getattr(import_module(f".{_MOVED[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
