"""k-FED + FedAvg (Dennis, Li & Smith, ICML 2021, §4.2.2) as a protocol on the
:class:`~.protocol.FLProtocol` rounds.

One k-FED round (the shared ``fl_kfed`` step, raw inputs or a feature map; the
``kfed_server`` step) clusters the devices' data; then FedAvg per cluster, one
request per cluster and round carrying that cluster's model and the (device,
local cluster) pairs that train it. After training every device gets its k-FED
label map, or, with k' > 1 and a gate routing, :class:`ServeModels` (its
clusters' final models) to fit its gate on (:func:`fedclust.fl.client.fit_gate`).
"""

from __future__ import annotations

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import Message
from ..core.random import server_rng
from ..core.validation import check_choice, check_int
from ..kfed.messages import LabelMap, LocalCenters
from ..kfed.server import assign_to_centers
from .client import fit_gate
from .messages import ClusterModel, LossReport, ModelParams, ModelUpdate, ServeModels
from .protocol import SELECT_BRANCH, FEATURE_MAPS, KFED, LOSS, TRAIN, FLProtocol, FLResult
from .server import KFED_SERVERS, select_random

__all__ = ["ClusteredFedAvgProtocol", "ROUTINGS"]

#: how a device with k' > 1 picks, per point, which of its cluster models serves it
ROUTINGS = ("centers", "gate", "soft-gate", "confidence")


