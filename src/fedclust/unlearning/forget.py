"""``forget`` and ``verify`` for the federated estimators (exact unlearning).

``model.forget(devices=[...])`` drops every summary the server keeps from those
devices and runs the server side of the protocol again over the rest
(:func:`fedclust.unlearning.replay.replay`); ``model.forget(rows={device:
rows})`` has that device run its step again without the rows, then the server
aggregates once. Either way the model equals a fresh ``fit`` on the federation
without that data with the same ``random_state`` and the same device ids.
Every forget appends a :class:`ForgetRecord` to ``forget_log_``;
:meth:`ForgetMixin.verify` recomputes from scratch and compares.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import RunOutput
from ..core.threads import one_blas_thread
from .digests import DOWNDATE_RTOL, digest_result, results_close
from .replay import DevicesNeeded, ReplayOutput, replay
from .requests import device_list, drop_rows, row_indices, row_requests
from .store import SummaryStore, digest_message, recording

__all__ = ["DOWNDATE_RTOL", "ForgetMixin", "ForgetRecord", "Unlearning", "VerifyReport",
           "digest_result", "results_close", "run_recorded"]


@dataclass
class ForgetRecord:
    """One forget: what was forgotten, what was computed again, and the digest of the
    inputs the model now rests on (the kept summaries, :meth:`SummaryStore.digest`)."""

    devices: list[int]
    rows: dict[int, list[int]]
    #: (round, device) pairs computed again (row deletions, and devices whose request changed)
    recomputed: list[tuple[int, int]]
    #: devices whose rows were deleted but whose summaries did not change (only the check ran)
    unchanged: list[int]
    #: True when devices other than the ones losing rows had to compute again (a retrain)
    retrained: bool
    seconds: float
    _digest: str | None = field(default=None, repr=False)
    #: how the server's result was recomputed: ``"replay"`` (its step in full, bit for
    #: bit), ``"trace"`` (the step's trace followed, its doubtful decisions computed
    #: again: bit for bit), ``"downdate"`` (the leaving devices' share subtracted; equal
    #: to a fresh fit within :data:`DOWNDATE_RTOL`), ``"none"`` (no summary changed)
    path: str = "replay"
    _store: SummaryStore | None = field(default=None, repr=False, compare=False)
    #: after a downdate: how many remaining device centers were assigned to the new
    #: centers again (the others kept their label by a certificate); None otherwise
    rechecked: int | None = None
    #: the parts of the server's step computed again, where the server keeps partial
    #: results (the Gaussians' ``server="tree"``: the trie nodes on the changed owners'
    #: paths, ``"root"`` its final steps); None where its step runs in full
    server_work: list[str] | None = None

    @property
    def summaries_digest(self) -> str:
        """SHA-256 of the remaining inputs: every summary kept after this forget with what
        its device was asked (:meth:`SummaryStore.digest`; hashed on first read)."""
        if self._digest is None:
            self._digest = self._store.digest()
        return self._digest

    def to_json(self) -> dict[str, Any]:
        return {"devices": self.devices, "rows": {str(z): r for z, r in self.rows.items()},
                "recomputed": [list(p) for p in self.recomputed], "unchanged": self.unchanged,
                "retrained": self.retrained, "summaries_digest": self.summaries_digest,
                "seconds": self.seconds, "path": self.path, "rechecked": self.rechecked,
                "server_work": self.server_work}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ForgetRecord":
        return cls([int(z) for z in doc["devices"]],
                   {int(z): [int(i) for i in r] for z, r in doc["rows"].items()},
                   [(int(a), int(b)) for a, b in doc["recomputed"]],
                   [int(z) for z in doc["unchanged"]], bool(doc["retrained"]),
                   float(doc["seconds"]), str(doc["summaries_digest"]),
                   path=str(doc.get("path", "replay")),
                   rechecked=None if doc.get("rechecked") is None else int(doc["rechecked"]),
                   server_work=(None if doc.get("server_work") is None
                                else [str(w) for w in doc["server_work"]]))


@dataclass
class VerifyReport:
    """``summaries``: the kept summaries give the model again (server side);
    ``retrain``: a fresh fit on the devices' current data gives it too (None: not run)."""

    summaries: bool
    retrain: bool | None
    digest: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.summaries and self.retrain is not False


