"""The Flower codec: fedclust messages and configs <-> Flower records, through protobuf."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, RecordDict  # noqa: E402
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto  # noqa: E402

from fedclust import IncompatibleMessageError, ValidationError  # noqa: E402
from fedclust.flower.codec import (PAYLOAD, arrays_to_record, config_to_record,  # noqa: E402
                                   content_to_request, message_to_record, record_to_config,
                                   record_to_message, request_to_content)
from fedclust.core.registry import PROTOCOLS, protocol_from_config  # noqa: E402
from fedclust.kfed.messages import LabelMap, LocalCenters  # noqa: E402
from fedclust.lloyd.messages import CenterBroadcast, ClusterSums, PointSample  # noqa: E402
from fedclust.core.protocol import Request  # noqa: E402
from fedclust.kfed.protocol import KFedProtocol  # noqa: E402
from fedclust.lloyd.protocol import DistributedLloydProtocol  # noqa: E402


def _proto_round_trip(rd: RecordDict) -> RecordDict:
    proto = recorddict_to_proto(rd)
    return recorddict_from_proto(type(proto).FromString(proto.SerializeToString()))


rng = np.random.default_rng(0)
MESSAGES = [
    LocalCenters(rng.standard_normal((4, 3)), np.array([5, 1, 2, 9], dtype=np.int64)),
    LocalCenters(rng.standard_normal((2, 7)).astype(np.float32), np.array([3, 4])),
    CenterBroadcast(rng.standard_normal((5, 2))),
    ClusterSums(rng.standard_normal((3, 2)), np.array([0, 4, 2]), np.asarray(1.25)),
    PointSample(rng.standard_normal((6, 4)), np.asarray(100, dtype=np.int64)),
    LabelMap(np.array([2, 0, 1], dtype=np.int64)),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: f"{m.kind}")
def test_message_round_trip_is_bit_exact(msg):
    rd = _proto_round_trip(RecordDict({"m": message_to_record(msg)}))
    back = record_to_message(rd.array_records["m"], type(msg), sender="device 3")
    for key, a in msg.to_arrays().items():
        b = back.to_arrays()[key]
        assert b.dtype == a.dtype and b.shape == a.shape
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("arrays, text", [
    ({"centers": np.ones((2, 3))}, "wrong fields"),
    ({"centers": np.ones((2, 3), dtype=np.int64), "counts": np.ones(2, dtype=np.int64)}, "dtype"),
    ({"centers": np.ones(3), "counts": np.ones(3, dtype=np.int64)}, "expected 2-D"),
    ({"centers": np.array([[np.nan, 1.0]]), "counts": np.ones(1, dtype=np.int64)}, "non-finite"),
    ({"centers": np.ones((2, 3)), "counts": np.ones(3, dtype=np.int64)}, "counts has shape"),
])
def test_bad_replies_are_rejected_by_name(arrays, text):
    rd = _proto_round_trip(RecordDict({"m": arrays_to_record(arrays)}))
    with pytest.raises(IncompatibleMessageError, match=text) as info:
        record_to_message(rd.array_records["m"], LocalCenters, sender="device 7")
    assert "device 7" in str(info.value)


def test_not_an_array_record_is_rejected():
    with pytest.raises(IncompatibleMessageError, match="device 1: expected an ArrayRecord"):
        record_to_message(ConfigRecord({"a": 1}), LocalCenters, sender="device 1")


def test_object_arrays_are_refused():
    with pytest.raises(IncompatibleMessageError, match="object array"):
        arrays_to_record({"x": np.array([{"a": 1}], dtype=object)})


@pytest.mark.parametrize("protocol", [
    KFedProtocol(8, 2),
    KFedProtocol(np.int64(5), {0: np.int64(2), 3: 4, 9: 1}, server="single-linkage",
                 weighted=True, first_device=np.int64(3), tol=1e-7),
    DistributedLloydProtocol(4, points_per_device=3, max_rounds=7, tol=0.01),
], ids=["kfed", "kfed-per-device", "lloyd"])
def test_protocol_config_round_trip(protocol):
    rd = _proto_round_trip(RecordDict({"c": config_to_record(protocol.config())}))
    cfg = record_to_config(rd.config_records["c"])
    rebuilt = protocol_from_config(protocol.name, cfg)
    assert type(rebuilt) is type(protocol)
    assert rebuilt.config() == protocol.config()
    assert all(type(v) is not np.int64 for v in cfg.values())


def test_registry_and_unknown_protocol():
    assert {"kfed", "distributed-lloyd"} <= set(PROTOCOLS)
    with pytest.raises(ValidationError, match="unknown protocol 'nope'"):
        protocol_from_config("nope", {})


def test_request_round_trip_with_payload():
    protocol = DistributedLloydProtocol(3)
    payload = CenterBroadcast(rng.standard_normal((3, 2)))
    content = _proto_round_trip(request_to_content(protocol, Request(4, "lloyd", payload), 11))
    p2, req, seed, head = content_to_request(content)
    assert p2.config() == protocol.config() and seed == 11 and head["protocol"] == protocol.name
    assert (req.round, req.action) == (4, "lloyd")
    assert np.array_equal(req.payload.centers, payload.centers)


def test_request_with_bad_payload_is_rejected():
    protocol = DistributedLloydProtocol(3)
    content = request_to_content(protocol, Request(1, "lloyd",
                                                   CenterBroadcast(np.ones((3, 2)))), 0)
    content[PAYLOAD] = arrays_to_record({"centers": np.array([[np.inf, 0.0]])})
    with pytest.raises(IncompatibleMessageError, match="server.*non-finite"):
        content_to_request(content)
