"""A round in which no device gives a valid reply: the run stops, unless the round allows it."""

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.core.messages import FLOAT, Message
from fedclust.core import registry
from fedclust.core.protocol import Protocol, Request
from fedclust.flower.grid import FlowerInMemoryTransport
from fedclust.sim.transport import InProcessTransport


@dataclass(frozen=True)
class _Total(Message):
    total: np.ndarray
    schema: ClassVar = {"total": (FLOAT, 0)}
    kind: ClassVar[str] = "test_round_total"


@dataclass
class _Sums:
    total: float = 0.0
    replies: list = field(default_factory=list)


class _TwoGroupSums(Protocol):
    """Round 0 asks devices 0 and 1, round 1 asks devices 2 and 3; the result is
    the sum of every reply's data total and the number of replies per round."""

    name = "test-two-group-sums"
    reply_types = {"total": _Total}

    def __init__(self, allow_empty: bool = False):
        self.allow_empty = allow_empty

    def config(self):
        return {"allow_empty": self.allow_empty}

    @classmethod
    def from_config(cls, config):
        return cls(bool(config["allow_empty"]))

    def start(self, device_ids, seed):
        return {"round": 0, "result": _Sums()}

    def next_request(self, state):
        if state["round"] == 2:
            return None
        group = (0, 1) if state["round"] == 0 else (2, 3)
        return Request(state["round"], "total", devices=group, allow_empty=self.allow_empty)

    def server_step(self, state, request, replies):
        state["result"].total += sum(float(r.total) for r in replies.values())
        state["result"].replies.append(len(replies))
        state["round"] += 1

    def finish(self, state, log):
        return state["result"]

    def client_step(self, request, X, *, device_id, seed, state):
        # devices 0 and 1 reply NaN: the codec rejects them by name
        return _Total(np.asarray(np.nan if device_id < 2 else X.sum(), dtype=np.float64))


@pytest.fixture(autouse=True)
def _registered():
    saved = dict(registry.PROTOCOLS), dict(registry.RESULT_TYPES)
    registry.register_protocol(_TwoGroupSums, _Sums)  # Flower rebuilds protocols by name
    yield
    for table, old in zip((registry.PROTOCOLS, registry.RESULT_TYPES), saved):
        table.clear()
        table.update(old)


DEVICES = {z: np.full((3, 2), float(z + 1)) for z in range(4)}


@pytest.mark.parametrize("transport", [InProcessTransport, FlowerInMemoryTransport])
def test_empty_round_stops_the_run_by_default(transport):
    with pytest.raises(ValidationError, match="round 0: none of the 2 devices"):
        transport().run(_TwoGroupSums(), DEVICES, 0)


@pytest.mark.parametrize("transport", [InProcessTransport, FlowerInMemoryTransport])
def test_allowed_empty_round_goes_on_without_replies(transport):
    out = transport().run(_TwoGroupSums(allow_empty=True), DEVICES, 0)
    assert out.result.replies == [0, 2]
    assert sorted(out.log.rejected) == [0, 1]
    assert out.result.total == pytest.approx(6 * (3 + 4))  # devices 2 and 3 only


@dataclass(frozen=True)
class _Factor(Message):
    factor: np.ndarray
    schema: ClassVar = {"factor": (FLOAT, 1)}
    kind: ClassVar[str] = "test_round_factor"


class _PerDeviceFactors(Protocol):
    """One round: device z gets its own factor vector (length z + 1) unless it is device 3,
    which gets the shared payload; each replies sum(X) * sum(factor)."""

    name = "test-per-device-factors"
    reply_types = {"total": _Total}

    def config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls()

    def start(self, device_ids, seed):
        return {"done": False, "result": _Sums()}

    def next_request(self, state):
        if state["done"]:
            return None
        own = {z: _Factor(np.full(z + 1, 2.0)) for z in range(3)}
        return Request(0, "total", payload=_Factor(np.array([10.0])), payloads=own)

    def server_step(self, state, request, replies):
        state["result"].replies = [float(replies[z].total) for z in sorted(replies)]
        state["done"] = True

    def finish(self, state, log):
        return state["result"]

    def client_step(self, request, X, *, device_id, seed, state):
        assert request.payloads is None  # a device sees only its own message
        return _Total(np.asarray(X.sum() * request.payload.factor.sum(), dtype=np.float64))


@pytest.mark.parametrize("transport", [InProcessTransport, FlowerInMemoryTransport])
def test_per_device_payloads_reach_their_device_and_are_counted(transport):
    saved = dict(registry.PROTOCOLS), dict(registry.RESULT_TYPES)
    registry.register_protocol(_PerDeviceFactors, _Sums)
    try:
        out = transport().run(_PerDeviceFactors(), DEVICES, 0)
    finally:
        for table, old in zip((registry.PROTOCOLS, registry.RESULT_TYPES), saved):
            table.clear()
            table.update(old)
    sums = [6.0 * (z + 1) for z in range(4)]
    factors = [2.0 * (z + 1) for z in range(3)] + [10.0]
    assert out.result.replies == pytest.approx([s * f for s, f in zip(sums, factors)])
    assert [out.meter.down[z] for z in range(4)] == [8 * (z + 1) for z in range(3)] + [8]
