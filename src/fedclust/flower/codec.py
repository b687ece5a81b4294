"""fedclust messages and configs <-> Flower records: the one codec of the adapter.

* :func:`message_to_record` / :func:`record_to_message`: a
  :class:`~fedclust.messages.Message` travels as an ``ArrayRecord`` holding
  exactly the arrays of ``Message.to_arrays()``. Decoding goes through
  ``MessageCls.from_arrays(arrays, sender=...)``, so a Flower reply is validated
  (fields, dtypes, shapes, finiteness) by the same code as in-process, before
  any server maths. Flower's ``Array`` serialises with ``np.save`` /
  ``np.load(allow_pickle=False)``: dtypes and 0-d arrays round-trip exactly.
* :func:`config_to_record` / :func:`record_to_config`: a protocol's
  :meth:`~fedclust.protocols.base.Protocol.config` travels as a
  ``ConfigRecord`` (numpy scalars become Python scalars, tuples lists).
* :func:`request_to_content` / :func:`content_to_request`: one protocol round
  (action, round, seed, protocol name and config, optional payload) as the
  ``RecordDict`` of a Flower message of type ``query.<action>``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import MESSAGE_TYPES, Message
from ..core.policy import FORGET_ACTION
from ..core.protocol import Protocol, Request
from ..core.registry import protocol_from_config

__all__ = [
    "message_to_record", "record_to_message", "arrays_to_record", "record_to_arrays",
    "config_to_record", "record_to_config", "request_to_content", "content_to_request",
    "REQUEST", "PROTOCOL", "PAYLOAD", "REPLY", "ERROR", "HELLO", "OUTPUT",
    "HELLO_ACTION", "FINISH_ACTION", "SECAGG", "SECAGG_STAGE", "FORGET", "FORGET_ACTION",
    "reply_failure",
]

# record names inside a Flower message's RecordDict
REQUEST = "fedclust.request"    # ConfigRecord: round, action, seed, protocol, payload-kind
PROTOCOL = "fedclust.protocol"  # ConfigRecord: Protocol.config()
PAYLOAD = "fedclust.payload"    # ArrayRecord: the request's / final message's arrays
REPLY = "fedclust.reply"        # ArrayRecord: the client's reply message
ERROR = "fedclust.error"        # ConfigRecord: a client-side fedclust error (type, message)
HELLO = "fedclust.hello"        # ConfigRecord: device-id, n-points, n-features
OUTPUT = "fedclust.output"      # ArrayRecord: the device's output (client_finish)
SECAGG = "fedclust.secagg"      # ArrayRecord: a secure aggregation stage's arrays (both ways)
SECAGG_STAGE = "secagg-stage"   # request head entry: which stage (core.secure_sum.STAGES)
FORGET = "fedclust.forget"      # ConfigRecord: a device's forget request (device-id, level)

# adapter actions that are not protocol rounds
HELLO_ACTION = "fedclust_hello"
FINISH_ACTION = "fedclust_finish"


def arrays_to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """dict of numpy arrays -> ``ArrayRecord`` (refuses object arrays, like the codec)."""
    record = ArrayRecord()
    for key, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.hasobject:
            raise IncompatibleMessageError(f"field {key!r} is an object array; refusing to send it")
        record[str(key)] = Array(np.ascontiguousarray(a) if a.ndim else a)
    return record


def record_to_arrays(record: Any, *, sender: str = "message") -> dict[str, np.ndarray]:
    """``ArrayRecord`` -> dict of numpy arrays; anything unreadable is an IncompatibleMessageError."""
    if not isinstance(record, ArrayRecord):
        raise IncompatibleMessageError(
            f"{sender}: expected an ArrayRecord, got {type(record).__name__}")
    try:
        return {key: arr.numpy() for key, arr in record.items()}
    except Exception as exc:  # bad bytes, non-numpy stype, pickled payload, ...
        raise IncompatibleMessageError(f"{sender}: unreadable array record ({exc})") from None


def message_to_record(msg: Message) -> ArrayRecord:
    """A fedclust message -> ``ArrayRecord`` (exactly ``msg.to_arrays()``)."""
    return arrays_to_record(msg.to_arrays())


def record_to_message(record: Any, cls: type[Message], *, sender: str = "message") -> Message:
    """``ArrayRecord`` -> validated ``cls`` message; raises IncompatibleMessageError naming ``sender``."""
    return cls.from_arrays(record_to_arrays(record, sender=sender), sender=sender)


def _config_value(key: str, v: Any) -> Any:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (list, tuple, np.ndarray)):
        vals = [_config_value(key, x) for x in (v.tolist() if isinstance(v, np.ndarray) else v)]
        if len({type(x) for x in vals}) > 1:
            raise ValidationError(f"config value {key!r}: list mixes types {vals[:5]}")
        return vals
    if isinstance(v, (bool, int, float, str, bytes)):
        return v
    raise ValidationError(
        f"config value {key}={v!r} ({type(v).__name__}) cannot travel in a Flower ConfigRecord")


def config_to_record(config: Mapping[str, Any]) -> ConfigRecord:
    """Protocol config (scalars and lists of scalars) -> ``ConfigRecord``."""
    return ConfigRecord({str(k): _config_value(str(k), v) for k, v in config.items()})


def record_to_config(record: ConfigRecord) -> dict[str, Any]:
    """``ConfigRecord`` -> plain dict (lists stay lists)."""
    return {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in record.items()}


def request_to_content(protocol: Protocol, request: Request, seed: int,
                       payload: Message | None = None, **extra: Any) -> RecordDict:
    """The RecordDict of one round sent to one device (``payload`` defaults to the request's)."""
    payload = request.payload if payload is None else payload
    head = {"round": int(request.round), "action": request.action, "seed": int(seed),
            "protocol": protocol.name, "payload-kind": "" if payload is None else payload.kind}
    head.update(extra)
    content = RecordDict({REQUEST: config_to_record(head),
                          PROTOCOL: config_to_record(protocol.config())})
    if payload is not None:
        content[PAYLOAD] = message_to_record(payload)
    return content


def content_to_request(content: RecordDict, *, sender: str = "server"
                       ) -> tuple[Protocol, Request, int, dict[str, Any]]:
    """Client side: rebuild ``(protocol, request, seed, head)`` from a message's content."""
    try:
        head = record_to_config(content.config_records[REQUEST])
        pconf = record_to_config(content.config_records[PROTOCOL])
    except KeyError as exc:
        raise IncompatibleMessageError(f"{sender}: message has no {exc.args[0]} record") from None
    protocol = protocol_from_config(str(head["protocol"]), pconf)
    payload = None
    kind = head.get("payload-kind", "")
    if kind:
        if kind not in MESSAGE_TYPES:
            raise IncompatibleMessageError(
                f"{sender}: unknown payload kind {kind!r}; known: {sorted(MESSAGE_TYPES)}")
        if PAYLOAD not in content.array_records:
            raise IncompatibleMessageError(f"{sender}: payload kind {kind!r} but no payload")
        payload = record_to_message(content.array_records[PAYLOAD], MESSAGE_TYPES[kind],
                                    sender=sender)
    request = Request(round=int(head["round"]), action=str(head["action"]), payload=payload)
    return protocol, request, int(head["seed"]), head


def reply_failure(reply: Any) -> str | None:
    """Why a Flower reply is a failure (a client error, or an error record), or None."""
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    content = reply.content
    if ERROR in content.config_records:
        err = content.config_records[ERROR]
        return f"{err.get('type', 'error')}: {err.get('message', '')}"
    return None
