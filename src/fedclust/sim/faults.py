"""The simulated faults of a run, drawn alike by every transport (in-process, Flower):
which devices are absent and which reply late, and what a late device is asked."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.protocol import Protocol, Request
from ..core.random import server_rng

__all__ = ["draw_faults", "late_request", "FAULT_BRANCH"]

FAULT_BRANCH = 7  # server-stream round index reserved for drawing faults


def late_request(protocol: Protocol, result: Any) -> Request:
    """What a late device is asked: the protocol's ``late_request(result)`` where it has one
    (a request carrying what the late device missed), else its first action, no payload."""
    hook = getattr(protocol, "late_request", None)
    if hook is not None:
        return hook(result)
    return Request(round=0, action=next(iter(protocol.reply_types)))


def draw_faults(ids: Sequence[int], seed: int, *, dropout: float = 0.0, late: float = 0.0,
                dropped: Sequence[int] = (), late_devices: Sequence[int] = ()
                ) -> tuple[set[int], set[int]]:
    """The simulated faults of a run: ``(absent, late)`` device ids, drawn from the seed.

    Every transport (in-process, Flower) calls this, so both drop the same devices.
    ``dropout``/``late`` are fractions of ``ids``; ``dropped``/``late_devices``
    are explicit ids added to them. A device is never both.
    """
    ids = sorted(map(int, ids))  # the draw must not depend on the order ids come in
    n = len(ids)
    n_drop = int(round(dropout * n))
    n_late = int(round(late * n))
    # nobody drawn: the permutation would not be read
    perm = (server_rng(seed, FAULT_BRANCH).permutation(ids) if n and (n_drop or n_late)
            else np.array([], dtype=int))
    absent = {int(z) for z in perm[:n_drop]} | {int(z) for z in dropped}
    late_set = {int(z) for z in perm[n_drop:n_drop + n_late]} | {int(z) for z in late_devices}
    named = set(dropped) | set(late_devices)
    unknown = named - set(ids) if named else named
    if unknown:
        raise ValidationError(f"dropped/late device ids {sorted(unknown)} are not in the federation")
    return absent, late_set - absent