@dataclass
class Unlearning:
    """Held by a fitted estimator (``_unlearning_``): the protocol, the run's seed, the
    kept summaries (server side) and, in-process, the simulated devices' data and
    final state (the devices' side, never saved with the model)."""

    protocol: Any
    seed: int
    store: SummaryStore
    result: Any
    data: dict[int, Any] = field(default_factory=dict)
    memory: dict[int, dict] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)
    #: False once a forget took the downdate path: the model then equals the server's
    #: step within DOWNDATE_RTOL, not bit for bit (until a full step runs again)
    exact: bool = True
    #: how the estimator works out ``trace`` from this object when it is first read
    trace_of: Any = None
    _trace: Any = None
    _traced: bool = False

    @property
    def trace(self) -> Any:
        """What an estimator keeps to downdate its server's result (its own form),
        worked out on first use: a model that never forgets never pays for it."""
        if not self._traced and self.trace_of is not None:
            self._trace, self._traced = self.trace_of(self), True
        return self._trace

    @trace.setter
    def trace(self, value: Any) -> None:
        # None: worked out again (by ``trace_of``) when next read
        self._trace, self._traced = value, value is not None

    def __getstate__(self) -> dict[str, Any]:
        # the devices' side stays with the devices: a pickled model holds no device data;
        # nor the downdate trace (its label margins refer to an earlier model's centers):
        # it is worked out again from the kept summaries at the next forget
        return {**self.__dict__, "data": {}, "memory": {}, "_trace": None, "_traced": False}


class _KeptMeter:
    """Stands in for the communication meter: ``communication_`` stays the fit's."""

    def __init__(self, summary: dict[str, Any]):
        self._summary = summary

    def summary(self) -> dict[str, Any]:
        return self._summary


def run_recorded(estimator: Any, transport: Any, protocol: Any, devices: Mapping[int, Any],
                 seed: int) -> RunOutput:
    """``transport.run`` while recording what the server keeps; sets ``estimator._unlearning_``."""
    store = SummaryStore(sorted(int(z) for z in devices))
    memory: dict[int, dict] = {}
    with recording(protocol, store, memory, devices):
        out = transport.run(protocol, devices, seed)
    kept = getattr(out, "summaries", None)   # a server elsewhere (Flower) keeps its own
    if not store.rounds and kept is not None:
        store = kept
    if not store.rounds:
        store.complete = False
    from ..sim.transport import InProcessTransport

    in_process = isinstance(transport, InProcessTransport)   # the devices live in this process
    estimator._unlearning_ = Unlearning(protocol, int(seed), store, out.result,
                                       dict(devices) if in_process else {}, memory)
    estimator.forget_log_ = []
    return out


