"""Checkpoint and resume of an in-process run (:mod:`fedclust.core.checkpoint`).

The in-process transport writes ``checkpoint.npz`` after every completed
round into its ``checkpoint_dir``: the protocol's server state, the rounds
done, the run log, the communication meter, the devices that take part, and
the simulated devices' own state (what each device keeps between rounds; on
a real deployment the device keeps it). A run started again with
``resume=True`` on the same folder continues after the last complete round;
with the same ``random_state`` (and ``noise_seed`` under privacy) it ends
exactly where the uninterrupted run ends.

What the server keeps to forget a device (:class:`fedclust.unlearning.SummaryStore`,
every completed round's validated replies) is written with the round, so a
resumed run keeps the summaries of the rounds before the interruption too and a
``forget`` after it is exact.

A round interrupted half-way is redone from its beginning. A securely summed
round redone after a resume runs under a new round id (``attempt << 32`` plus
the round) with fresh keys, so nothing of the interrupted attempt is reused.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.checkpoint import (LEDGER_FILE, CheckpointError, PrivacyLedger, check_same_run,
                               load_checkpoint, save_checkpoint)
from ..core.protocol import Protocol, RunLog
from ..core.random import root_seed
from .meter import CommunicationMeter

__all__ = ["RunCheckpoint", "ATTEMPT_SHIFT"]

#: a resumed attempt's secure-round ids: ``(attempt << ATTEMPT_SHIFT) + round``
ATTEMPT_SHIFT = 32
_SECAGG_STATE = "secagg."  # a device's secure-round secrets: never written, never resumed


def run_identity(protocol: Protocol, seed: int, device_ids: Sequence[int], secure: bool
                 ) -> dict[str, Any]:
    """What must match for a checkpoint to be resumed by this run."""
    return {"protocol": protocol.name, "config": protocol.config(), "seed": int(seed),
            "devices": [int(z) for z in device_ids], "secure_aggregation": bool(secure)}


@dataclass
class RunCheckpoint:
    """A run's checkpoint folder: what was saved (when resuming) and its privacy ledger."""

    folder: Path
    resume: bool
    meta: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)
    attempt: int = 0
    #: a state that cannot be written: the run goes on without checkpoints (warned once)
    broken: bool = False

    @classmethod
    def open(cls, folder: str | Path, resume: bool) -> "RunCheckpoint":
        folder = Path(folder)
        ck = cls(folder, bool(resume))
        if resume:
            saved = load_checkpoint(folder)
            if saved is not None:
                ck.meta, ck.values = saved
        return ck

    def seed(self, random_state: Any) -> int:
        """The run's seed: ``random_state``'s, or the checkpoint's when resuming without one."""
        if self.meta is not None and random_state is None:
            return int(self.meta["identity"]["seed"])
        return root_seed(random_state)

    def restore(self, identity: Mapping[str, Any]) -> tuple[Any, RunLog, CommunicationMeter,
                                                            dict[int, dict[str, np.ndarray]],
                                                            list[int]] | None:
        """``(state, log, meter, device states, active devices)`` to continue from, or
        ``None`` (start afresh); opens the ledger either way."""
        done = None if not self.resume else 0
        out = None
        if self.meta is not None:
            check_same_run(self.folder, self.meta["identity"], identity)
            v = self.values
            meter: CommunicationMeter = v["meter"]
            meter.up = defaultdict(int, meter.up)
            meter.down = defaultdict(int, meter.down)
            out = (v["state"], v["log"], meter, v["devices"], list(v["active"]))
            done = int(self.meta["rounds"])
            self.attempt = int(self.meta.get("attempt", 0)) + 1
        elif self.resume and (self.folder / LEDGER_FILE).exists():
            self.attempt = 1   # the first round was interrupted: redo it under new ids
        self.ledger = PrivacyLedger.open(self.folder / LEDGER_FILE, done)
        return out

    def secure_round_id(self, round_index: int) -> int:
        return (self.attempt << ATTEMPT_SHIFT) + int(round_index)

    def kept_summaries(self, kind: Any) -> Any:
        """The server's kept summaries of the checkpointed rounds, rebuilt as ``kind``
        (:class:`~fedclust.unlearning.SummaryStore`, whose ``from_arrays`` reads them
        back), or None (no checkpoint, or a run that kept none)."""
        saved = (self.values or {}).get("summaries")
        if saved is None:
            return None
        return kind.from_arrays(saved["arrays"], saved["meta"])

    def save(self, identity: Mapping[str, Any], state: Any, log: RunLog,
             meter: CommunicationMeter, device_states: Mapping[int, Mapping[str, np.ndarray]],
             active: Sequence[int], summaries: Any = None,
             transport: Mapping[str, Any] | None = None) -> Path | None:
        """Write the round just completed; ``summaries``: the server's kept summaries
        (a :class:`~fedclust.unlearning.SummaryStore`; as plain arrays + JSON);
        ``transport``: what the transport itself keeps (plain values, read back as
        ``values["transport"]``)."""
        if self.broken:
            return None
        devices = {int(z): {k: v for k, v in s.items() if not k.startswith(_SECAGG_STATE)}
                   for z, s in device_states.items()}
        kept = None
        if summaries is not None:
            arrays, meta = summaries.to_arrays()
            kept = {"arrays": arrays, "meta": meta}
        try:
            return save_checkpoint(
                self.folder, {"identity": dict(identity), "rounds": int(meter.rounds),
                              "attempt": self.attempt},
                {"state": state, "log": log, "meter": meter, "devices": devices,
                 "active": [int(z) for z in active], "summaries": kept,
                 "transport": dict(transport or {})})
        except CheckpointError as exc:
            # the run itself is fine: it goes on, without further checkpoints
            self.broken = True
            warnings.warn(f"{identity['protocol']}: no checkpoints for this run, it cannot be "
                          f"resumed ({exc})", RuntimeWarning, stacklevel=2)
            return None
