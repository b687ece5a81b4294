"""Federated evolving Gaussians as a protocol (Ožbot & Škrjanc).

Round r (``action="gauss_clusters"``): every owner learns, in one pass, the
r-th of ``n_rounds`` contiguous chunks of its rows into a fresh local cluster
set (its prior scale pooled from the broadcast global statistics and its own),
and sends the clusters with n > kappa_n plus its global statistics
(:class:`~fedclust.gauss.messages.GaussClusters`). The server pools the
statistics exactly, merges the clusters (never across classes), removes the
oldest past ``max_clusters`` and broadcasts the global model. Every sample is
counted once whatever the number of rounds, so the pooled statistics stay exact.
One round is the paper's setting and the default.

With ``em_rounds > 0`` (clustering only), up to that many federated EM rounds follow
(``action="gauss_em"``, :mod:`fedclust.gauss.em_rounds`): the server sends the
current mixture and candidate merges, drops and splits, every owner returns the
row-level log-likelihood (and responsibility entropy) of each and the E-step statistics,
and the server keeps the model with the lowest BIC (or ICL) and takes one M-step.

:class:`~fedclust.gauss.classifier_protocol.GaussClassifierProtocol` is the supervised variant (device data
``(X, y)``; ``classes`` travel in the config, so a label seen only at predict
time is impossible and a label missing on some owners is fine).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from ..core.messages import Message
from ..core.protocol import Protocol, Request, RunLog
from ..core.validation import check_array, check_choice, check_float, check_int
from .em_rounds import check_em_reply, em_payload, em_statistics, em_step
from .federated_em import CRITERIA
from .local import from_message, learn_local, to_message
from .messages import (GaussClassStats, GaussClassSums, GaussClusters, GaussEMStats,
                       GaussFeatures, GaussModel)
from .model import MERGE_TESTS, PREDICT_RULES, VOLUMES, ClusterSet, Settings, one_thread
from .server import merge_messages
from .stats import (class_moments, fisher_mask, fisher_scores, merge_class_moments, moments,
                    pack_scatter)
from .tree_merge import TreeMerge

__all__ = ["GaussProtocol", "GaussResult", "check_settings", "model_message", "result_message",
           "predict_labels"]

ACTION = "gauss_clusters"
STATS = "gauss_class_stats"  # the classifier's feature-selection round
EM = "gauss_em"  # federated EM rounds (em_rounds > 0)
#: the server's optional last step (:mod:`fedclust.gauss.combine`)
COMBINE = ("none", "entropy", "unimodal")


def check_settings(**kw: Any) -> Settings:
    """Validate the hyper-parameters (errors name the parameter and the value)."""
    s = Settings(**kw)
    check_choice(s.covariance, "covariance", ("full", "diag"))
    check_float(s.gate_quantile, "gate_quantile", min_value=0.0, max_value=1.0, min_inclusive=False)
    if s.gate_quantile >= 1.0:
        raise ValidationError(f"gate_quantile={s.gate_quantile} must be < 1")
    if s.n_sigma is not None:
        check_float(s.n_sigma, "n_sigma", min_value=0.0, min_inclusive=False)
    check_float(s.volume_fraction, "volume_fraction", min_value=0.0, max_value=1.0,
                min_inclusive=False)
    if s.n_r is not None:
        check_float(s.n_r, "n_r", min_value=0.0, min_inclusive=False)
    if s.prior_weight is not None:
        check_float(s.prior_weight, "prior_weight", min_value=1.0)
    check_float(s.kappa_m, "kappa_m", min_value=0.0, min_inclusive=False)
    check_choice(s.volume, "volume", tuple(VOLUMES))
    check_float(s.max_volume, "max_volume", min_value=0.0, min_inclusive=False)
    check_int(s.max_clusters, "max_clusters", min_value=1)
    check_float(s.min_weight, "min_weight", min_value=0.0, max_value=1.0)
    check_float(s.var_floor, "var_floor", min_value=0.0, min_inclusive=False)
    check_choice(s.predict_rule, "predict_rule", PREDICT_RULES)
    check_choice(s.merge_test, "merge_test", MERGE_TESTS)
    check_float(s.pooled_shrinkage, "pooled_shrinkage", min_value=0.0)
    check_float(s.merge_tol, "merge_tol", min_value=0.0)
    return s


#: the server's merge: ``"flat"`` (every owner's clusters at once) or ``"tree"``
#: (along a fixed trie over the owners' ids, :mod:`fedclust.gauss.tree_merge`)
SERVERS = ("flat", "tree")

SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings))


@dataclass
class GaussResult:
    """The global model (server side)."""

    means: np.ndarray                 # (K, D)
    scatters: np.ndarray              # (K, D, D) full, (K, D) diag
    counts: np.ndarray                # (K,) int64
    ages: np.ndarray                  # (K,) int64
    classes: np.ndarray               # (K,) int64 class index, -1 for clustering
    global_count: int
    global_mean: np.ndarray           # (D,)
    global_m2: np.ndarray             # (D,)
    class_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (M,)
    class_mean: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))         # (M, D)
    class_m2: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))           # (M, D)
    features: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (D_all,) 0/1
    fisher: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (D_all,) Fisher scores
    local_counts: dict[int, np.ndarray] = field(default_factory=dict)  # what each owner sent
    #: samples learnt but not in ``counts``: per owner (clusters with n <= kappa_n and
    #: clusters removed past max_clusters) and on the server (removed past max_clusters)
    removed_by_owner: dict[int, int] = field(default_factory=dict)
    removed_by_server: int = 0
    n_rounds: int = 1
    log: RunLog = field(default_factory=RunLog)
    #: federated EM rounds: per round the components, the kept edit and every model's score
    em_trace: list = field(default_factory=list)


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    model: GaussModel | None = None
    local_counts: dict[int, np.ndarray] = field(default_factory=dict)
    removed_by_owner: dict[int, int] = field(default_factory=dict)
    removed_by_server: int = 0
    features: np.ndarray | None = None   # (D_all,) 0/1 once the selection round is done
    fisher: np.ndarray | None = None
    em_round: int = 0
    em_done: bool = False
    mix: Mixture | None = None
    edits: np.ndarray | None = None
    ridge: np.ndarray | None = None
    em_ll: float = -np.inf
    em_trace: list = field(default_factory=list)


def model_message(cs: ClusterSet, features: np.ndarray | None = None) -> GaussModel:
    """The global model as the message broadcast to owners (``features``: kept features
    of the D_all original ones; None = all)."""
    count, mean, m2 = cs.g
    C = cs.C
    onehot = np.zeros((C, cs.n_classes), dtype=np.int64)
    if cs.n_classes:
        onehot[np.arange(C), cs.cls[:C]] = 1
    S = cs.S[:C]
    return GaussModel(means=cs.mu[:C].copy(), scatters=pack_scatter(S) if cs.full else S.copy(),
                      counts=np.rint(cs.n[:C]).astype(np.int64),
                      ages=np.maximum(cs.t - cs.last[:C], 0).astype(np.int64), classes=onehot,
                      global_count=np.asarray(int(count), dtype=np.int64),
                      global_mean=np.asarray(mean, dtype=float),
                      global_m2=np.asarray(m2, dtype=float),
                      class_count=np.asarray(cs.gc[0], dtype=np.int64),
                      class_mean=np.asarray(cs.gc[1], dtype=float),
                      class_m2=np.asarray(cs.gc[2], dtype=float),
                      features=(np.ones(cs.D, np.int64) if features is None
                                else np.asarray(features, dtype=np.int64)))


class GaussProtocol(Protocol):
    """Federated self-evolving Gaussian clustering. Parameters as in :class:`fedclust.FedGaussClustering`."""

    name = "gauss"
    reply_types = {ACTION: GaussClusters, STATS: GaussClassStats, EM: GaussEMStats}
    not_summable_reason = "the server merges each owner's evolving clusters, which a sum cannot carry"

    def __init__(self, *, kappa_n: float = 1, n_rounds: int = 1, n_features: int | None = None,
                 em_rounds: int = 0, em_criterion: str = "bic", combine: str = "none",
                 server: str = "flat", **settings: Any):
        unknown = set(settings) - set(SETTING_NAMES)
        if unknown:
            raise ValidationError(f"unknown parameters {sorted(unknown)}")
        self.settings = check_settings(**settings)
        self.kappa_n = check_float(kappa_n, "kappa_n", min_value=0.0)
        self.n_rounds = check_int(n_rounds, "n_rounds", min_value=1)
        self.em_rounds = check_int(em_rounds, "em_rounds", min_value=0)
        self.em_criterion = check_choice(em_criterion, "em_criterion", CRITERIA)
        self.combine = check_choice(combine, "combine", COMBINE)
        if self.combine != "none" and settings.get("merge_test", "bic") != "bic":
            raise ValidationError(f"combine={self.combine!r} needs merge_test='bic', got "
                                  f"{settings.get('merge_test')!r}")
        self.server = check_choice(server, "server", SERVERS)
        self._tree = TreeMerge() if self.server == "tree" else None
        if self.combine != "none" and self.server != "flat":
            raise ValidationError(f"combine={self.combine!r} needs server='flat': the tree "
                                  "server's forget reuses node results that a last "
                                  "combining step over the whole model would not keep")
        self.n_features = None if n_features is None else check_int(n_features, "n_features",
                                                                    min_value=1)

    @property
    def n_classes(self) -> int:
        return 0

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {k: v for k, v in dataclasses.asdict(self.settings).items()
                               if v is not None}
        cfg.update(kappa_n=self.kappa_n, n_rounds=self.n_rounds)
        if self.em_rounds:
            cfg["em_rounds"] = self.em_rounds
            cfg["em_criterion"] = self.em_criterion
        if self.combine != "none":
            cfg["combine"] = self.combine
        if self.n_features is not None:
            cfg["n_features"] = self.n_features
        if self.server != "flat":
            cfg["server"] = self.server
        return cfg

    @property
    def server_work(self) -> list[str] | None:
        """``server="tree"``: the trie nodes the last merge computed (the others were
        reused); None for the flat server (its step always runs in full)."""
        return None if self._tree is None else list(self._tree.last_work)

    def uncached(self) -> "GaussProtocol":
        """This protocol without the tree server's kept node results (a check from scratch)."""
        out = copy.copy(self)
        out._tree = TreeMerge() if self.server == "tree" else None
        return out

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "GaussProtocol":
        return cls(**dict(config))

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(int(z) for z in device_ids), int(seed))

    #: the classifier's Fisher-score feature selection adds a statistics round first
    selects = False

    def next_request(self, state: _State) -> Request | None:
        if self.selects and state.features is None:
            return Request(round=0, action=STATS)
        if state.round >= self.n_rounds:
            return self._em_request(state)
        payload: Message | None = state.model
        if payload is None and state.features is not None:
            payload = GaussFeatures(features=state.features.copy())
        return Request(round=state.round + int(self.selects), action=ACTION, payload=payload)

    def _em_request(self, state: _State) -> Request | None:
        if (not self.em_rounds or state.em_done or state.em_round >= self.em_rounds
                or state.model is None or self.n_classes):
            return None
        return Request(round=self.n_rounds + int(self.selects) + state.em_round, action=EM,
                       payload=em_payload(state, self.settings))

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        if request.action == EM:
            check_em_reply(state, device_id, reply)
            return
        if request.action == STATS:
            if not isinstance(reply, self.reply_types[STATS]):
                raise IncompatibleMessageError(
                    f"device {device_id}: expected {STATS}, got {type(reply).__name__}")
            D = (reply.class_sum if self.summed_stats else reply.global_mean).shape[-1]
            M = reply.class_count.shape[0]
            if (self.n_features and D != self.n_features) or M != self.n_classes:
                raise IncompatibleMessageError(
                    f"device {device_id}: statistics over {D} features and {M} classes; the "
                    f"federation has {self.n_features} and {self.n_classes}")
            return
        if not isinstance(reply, GaussClusters):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {ACTION}, got {type(reply).__name__}")
        D = reply.means.shape[1]
        if state.features is not None:
            want = int(state.features.sum())
        else:
            want = self.n_features or (state.model.means.shape[1] if state.model is not None
                                       else D)
        if D != want:
            raise IncompatibleMessageError(
                f"device {device_id}: clusters have {D} features but the federation has {want}")
        width = D * (D + 1) // 2 if self.settings.covariance == "full" else D
        if reply.scatters.shape[1] != width:
            raise IncompatibleMessageError(
                f"device {device_id}: scatters have width {reply.scatters.shape[1]}; "
                f"covariance={self.settings.covariance!r} needs {width}")
        if reply.classes.shape[1] != self.n_classes:
            raise IncompatibleMessageError(
                f"device {device_id}: classes have {reply.classes.shape[1]} columns but the "
                f"federation has {self.n_classes} classes")

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if request.action == EM:
            cs = em_step(state, replies, self.settings, self.em_criterion)
            if cs is not None:
                state.model = model_message(cs, state.features)
                # EM covers all rows
                state.removed_by_owner = {z: 0 for z in state.removed_by_owner}
                state.removed_by_server = 0
            return
        if request.action == STATS:
            msgs = list(replies.values())
            state.fisher, state.features = (self._select_sums(msgs) if self.summed_stats
                                            else self._select(msgs))
            return
        msgs = [replies[z] for z in sorted(replies)]
        for z in sorted(replies):
            prev = state.local_counts.get(z)
            cnt = np.asarray(replies[z].counts)
            state.local_counts[z] = cnt if prev is None else np.concatenate([prev, cnt])
            state.removed_by_owner[z] = (state.removed_by_owner.get(z, 0)
                                         + int(replies[z].global_count) - int(cnt.sum()))
        if msgs:
            with one_thread():
                if self._tree is not None:
                    cs = self._tree.merge(msgs, sorted(replies), self.settings, self.n_classes,
                                          state.model)  # type: ignore[arg-type]
                else:
                    cs = merge_messages(msgs, self.settings, self.n_classes, state.model,  # type: ignore[arg-type]
                                        combine=self.combine)
                state.removed_by_server += int(round(cs.removed))
                state.model = model_message(cs, state.features)
        state.round += 1

    def _select(self, msgs: list) -> tuple[np.ndarray, np.ndarray]:
        """Pool the per-class statistics exactly; Fisher scores and the kept features."""
        msgs = sorted(msgs, key=lambda m: (int(m.global_count), m.class_count.tolist(),
                                           m.global_mean.tolist(), m.global_m2.tolist()))
        D, M = msgs[0].global_mean.shape[0], self.n_classes
        gc: tuple = (np.zeros(M, np.int64), np.zeros((M, D)), np.zeros((M, D)))
        for m in msgs:
            gc = merge_class_moments(gc, (m.class_count, m.class_mean, m.class_m2))
        F = fisher_scores(*gc)
        return F, fisher_mask(F, self.kappa_f).astype(np.int64)

    kappa_f = 0.0
    summed_stats = False

    def _select_sums(self, msgs: list) -> tuple[np.ndarray, np.ndarray]:
        """Fisher scores from per-class counts, sums and sums of squares (a secure sum)."""
        n = sum(m.class_count for m in msgs).astype(np.float64)
        s = sum(m.class_sum for m in msgs)
        q = sum(m.class_sq for m in msgs)
        means = np.divide(s, n[:, None], out=np.zeros_like(s), where=n[:, None] > 0)
        m2 = np.maximum(q - n[:, None] * means ** 2, 0.0)  # Σx² − n x̄², per class
        F = fisher_scores(n, means, m2)
        return F, fisher_mask(F, self.kappa_f).astype(np.int64)

    def finish(self, state: _State, log: RunLog) -> GaussResult:
        m = state.model
        if m is None:
            raise TooFewReplies("no device replied (all dropped, failed or rejected); no model")
        with one_thread():
            cs = from_message(m, self.settings, self.n_classes)
        C = cs.C
        log.removed.update({z: c for z, c in state.removed_by_owner.items() if c})
        log.removed_by_server = state.removed_by_server
        return GaussResult(
            means=cs.mu[:C].copy(), scatters=cs.S[:C].copy(), counts=m.counts.copy(),
            ages=m.ages.copy(),
            classes=(np.argmax(m.classes, axis=1) if self.n_classes
                     else np.full(C, -1, np.int64)).astype(np.int64),
            global_count=int(m.global_count), global_mean=m.global_mean.copy(),
            global_m2=m.global_m2.copy(), class_count=m.class_count.copy(),
            class_mean=m.class_mean.copy(), class_m2=m.class_m2.copy(),
            features=m.features.copy(),
            fisher=np.zeros(0) if state.fisher is None else state.fisher.copy(),
            local_counts=dict(state.local_counts),
            removed_by_owner=dict(state.removed_by_owner),
            removed_by_server=state.removed_by_server,
            n_rounds=state.round, log=log, em_trace=list(state.em_trace))

    def final_message(self, result: GaussResult, device_id: int) -> Message | None:
        return result_message(result, self.settings)

    # -- client ------------------------------------------------------------
    def _device_data(self, data: Any, device_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        X = check_array(data, f"device {device_id}")
        if X.shape[0] == 0:
            raise ValidationError(f"device {device_id} has no rows")
        return X.astype(np.float64, copy=False), None

    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action == EM:
            return em_statistics(request.payload, self._device_data(X, device_id)[0], device_id,
                                 self.settings)
        if request.action not in (ACTION, STATS):
            raise ValidationError(f"gauss has no client action {request.action!r}")
        Xd, y = self._device_data(X, device_id)
        if self.n_features is not None and Xd.shape[1] != self.n_features:
            raise ValidationError(f"device {device_id} has {Xd.shape[1]} features but the "
                                  f"federation has n_features={self.n_features}")
        if request.action == STATS and self.summed_stats:
            M = self.n_classes
            s, q = np.zeros((M, Xd.shape[1])), np.zeros((M, Xd.shape[1]))
            np.add.at(s, y, Xd)
            np.add.at(q, y, Xd * Xd)
            return GaussClassSums(class_count=np.bincount(y, minlength=M).astype(np.int64),
                                  class_sum=s, class_sq=q)
        if request.action == STATS:
            count, mean, m2 = moments(Xd)
            cc, cm, cv = class_moments(Xd, y, self.n_classes)  # type: ignore[arg-type]
            return GaussClassStats(global_count=np.asarray(int(count), np.int64),
                                   global_mean=mean, global_m2=m2, class_count=cc,
                                   class_mean=cm, class_m2=cv)
        payload = request.payload
        features = getattr(payload, "features", None)
        if features is not None:  # learn on the selected features only
            Xd = Xd[:, np.asarray(features, dtype=bool)]
        chunk = request.round - int(self.selects)
        rows = np.array_split(np.arange(Xd.shape[0]), self.n_rounds)[chunk]
        Xr = Xd[rows]
        yr = None if y is None else y[rows]
        own = moments(Xr)
        prior = None
        if isinstance(payload, GaussClusters):
            prior = (int(payload.global_count), payload.global_mean, payload.global_m2)
        if Xr.shape[0] == 0:  # fewer rows than rounds: nothing new this round
            D, M = Xd.shape[1], self.n_classes
            return GaussClusters(
                means=np.zeros((0, D)), scatters=np.zeros((0, D * (D + 1) // 2
                                                           if self.settings.covariance == "full"
                                                           else D)),
                counts=np.zeros(0, np.int64), ages=np.zeros(0, np.int64),
                classes=np.zeros((0, M), np.int64),
                global_count=np.asarray(0, np.int64), global_mean=np.zeros(D),
                global_m2=np.zeros(D), class_count=np.zeros(M, np.int64),
                class_mean=np.zeros((M, D)), class_m2=np.zeros((M, D)))
        own_cls = None if yr is None else class_moments(Xr, yr, self.n_classes)
        with one_thread():
            cs = learn_local(Xr, yr, self.settings, self.n_classes, prior)
        return to_message(cs, self.kappa_n, own, own_class_moments=own_cls)

    def client_finish(self, message: Message | None, X: Any,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None:
            return {}
        Xd, _ = self._device_data(X, -1)
        features = getattr(message, "features", None)
        if features is not None:
            Xd = Xd[:, np.asarray(features, dtype=bool)]
        with one_thread():
            cs = from_message(message, self.settings, self.n_classes)  # type: ignore[arg-type]
            return {"labels": predict_labels(cs, Xd, self.settings.predict_rule)}


def result_message(result: GaussResult, settings: Settings) -> GaussModel:
    S = result.scatters
    onehot_cols = int(result.classes.max()) + 1 if (result.classes >= 0).any() else 0
    return GaussModel(
        means=result.means, scatters=pack_scatter(S) if S.ndim == 3 else S,
        counts=result.counts.astype(np.int64), ages=result.ages.astype(np.int64),
        classes=onehot(result.classes, onehot_cols),
        global_count=np.asarray(int(result.global_count), np.int64),
        global_mean=result.global_mean, global_m2=result.global_m2,
        class_count=result.class_count.astype(np.int64),
        class_mean=result.class_mean.reshape(-1, result.means.shape[1]),
        class_m2=result.class_m2.reshape(-1, result.means.shape[1]),
        features=(result.features.astype(np.int64) if result.features.size
                  else np.ones(result.means.shape[1], np.int64)))


def onehot(classes: np.ndarray, M: int) -> np.ndarray:
    out = np.zeros((classes.size, M), dtype=np.int64)
    if M:
        out[np.arange(classes.size), classes] = 1
    return out


def predict_labels(cs: ClusterSet, X: np.ndarray, rule: str) -> np.ndarray:
    """Cluster index (clustering) or class index (classification) of every row."""
    from .scoring import class_log_scores

    if cs.n_classes:
        return np.argmax(class_log_scores(cs, X, rule), axis=1).astype(np.int64)
    return np.argmax(cs.log_scores(X, rule), axis=1).astype(np.int64)
