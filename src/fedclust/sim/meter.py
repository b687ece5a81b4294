"""Counting what crosses the network in a simulated run."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

__all__ = ["CommunicationMeter"]


@dataclass
class CommunicationMeter:
    """Payload bytes per device and direction, and the number of rounds.

    ``up`` is device -> server, ``down`` server -> device. Bytes are the
    ``nbytes`` of the message arrays (see :mod:`fedclust.messages`).
    """

    up: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    down: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    rounds: int = 0
    messages_up: int = 0
    messages_down: int = 0
    #: extra exchanges of secure aggregation (3 per securely summed round)
    secure_exchanges: int = 0

    def record_up(self, device_id: int, nbytes: int) -> None:
        self.up[device_id] += int(nbytes)
        self.messages_up += 1

    def record_down(self, device_id: int, nbytes: int) -> None:
        self.down[device_id] += int(nbytes)
        self.messages_down += 1

    def record_up_many(self, device_ids, nbytes: int) -> None:
        """:meth:`record_up` of ``nbytes`` for each of ``device_ids`` (one message each)."""
        _add_each(self.up, device_ids, int(nbytes))
        self.messages_up += len(device_ids)

    def record_down_many(self, device_ids, nbytes: int) -> None:
        """:meth:`record_down` of ``nbytes`` for each of ``device_ids`` (one message each)."""
        _add_each(self.down, device_ids, int(nbytes))
        self.messages_down += len(device_ids)

    @property
    def bytes_up(self) -> int:
        return sum(self.up.values())

    @property
    def bytes_down(self) -> int:
        return sum(self.down.values())

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down

    def summary(self) -> dict[str, Any]:
        """JSON-ready totals and per-device counts."""
        return {
            "rounds": self.rounds,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "bytes_total": self.bytes_total,
            "messages_up": self.messages_up,
            "messages_down": self.messages_down,
            **({"secure_exchanges": self.secure_exchanges} if self.secure_exchanges else {}),
            "per_device": self._per_device(),
        }

    def _per_device(self) -> dict[str, dict[str, int]]:
        up, down = self.up, self.down
        ids = sorted(up if up.keys() == down.keys() else up.keys() | down.keys())
        zero = repeat(0)
        # keys and values made apart: the str keys at C speed
        return dict(zip(map(str, ids), [{"up": u, "down": d} for u, d in
                                        zip(map(up.get, ids, zero), map(down.get, ids, zero))]))


def _add_each(counts: dict[int, int], device_ids, n: int) -> None:
    """``counts[z] += n`` for every z of ``device_ids`` (a device named twice counts twice)."""
    size = len(counts)
    if counts.keys().isdisjoint(device_ids):   # first message of each: one C-level update
        counts.update(zip(device_ids, repeat(n)))
        if len(counts) - size == len(device_ids):
            return
        for z in set(device_ids):   # some named twice: count them again, one at a time
            del counts[z]
    for z in device_ids:
        counts[z] += n
