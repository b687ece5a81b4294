"""What the server keeps so that it can forget: every round's replies, by device.

A :class:`SummaryStore` is filled while a protocol runs (:func:`recording`):
for every round, the request's action, the digest of what each device
received, and each device's validated reply (its *summary*: k-FED's local
centers and counts, the evolving Gaussians' cluster statistics, ...). It is
plain arrays + JSON (:meth:`SummaryStore.to_arrays`, no pickle), and it is
exactly what a server that forgets without the departed device online needs.
The privacy meaning of keeping it is stated in ``docs/unlearning.md``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import MESSAGE_TYPES, Message, ReplyTable
from ..core.secure_sum import SUMMED

__all__ = ["RoundRecord", "SummaryStore", "digest_message", "record_round", "recording"]

_NONE = "-"  # digest of "no payload"


def _update(h: Any, arrays: Mapping[str, np.ndarray]) -> None:
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())


def digest_message(msg: Message | None) -> str:
    """SHA-256 of a message's kind and wire arrays (``"-"`` for no message)."""
    if msg is None:
        return _NONE
    h = hashlib.sha256(msg.kind.encode())
    _update(h, msg.to_arrays())
    return h.hexdigest()


@dataclass
class RoundRecord:
    """One round as the server saw it: ``action``, the digest of each device's
    payload (what it was asked with) and each device's validated reply."""

    round: int
    action: str
    payloads: dict[int, str] = field(default_factory=dict)
    replies: dict[int, Message] = field(default_factory=dict)
    #: digest of each reply (:func:`digest_message`), computed once
    digests: dict[int, str] = field(default_factory=dict)

    def digest_of(self, device_id: int) -> str:
        if device_id not in self.digests:
            self.digests[device_id] = digest_message(self.replies[device_id])
        return self.digests[device_id]

    def without(self, device_ids: set[int]) -> "RoundRecord":
        if not any(z in self.replies for z in device_ids):
            return RoundRecord(self.round, self.action, dict(self.payloads), dict(self.replies),
                               dict(self.digests))
        kept = [dict(self.payloads), dict(self.replies), dict(self.digests)]
        for table in kept:   # a copy less a few keys: no pass over every device in Python
            for z in device_ids:
                table.pop(z, None)
        return RoundRecord(self.round, self.action, *kept)


