"""The in-process transport: runs any :class:`~fedclust.protocols.base.Protocol`
over devices held in memory, as a laptop stand-in for real clients.

Every message goes through the same codec a network transport uses
(``to_arrays`` -> ``from_arrays`` with validation), so byte counts are real
and a malformed reply is rejected exactly as it would be on Flower. Faults are
simulated from the run's seed: dropped devices never reply, late devices reply
after the server has finished (and are then assigned, when the protocol can),
failing clients are dropped and named.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..core.random import root_seed
from ..core.validation import check_float
from ..core.exceptions import FedClustError, IncompatibleMessageError, ValidationError
from ..core.messages import Message, ReplyTable, StackedReplies, message_nbytes
from ..core.threads import one_blas_thread
from ..core.protocol import (DeviceData, Protocol, Request, RunLog, RunOutput, naming_left_out,
                             require_participants, require_replies, round_targets)
from ..core.policy import PolicyRefusal, policy_for
from ..core.secure_sum import SecureAggregation, check_summable, make_identities
from .faults import draw_faults, late_request
from .gc_pause import cyclic_gc_paused
from .meter import CommunicationMeter
from ..core.checkpoint import PrivacyLedger, round_releases
from .resume import RunCheckpoint, run_identity
from .secure import secure_round

__all__ = ["InProcessTransport", "RunOutput", "Tamper", "fit_transport"]

#: ``tamper(device_id, round, arrays) -> arrays``: rewrite a reply on the wire (Byzantine / faulty clients).
Tamper = Callable[[int, int, dict[str, np.ndarray]], dict[str, np.ndarray]]

_DEVICE_LOG = logging.getLogger("fedclust.device")

@dataclass
class InProcessTransport:
    """Run a protocol over in-memory devices.

    Parameters
    ----------
    dropout : float, default=0
        Fraction of devices that never reply (drawn from the seed).
    late : float, default=0
        Fraction of devices that reply only after the server has finished; for
        k-FED they are then assigned to the final centers (Theorem 3.2).
    dropped, late_devices : sequence of int, optional
        Explicit device ids, in addition to the fractions.
    on_client_error : {"raise", "drop"}, default="raise"
        What a failing client step does: stop the run with its error, or drop
        the device and name it in ``log.failed`` (what a real server does).
    tamper : callable, optional
        Rewrites chosen replies on the wire; the server validates them like
        any other reply, rejecting and naming malformed ones.
    secure_aggregation : bool or SecureAggregation, default=False
        Run the protocol's summed rounds (``Protocol.summed_actions``) as secure
        sums (:mod:`fedclust.core.secure_sum`): the server's code receives only
        the sum of the replies. A protocol without such rounds is refused.
        ``SecureAggregation(signed=True)``: the malicious-server variant; each
        simulated device gets a fresh Ed25519 identity per run.
    drop_after_masking : sequence of int, optional
        Devices that vanish after sending their keys and shares in a secure
        round (simulated; their masks are removed with the others' shares).
    progress : bool, default=False
        Progress bars (tqdm): one over the rounds, one over each round's devices.
    n_jobs : int or None, default=None
        Simulated devices computed at once, in threads, for protocols that
        declare ``parallel_safe`` (k-FED): ``None`` uses every core, as
        scikit-learn's KMeans does. Results do not depend on it (each device has
        its own random stream; replies are validated in device order).
    policies : DevicePolicy or mapping of int to DevicePolicy, optional
        Each device's own policy (:class:`fedclust.core.policy.DevicePolicy`,
        the object a Flower SuperNode reads from its node config), checked on
        the device before every data request; a refusal is one line on the
        device and, as a client error, stops the run or (``on_client_error=
        "drop"``) names the device in ``log.failed``. ``None``: no checks.
    checkpoint_dir : str or Path, optional
        Folder where the server writes ``checkpoint.npz`` after every completed
        round and the write-ahead privacy ledger ``ledger.json``
        (:mod:`fedclust.sim.resume`).
    resume : bool, default=False
        Continue the run checkpointed in ``checkpoint_dir`` after its last
        complete round (from the start when it has none); the protocol's
        config, the seed and the devices must be those of the checkpointed run.
    """

    dropout: float = 0.0
    late: float = 0.0
    dropped: Sequence[int] = ()
    late_devices: Sequence[int] = ()
    on_client_error: str = "raise"
    tamper: Tamper | None = None
    progress: bool = False
    n_jobs: int | None = None
    secure_aggregation: Any = False
    drop_after_masking: Sequence[int] = ()
    policies: Any = None
    checkpoint_dir: Any = None
    resume: bool = False

    def run(self, protocol: Protocol, devices: Mapping[int, DeviceData],
            random_state: Any = None) -> RunOutput:
        """Run ``protocol`` over ``devices`` (device id -> (n_z, d) array)."""
        with cyclic_gc_paused():
            return self._run(protocol, devices, random_state)

    def _run(self, protocol: Protocol, devices: Mapping[int, DeviceData],
             random_state: Any = None) -> RunOutput:
        check_float(self.dropout, "dropout", min_value=0.0, max_value=1.0)
        check_float(self.late, "late", min_value=0.0, max_value=1.0)
        if self.on_client_error not in ("raise", "drop"):
            raise ValidationError(
                f"on_client_error={self.on_client_error!r} must be 'raise' or 'drop'")
        if self.resume and self.checkpoint_dir is None:
            raise ValidationError("resume=True needs checkpoint_dir (the folder to resume from)")
        ckpt = (RunCheckpoint.open(self.checkpoint_dir, self.resume)
                if self.checkpoint_dir is not None else None)
        seed = ckpt.seed(random_state) if ckpt is not None else root_seed(random_state)
        secure = SecureAggregation.coerce(self.secure_aggregation)
        if secure is not None:
            protocol = protocol.secure_form()
        summed = check_summable(protocol) if secure is not None else frozenset()
        ids = sorted(map(int, devices))
        log = RunLog()
        absent, late = self._draw_faults(ids, seed)
        log.dropped = sorted(absent)
        log.late = sorted(late)
        active = ([z for z in ids if z not in absent and z not in late]  # sets: O(1) lookups
                  if absent or late else list(ids))
        states: dict[int, dict[str, np.ndarray]] = {z: {} for z in ids}
        identities = make_identities(ids) if secure is not None and secure.signed else None
        self._policies = ({z: policy_for(self.policies, z) for z in ids}
                          if self.policies is not None else dict.fromkeys(ids))
        # whether any device has a policy: without one, every device is admitted as is
        self._any_policy = self.policies is not None and any(
            p is not None for p in self._policies.values())
        shared = ([p for p in self._policies.values() if p is not None and p.ledger]
                  if self._any_policy else [])
        if len(shared) > 1 and len({id(p) for p in shared}) == 1 \
                and "{device}" not in shared[0].ledger:
            raise ValidationError(f"policies: devices share the ledger file {shared[0].ledger}; "
                                  "put {device} in its name (one ledger per device)")
        if identities is not None and self._any_policy:
            self._policies = {z: p.at_least_signed() if p is not None else None
                              for z, p in self._policies.items()}
        # the policy's own device state (read only where a device has a policy)
        self._charged: dict[int, dict] = {z: {} for z in ids} if self._any_policy else {}
        meter = CommunicationMeter()
        # what a checkpoint must match (only a checkpointing run needs it)
        identity = (run_identity(protocol, seed, ids, secure is not None)
                    if ckpt is not None else None)
        saved = ckpt.restore(identity) if ckpt is not None else None
        # what the server keeps to forget a device: recorded by the estimator
        # (fedclust.unlearning.recording), checkpointed with every round
        kept = self._kept_summaries = getattr(protocol, "kept_summaries", None)
        if saved is not None:
            state, log, meter, states, active = saved
            restored = None if kept is None else ckpt.kept_summaries(type(kept))
            if restored is not None:  # the rounds before the resume
                kept.device_ids, kept.rounds = restored.device_ids, restored.rounds
                kept.complete = restored.complete
        else:
            state = protocol.start(active, seed)
        ledger = ckpt.ledger if ckpt is not None else PrivacyLedger()
        rounds_bar = _rounds_bar(self.progress, protocol.name)
        last_round = None
        while (request := protocol.next_request(state)) is not None:
            last_round = request.round
            targets = round_targets(request, active, log)
            # written ahead: the round counts as spent before anything is released
            ledger.spend(request.round, request.action, round_releases(protocol, request),
                         meter.rounds)
            if request.action in summed:
                with naming_left_out(request.round, log):
                    replies = secure_round(
                        protocol, state, request, targets, devices, states, seed, secure, meter,
                        log, tamper=self.tamper, drop_after_masking=self.drop_after_masking,
                        raise_client_errors=self.on_client_error == "raise",
                        identities=identities,
                        admit=lambda zs: self._admit(protocol, request, zs, log, states,
                                                     secure=True),
                        policies=self._policies,
                        round_id=None if ckpt is None else ckpt.secure_round_id(request.round))
            else:
                allowed = self._admit(protocol, request, targets, log, states, secure=False)
                replies = self._round(protocol, state, request, allowed, devices, states, seed,
                                      log, meter)
            meter.rounds += 1
            if rounds_bar is not None:
                rounds_bar.set_postfix_str(f"{request.action}: {len(replies)}/{len(targets)} "
                                           "devices")
                rounds_bar.update(1)
            require_replies(request, targets, replies, log)
            with naming_left_out(request.round, log):
                self._server_step(protocol, state, request, replies)
            if ckpt is not None:
                self._checkpoint(ckpt, identity, state, log, meter, states, active)
        if rounds_bar is not None:
            rounds_bar.close()
        if any(e["releases"] for e in ledger.entries + ledger.lost):
            log.privacy_ledger = ledger.summary(getattr(protocol, "plan", None))
        log.participants = ([z for z in active if z not in log.failed and z not in log.rejected]
                            if log.failed or log.rejected else list(active))
        require_participants(log, last_round)
        with one_blas_thread(), naming_left_out(last_round, log):
            result = protocol.finish(state, log)
        if late and hasattr(protocol, "assign_late"):
            self._assign_late(protocol, result, sorted(late), devices, states, seed, log, meter)
        outputs = self._send_finals(protocol, result, ids, devices, states, log, meter)
        return RunOutput(result, outputs, meter, log, seed)

    def _send_finals(self, protocol, result, ids, devices, states, log, meter) -> dict:
        """Every device's final message through the codec, its bytes counted, and the
        device's outputs (``client_finish``)."""
        batches, finals = _final_steps(protocol)(result, ids)
        if batches and self._any_policy:
            for batch in batches:   # policies are asked device by device
                finals.update(zip(batch.ids, batch.messages()))
            batches, finals = [], {z: finals[z] for z in ids if z in finals}
        for z in list(finals) if self._any_policy else ():
            pol = self._policies.get(z)
            if pol is not None:  # the outputs go back to the caller: collect is asked
                try:
                    pol.check_finish(protocol, True, f"device {z}")
                except PolicyRefusal as exc:
                    _DEVICE_LOG.warning("fedclust: %s", exc)
                    log.failed.setdefault(z, str(exc))
                    del finals[z]
        outputs = {}
        finish_stacked = getattr(protocol, "client_finish_stacked", None)
        for batch in batches:   # column-wise: one check of the stacked arrays
            cls = batch.message_type
            if cls.check_stacked(batch.arrays) and finish_stacked is not None:
                meter.record_down_many(batch.ids, batch.nbytes_each)
                outputs.update(zip(batch.ids, finish_stacked(
                    batch, list(map(devices.__getitem__, batch.ids)),
                    list(map(states.__getitem__, batch.ids)))))
                continue
            if cls.check_stacked(batch.arrays):
                decoded = batch.messages()
            else:
                decoded = cls.from_arrays_many(batch.wires(),
                                               [f"server -> device {z}" for z in batch.ids])
                for final in decoded:
                    if isinstance(final, IncompatibleMessageError):
                        raise final  # the server's own message: a bug, not a device fault
            meter.record_down_many(batch.ids, batch.nbytes_each)
            for z, final in zip(batch.ids, decoded):
                outputs[z] = protocol.client_finish(final, devices[z], states[z])
        by_object: dict[int, list[int]] = {}   # one message object sent to many devices
        for z, final in finals.items():
            by_object.setdefault(id(final), []).append(z)
        by_type: dict[type, list[int]] = {}
        for zs in by_object.values():
            if len(zs) == 1:
                by_type.setdefault(type(finals[zs[0]]), []).append(zs[0])
                continue
            # the same bytes to every device: encoded and validated once (a server's
            # own message failing here is a bug, not a device fault: raised)
            wire = finals[zs[0]].to_arrays()
            final = type(finals[zs[0]]).from_arrays(wire, sender=f"server -> device {zs[0]}")
            meter.record_down_many(zs, sum(a.nbytes for a in wire.values()))
            finish_shared = getattr(protocol, "client_finish_shared", None)
            if finish_shared is not None:   # one pass for all of them
                outputs.update(zip(zs, finish_shared(final, [devices[z] for z in zs],
                                                     [states[z] for z in zs])))
                continue
            for z in zs:
                outputs[z] = protocol.client_finish(final, devices[z], states[z])
        for cls, zs in by_type.items():
            wires = [finals[z].to_arrays() for z in zs]
            decoded = cls.from_arrays_many(wires, [f"server -> device {z}" for z in zs])
            for z, wire, final in zip(zs, wires, decoded):
                if isinstance(final, IncompatibleMessageError):
                    raise final  # the server's own message: a bug, not a device fault
                meter.record_down(z, sum(a.nbytes for a in wire.values()))
                outputs[z] = protocol.client_finish(final, devices[z], states[z])
        return outputs

    def _admit(self, protocol, request: Request, targets, log, states, *, secure: bool
               ) -> list[int]:
        """The targets whose policy accepts the request (its round counted per device for
        a private fit); a refusal is a client error."""
        if not self._any_policy:
            return list(targets)
        allowed = []
        for z in targets:
            pol = self._policies.get(z)
            if pol is not None:
                try:
                    pol.check_request(protocol, request.action, self._charged[z], f"device {z}",
                                      secure=secure, round_index=request.round,
                                      device_state=states[z], payload=request.payload)
                except PolicyRefusal as exc:
                    _DEVICE_LOG.warning("fedclust: %s", exc)
                    if self.on_client_error == "raise":
                        raise
                    log.failed[z] = str(exc)
                    continue
            allowed.append(z)
        return allowed

    def _server_step(self, protocol: Protocol, state, request: Request, replies) -> None:
        """The round's server maths (a test transport overrides it to crash around it)."""
        with one_blas_thread():  # the same rounding on every transport and machine
            protocol.server_step(state, request, replies)

    def _checkpoint(self, ckpt: RunCheckpoint, identity, state, log, meter, states, active
                    ) -> None:
        """Write the round just completed (a test transport overrides it to crash here)."""
        ckpt.save(identity, state, log, meter, states, active,
                  getattr(self, "_kept_summaries", None))

    def _draw_faults(self, ids, seed):
        return draw_faults(ids, seed, dropout=self.dropout, late=self.late, dropped=self.dropped,
                           late_devices=self.late_devices)

    def _round(self, protocol, state, request: Request, targets, devices, states, seed, log,
               meter):
        down = None if request.payloads is not None else message_nbytes(request.payload)
        reply_type = protocol.reply_types[request.action]
        replies: dict[int, Message] = {}
        tables: list[StackedReplies] = []
        # Simulated devices are many small BLAS calls in a row: threading them
        # only adds contention (measured 5x slower on 2 cores), as scikit-learn's
        # KMeans also finds; one BLAS thread per call, as a real device would have.
        jobs = 1 if not getattr(protocol, "parallel_safe", False) else (
            self.n_jobs if self.n_jobs is not None else (os.cpu_count() or 1))
        # at least one chunk per job, so a few large devices also fill every core
        chunks = _chunks(targets, max(1, min(_CHUNK, -(-len(targets) // max(jobs, 1)))))

        # replies column-wise where the protocol offers it; a tamper rewrites them one by one
        steps = protocol.client_steps if self.tamper is not None else _column_steps(protocol)

        def compute(chunk):
            if request.payloads is None:
                return steps(request, {z: devices[z] for z in chunk}, seed=seed,
                             states={z: states[z] for z in chunk})
            groups: dict[int, list[int]] = {}  # devices that receive the same message object
            for z in chunk:
                groups.setdefault(id(request.payload_for(z)), []).append(z)
            batches, out = [], {}
            for zs in groups.values():
                got = steps(request.for_device(zs[0]), {z: devices[z] for z in zs}, seed=seed,
                            states={z: states[z] for z in zs})
                if isinstance(got, tuple):  # column-wise: (batches, other replies)
                    batches += got[0]
                    got = got[1]
                out.update(got)
            return batches, out

        with one_blas_thread(), \
                ThreadPoolExecutor(max(1, min(jobs, len(chunks)))) as pool:
            # numpy releases the GIL in the batched maths: threads overlap devices
            results = pool.map(compute, chunks) if jobs > 1 else map(compute, chunks)
            for chunk, computed in zip(_progress(chunks, self.progress,
                                                 f"round {request.round} ({request.action})",
                                                 len(targets)), results):
                batches, computed = computed if isinstance(computed, tuple) else ([], computed)
                if down is not None:
                    meter.record_down_many(chunk, down)
                else:
                    for z in chunk:
                        meter.record_down(z, message_nbytes(request.payload_for(z)))
                got: dict[int, Message] = {}
                whole = []   # batches kept whole (a protocol that reads them column-wise)
                for batch in batches:
                    kept = self._receive_batch(protocol, state, request, batch, reply_type,
                                               meter, log)
                    if isinstance(kept, StackedReplies):
                        whole.append(kept)
                    else:
                        got.update(kept)
                if whole and not got and not computed \
                        and [z for b in whole for z in b.ids] == chunk:
                    tables.extend(whole)   # the chunk's replies, in device order, no messages
                    continue
                for batch in whole:   # mixed with other replies: as messages
                    got.update(zip(batch.ids, batch.messages()))
                if tables:   # an earlier chunk's batches come first
                    replies.update(ReplyTable(tables))
                    tables = []
                if not computed and sum(len(b.ids) for b in batches) == len(chunk) \
                        and len(got) == len(chunk):   # every reply came in a batch, all kept
                    replies.update(zip(chunk, map(got.__getitem__, chunk)))
                    continue
                batched = {z for batch in batches for z in batch.ids}
                sent, wires = [], []
                for z in chunk:
                    if z in batched:
                        continue
                    reply = computed[z]
                    if isinstance(reply, FedClustError):
                        if self.on_client_error == "raise":
                            raise reply
                        log.failed[z] = str(reply)
                        continue
                    sent.append(z)
                    wires.append(self._encode(z, request.round, reply, meter))
                # one validation pass over the chunk's same-shaped replies
                decoded = reply_type.from_arrays_many(wires, [f"device {z}" for z in sent])
                for z, msg in zip(sent, decoded):
                    try:
                        if isinstance(msg, IncompatibleMessageError):
                            raise msg
                        protocol.check_reply(state, request, z, msg)
                    except IncompatibleMessageError as exc:
                        log.rejected[z] = str(exc)
                        continue
                    got[z] = msg
                for z in chunk:   # in device order, whichever way each reply came
                    if z in got:
                        replies[z] = got[z]
        if tables:
            if not replies:   # every reply in batches kept whole
                return ReplyTable(tables)
            replies.update(ReplyTable(tables))
        return replies

    def _receive_batch(self, protocol, state, request: Request, batch: StackedReplies,
                       reply_type, meter, log) -> dict[int, Message] | StackedReplies:
        """A batch of replies held column-wise: count every device's bytes, validate the
        stacked arrays at once, and check them; when any reply fails, decode them one by
        one so that each error names its device. A protocol that reads replies
        column-wise (``reads_stacked_replies``) gets a batch that passes whole as it is,
        without a message object per device."""
        meter.record_up_many(batch.ids, batch.nbytes_each)
        ids = batch.ids
        if batch.message_type is reply_type and reply_type.check_stacked(batch.arrays):
            # every reply valid: one check of the batch
            columnar = getattr(protocol, "reads_stacked_replies", False)
            decoded = None if columnar else batch.messages()
            refused = protocol.check_batch(state, request, batch, decoded)
            if not refused:
                return batch if columnar else dict(zip(ids, decoded))
            for z, exc in refused.items():
                log.rejected[z] = str(exc)
            if decoded is None:
                decoded = batch.messages()
            return {z: m for z, m in zip(ids, decoded) if z not in refused}
        decoded = reply_type.from_arrays_many(batch.wires(), [f"device {z}" for z in ids])
        good = [(z, m) for z, m in zip(ids, decoded) if not isinstance(m, Exception)]
        for z, m in zip(ids, decoded):
            if isinstance(m, IncompatibleMessageError):
                log.rejected[z] = str(m)
        if len(good) == len(ids):
            refused = protocol.check_batch(state, request, batch, decoded)
        else:
            refused = {}
            for z, m in good:
                try:
                    protocol.check_reply(state, request, z, m)
                except IncompatibleMessageError as exc:
                    refused[z] = exc
        for z, exc in refused.items():
            log.rejected[z] = str(exc)
        return {z: m for z, m in good if z not in refused}

    def _assign_late(self, protocol, result, late, devices, states, seed, log, meter):
        request = late_request(protocol, result)
        reply_type = protocol.reply_types[request.action]
        late = self._admit(protocol, request, late, log, states, secure=False)
        for z in late:
            meter.record_down(z, message_nbytes(request.payload))
            try:
                reply = protocol.client_step(request, devices[z], device_id=z, seed=seed,
                                             state=states[z])
                protocol.assign_late(result, z,
                                     self._send_up(z, request.round, reply, reply_type, meter))
            except IncompatibleMessageError as exc:
                log.rejected[z] = str(exc)
            except FedClustError as exc:
                if self.on_client_error == "raise":
                    raise
                log.failed[z] = str(exc)

    def _encode(self, z: int, round_index: int, reply: Message, meter) -> dict[str, np.ndarray]:
        """Device -> wire: encode, (tamper,) count the bytes."""
        arrays = reply.to_arrays()
        if self.tamper is not None:
            arrays = self.tamper(z, round_index, arrays)
        meter.record_up(z, sum(a.nbytes if type(a) is np.ndarray else np.asarray(a).nbytes
                               for a in arrays.values()))
        return arrays

    def _send_up(self, z: int, round_index: int, reply: Message, reply_type, meter) -> Message:
        """Device -> server: encode, (tamper,) count the bytes, decode with validation."""
        return reply_type.from_arrays(self._encode(z, round_index, reply, meter),
                                      sender=f"device {z}")

def _column_steps(protocol: Protocol):
    """The protocol's ``client_steps_stacked`` (``client_steps`` as ``([], replies)`` for an
    object that predates it)."""
    stacked = getattr(protocol, "client_steps_stacked", None)
    if stacked is not None:
        return stacked

    def steps(request, devices, *, seed, states):
        return [], protocol.client_steps(request, devices, seed=seed, states=states)
    return steps


def _final_steps(protocol: Protocol):
    """The protocol's ``final_messages_stacked`` (``final_message`` device by device for an
    object that predates it)."""
    stacked = getattr(protocol, "final_messages_stacked", None)
    if stacked is not None:
        return stacked

    def finals(result, ids):
        return [], {z: f for z in ids if (f := protocol.final_message(result, z)) is not None}
    return finals


_CHUNK = 1024  # devices handed to the protocol at once (vectorised client steps)


def _chunks(items, size):
    return [items[i:i + size] for i in range(0, len(items), size)]


def _rounds_bar(enabled: bool, name: str):
    """The outer bar: one step per round (the number of rounds is the protocol's to decide)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=f"{name} rounds", unit="round", position=0)


def _progress(chunks, enabled: bool, desc: str, total: int):
    """Yield the chunks, advancing a tqdm bar by devices when enabled."""
    if not enabled:
        yield from chunks
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit="device", leave=False, position=1) as bar:
        for chunk in chunks:
            yield chunk
            bar.update(len(chunk))


def fit_transport(transport: Any, secure_aggregation: Any, progress: bool = False) -> Any:
    """The transport an estimator's ``fit`` runs on: the given one, or an in-process one
    with the estimator's ``secure_aggregation``; a given transport must agree with it."""
    secure = SecureAggregation.coerce(secure_aggregation)
    if transport is None:
        return InProcessTransport(progress=progress, secure_aggregation=secure or False)
    if secure is not None and not getattr(transport, "secure_aggregation", False):
        raise ValidationError(
            "secure_aggregation=True but the given transport has secure_aggregation off: "
            "pass secure_aggregation=True to the transport too")
    return transport
