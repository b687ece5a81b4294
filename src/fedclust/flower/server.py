"""The ServerApp's protocol loop over a Flower grid (:class:`Server`, :func:`run_server`).

What :func:`fedclust.flower.apps.make_server_app` runs; see :mod:`fedclust.flower.apps`
for the rounds. The graph relay's server side is :mod:`fedclust.flower.relay_server`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import message_nbytes
from ..core.protocol import (Request, RunLog, naming_left_out, require_participants,
                             require_replies, round_targets)
from ..sim.meter import CommunicationMeter
from ..sim.faults import draw_faults, late_request
from ..sim.transport import RunOutput
from ..core.secure_sum import SecureSumServer, check_summable
from ..sim.secure import summed_replies
from .codec import reply_failure as _reason
from .codec import (FINISH_ACTION, HELLO, HELLO_ACTION, OUTPUT, REPLY, SECAGG, SECAGG_STAGE,
                    arrays_to_record, record_to_arrays, request_to_content)
from ..core.registry import protocol_from_config
from ..unlearning.store import record_round
from ..core.threads import one_blas_thread
from .node_state import ASKED, RESUMED, STEP
from .recovery import ServerRecovery

from .spec import ServerSpec

__all__ = ["Server", "run_server"]

_INFO = 20
_WARNING = 30


def _activations(grid: Grid) -> dict[int, str | None]:
    """Online node id -> when Flower last activated it (None where the grid does not say).

    A SuperNode restarted with the same authentication key comes back under its old
    node id (Flower binds the id to the key); its new activation time tells it apart
    from the node that timed out."""
    try:
        nodes = list(grid.get_nodes())
    except NotImplementedError:
        return {int(n): None for n in grid.get_node_ids()}
    return {int(n.node_id): (getattr(n, "last_activated_at", None) or None) for n in nodes}


#: seconds between two looks at the grid's nodes while waiting for SuperNodes
_NODE_POLL_S = 1.0


def _wait_for_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        nodes = sorted(int(x) for x in grid.get_node_ids())
        if len(nodes) >= n or time.monotonic() >= end:
            return nodes
        time.sleep(0.1)


class Server:
    """One run of a protocol over a Flower grid (state of :func:`run_server`)."""

    def __init__(self, grid: Grid, spec: ServerSpec):
        self.grid = grid
        self.spec = spec
        self.protocol = protocol_from_config(spec.protocol, spec.protocol_config)
        self.seed = int(spec.seed)
        self.node_of: dict[int, int] = {}
        self.meter = CommunicationMeter()
        self.log = RunLog()
        self.secure = spec.secure_settings()
        #: devices that let a round time out: not sent the final message (another timeout)
        self.unreachable: set[int] = set()
        #: node -> the activation at which it was last sent a hello (not asked again before
        #: Flower activates it anew: a dead node that is still listed costs one timeout)
        self.asked: dict[int, str | None] = {}
        #: node -> the device it claimed, back but not yet taken into the run
        self.pending: dict[int, int] = {}
        #: nodes refused or silent at a hello (node id -> reason)
        self.node_failed: dict[int, str] = {}
        #: devices that came back on a new (or restarted) node, and the round they rejoined at
        self.rejoined: list[dict[str, Any]] = []
        self._named: set[tuple[int, int]] = set()   # (node, device) refusals already logged
        if self.secure is not None:
            self.protocol = self.protocol.secure_form()
        self.summed = check_summable(self.protocol) if self.secure is not None else frozenset()

    def position(self, device: int) -> dict[str, int]:
        """Request head entries that let a node keep its state (:mod:`fedclust.flower.node_state`):
        ``step``, the rounds done before this one, and in a resumed run ``resumed-rounds``,
        the rounds its checkpoint holds, and ``asked-before``, whether those rounds asked
        ``device`` anything (one that was not has nothing to resume)."""
        head = {STEP: int(self.meter.rounds)}
        rec = getattr(self, "recovery", None)
        if rec is not None and rec.resumed_rounds is not None:
            head[RESUMED] = int(rec.resumed_rounds)
            head[ASKED] = int(device in rec.asked_before)
        return head

    def send(self, request: Request, targets: list[int], *, payloads=None, **head: Any
             ) -> dict[int, Message | None]:
        """One message per target device; returns device -> reply (None: no reply in time)."""
        action = request.action
        msgs = []
        for z in targets:
            payload = payloads.get(z) if payloads is not None else None
            content = request_to_content(self.protocol, request, self.seed, payload,
                                         **{**self.position(z), **head})
            msgs.append(Message(content, dst_node_id=self.node_of[z],
                                message_type=f"query.{action}", group_id=str(request.round)))
        return self._exchange(msgs, targets)

    def hello(self) -> dict[int, str]:
        """Map device ids to node ids; returns node failures (node id -> reason)."""
        nodes = _wait_for_nodes(self.grid, self.spec.min_nodes, self.spec.node_wait_s)
        if len(nodes) < self.spec.min_nodes:
            flwr_log(_WARNING, "fedclust: %d of %d SuperNodes connected after %.0f s; going on",
                     len(nodes), self.spec.min_nodes, self.spec.node_wait_s)
        if not nodes:
            raise ValidationError("no SuperNode is connected: nothing to run on")
        claims, node_failed = self._ask_hello(nodes, _activations(self.grid))
        mapping = {z: claimants[0] for z, claimants in claims.items() if len(claimants) == 1}
        self.node_of = mapping
        for node, why in node_failed.items():
            flwr_log(_WARNING, "fedclust: %s", why)
        if not mapping:
            shown = "; ".join(node_failed[n] for n in sorted(node_failed)[:2])
            raise ValidationError(f"none of the {len(nodes)} SuperNodes can take part: {shown}")
        return node_failed

    def _ask_hello(self, nodes: list[int], activations: dict[int, str | None]
                   ) -> tuple[dict[int, list[int]], dict[int, str]]:
        """Ask ``nodes`` who they are: ``(device id -> claiming nodes, node -> why not)``;
        nodes that claim the same device id are all named (no way to tell the honest one)."""
        hello = Request(-1, HELLO_ACTION)
        msgs = [Message(request_to_content(self.protocol, hello, self.seed), dst_node_id=n,
                        message_type=f"query.{HELLO_ACTION}", group_id="hello") for n in nodes]
        replies = self.grid.send_and_receive(msgs, timeout=self.spec.round_timeout_s)
        by_node = {int(r.metadata.src_node_id): r for r in replies}
        node_failed: dict[int, str] = {}
        claims: dict[int, list[int]] = {}
        for node in nodes:
            r = by_node.get(node)
            self.asked[node] = activations.get(node)
            if r is None:
                node_failed[node] = f"node {node}: no reply to hello (timed out)"
                continue
            why = _reason(r)
            if why is None and HELLO not in r.content.config_records:
                why = "hello reply has no device id"
            if why is not None:
                node_failed[node] = f"node {node}: {why}"
                continue
            z = int(r.content.config_records[HELLO]["device-id"])
            claims.setdefault(z, []).append(node)
        for z, claimants in claims.items():
            if len(claimants) > 1:   # cannot tell which one is honest: leave them all out
                for node in claimants:
                    node_failed[node] = (f"node {node}: nodes {claimants} all claim device id "
                                         f"{z}; give each SuperNode its own data file / "
                                         "device-id")
        return {z: c for z, c in claims.items() if len(c) == 1}, node_failed

    def _discover(self, at: str, log: RunLog) -> None:
        """Ask nodes that are new, or whose old node id Flower activated anew, who they
        are; a device they may take back waits in ``self.pending``. A node claiming a
        device that a live node serves, or that was rejected, is refused and named."""
        activations = _activations(self.grid)
        live = {n for z, n in self.node_of.items() if z not in self.unreachable}
        new = [n for n, when in sorted(activations.items())
               if n not in live and n not in self.pending
               and not (n in self.asked and self.asked[n] == when)]
        if not new:
            return
        claims, failed = self._ask_hello(new, activations)
        for z, (node,) in sorted(claims.items()):
            serving = self.node_of.get(z)
            if z in log.rejected:
                failed[node] = (f"node {node}: device {z} was rejected in this run "
                                f"({log.rejected[z]}); it does not rejoin")
            elif serving is not None and serving != node and z not in self.unreachable:
                failed[node] = (f"node {node}: claims device id {z}, which node {serving} "
                                "serves in this run; refused")
            elif any(p == z for p in self.pending.values()):
                failed[node] = (f"node {node}: claims device id {z}, which another node "
                                "that came back claims too; refused")
            else:
                self.pending[node] = z
        for node, why in failed.items():
            flwr_log(_WARNING, "fedclust: %s: %s", at, why)
        self.node_failed.update(failed)

    def _await_not_connected(self, missing: set[int], log: RunLog) -> list[int]:
        """A resumed run: the checkpoint's devices that did not answer its hello get up to
        ``node_wait_s`` to connect before the first round (a SuperNode that restarted with
        the SuperLink, or that Flower let in only once its old activation lapsed). One that
        connects takes part as if it had answered the hello; returns the nodes taken.
        Only nodes that are new or activated anew are asked (:meth:`_discover`): a dead
        node that is still listed costs no further timeout."""
        missing = set(missing)
        taken: list[int] = []
        end = time.monotonic() + self.spec.node_wait_s
        while missing and time.monotonic() < end:
            time.sleep(min(_NODE_POLL_S, max(end - time.monotonic(), 0.0)))
            self._discover("the resume", log)
            for node, z in sorted(self.pending.items()):
                if z in missing:
                    self._serve_on(node, z, log)
                    missing.discard(z)
                    taken.append(node)
                    flwr_log(_INFO, "fedclust: device %d connected on node %d after the "
                             "resumed run's hello; it takes part from the first round", z, node)
        return taken

    def _serve_on(self, node: int, z: int, log: RunLog) -> tuple[str | None, int | None]:
        """Device ``z``, waiting in ``self.pending``, is served by ``node`` from now on;
        returns ``(why it had failed or None, the node that served it before or None)``."""
        del self.pending[node]
        missed = log.failed.pop(z, None)
        self.unreachable.discard(z)
        previous = self.node_of.get(z)
        self.node_of[z] = node
        return missed, previous

    def _take_back(self, node: int, z: int, at: int, log: RunLog, *, late: bool = False
                   ) -> None:
        missed, previous = self._serve_on(node, z, log)
        self.rejoined.append({"device": z, "node": node, "previous_node": previous,
                              "round": at, "late": late,
                              "missed": missed or "not connected at the start"})
        flwr_log(_INFO, "fedclust: device %d rejoined at round %d%s on node %d", z, at,
                 " (assigned as a late device)" if late else "", node)

    def rejoin(self, request: Request, active: list[int], log: RunLog) -> list[int]:
        """Before a round: take back devices whose SuperNode came back (a new node id, or
        its old one activated anew) or connected late; returns the active devices.

        A device rejoins only at a round whose action the protocol lists in
        ``rejoin_actions`` (its client step needs nothing the device kept from earlier
        rounds: a restarted SuperNode lost its state); until then it waits, named once.
        """
        self._discover(f"round {request.round}", log)
        action_ok = request.action in getattr(self.protocol, "rejoin_actions", frozenset())
        for node, z in sorted(self.pending.items(), key=lambda item: item[1]):
            if action_ok:
                self._take_back(node, z, request.round, log)
                if z not in active:
                    active = sorted([*active, z])
            elif (node, z) not in self._named:
                self._named.add((node, z))
                why = (f"device {z} is back on node {node} but cannot rejoin: protocol "
                       f"{self.protocol.name!r} round {request.round} ({request.action}) "
                       "needs what the device kept from earlier rounds, lost with its node")
                flwr_log(_WARNING, "fedclust: %s", why)
                if z in log.failed:
                    log.failed[z] = f"{log.failed[z]}; {why}"
                else:
                    self.node_failed[node] = f"node {node}: {why}"
        return active

    def rejoin_late(self, log: RunLog) -> list[int]:
        """After the last round, for a protocol that assigns late devices: devices whose
        SuperNode came back are assigned as late devices (the late request needs nothing
        from earlier rounds); returns them."""
        self._discover("late assignment", log)
        back = []
        for node, z in sorted(self.pending.items(), key=lambda item: item[1]):
            self._take_back(node, z, self.meter.rounds, log, late=True)
            back.append(z)
        return back

    def secure_round(self, state: Any, request: Request, targets: list[int]) -> dict[int, Any]:
        """A summed round as a secure sum: four exchanges, the server keeps only the sum."""
        srv = SecureSumServer(targets, self.recovery.secure_round_id(request.round),
                              self.secure, self.seed)
        for stage in srv.stages:
            inbound = srv.requests(stage)
            msgs = []
            for z, arrays in inbound.items():
                payload = request.payload_for(z) if stage == "mask" else None
                sent = Request(request.round, request.action, payload)
                content = request_to_content(self.protocol, sent, self.seed,
                                             **{SECAGG_STAGE: stage, **self.position(z)})
                content[SECAGG] = arrays_to_record(arrays)
                self.meter.record_down(z, message_nbytes(payload) +
                                       sum(np.asarray(a).nbytes for a in arrays.values()))
                msgs.append(Message(content, dst_node_id=self.node_of[z],
                                    message_type=f"query.{request.action}",
                                    group_id=f"{request.round}.{stage}"))
            got = self._exchange(msgs, list(inbound))
            replies, reasons = {}, {}
            for z, r in got.items():
                if r is None:
                    self.unreachable.add(z)
                why = (f"no answer within {self.spec.round_timeout_s} s (timed out)" if r is None
                       else _reason(r))
                if why is None and SECAGG not in r.content.array_records:
                    why = f"reply has no {SECAGG} array record"
                if why is not None:
                    reasons[z] = f"device {z}: {why}"
                    continue
                try:
                    arrays = record_to_arrays(r.content.array_records[SECAGG],
                                              sender=f"device {z}")
                except IncompatibleMessageError as exc:
                    reasons[z] = str(exc)
                    continue
                self.meter.record_up(z, sum(a.nbytes for a in arrays.values()))
                replies[z] = arrays
            flwr_log(_INFO, "fedclust: round %d (%s) secure stage '%s': %d of %d devices "
                     "answered", request.round, request.action, stage, len(replies), len(inbound))
            srv.take(stage, replies, reasons)
        return summed_replies(self.protocol, state, request, srv, self.meter, self.log)

    def _exchange(self, msgs: list[Message], targets: list[int]) -> dict[int, Message | None]:
        replies = self.grid.send_and_receive(msgs, timeout=self.spec.round_timeout_s)
        device_of = {n: z for z, n in self.node_of.items()}
        got: dict[int, Message | None] = {z: None for z in targets}
        for r in replies:
            z = device_of.get(int(r.metadata.src_node_id))
            if z in got:
                got[z] = r
        return got

    def round(self, state: Any, request: Request, targets: list[int]) -> dict[int, Any]:
        reply_type = self.protocol.reply_types[request.action]
        for z in targets:
            self.meter.record_down(z, message_nbytes(request.payload_for(z)))
        got = self.send(request, targets, payloads=request.payloads)
        replies = {}
        for z in targets:
            decoded = self._decode(z, got[z], reply_type)
            if decoded is None:
                continue
            try:
                self.protocol.check_reply(state, request, z, decoded)
            except IncompatibleMessageError as exc:
                self.log.rejected[z] = str(exc)
                continue
            replies[z] = decoded
        return replies

    def _decode(self, z: int, reply: Message | None, reply_type):
        if reply is None:
            self.unreachable.add(z)
            self.log.failed[z] = (f"device {z}: no reply within {self.spec.round_timeout_s} s "
                                  "(timed out)")
            return None
        why = _reason(reply)
        if why is not None:
            self.log.failed[z] = f"device {z}: {why}"
            return None
        sender = f"device {z}"
        try:
            if REPLY not in reply.content.array_records:
                raise IncompatibleMessageError(f"{sender}: reply has no {REPLY} array record")
            arrays = record_to_arrays(reply.content.array_records[REPLY], sender=sender)
            self.meter.record_up(z, sum(a.nbytes for a in arrays.values()))
            return reply_type.from_arrays(arrays, sender=sender)
        except IncompatibleMessageError as exc:
            self.log.rejected[z] = str(exc)
            return None

    def run(self) -> tuple[RunOutput, dict[str, Any]]:
        if self.spec.graph_edges:
            from .relay_server import run_relay

            return run_relay(self)
        t0 = time.perf_counter()
        protocol, log, spec = self.protocol, self.log, self.spec
        node_failed = self.hello()
        ids = sorted(self.node_of)
        absent, late = draw_faults(ids, self.seed, dropout=spec.dropout, late=spec.late,
                                   dropped=spec.dropped, late_devices=spec.late_devices)
        log.dropped = sorted(absent)
        log.late = sorted(late)
        active = [z for z in ids if z not in absent and z not in late]
        rec = self.recovery = ServerRecovery(protocol, self.seed, spec.result_dir, spec.resume,
                                             self.secure is not None)
        state, log, self.meter, active = rec.begin(ids, active, log, self.meter)
        self.log = log
        for node in self._await_not_connected(rec.not_connected, log):
            node_failed.pop(node, None)   # it timed out at the hello, then answered
        ids = sorted(self.node_of)   # with the devices that connected while it waited
        t_hello = time.perf_counter() - t0
        self.rejoined = [*rec.rejoined, *self.rejoined]   # rejoins before a crash, too
        if state is None:
            state = protocol.start(active, self.seed)
        summaries = rec.summaries(active)   # what the server keeps to forget a device
        last_round = None
        while (request := protocol.next_request(state)) is not None:
            last_round = request.round
            active = self.rejoin(request, active, log)
            targets = round_targets(request, active, log)
            rec.before_round(request, self.meter.rounds)   # written ahead of any release
            if request.action in self.summed:
                with naming_left_out(request.round, log):
                    replies = self.secure_round(state, request, targets)
            else:
                replies = self.round(state, request, targets)
            self.meter.rounds += 1
            replied = (sum(z not in log.failed and z not in log.rejected for z in targets)
                       if request.action in self.summed else len(replies))
            flwr_log(_INFO, "fedclust: round %d (%s): %d of %d devices replied%s", request.round,
                     request.action, replied, len(targets),
                     " (server holds their sum only)" if request.action in self.summed else "")
            require_replies(request, targets, replies, log)
            record_round(summaries, request, replies)
            # the same rounding on every transport and machine
            with one_blas_thread(), naming_left_out(request.round, log):
                protocol.server_step(state, request, replies)
            rec.after_round(state, log, self.meter, active, self.rejoined, summaries)
        rec.finish(log)
        log.participants = [z for z in active if z not in log.failed and z not in log.rejected]
        require_participants(log, last_round)
        with one_blas_thread(), naming_left_out(last_round, log):
            result = protocol.finish(state, log)
        if hasattr(protocol, "assign_late"):
            back = self.rejoin_late(log)
            log.late = sorted({*log.late, *back})
            late = {*late, *back}
        if late and hasattr(protocol, "assign_late"):
            self._assign_late(result, sorted(late))
        t_rounds = time.perf_counter() - t0 - t_hello
        outputs = self._finish(result, ids)
        extra = dict(protocol.run_extra(state)) if hasattr(protocol, "run_extra") else {}
        if extra.get("sites"):  # a site run: a failed device is named by its site
            log.name_sites(dict(zip(extra["device_ids"], extra["sites"]))
                           if "device_ids" in extra else extra["sites"])
        extra.update({"nodes": {str(z): n for z, n in self.node_of.items()},
                 "nodes_failed": {str(n): t for n, t in {**node_failed,
                                                         **self.node_failed}.items()},
                 "rejoined": self.rejoined,
                 "time_s": {"hello": t_hello, "rounds": t_rounds,
                            "total": time.perf_counter() - t0}})
        out = RunOutput(result, outputs, self.meter, log, self.seed)
        out.summaries = summaries   # type: ignore[attr-defined]
        return out, extra

    def _assign_late(self, result, late: list[int]) -> None:
        request = late_request(self.protocol, result)
        reply_type = self.protocol.reply_types[request.action]
        for z in late:
            self.meter.record_down(z, message_nbytes(request.payload))
        got = self.send(request, late)
        for z in late:
            decoded = self._decode(z, got[z], reply_type)
            if decoded is None:
                continue
            try:
                self.protocol.assign_late(result, z, decoded)
            except IncompatibleMessageError as exc:
                self.log.rejected[z] = str(exc)

    def _finish(self, result, ids: list[int]) -> dict[int, dict[str, np.ndarray]]:
        finals = {}
        for z in ids:
            final = None if z in self.unreachable else self.protocol.final_message(result, z)
            if final is not None:
                finals[z] = final
                self.meter.record_down(z, final.nbytes)
        if not finals:
            return {}
        request = Request(round=self.meter.rounds, action=FINISH_ACTION)
        got = self.send(request, list(finals), payloads=finals, collect=self.spec.collect_outputs)
        outputs: dict[int, dict[str, np.ndarray]] = {}
        for z, r in got.items():
            why = "no reply (timed out)" if r is None else _reason(r)
            if why is not None:
                # keep the first cause (a node dropped mid-run times out here again)
                self.log.failed.setdefault(z, f"device {z} (final message): {why}")
                continue
            if self.spec.collect_outputs:
                try:
                    outputs[z] = record_to_arrays(r.content.array_records[OUTPUT],
                                                  sender=f"device {z}")
                except (KeyError, IncompatibleMessageError) as exc:
                    self.log.rejected[z] = f"device {z}: bad output ({exc})"
        return outputs


def run_server(grid: Grid, spec: ServerSpec) -> tuple[RunOutput, dict[str, Any]]:
    """Run ``spec``'s protocol over the nodes of ``grid``; returns ``(RunOutput, extra)``."""
    return Server(grid, spec).run()