class ForgetMixin:
    """``forget`` / ``verify`` / ``forget_log_`` for an estimator fitted through
    :func:`run_recorded`; the estimator provides ``_apply_forget(out, ids)``."""

    def _unlearner(self) -> Unlearning:
        u = getattr(self, "_unlearning_", None)
        if u is None:
            if hasattr(self, "device_ids_"):
                raise ValidationError(
                    f"forget: this {type(self).__name__} was fitted without a server that keeps "
                    "device summaries (a general graph); fit again without the data")
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        if not u.store.complete:
            raise ValidationError(
                "forget: the server kept no per-device summaries for this run (secure "
                "aggregation hands it only their sum), so it cannot drop one device's share; "
                "fit again without the data")
        return u

    def _resolve(self, u: Unlearning, device: Any) -> int:
        if isinstance(device, str):
            if device not in u.names:
                raise ValidationError(f"forget: no site named {device!r}; sites: "
                                      f"{sorted(u.names)[:10]}")
            return u.names[device]
        if isinstance(device, (bool, np.bool_)) or not isinstance(device, (int, np.integer)):
            raise ValidationError(f"forget: device {device!r} must be a device id or a site name")
        if int(device) not in u.store.device_ids:
            raise ValidationError(f"forget: device {device} is not in the model (devices: "
                                  f"{u.store.device_ids[:10]})")
        return int(device)

    def forget(self, devices: Sequence[Any] = (), rows: Mapping[Any, Any] | None = None, *,
               data: Mapping[Any, Any] | None = None, relabel: bool = True,
               summaries: Mapping[Any, Any] | None = None) -> Any:
        """Forget whole devices and/or some of their rows, exactly.

        Parameters
        ----------
        devices : sequence of int or str
            Device ids (or site names) to forget: their kept summaries are dropped
            and the server's step runs again over the rest; the devices need not be
            online.
        rows : mapping device -> sequence of int, optional
            Rows to delete from a device's data (indices into its current rows).
            The device runs its step again without them; the server then
            aggregates once. If its summary does not change, nothing else runs.
            Deleting every row of a device forgets the device (a fit has no empty
            device).
        data : mapping device -> array (or (X, y)), optional
            A device's current data, where the model does not hold it (a model
            fitted on another transport, or read from a file); in-process fits
            keep a reference to every simulated device's arrays.
        relabel : bool, default=True
            Recompute ``device_labels_`` of the remaining devices (each device's
            own pass over its rows; the model itself does not need it). With
            False, or where the devices' data is not held, a changed model leaves
            each entry of ``device_labels_`` that it does not recompute as ``None``.
        summaries : mapping device -> Message, optional
            Rows deleted on a device that ran its step again itself (a site on
            Flower, :mod:`fedclust.flower.forget`): its validated reply to the
            fit's first request over its remaining rows. The server aggregates
            once; which rows went stays with the device (``rows`` of the record
            lists none). One-round protocols only; others need the device's data.

        Returns
        -------
        self
            With the model of a fresh ``fit`` without that data (same seed, same
            device ids); ``forget_log_[-1]`` records what was done.
        """
        t0 = time.perf_counter()
        u = self._unlearner()
        drop = sorted({self._resolve(u, z) for z in device_list(devices)})
        given = {self._resolve(u, z): v for z, v in (data or {}).items()}
        deleted: dict[int, np.ndarray] = {}
        for z, r in row_requests(rows).items():
            z = self._resolve(u, z)
            idx = row_indices(r, z)
            if z in drop or idx.size == 0:
                continue
            deleted[z] = idx
        held = {**u.data, **given}
        for z, idx in list(deleted.items()):   # every row of a device: the device leaves
            X = held.get(z)
            n = None if X is None else len(X[0] if isinstance(X, tuple) else X)
            if n == idx.size and idx[0] == 0 and idx[-1] == n - 1:
                del deleted[z]
                drop = sorted({*drop, z})
        replied = {self._resolve(u, z): m for z, m in (summaries or {}).items()}
        replied = {z: m for z, m in replied.items() if z not in drop and z not in deleted}
        if not drop and not deleted and not replied:
            raise ValidationError("forget: nothing to forget (give devices= or rows=)")
        if getattr(self, "privacy", None) is not None and (deleted or replied):
            raise ValidationError(
                "forget: row deletion is refused under privacy=: the device would release its "
                "summary again, and two releases of neighbouring data with the same noise reveal "
                "the deleted rows (fresh noise would spend budget and not equal a retrain); "
                "forget the whole device, or fit again")
        devices_data = {**u.data, **given}
        new_data = {}
        for z, idx in deleted.items():
            if z not in devices_data:
                raise ValidationError(
                    f"forget: device {z} must run its step again without the rows, but the "
                    "model does not hold its data; pass data={device: its current rows}")
            new_data[z] = drop_rows(devices_data[z], idx, z)
        kept = u.store.without(set(drop))
        if not kept.device_ids:
            raise ValidationError("forget: no device would remain")
        self._check_remaining(u, kept, new_data)
        protocol = self._forget_protocol(u, kept, new_data)
        if protocol is not u.protocol:   # the federation's settings change: every device again
            kept = SummaryStore(kept.device_ids, [], kept.complete)
        answers: dict[int, tuple[str, Any, dict]] = {}
        if len(kept.rounds) == 1:
            answers = self._check_rows(u, kept, new_data)
        answers.update(self._given_answers(u, kept, replied))
        rec = kept.rounds[0] if kept.rounds else None
        unchanged = sorted(z for z, (_, msg, _) in answers.items()
                           if z in rec.replies and digest_message(msg) == rec.digest_of(z))
        changing = sorted({*deleted, *replied})
        path = "replay"
        fast, rechecked = None, None
        entering = {z: answers[z][1] for z in changing
                    if z in answers and z not in unchanged}
        store = kept
        if drop and not changing and protocol is u.protocol:
            with one_blas_thread():   # the server maths round as the fit's did
                fast = self._downdate(u, drop, kept)
        elif (not drop and entering and protocol is u.protocol and len(kept.rounds) == 1
              and len(entering) + len(unchanged) == len(changing)):
            # the devices' new summaries enter the previous result (their old ones leave)
            store = kept.without(set())
            for z, msg in entering.items():
                store.rounds[0].replies[z] = msg
                store.rounds[0].digests[z] = digest_message(msg)
            with one_blas_thread():
                fast = self._replace(u, entering, store)
        if not drop and unchanged and len(unchanged) == len(changing):
            out, path = None, "none"
        elif fast is not None:
            fast, rechecked, exact = fast
            out, path = ReplayOutput(fast, store, fast.log, [(0, z) for z in changing],
                                     {z: answers[z][2] for z in changing}), \
                "trace" if exact else "downdate"
        else:
            avail = {z: devices_data[z] for z in kept.device_ids if z in devices_data}
            avail.update(new_data)
            if getattr(self, "privacy", None) is not None:
                avail = {}  # under privacy only the kept noisy releases may be reused
            try:
                out = replay(protocol, kept, u.seed, data=avail,
                             fresh=frozenset(changing), first_answers=answers)
            except DevicesNeeded as exc:
                if getattr(self, "privacy", None) is not None:
                    raise ValidationError(
                        "forget: under privacy=, forgetting may only recompute from the noisy "
                        "releases the server kept; this one would make devices release again "
                        f"({exc})") from None
                raise
        for z, X in new_data.items():
            if z in u.data:
                u.data[z] = X
        if protocol is not u.protocol:
            u.protocol = protocol
            self._protocol_changed(protocol)
        remaining = set(kept.device_ids)
        ids = [z for z in getattr(self, "device_ids_", kept.device_ids)
               if z in remaining]   # the fit's device order, less the forgotten
        if out is None:   # summaries unchanged: the model stands; the devices relabel
            u.memory.update({z: answers[z][2] for z in unchanged})
            outputs = self._relabel(u, u.result, changing, relabel)
            self._update_labels(outputs)
            recomputed = [(0, z) for z in changing]
        else:
            u.store, u.result = out.store, out.result
            for z in set(u.memory) - remaining:
                del u.memory[z]
            u.memory.update(out.states)
            outputs = self._relabel(u, out.result, ids, relabel)
            self._apply_forget(RunOutput(out.result, outputs, _KeptMeter(self.communication_),
                                         out.log, u.seed), ids)
            recomputed = out.recomputed
        for z in drop:
            u.data.pop(z, None)
            u.memory.pop(z, None)
        u.names = {n: z for n, z in u.names.items() if z not in drop}
        self._rows_after_forget()
        self.forget_log_.append(ForgetRecord(
            drop, {z: idx.tolist() for z, idx in deleted.items()}, sorted(recomputed),
            sorted(unchanged),
            any(z not in changing for _, z in recomputed), time.perf_counter() - t0,
            _store=u.store, path=path, rechecked=rechecked,
            server_work=getattr(protocol, "server_work", None) if path == "replay" else None))
        if path != "none":   # a full step or a followed trace: the server's bits again
            u.exact = path != "downdate"
        return self

    # -- pieces ------------------------------------------------------------------
    def _downdate(self, u: Unlearning, drop: list[int], kept: SummaryStore) -> Any:
        """``(result, rechecked, exact)``: the server's result without the devices ``drop``
        computed from the previous one (not its step in full), how many kept summaries
        it looked at again and whether the result is its step's bits, or None; an
        estimator whose server allows it overrides."""
        return None

    def _replace(self, u: Unlearning, entering: dict[int, Any], store: SummaryStore) -> Any:
        """``(result, rechecked, exact)``: the server's result with the devices' new summaries
        ``entering`` (after row deletions there; ``store`` holds them) computed from the
        previous one, or None; an estimator whose server allows it overrides."""
        return None

    def _check_remaining(self, u: Unlearning, kept: SummaryStore, new_data: dict[int, Any]
                         ) -> None:
        """Refuse, as a fresh ``fit`` on what remains would, a forget that leaves a federation
        the estimator does not fit (an estimator with such checks overrides)."""

    def _forget_protocol(self, u: Unlearning, kept: SummaryStore, new_data: dict[int, Any]
                         ) -> Any:
        """The protocol a fresh fit on the remaining data would build (``u.protocol`` when
        its settings do not depend on the data; the classifier's label set does)."""
        return u.protocol

    def _protocol_changed(self, protocol: Any) -> None:
        """Update the estimator's data-derived settings to ``protocol``'s."""
        if hasattr(self, "_protocol_"):
            self._protocol_ = protocol

    def _check_rows(self, u: Unlearning, kept: SummaryStore, new_data: dict[int, Any]
                    ) -> dict[int, tuple[str, Any, dict]]:
        """One-round protocols: each device's step without its rows, as
        ``(payload digest, reply, state)``: the check of whether its summary changed."""
        if not new_data:
            return {}
        proto = u.protocol
        state = proto.start(kept.device_ids, u.seed)
        request = proto.next_request(state)
        rec = kept.rounds[0]
        answers: dict[int, tuple[str, Any, dict]] = {}
        for z, X in new_data.items():
            digest = None if request is None else digest_message(request.payload_for(z))
            if digest is None or rec.payloads.get(z) != digest:
                continue
            st: dict = {}
            with one_blas_thread():   # as the transports and the replay: the same rounding
                got = proto.client_steps(request.for_device(z), {z: X}, seed=u.seed,
                                         states={z: st})
            if isinstance(got[z], Exception):
                raise got[z]
            msg = proto.reply_types[request.action].from_arrays(got[z].to_arrays(),
                                                                sender=f"device {z}")
            answers[z] = (digest, msg, st)
        return answers

    def _given_answers(self, u: Unlearning, kept: SummaryStore, replied: Mapping[int, Any]
                       ) -> dict[int, tuple[str, Any, dict]]:
        """Replies a device computed itself, as ``(payload digest, reply, state)`` for the
        replay; they must answer the fit's first request of a one-round protocol."""
        if not replied:
            return {}
        proto = u.protocol
        if len(kept.rounds) != 1:
            raise ValidationError(
                f"forget: devices {sorted(replied)} sent their new summaries, but this "
                f"protocol runs {len(kept.rounds)} rounds: every round's request depends on "
                "the others' data, so the devices must take part in a fresh fit")
        state = proto.start(kept.device_ids, u.seed)
        request = proto.next_request(state)
        reply_type = proto.reply_types[request.action]
        answers = {}
        for z, msg in replied.items():
            if not isinstance(msg, reply_type):
                raise ValidationError(f"forget: device {z}'s new summary is a "
                                      f"{type(msg).__name__}, not a {reply_type.__name__}")
            proto.check_reply(state, request, z, msg)
            answers[z] = (digest_message(request.payload_for(z)), msg, {})
        return answers

    def _relabel(self, u: Unlearning, result: Any, ids: Sequence[int], relabel: bool
                 ) -> dict[int, dict]:
        outputs: dict[int, dict] = {}
        if not relabel:
            return outputs
        proto = u.protocol
        for z in ids:
            if z not in u.memory or z not in u.data:
                continue
            final = proto.final_message(result, z)
            if final is not None:
                outputs[z] = proto.client_finish(final, u.data[z], u.memory[z])
        return outputs

    def _update_labels(self, outputs: dict[int, dict]) -> None:
        for z, o in outputs.items():
            if "labels" in o and z in self.device_ids_:
                self.device_labels_[self.device_ids_.index(z)] = o["labels"]

    def _rows_after_forget(self) -> None:
        """``labels_`` in the groups form followed the rows of the fitted X; after a
        forget the devices' rows are listed in device order instead."""
        from ..core.estimators import RowOrder

        if hasattr(self, "_rows"):
            self._rows = RowOrder()

    def verify(self, data: Mapping[Any, Any] | None = None) -> VerifyReport:
        """Recompute from scratch and compare.

        Always: the server's step over the kept summaries, from the start, gives
        the model bit for bit. With the devices' data (held in-process, or
        ``data``): a fresh ``fit`` on it (same seed and device ids) gives the same
        model and the same kept summaries.
        """
        u = self._unlearner()
        # a protocol that keeps partial server results checks without them
        uncached = getattr(u.protocol, "uncached", None)
        again = replay(uncached() if uncached else u.protocol, u.store, u.seed)
        digest = digest_result(u.result)
        # after a downdate the model equals the server's step within DOWNDATE_RTOL
        summaries = (digest_result(again.result) == digest if u.exact
                     else results_close(again.result, u.result))
        devices = {**u.data, **{self._resolve(u, z): v for z, v in (data or {}).items()}}
        present = set(u.store.device_ids)
        ids = [z for z in getattr(self, "device_ids_", u.store.device_ids) if z in present]
        retrain = None
        detail = ""
        if all(z in devices for z in ids):
            from sklearn.base import clone

            fresh = clone(self).set_params(random_state=u.seed)
            parts = [devices[z] for z in ids]
            if parts and isinstance(parts[0], tuple):
                fresh.fit([p[0] for p in parts], [p[1] for p in parts], device_ids=list(ids))
            else:
                fresh.fit(parts, device_ids=list(ids))
            fu = fresh._unlearning_
            retrain = ((digest_result(fu.result) == digest if u.exact
                        else results_close(fu.result, u.result))
                       and fu.store.digest() == u.store.digest())
            if not retrain:
                detail = "a fresh fit on the devices' current data gives a different model"
        else:
            detail = "the devices' data is not at hand: only the kept summaries were checked"
        return VerifyReport(summaries, retrain, u.store.digest(), detail)
