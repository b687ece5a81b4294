"""IFCA (Ghosh et al., NeurIPS 2020) as a protocol on the :class:`~.protocol.FLProtocol` rounds.

Every selected device downloads all k models (:class:`ModelSet`), keeps the one
with the lowest loss on its data, trains it and sends it back tagged; the server
averages per cluster. Optional restarts (``n_init``) and power-of-choice probes.
"""

from __future__ import annotations

import numpy as np

from ..core.exceptions import ValidationError
from ..core.random import server_rng
from ..core.validation import check_int
from .client import choose_cluster
from .messages import LossReport, ModelSet, ModelUpdate
from .protocol import INIT_BRANCH, SELECT_BRANCH, LOSS, TRAIN, FLProtocol
from .server import select_random

__all__ = ["IFCAProtocol"]

_RESTART_BRANCH = 100000  # IFCA start s > 0 draws its models from INIT_BRANCH + s * this


class IFCAProtocol(FLProtocol):
    """IFCA (Ghosh et al. 2020): k models; every selected device downloads all k (8 k p bytes),
    keeps the one with the lowest local loss, trains it and sends it back tagged; the server
    averages per cluster. Random selection only.

    Restarts (``n_init > 1``, as Ghosh et al.): ``n_init`` independent random starts
    each run the first ``restart_rounds`` rounds side by side (a device downloads and
    trains every start's k models: ``n_init`` times the bytes in those rounds); then
    the start with the lowest mean training loss (the IFCA objective, min over its k
    models, weighted by n_z) in the last restart round goes on alone. ``rounds``
    counts the restart rounds (which select devices at random).

    ``selection="pow-d"`` (Cho et al.): the d candidates download all k models and
    report the loss of their best one (8 k p bytes down, 16 up each); the m with
    the highest loss train.
    """

    name = "ifca"
    reply_types = {TRAIN: ModelUpdate, LOSS: LossReport}
    _EXTRA_KEYS = ("n_clusters", "n_init", "restart_rounds")

    def _init_extra(self, n_clusters: int = 2, n_init: int = 1, restart_rounds: int = 3) -> None:
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.n_models = self.n_clusters
        self.n_init = check_int(n_init, "n_init", min_value=1)
        self.restart_rounds = check_int(restart_rounds, "restart_rounds", min_value=1)
        if self.n_init > 1 and self.restart_rounds >= self.rounds:
            raise ValidationError(f"restart_rounds={self.restart_rounds} must be below "
                                  f"rounds={self.rounds} when n_init > 1")
        if self.selection not in ("random", "pow-d"):
            raise ValidationError(
                f"IFCA supports selection='random' or 'pow-d', got {self.selection!r}")

    def _refuse_private(self, spec):
        if self.n_init > 1:
            return (f"n_init={self.n_init} picks a start by the devices' losses, which have no "
                    "DP release; use n_init=1")
        return super()._refuse_private(spec)

    def start(self, device_ids, seed):
        state = super().start(device_ids, seed)
        if self.n_init > 1:
            starts = [state.models]
            for s in range(1, self.n_init):
                init = self.new_model()
                base = INIT_BRANCH + _RESTART_BRANCH * s
                M = np.stack([init.init_params(server_rng(seed, base + j))
                              for j in range(self.n_models)])
                if not hasattr(init, "hidden"):
                    M += 0.01 * server_rng(seed, base - 1).standard_normal(M.shape)
                starts.append(M)
            state.starts = np.stack(starts)
            state.start_acc = np.zeros((self.n_init, 2))
            state.req_start = {}
        return state

    def _restarting(self, state) -> bool:
        return self.n_init > 1 and state.fl_round <= self.restart_rounds

    def _round_plan(self, state):
        if not self._restarting(state):
            return super()._round_plan(state)
        state.restart_chosen = select_random(
            self._live(state), self._m(state),
            server_rng(state.seed, SELECT_BRANCH + state.fl_round))
        state.start_acc[:] = 0.0
        return [f"start:{s}" for s in range(self.n_init)]

    def _make(self, state, item):
        if not item.startswith("start:"):
            return super()._make(state, item)
        s = int(item.split(":")[1])
        state.req_start[state.req] = s  # the round number this request will carry
        live = set(self._live(state))
        return self._req(state, TRAIN, ModelSet(state.starts[s]),
                         [z for z in state.restart_chosen if z in live])

    def _train_step(self, state, request, replies):
        s = state.req_start.get(request.round) if self.n_init > 1 else None
        if s is None:
            return super()._train_step(state, request, replies)
        if replies:
            state.starts[s] = self._aggregate(replies, state.starts[s])
        for z, r in replies.items():
            n = int(r.n_samples)
            state.start_acc[s] += (float(r.loss) * n, n)
            if s == 0:
                state.acc["dev"] += 1

    def _close_round(self, state):
        if self._restarting(state):
            loss = state.start_acc[:, 0] / np.maximum(state.start_acc[:, 1], 1)
            best = int(np.argmin(loss))
            state.models = state.starts[best].copy()
            state.acc["loss"], state.acc["n"] = state.start_acc[best]
            if state.fl_round == self.restart_rounds:
                state.restart_loss = loss
                state.center_labels, state.local_counts = {}, {}
        super()._close_round(state)

    def _train_request(self, state, devices):
        return self._req(state, TRAIN, ModelSet(state.models), devices)

    def _probe_payload(self, state):
        return ModelSet(state.models)

    def _note_choice(self, state, z, reply):
        state.center_labels[z] = np.array([int(reply.cluster)], dtype=np.int64)
        state.local_counts[z] = np.array([int(reply.n_samples)], dtype=np.int64)

    def _train(self, request, X, y, *, device_id, seed, state):
        params_k = request.payload.params
        if params_k.shape[0] != self.n_clusters:
            raise ValidationError(f"device {device_id}: got {params_k.shape[0]} models, "
                                  f"expected {self.n_clusters}")
        j, losses = choose_cluster(self._scratch, params_k, X, y)
        return self._local(params_k[j], X, y, device_id, seed, request.round, cluster=j,
                           loss=float(losses[j]))
