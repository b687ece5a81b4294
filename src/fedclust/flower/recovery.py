"""Checkpoint and resume of the ServerApp (:mod:`fedclust.core.checkpoint`).

With a ``result-dir``, the ServerApp writes ``result-dir/checkpoint/checkpoint.npz``
after every completed round and keeps the write-ahead privacy ledger
``ledger.json`` beside it, as the in-process transport does
(:mod:`fedclust.sim.resume`). Flower does not restart a ServerApp; started again
with the run-config key ``resume=true`` (``fedclust flower run ... --resume``),
the new run reads the checkpoint and continues after the last complete round.

What differs from the in-process transport: the devices are real SuperNodes.
They say hello again (device ids come from their data, so a node that
reconnected under a new node id is the same device); a device of the
checkpointed run that is not connected when the run resumes gets up to the
spec's ``node_wait_s`` to connect before the first resumed round (a SuperNode
restarted with the SuperLink, or one Flower lets in only once its old activation
lapsed); one that connects in that time takes part as if it had answered the
hello. One that does not is named in ``log.failed`` and left out, as a device that
timed out, until its SuperNode connects (it then rejoins as a late node:
:meth:`fedclust.flower.server.Server.rejoin`).
A SuperNode keeps its ``context.state`` per Flower run. Every request the
resumed run sends carries ``resumed-rounds`` (the rounds its checkpoint holds)
and ``step`` (the rounds done before it); a node with node config
``state-dir`` sets its device state back from its own state file
(:mod:`fedclust.flower.node_state`), so families whose devices carry state
from one round to the next (PCA-reduced data for coresets, local labels of
k-FED + FedAvg) resume at any round. A node without one answers only rounds
that need nothing it kept; a round that does is refused by name.

The checkpoint also keeps the rejoins before the crash (``extra["rejoined"]``).

The server's kept summaries (what ``forget`` needs: every completed round's
validated replies) are part of the checkpoint, so a forget after a resumed run
sees every round, not only those after the resume.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.checkpoint import PrivacyLedger, round_releases
from ..core.protocol import Protocol, Request, RunLog
from ..sim.meter import CommunicationMeter
from ..sim.resume import RunCheckpoint

__all__ = ["ServerRecovery", "CHECKPOINT_SUBDIR"]

CHECKPOINT_SUBDIR = "checkpoint"


class ServerRecovery:
    """The ServerApp's checkpoint folder, its ledger and the resumed position."""

    def __init__(self, protocol: Protocol, seed: int, result_dir: str | None, resume: bool,
                 secure: bool):
        self.protocol = protocol
        self.ckpt = (RunCheckpoint.open(Path(result_dir) / CHECKPOINT_SUBDIR, resume)
                     if result_dir else None)
        if resume and self.ckpt is None:
            from ..core.exceptions import ValidationError

            raise ValidationError("resume=true needs result-dir (where the checkpoint is)")
        # the devices are whoever says hello: not part of what must match
        self.identity = {"protocol": protocol.name, "config": protocol.config(),
                         "seed": int(seed), "secure_aggregation": bool(secure)}
        self.ledger = PrivacyLedger()
        #: the rounds the resumed checkpoint holds; None: a fresh run
        self.resumed_rounds: int | None = None
        #: devices the checkpointed rounds sent a request to
        self.asked_before: set[int] = set()
        #: rejoins recorded before the crash (``Server.rejoined``)
        self.rejoined: list[dict[str, Any]] = []
        #: devices of the checkpointed run that did not answer the resumed run's hello
        self.not_connected: set[int] = set()

    def begin(self, connected: Sequence[int], active: list[int], log: RunLog,
              meter: CommunicationMeter) -> tuple[Any, RunLog, CommunicationMeter, list[int]]:
        """``(state or None, log, meter, active)``: the checkpointed position, or the fresh one
        (``state`` None: the caller starts the protocol)."""
        saved = self.ckpt.restore(self.identity) if self.ckpt is not None else None
        if self.ckpt is not None:
            self.ledger = self.ckpt.ledger
        if saved is None:
            if self.ckpt is not None and self.ckpt.resume:
                self.resumed_rounds = 0   # killed inside its first round: nodes may have answered
            return None, log, meter, active
        state, log, meter, _, active = saved
        self.resumed_rounds = int(meter.rounds)
        self.asked_before = {int(z) for z in meter.down}
        kept = (self.ckpt.values or {}).get("transport") or {}
        self.rejoined = [dict(r) for r in kept.get("rejoined", [])]
        here = set(connected)
        for z in active:
            if z not in here and z not in log.failed and z not in log.rejected:
                log.failed[z] = f"device {z}: not connected when the run resumed"
                self.not_connected.add(z)
        return state, log, meter, list(active)

    def before_round(self, request: Request, rounds_done: int) -> None:
        """Record the round as spent, durably, before it is sent out."""
        self.ledger.spend(request.round, request.action,
                          round_releases(self.protocol, request), rounds_done)

    def secure_round_id(self, round_index: int) -> int:
        return round_index if self.ckpt is None else self.ckpt.secure_round_id(round_index)

    def summaries(self, active: Sequence[int]) -> Any:
        """The server's kept summaries to record into: the checkpoint's (rounds before the
        resume), or an empty store of the ``active`` devices."""
        from ..unlearning.store import SummaryStore

        kept = self.ckpt.kept_summaries(SummaryStore) if self.ckpt is not None else None
        return kept if kept is not None else SummaryStore(list(active))

    def after_round(self, state: Any, log: RunLog, meter: CommunicationMeter,
                    active: Sequence[int], rejoined: Sequence[Mapping[str, Any]] = (),
                    summaries: Any = None) -> None:
        if self.ckpt is not None:
            self.ckpt.save(self.identity, state, log, meter, {}, active, summaries,
                           transport={"rejoined": [dict(r) for r in rejoined]})

    def finish(self, log: RunLog) -> None:
        if any(e["releases"] for e in self.ledger.entries + self.ledger.lost):
            log.privacy_ledger = self.ledger.summary(getattr(self.protocol, "plan", None))
