"""The shape every federated algorithm in fedclust takes.

A :class:`Protocol` is written once and run by a transport: the in-process
simulator (:mod:`fedclust.sim`) or Flower (:mod:`fedclust.flower`). It has

* client maths — :meth:`Protocol.client_step` (device data -> reply message)
  and :meth:`Protocol.client_finish` (final per-device message -> device output,
  e.g. point labels). Devices keep private arrays between calls in ``state``
  (in-process: a dict; Flower: ``context.state``);
* server maths — :meth:`Protocol.server_step` over the validated replies of one
  round, then :meth:`Protocol.finish`;
* the round plan — :meth:`Protocol.next_request` says what to ask whom, until
  it returns ``None``.

Everything a client needs to rebuild the protocol travels as scalars in
:meth:`Protocol.config`; randomness comes from the run's seed and the device
id (:mod:`fedclust.core.random`). Replies are validated by the message codec and
:meth:`Protocol.check_reply` before any server maths; a bad reply is rejected
by name and the round goes on without it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Protocol as TypingProtocol, Sequence, Union

import numpy as np

from .exceptions import FedClustError, IncompatibleMessageError, TooFewReplies, ValidationError
from .messages import Message, StackedReplies

__all__ = ["Request", "Protocol", "RunLog", "RunOutput", "Transport", "DeviceData", "ConfigValue",
           "round_targets", "require_replies", "require_participants", "left_out",
           "explain_too_few", "naming_left_out"]

ConfigValue = Any  # int | float | str | bool | list of those

#: What a device holds: its points ``X`` (n, d), or ``(X, y)`` for supervised
#: families (``Protocol.supervised``). Transports pass it to the client step as is.
DeviceData = Union[np.ndarray, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Request:
    """One round: ``action`` names the client step, ``payload`` is broadcast to ``devices``.

    ``devices=None`` means every device still in the run. ``payloads`` gives some
    devices a message of their own instead of ``payload`` (e.g. each device its
    cluster's model: one round for all clusters, each device downloading one
    model); bytes are counted per device. ``allow_empty=True``
    lets the run go on when no device of the round gives a valid reply
    (``server_step`` then gets no replies), e.g. one cluster's round in clustered
    training whose members all dropped out; by default such a round stops the run.
    It is the server's plan only and does not travel to the devices.
    """

    round: int
    action: str
    payload: Message | None = None
    devices: tuple[int, ...] | None = None
    allow_empty: bool = False
    payloads: Mapping[int, Message] | None = None

    def payload_for(self, device_id: int) -> Message | None:
        """What ``device_id`` receives in this round."""
        if self.payloads is not None and device_id in self.payloads:
            return self.payloads[device_id]
        return self.payload

    def for_device(self, device_id: int) -> "Request":
        """The round as ``device_id`` sees it (its own payload, no per-device table)."""
        if self.payloads is None:
            return self
        return replace(self, payload=self.payload_for(device_id), payloads=None)


@dataclass
class RunLog:
    """What happened to the devices during a run (filled by the transport)."""

    participants: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    #: devices whose well-formed replies a robust server judged untrustworthy (still participants)
    distrusted: dict[int, str] = field(default_factory=dict)
    #: samples of each device that the result does not hold (a summary that leaves small
    #: clusters out, a cluster cap), and samples the server removed; absent: none
    removed: dict[int, int] = field(default_factory=dict)
    removed_by_server: int = 0
    #: the server's diagnostics: reasons to doubt the answer (e.g. k-FED's answer costing
    #: well above another answer built from the devices' summaries)
    warnings: list[str] = field(default_factory=list)
    #: private runs with a write-ahead ledger: rounds released, releases lost to a crash
    #: and redone, and the true ε (:class:`fedclust.core.checkpoint.PrivacyLedger`)
    privacy_ledger: dict = field(default_factory=dict)

    def name_sites(self, names: Sequence[str] | Mapping[int, str]) -> None:
        """A site run: each failed, rejected or distrusted device's reason names its site,
        ``site 'hospital_b' (device 2): ...`` in place of ``device 2: ...`` (``names[z]``
        is device z's site, a list by position or a mapping by device id; a placeholder
        ``device z`` or a missing entry is left as is). A warning's list of devices,
        ``devices 12, 40``, becomes ``sites 'hospital_a', 'hospital_b'`` when every
        device listed has a site name."""
        def name_of(z: int) -> str | None:
            if isinstance(names, Mapping):
                name = names.get(z)
            else:
                name = names[z] if 0 <= z < len(names) else None
            return None if not name or name == f"device {z}" else str(name)

        def listed(match: "re.Match[str]") -> str:
            ids = [int(t) for t in match.group(1).split(", ")]
            found = [name_of(z) for z in ids]
            if any(n is None for n in found):
                return match.group(0)
            return "sites " + ", ".join(repr(n) for n in found)

        self.warnings = [re.sub(r"\bdevices ((?:\d+, )*\d+)\b", listed, w) for w in self.warnings]
        for reasons in (self.failed, self.rejected, self.distrusted):
            for z, why in reasons.items():
                name = name_of(z)
                if name is None:
                    continue
                site, plain = f"site {name!r} (device {z})", f"device {z}"
                if site in why:
                    continue
                rest = why[len(plain):]
                if why.startswith(plain) and not rest[:1].isdigit():
                    reasons[z] = site + rest
                else:
                    reasons[z] = f"{site}: {why}"


@dataclass
class RunOutput:
    """What a transport returns: the protocol's result, per-device outputs, the
    communication meter (:class:`fedclust.sim.meter.CommunicationMeter`), the log."""

    result: Any
    device_outputs: dict[int, dict[str, np.ndarray]]
    meter: Any
    log: RunLog
    seed: int


class Transport(TypingProtocol):
    """What ``fit(..., transport=)`` accepts: the in-process simulator
    (:class:`fedclust.sim.InProcessTransport`) or Flower
    (:class:`fedclust.flower.FlowerSimulationTransport`, ...)."""

    def run(self, protocol: "Protocol", devices: Mapping[int, DeviceData],
            random_state: Any = None) -> RunOutput:
        ...


class Protocol(ABC):
    """Base class of federated protocols (see the module docstring)."""

    name: ClassVar[str]
    #: reply message class of each action
    reply_types: ClassVar[Mapping[str, type[Message]]]
    #: devices hold ``(X, y)`` rather than ``X`` (see :data:`DeviceData`)
    supervised: ClassVar[bool] = False
    #: actions whose replies :meth:`server_step` only adds up (field by field): a
    #: transport with secure aggregation hands it their sum alone, under the key
    #: :data:`fedclust.core.secure_sum.SUMMED` (:mod:`fedclust.core.secure_sum`)
    summed_actions: ClassVar[frozenset[str]] = frozenset()
    #: :meth:`client_steps` may run for several device chunks at once in threads
    #: (it touches only its own devices' ``states``, no shared mutable state)
    parallel_safe: ClassVar[bool] = False
    #: actions whose client step reads nothing a device kept from an earlier round
    #: (its ``state``) and whose server step takes replies from any subset of the devices:
    #: a device that lost its state (a restarted Flower SuperNode) or connected late may
    #: take part from such a round on. Empty: such a device stays out of the run.
    rejoin_actions: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def config(self) -> dict[str, ConfigValue]:
        """Scalars (and lists of scalars) from which :meth:`from_config` rebuilds ``self``."""

    @classmethod
    @abstractmethod
    def from_config(cls, config: Mapping[str, ConfigValue]) -> "Protocol":
        """Rebuild the protocol on a client from :meth:`config`."""

    def node_data(self, data: Any, where: str) -> Any:
        """What a node hands this protocol from its stored ``data``: ``X`` or ``(X, y)``.

        Labels are dropped for an unsupervised protocol; data without labels is
        refused, by ``where``, for a supervised one. Data that is not arrays (a
        site table) offers ``as_arrays(where)``, which gives its numbers or says
        why it cannot. A protocol that reads such data itself (site preprocessing
        on the node) overrides this and takes ``data`` as it is.
        """
        as_arrays = getattr(data, "as_arrays", None)
        if as_arrays is not None:
            data = as_arrays(where)
        if isinstance(data, tuple) and not self.supervised:
            return data[0]
        if not isinstance(data, tuple) and self.supervised:
            raise ValidationError(f"{where}: protocol {self.name!r} needs labels; the data file "
                                  "has no 'y'")
        return data

    def node_device_id(self, data: Any, given: int | None) -> int | None:
        """The device id a node answers under, from its stored ``data`` and the id its
        configuration gives (``given``: node config ``device-id``, the data file's, or
        its ``partition-id``; ``None``: none). Default: ``given``. A protocol whose
        devices are known by name (sites under ``site_ids = "name"``) derives it from
        the data instead."""
        return given

    # -- server side -----------------------------------------------------
    @abstractmethod
    def start(self, device_ids: Sequence[int], seed: int) -> Any:
        """Fresh server state for a run over ``device_ids``."""

    @abstractmethod
    def next_request(self, state: Any) -> Request | None:
        """The next round, or ``None`` when the run is over."""

    def check_reply(self, state: Any, request: Request, device_id: int, reply: Message) -> None:
        """Protocol-level validation of a decoded reply (raise IncompatibleMessageError)."""

    @abstractmethod
    def server_step(self, state: Any, request: Request, replies: Mapping[int, Message]) -> None:
        """Server maths over the validated replies of one round (updates ``state``)."""

    @abstractmethod
    def finish(self, state: Any, log: RunLog) -> Any:
        """The protocol's result object."""

    def secure_form(self) -> "Protocol":
        """What a transport with secure aggregation runs: ``self``, or an equivalent
        protocol whose rounds send plain sums (more :attr:`summed_actions`)."""
        return self

    def final_message(self, result: Any, device_id: int) -> Message | None:
        """What the server sends a device once the run is over (``None``: nothing)."""
        return None

    def final_messages_stacked(self, result: Any, device_ids: Sequence[int]
                               ) -> tuple[list[StackedReplies], dict[int, Message]]:
        """:meth:`final_message` of ``device_ids``, some held column-wise: ``(batches,
        others)`` (devices without a final message in neither), for the in-process
        transport. Default: every message in ``others``, in device order."""
        return [], {z: f for z in device_ids if (f := self.final_message(result, z)) is not None}

    # -- client side -----------------------------------------------------
    @abstractmethod
    def client_step(self, request: Request, X: DeviceData, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        """Client maths for ``request.action`` on the device's own data (``(X, y)`` if supervised)."""

    def client_steps(self, request: Request, devices: Mapping[int, DeviceData], *, seed: int,
                     states: Mapping[int, dict[str, np.ndarray]]
                     ) -> dict[int, Message | FedClustError]:
        """:meth:`client_step` for several simulated devices; errors are returned, not raised.

        A protocol may override it to vectorise over devices (k-FED batches
        same-shaped devices); the result per device must not change.
        """
        out: dict[int, Message | FedClustError] = {}
        for z, X in devices.items():
            try:
                out[z] = self.client_step(request, X, device_id=z, seed=seed, state=states[z])
            except FedClustError as exc:
                out[z] = exc
        return out

    def client_steps_stacked(self, request: Request, devices: Mapping[int, DeviceData], *,
                             seed: int, states: Mapping[int, dict[str, np.ndarray]]
                             ) -> tuple[list[StackedReplies], dict[int, Message | FedClustError]]:
        """:meth:`client_steps` with some replies held column-wise: ``(batches, others)``.

        For the in-process transport, which then encodes, counts and validates a
        batch at once instead of one device at a time. Each device is in exactly one
        batch or in ``others``; its reply must be the one :meth:`client_steps` gives.
        Default: every reply in ``others``.
        """
        return [], self.client_steps(request, devices, seed=seed, states=states)

    def check_batch(self, state: Any, request: Request, batch: StackedReplies,
                    messages: Sequence[Message]) -> dict[int, IncompatibleMessageError]:
        """:meth:`check_reply` for a batch of decoded replies (``messages[i]`` from device
        ``batch.ids[i]``): the refused devices with their errors. A protocol may
        override it with checks over ``batch.arrays`` that give the same verdicts."""
        refused: dict[int, IncompatibleMessageError] = {}
        for z, msg in zip(batch.ids, messages):
            try:
                self.check_reply(state, request, z, msg)
            except IncompatibleMessageError as exc:
                refused[z] = exc
        return refused

    def client_finish(self, message: Message | None, X: DeviceData,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Turn the final message into the device's output (e.g. its point labels)."""
        return {}


def round_targets(request: Request, active: Sequence[int], log: RunLog) -> list[int]:
    """Devices a round goes to: those asked for that are active and not yet failed/rejected."""
    active_set = set(active)
    return [z for z in (request.devices or active)
            if z in active_set and z not in log.failed and z not in log.rejected]


def left_out(log: RunLog, ids: Sequence[int] | None = None) -> dict[int, str]:
    """Why each device (of ``ids``; default: every device the log names) gave no valid
    reply: dropped out, late, failed (its reason) or rejected (its reason)."""
    reasons: dict[int, str] = {}
    for z in log.dropped:
        reasons[z] = f"device {z}: dropped out (never replied)"
    for z in log.late:
        reasons[z] = f"device {z}: late (replies only after the server has finished)"
    reasons.update(log.failed)
    reasons.update(log.rejected)
    if ids is not None:
        wanted = set(ids)
        reasons = {z: why for z, why in reasons.items() if z in wanted}
    return dict(sorted(reasons.items()))


def _describe(reasons: Mapping[int, str], shown_ids: int = 12, shown_reasons: int = 8) -> str:
    """``reasons`` in a line: devices with the same reason grouped, ``devices 0, 3: dropped
    out (never replied)``; at most ``shown_reasons`` groups and ``shown_ids`` ids a group."""
    groups: dict[str, list[int]] = {}
    for z, why in reasons.items():
        head = f"device {z}: "
        groups.setdefault(why[len(head):] if why.startswith(head) else why, []).append(z)
    parts = []
    for why, zs in list(groups.items())[:shown_reasons]:
        ids = ", ".join(str(z) for z in zs[:shown_ids])
        more = f", ... ({len(zs)} in all)" if len(zs) > shown_ids else ""
        parts.append(f"device{'s' if len(zs) > 1 else ''} {ids}{more}: {why}")
    if len(groups) > shown_reasons:
        parts.append(f"{len(groups) - shown_reasons} other reasons (the error's .reasons "
                     "names every device)")
    return "; ".join(parts)


def explain_too_few(exc: TooFewReplies, round: int | None, log: RunLog) -> TooFewReplies:
    """``exc`` with the round and why each device of the run gave no valid reply."""
    if exc.reasons:   # already explained: only the round may be missing
        if exc.round is None:
            exc.round = round
        return exc
    reasons = left_out(log)
    where = "before any round" if round is None else f"round {round}"
    text = f"{where}: {exc}"
    if reasons:
        text += f"; {len(reasons)} device(s) gave no valid reply: {_describe(reasons)}"
    return TooFewReplies(text, round=round, reasons=reasons)


@contextmanager
def naming_left_out(round: int | None, log: RunLog):
    """Inside: a :class:`TooFewReplies` from the protocol's server maths is raised again
    with the round and the devices' reasons (:func:`explain_too_few`)."""
    try:
        yield
    except TooFewReplies as exc:
        raise explain_too_few(exc, round, log) from None


def require_participants(log: RunLog, round: int | None) -> None:
    """Stop a run that ends with no participant (every device dropped, late, failed or
    rejected): its model would be the protocol's start, moved by no device."""
    if not log.participants:
        raise explain_too_few(TooFewReplies(
            "no device took part in the run: there is no model to return"), round, log)


def require_replies(request: Request, targets: Sequence[int], replies: Mapping[int, Any],
                    log: RunLog) -> None:
    """Stop the run (:class:`TooFewReplies`, naming the round and why each device gave no
    valid reply) when nobody gave one, including a round left with no device to ask
    (unless the round allows it: :attr:`Request.allow_empty`)."""
    if replies or request.allow_empty:
        return
    asked = request.devices if request.devices else None
    reasons = left_out(log, asked)
    if targets:
        what = f"none of the {len(targets)} devices asked gave a valid reply"
    else:
        what = "no device was left to ask (every one dropped, late, failed or rejected)"
    raise TooFewReplies(f"round {request.round}: {what}: {_describe(reasons)}",
                        round=request.round, reasons=reasons)