class ClusteredFedAvgProtocol(FLProtocol):
    """k-FED + FedAvg (Dennis et al. 2021, §4.2.2): one k-FED round clusters the devices' data,
    then FedAvg per cluster (one request per cluster and round, one model download each).

    ``feature_map``: what k-FED clusters — ``"raw"`` inputs, a shared
    ``"random-projection"`` to ``feature_dim`` dims, or the ``"hidden"`` layer of
    the MLP after one global FedAvg round. ``kfed_server``: how the server clusters
    the local centers — ``"kmeans++"`` (k-means++ restarts + Lloyd to convergence;
    default) or the paper's ``"farthest-lloyd1"`` (farthest-first + one Lloyd step).
    Random selection only (m devices per round over all clusters).

    ``routing`` (k' > 1; prediction only, training always uses k-FED's local
    clusters; default ``"soft-gate"``): ``"centers"`` — nearest local k-FED center
    (the paper);
    ``"confidence"`` — the device's model with the lowest predictive entropy;
    ``"gate"`` — after training every device gets its clusters' final models
    (:class:`ServeModels`), labels each of its training points by the model with
    the lowest loss and fits a logistic-regression gate on them
    (:func:`fedclust.fl.client.fit_gate`), returned as its device output;
    ``"soft-gate"`` — the same gate, but the prediction mixes the models'
    class probabilities with the gate's probabilities (a mixture of experts).
    """

    name = "clustered-fedavg"
    # training reads the device's k-FED local clusters, kept from the k-FED round
    rejoin_actions = frozenset({LOSS, KFED})
    reply_types = {KFED: LocalCenters, TRAIN: ModelUpdate, LOSS: LossReport}
    _EXTRA_KEYS = ("n_clusters", "n_local_clusters", "feature_map", "feature_dim", "kfed_server",
                   "routing")

    def _refuse_private(self, spec):
        return ("its k-FED round has no device-level DP (hiding a whole device's local "
                "centers needs local noise of the order of the data's scale); use FedAvg "
                "or IFCA")

    def _init_extra(self, n_clusters: int = 2, n_local_clusters: int = 1,
                    feature_map: str = "raw", feature_dim: int = 50,
                    kfed_server: str = "kmeans++", routing: str = "soft-gate") -> None:
        self.kfed_server = check_choice(kfed_server, "kfed_server", KFED_SERVERS)
        self.routing = check_choice(routing, "routing", ROUTINGS)
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.n_models = self.n_clusters
        self.n_local_clusters = check_int(n_local_clusters, "n_local_clusters", min_value=1)
        self.kfed_map = self.feature_map = check_choice(feature_map, "feature_map", FEATURE_MAPS)
        self.feature_dim = check_int(feature_dim, "feature_dim", min_value=1)
        if self.feature_map == "hidden" and self.model != "mlp":
            raise ValidationError("feature_map='hidden' needs model='mlp'")
        if self.selection != "random":
            raise ValidationError(
                f"clustered-fedavg supports selection='random' only, got {self.selection!r}")

    def start(self, device_ids, seed):
        state = super().start(device_ids, seed)
        state.models[:] = state.models[0]  # one start for every cluster (clusters differ by data)
        return state

    def _setup_requests(self, state):
        return ["hidden", "kfed"] if self.feature_map == "hidden" else ["kfed"]

    def _round_plan(self, state):
        live = self._live(state)
        chosen = set(select_random(live, self._m(state),
                                   server_rng(state.seed, SELECT_BRANCH + state.fl_round)))
        plan = []
        for c in range(self.n_clusters):
            pairs = [(z, j) for z in sorted(chosen) if z in state.center_labels
                     for j in np.flatnonzero(state.center_labels[z] == c)]
            if not pairs:
                continue
            members = np.array([p[0] for p in pairs], dtype=np.int64)
            payload = ClusterModel(params=state.models[c], cluster=np.int64(c), members=members,
                                   local_index=np.array([p[1] for p in pairs], dtype=np.int64))
            plan.append(self._req(state, TRAIN, payload, np.unique(members)))
        return plan

    def check_reply(self, state, request, device_id, reply):
        super().check_reply(state, request, device_id, reply)
        if request.action == TRAIN and state.phase == "train" \
                and int(reply.cluster) != int(request.payload.cluster):
            raise IncompatibleMessageError(
                f"device {device_id}: update for cluster {int(reply.cluster)} in the round of "
                f"cluster {int(request.payload.cluster)}")

    def _train(self, request, X, y, *, device_id, seed, state):
        msg = request.payload
        if isinstance(msg, ModelParams):  # the 'hidden' feature round
            return self._local(msg.params, X, y, device_id, seed, request.round)
        mine = msg.local_index[msg.members == device_id]
        if "local_labels" not in state:
            raise ValidationError(f"device {device_id}: no k-FED local clusters in its state")
        mask = np.isin(state["local_labels"], mine)
        if not mask.any():
            raise ValidationError(f"device {device_id}: no points in local clusters "
                                  f"{mine.tolist()} of cluster {int(msg.cluster)}")
        return self._local(msg.params, X[mask], y[mask], device_id, seed, request.round,
                           cluster=int(msg.cluster))

    def assign_late(self, result: FLResult, device_id: int, reply: LocalCenters) -> np.ndarray:
        """Map a late device's local centers to the k-FED centers (O(k_z k d)); no training."""
        if reply.centers.shape[1] != result.centers.shape[1]:
            raise IncompatibleMessageError(
                f"device {device_id}: centers have {reply.centers.shape[1]} features but the "
                f"k-FED centers have {result.centers.shape[1]}")
        labels = assign_to_centers(reply.centers, result.centers)
        result.center_labels[device_id] = labels
        result.local_counts[device_id] = reply.counts
        result.local_centers[device_id] = reply.centers
        return labels

    def final_message(self, result: FLResult, device_id: int) -> Message | None:
        labels = result.center_labels.get(device_id)
        if labels is None:
            return None
        labels = labels.astype(np.int64)
        if self.routing not in ("gate", "soft-gate") or self.n_local_clusters == 1:
            return LabelMap(global_labels=labels)
        mine = np.unique(labels)
        return ServeModels(global_labels=labels, clusters=mine, params=result.models[mine])

    def client_finish(self, message, X, state):
        if message is None or "local_labels" not in state:
            return {}
        out = {"labels": np.asarray(message.global_labels)[state["local_labels"]]}
        if isinstance(message, ServeModels):
            Xd, yd = self._device_data(X, -1)
            gate = fit_gate(self._scratch, message.params, message.clusters, Xd, yd)
            out.update({f"gate_{k}": v for k, v in gate.items()})
        return out
