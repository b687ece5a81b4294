"""A row deletion that leaves the device's summary unchanged costs the device its check only.

The families' summaries all count rows, so this path is exercised with a small protocol
whose device summary is the per-feature maximum of its rows (deleting a row that holds no
maximum leaves it as it was)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from sklearn.base import BaseEstimator

from fedclust.core.messages import FLOAT, Message
from fedclust.core.protocol import Protocol, Request
from fedclust.sim import InProcessTransport
from fedclust.unlearning.forget import ForgetMixin, run_recorded


@dataclass(frozen=True)
class _Max(Message):
    value: np.ndarray
    schema: ClassVar = {"value": (FLOAT, 1)}
    kind: ClassVar[str] = "test_unlearning_max"


class _MaxProtocol(Protocol):
    name = "test-unlearning-max"
    reply_types = {"max": _Max}

    def config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls()

    def start(self, device_ids, seed):
        return {"round": 0, "replies": {}}

    def next_request(self, state):
        return Request(0, "max") if state["round"] == 0 else None

    def server_step(self, state, request, replies):
        state["replies"] = {z: replies[z].value for z in sorted(replies)}
        state["round"] += 1

    def finish(self, state, log):
        return np.max(np.stack(list(state["replies"].values())), axis=0)

    def client_step(self, request, X, *, device_id, seed, state):
        return _Max(value=np.asarray(X, np.float64).max(axis=0))


class _MaxEstimator(ForgetMixin, BaseEstimator):
    def fit(self, Xs, device_ids):
        out = run_recorded(self, InProcessTransport(), _MaxProtocol(), dict(zip(device_ids, Xs)), 0)
        self._apply_forget(out, device_ids)
        return self

    def _apply_forget(self, out, device_ids):
        self.max_ = out.result
        self.device_ids_ = list(device_ids)
        self.device_labels_ = [None] * len(device_ids)
        self.communication_ = {}


def test_a_deletion_that_keeps_the_summary_touches_nothing_else():
    X0 = np.array([[1.0, 5.0], [4.0, 2.0], [0.0, 0.0]])
    X1 = np.array([[9.0, 1.0], [2.0, 3.0]])
    model = _MaxEstimator().fit([X0, X1], [10, 20])
    digest = model._unlearning_.store.digest()
    model.forget(rows={10: [2]})                       # row 2 holds no maximum
    rec = model.forget_log_[-1]
    assert rec.unchanged == [10] and rec.recomputed == [(0, 10)]
    assert rec.summaries_digest == digest              # the server's inputs did not change
    np.testing.assert_array_equal(model.max_, [9.0, 5.0])
    model.forget(rows={10: [0]})                       # the row with 5.0: the summary changes
    rec = model.forget_log_[-1]
    assert rec.unchanged == [] and rec.summaries_digest != digest
    np.testing.assert_array_equal(model.max_, [9.0, 3.0])
    fresh = _MaxEstimator().fit([X0[[1]], X1], [10, 20])
    assert fresh._unlearning_.store.digest() == rec.summaries_digest