@dataclass
class SummaryStore:
    """The server's memory of a run: the devices it started with and every round.

    ``device_ids`` are the devices the run started with (sorted); ``rounds``
    the recorded rounds in order. ``complete`` is False when a round's replies
    reached the server only as a secure sum (no per-device summary to drop).
    """

    device_ids: list[int]
    rounds: list[RoundRecord] = field(default_factory=list)
    complete: bool = True

    def without(self, device_ids: set[int]) -> "SummaryStore":
        return SummaryStore([z for z in self.device_ids if z not in device_ids],
                            [r.without(device_ids) for r in self.rounds], self.complete)

    def summaries(self, device_id: int) -> list[Message]:
        """Every reply the server keeps from ``device_id``, in round order."""
        return [r.replies[device_id] for r in self.rounds if device_id in r.replies]

    def digest(self) -> str:
        """SHA-256 over the devices and every kept reply (round and device order): the
        digest of the inputs the server's result is computed from."""
        h = hashlib.sha256(json.dumps(self.device_ids).encode())
        for r in self.rounds:
            h.update(f"round {r.round} {r.action};".encode())
            for z in sorted(r.replies):
                h.update(f"device {z} {r.payloads.get(z, _NONE)} {r.digest_of(z)};".encode())
        return h.hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for r in self.rounds for m in r.replies.values())

    # -- no-pickle form ---------------------------------------------------------
    def to_arrays(self, prefix: str = "") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, meta)``: arrays named ``{prefix}{round}/{device}/{field}`` and a
        JSON-ready ``meta`` (devices, rounds, actions, payload digests, message kinds)."""
        arrays: dict[str, np.ndarray] = {}
        rounds = []
        for i, r in enumerate(self.rounds):
            kinds = {}
            for z, msg in r.replies.items():
                kinds[str(z)] = msg.kind
                for name, a in msg.to_arrays().items():
                    arrays[f"{prefix}{i}/{z}/{name}"] = np.asarray(a)
            rounds.append({"round": r.round, "action": r.action, "kinds": kinds,
                           "payloads": {str(z): p for z, p in r.payloads.items()}})
        meta = {"device_ids": list(self.device_ids), "rounds": rounds,
                "complete": self.complete}
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
                    prefix: str = "") -> "SummaryStore":
        """Rebuild from :meth:`to_arrays`; every reply is validated again by its codec."""
        try:
            rounds = []
            fields: dict[tuple[int, int], dict[str, np.ndarray]] = {}
            for key, a in arrays.items():
                if not key.startswith(prefix):
                    continue
                i, z, name = key[len(prefix):].split("/", 2)
                fields.setdefault((int(i), int(z)), {})[name] = a
            for i, r in enumerate(meta["rounds"]):
                replies = {}
                for z, kind in r["kinds"].items():
                    if kind not in MESSAGE_TYPES:
                        raise ValidationError(f"unknown message kind {kind!r}")
                    replies[int(z)] = MESSAGE_TYPES[kind].from_arrays(
                        fields.get((i, int(z)), {}), sender=f"kept summary of device {z}")
                rounds.append(RoundRecord(int(r["round"]), str(r["action"]),
                                          {int(z): str(p) for z, p in r["payloads"].items()},
                                          replies))
            return cls([int(z) for z in meta["device_ids"]], rounds, bool(meta["complete"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(f"the kept device summaries are unreadable ({exc})") from None


def record_round(store: SummaryStore, request: Any, replies: Mapping[int, Any],
                 payload_digest: Any = digest_message) -> None:
    """Keep one round's validated replies (what the server's step is about to read)."""
    if SUMMED in replies:
        store.complete = False  # a secure sum: the server holds no per-device reply
        return
    if not replies:
        payloads = {}
    elif getattr(request, "payloads", None) is None:   # one payload for all: digested once
        payloads = dict.fromkeys(map(int, replies), payload_digest(request.payload))
    else:
        payloads = {int(z): payload_digest(request.payload_for(z)) for z in replies}
    # reply digests: on first use; a round's replies held column-wise stay so (the
    # messages are built at the first read of one device's)
    kept = (replies.copy() if isinstance(replies, ReplyTable)
            else dict(zip(map(int, replies), replies.values())))
    store.rounds.append(RoundRecord(request.round, request.action, payloads, kept))


@contextlib.contextmanager
def recording(protocol: Any, store: SummaryStore, memory: dict[int, Any] | None = None,
              devices: Mapping[int, Any] | None = None) -> Iterator[SummaryStore]:
    """Record every ``server_step`` of ``protocol`` into ``store`` while inside.

    ``protocol.kept_summaries`` is ``store`` while inside: a transport that
    checkpoints its rounds writes it with each round and, resuming, puts the
    checkpointed rounds back into it (the rounds before an interruption are
    not run again, so they would not be recorded).

    With ``memory`` and ``devices`` (in-process runs), each simulated device's own
    state at the end of the run (what ``client_finish`` is given) is kept in
    ``memory[device id]``: the device's side, never saved with the model.
    The protocol object is left as it was on exit.
    """
    step = protocol.server_step
    finish = protocol.client_finish
    begin = protocol.start

    def recorded_start(device_ids: Any, seed: int) -> Any:
        store.device_ids = sorted(map(int, device_ids))  # those that take part
        return begin(device_ids, seed)

    digests: dict[int, tuple[Any, str]] = {}   # id -> (the message, kept alive; digest)

    def payload_digest(msg: Message | None) -> str:
        key = id(msg)
        if key not in digests or digests[key][0] is not msg:
            digests[key] = (msg, digest_message(msg))
        return digests[key][1]

    def recorded_step(state: Any, request: Any, replies: Mapping[int, Any]) -> None:
        record_round(store, request, replies, payload_digest)
        return step(state, request, replies)

    by_data = dict(zip(map(id, (devices or {}).values()), devices or {}))

    def recorded_finish(message: Any, X: Any, state: dict) -> Any:
        z = by_data.get(id(X))
        if memory is not None and z is not None:
            memory[z] = state
        return finish(message, X, state)

    finish_stacked = getattr(protocol, "client_finish_stacked", None)

    def recorded_finish_stacked(batch: Any, datas: list, states: list) -> list:
        if memory is not None:
            zs = list(map(by_data.get, map(id, datas)))
            if None in zs:
                memory.update((z, st) for z, st in zip(zs, states) if z is not None)
            else:
                memory.update(zip(zs, states))
        return finish_stacked(batch, datas, states)

    finish_shared = getattr(protocol, "client_finish_shared", None)

    def recorded_finish_shared(message: Any, datas: list, states: list) -> list:
        if memory is not None:
            memory.update((z, st) for z, st in zip(map(by_data.get, map(id, datas)), states)
                          if z is not None)
        return finish_shared(message, datas, states)

    protocol.start = recorded_start
    protocol.server_step = recorded_step
    protocol.client_finish = recorded_finish
    if finish_stacked is not None:
        protocol.client_finish_stacked = recorded_finish_stacked
    if finish_shared is not None:
        protocol.client_finish_shared = recorded_finish_shared
    protocol.kept_summaries = store   # a checkpointing transport saves and restores it
    try:
        yield store
    finally:
        del protocol.start
        del protocol.server_step
        del protocol.client_finish
        if finish_stacked is not None:
            del protocol.client_finish_stacked
        if finish_shared is not None:
            del protocol.client_finish_shared
        del protocol.kept_summaries
