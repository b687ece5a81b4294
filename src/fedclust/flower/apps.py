"""The Flower ``ServerApp`` and ``ClientApp`` that run any fedclust protocol.

Nothing here is specific to a family. The ServerApp's main loop *is* the protocol
loop of :class:`~fedclust.sim.InProcessTransport`, with Flower messages instead
of function calls:

1. wait for ``min_nodes`` SuperNodes, ask each who it is (``query.fedclust_hello``:
   its device id — node config ``device-id``, the data file's ``device_id``,
   or its ``partition-id``);
2. draw the simulated faults (``dropout``, ``late``) from the seed exactly as
   in-process, so both transports drop the same devices;
3. ``next_request`` -> one ``query.<action>`` message per device ->
   ``grid.send_and_receive`` -> decode and validate every reply
   (:func:`~fedclust.flower.codec.record_to_message`, then
   ``Protocol.check_reply``) -> ``server_step``; a client that raises or does not
   answer within ``round_timeout_s`` goes to ``log.failed``, a malformed reply to
   ``log.rejected``, both by device id, and the round goes on without it;
4. ``finish``; late devices are asked afterwards and assigned
   (``assign_late``) when the protocol can;
5. every device gets ``final_message`` (``query.fedclust_finish``) and runs
   ``client_finish`` on its own data; its output (e.g. point labels) is sent
   back only when ``collect_outputs`` is true.

The ClientApp rebuilds the protocol from the message (registry name + config),
loads its own device data once per process, keeps per-device ``state`` in
``context.state`` (an ArrayRecord) and calls the protocol's ``client_step``
with the run's seed — so a device draws from the same random stream as
in-process. Byte counts are payload ``nbytes`` as in-process (protobuf framing
and the hello/finish bookkeeping are not counted).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from ..core.exceptions import FedClustError, IncompatibleMessageError, ValidationError
from ..core.messages import message_nbytes
from ..core.protocol import Protocol, Request, RunLog, require_replies, round_targets
from ..sim.meter import CommunicationMeter
from ..sim.transport import RunOutput, Tamper, draw_faults, late_request
from ..core.policy import DevicePolicy, PolicyRefusal
from ..core.secure_sum_device import secure_sum_client
from ..core.secure_sum import (DeviceIdentity, SecureAggregation, SecureSumServer,
                               check_summable)
from ..sim.secure import summed_replies
from .codec import reply_failure as _reason
from .codec import (ERROR, FINISH_ACTION, FORGET_ACTION, HELLO, HELLO_ACTION, OUTPUT, REPLY,
                    SECAGG, SECAGG_STAGE,
                    arrays_to_record, content_to_request, record_to_arrays, request_to_content)
from ..core.registry import all_actions, protocol_from_config
from ..unlearning.store import SummaryStore, record_round
from ..core.threads import one_blas_thread
from .dataio import load_device_file, save_device_file
from .relay import GRAPH_ACTION, relay_client
from .recovery import ServerRecovery
from .results import save_error, save_run_output

__all__ = ["ServerSpec", "ServerAppFailed", "one_line_cause", "make_server_app", "make_client_app",
           "run_server", "node_policy", "confine_result_dir",
           "save_device_file", "load_device_file", "load_node_data"]

_STATE = "fedclust.state"
_POLICY_STATE = "fedclust.policy"  # the fits this run's node already charged to its ledger
_INFO = 20
_WARNING = 30
_ERROR = 40


class ServerAppFailed(FedClustError):
    """The fedclust ServerApp stopped; the text is the one-line cause.

    Raised out of the ServerApp so that Flower marks the run ``finished:failed``
    with this text as its status details (``flwr ls --run-id N``), which
    ``fedclust flower run`` turns into a non-zero exit. ``original`` is the
    exception that stopped the run (re-raised by in-process callers).
    """

    def __init__(self, cause: str, original: BaseException | None = None):
        super().__init__(cause)
        self.original = original


def one_line_cause(exc: BaseException) -> str:
    """``Type: text`` of an exception on one line (fedclust errors: just the text)."""
    text = " ".join(str(exc).split()) or "(no message)"
    return text if isinstance(exc, FedClustError) else f"{type(exc).__name__}: {text}"


# --------------------------------------------------------------------------- server
@dataclass
class ServerSpec:
    """Everything the ServerApp needs; from code or from ``[tool.flwr.app.config]``.

    Parameters
    ----------
    protocol, protocol_config : str, dict
        Registry name and :meth:`Protocol.config` of the protocol to run.
    seed : int
        Root seed of the run (devices derive their streams from it and their id).
    dropout, late, dropped, late_devices
        Simulated faults, drawn from the seed exactly as by ``InProcessTransport``.
    min_nodes : int
        SuperNodes to wait for before starting (at most ``node_wait_s`` seconds;
        then the run goes on with the nodes that are there).
    round_timeout_s : float or None
        How long a round waits for replies; missing ones are failed devices.
    result_dir : str or None
        Where the ServerApp writes ``result.npz`` / ``result.json`` (or ``error.json``).
    collect_outputs : bool
        Send device outputs (point labels) back to the server after the run.
    resume : bool
        Continue the run checkpointed in ``result_dir/checkpoint`` after its last
        complete round (:mod:`fedclust.flower.recovery`); a ServerApp with a
        ``result_dir`` writes that checkpoint after every round.
    secure_aggregation : bool
        Run the protocol's summed rounds as secure sums
        (:mod:`fedclust.core.secure_sum`); ``secagg_frac_bits`` and
        ``secagg_neighbors`` (0: every other device) are its settings.
    """

    protocol: str
    protocol_config: dict[str, Any]
    seed: int = 0
    dropout: float = 0.0
    late: float = 0.0
    dropped: list[int] = field(default_factory=list)
    late_devices: list[int] = field(default_factory=list)
    min_nodes: int = 1
    node_wait_s: float = 120.0
    round_timeout_s: float | None = 600.0
    result_dir: str | None = None
    collect_outputs: bool = False
    secure_aggregation: bool = False
    secagg_frac_bits: int = 20
    secagg_neighbors: int = 0
    secagg_signed: bool = False
    #: edges ``[u, v]`` (device ids) of a communication graph: the server then only
    #: relays messages between neighbours (:mod:`fedclust.flower.relay`); empty: a star
    graph_edges: list[list[int]] = field(default_factory=list)
    resume: bool = False

    def secure_settings(self) -> SecureAggregation | None:
        if not self.secure_aggregation:
            return None
        return SecureAggregation(int(self.secagg_frac_bits), int(self.secagg_neighbors) or None,
                                 bool(self.secagg_signed))

    @classmethod
    def for_protocol(cls, protocol: Protocol, seed: int, **kw: Any) -> "ServerSpec":
        return cls(protocol.name, dict(protocol.config()), int(seed), **kw)

    # Flower run configs hold only bool/int/float/str: lists travel as JSON text.
    def to_run_config(self) -> dict[str, Any]:
        """Flat ``[tool.flwr.app.config]`` entries (protocol parameters under ``params.``)."""
        cfg: dict[str, Any] = {
            "algorithm": self.protocol, "seed": self.seed, "dropout": float(self.dropout),
            "late": float(self.late), "dropped": json.dumps(list(self.dropped)),
            "late-devices": json.dumps(list(self.late_devices)), "min-nodes": self.min_nodes,
            "node-wait-s": float(self.node_wait_s),
            "round-timeout-s": float(self.round_timeout_s or 0.0),
            "result-dir": self.result_dir or "", "collect-outputs": self.collect_outputs,
            "secure-aggregation": bool(self.secure_aggregation),
            "secagg-frac-bits": int(self.secagg_frac_bits),
            "secagg-neighbors": int(self.secagg_neighbors),
            "secagg-signed": bool(self.secagg_signed),
            "graph-edges": json.dumps([[int(u), int(v)] for u, v in self.graph_edges]),
            "resume": bool(self.resume),
        }
        for k, v in self.protocol_config.items():
            cfg[f"params.{k}"] = json.dumps(list(v)) if isinstance(v, (list, tuple)) else v
        return cfg

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "ServerSpec":
        rc = dict(run_config)
        if "algorithm" not in rc:
            raise ValidationError(
                "the run config has no 'algorithm' key: generate the app with "
                "`fedclust flower app DIR --config CONFIG.toml`")
        params = {}
        for k, v in rc.items():
            if k.startswith("params."):
                if isinstance(v, str) and v.startswith("["):
                    v = json.loads(v)
                params[k[len("params."):]] = v
        timeout = float(rc.get("round-timeout-s", 600.0))
        return cls(
            protocol=str(rc["algorithm"]), protocol_config=params, seed=int(rc.get("seed", 0)),
            dropout=float(rc.get("dropout", 0.0)), late=float(rc.get("late", 0.0)),
            dropped=json.loads(rc.get("dropped", "[]")),
            late_devices=json.loads(rc.get("late-devices", "[]")),
            min_nodes=int(rc.get("min-nodes", 1)), node_wait_s=float(rc.get("node-wait-s", 120.0)),
            round_timeout_s=timeout if timeout > 0 else None,
            result_dir=str(rc.get("result-dir", "")) or None,
            collect_outputs=bool(rc.get("collect-outputs", False)),
            secure_aggregation=bool(rc.get("secure-aggregation", False)),
            secagg_frac_bits=int(rc.get("secagg-frac-bits", 20)),
            secagg_neighbors=int(rc.get("secagg-neighbors", 0)),
            secagg_signed=bool(rc.get("secagg-signed", False)),
            graph_edges=json.loads(rc.get("graph-edges", "[]")),
            resume=bool(rc.get("resume", False)))


def confine_result_dir(result_dir: str, root: str | Path) -> str:
    """``result_dir`` (relative: under ``root``) as an absolute path inside ``root``;
    a run config pointing anywhere else on the server host is refused."""
    base = Path(root).resolve()
    path = Path(result_dir)
    path = (path if path.is_absolute() else base / path).resolve()
    if path != base and base not in path.parents:
        raise ValidationError(f"run config result-dir={result_dir!r} is outside the app's output "
                              f"folder {base}; give a folder inside it")
    return str(path)


def make_server_app(spec: ServerSpec | None = None, *,
                    on_result: Callable[[RunOutput, dict], None] | None = None,
                    result_root: str | Path | None = None) -> ServerApp:
    """A ``ServerApp`` running the protocol of ``spec`` (default: read from ``context.run_config``).

    A spec read from the run config writes its results only inside the app's
    output folder: ``result_root`` (the generated app fixes it), else the
    server host's ``FEDCLUST_RESULT_ROOT``, else the ServerApp's working folder.
    """
    import os

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        s = None
        if spec is None and "forget-model" in context.run_config:
            # the sites' forget requests against a saved model (fedclust.flower.forget)
            from .forget import forget_from_run_config

            try:
                forget_from_run_config(grid, context.run_config, result_root or os.environ.get(
                    "FEDCLUST_RESULT_ROOT") or os.getcwd())
            except Exception as exc:
                flwr_log(_ERROR, "fedclust: error: %s", one_line_cause(exc))
                raise ServerAppFailed(one_line_cause(exc), exc) from None
            return
        try:
            if spec is not None:
                s = spec
            else:
                read = ServerSpec.from_run_config(context.run_config)
                if read.result_dir:  # confined before anything (even error.json) is written
                    root = (result_root or os.environ.get("FEDCLUST_RESULT_ROOT")
                            or os.getcwd())
                    read.result_dir = confine_result_dir(read.result_dir, root)
                s = read
            out, extra = run_server(grid, s)
        except Exception as exc:
            cause = one_line_cause(exc)
            # the cause first, as one line; Flower's own report (status
            # finished:failed, its traceback) comes after it
            flwr_log(_ERROR, "fedclust: error: %s", cause)
            if s is not None and s.result_dir:
                save_error(exc, s.result_dir)
            raise ServerAppFailed(cause, exc) from None
        if s.result_dir:
            path = save_run_output(out, s.protocol, s.result_dir, extra)
            flwr_log(_INFO, "fedclust: wrote %s", path)
            # a protocol that can write more (a model file for `fedclust predict`) does
            written = getattr(protocol_from_config(s.protocol, s.protocol_config),
                              "write_outputs", None)
            if written is not None:
                try:
                    model = written(out, extra, s.result_dir)
                except Exception as exc:  # the run itself succeeded: say why, keep its result
                    flwr_log(_WARNING, "fedclust: no model file: %s", one_line_cause(exc))
                else:
                    if model is not None:
                        flwr_log(_INFO, "fedclust: wrote %s", model)
        if on_result is not None:
            on_result(out, extra)

    return app


def _wait_for_nodes(grid: Grid, n: int, timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        nodes = sorted(int(x) for x in grid.get_node_ids())
        if len(nodes) >= n or time.monotonic() >= end:
            return nodes
        time.sleep(0.1)


class _Server:
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
        if self.secure is not None:
            self.protocol = self.protocol.secure_form()
        self.summed = check_summable(self.protocol) if self.secure is not None else frozenset()

    def send(self, request: Request, targets: list[int], *, payloads=None, **head: Any
             ) -> dict[int, Message | None]:
        """One message per target device; returns device -> reply (None: no reply in time)."""
        action = request.action
        msgs = []
        for z in targets:
            payload = payloads.get(z) if payloads is not None else None
            content = request_to_content(self.protocol, request, self.seed, payload, **head)
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
        self.node_of = {-(i + 1): n for i, n in enumerate(nodes)}  # provisional keys
        got = self.send(Request(-1, HELLO_ACTION), list(self.node_of))
        node_failed: dict[int, str] = {}
        mapping: dict[int, int] = {}
        claims: dict[int, list[int]] = {}
        for key, r in got.items():
            node = self.node_of[key]
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
            if len(claimants) == 1:
                mapping[z] = claimants[0]
                continue
            for node in claimants:  # cannot tell which one is honest: leave them all out
                node_failed[node] = (f"node {node}: nodes {claimants} all claim device id {z}; "
                                     "give each SuperNode its own data file / device-id")
        self.node_of = mapping
        for node, why in node_failed.items():
            flwr_log(_WARNING, "fedclust: %s", why)
        if not mapping:
            shown = "; ".join(node_failed[n] for n in sorted(node_failed)[:2])
            raise ValidationError(f"none of the {len(nodes)} SuperNodes can take part: {shown}")
        return node_failed

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
                                             **{SECAGG_STAGE: stage})
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
            from .relay import run_relay

            return run_relay(self)
        t0 = time.perf_counter()
        protocol, log, spec = self.protocol, self.log, self.spec
        node_failed = self.hello()
        t_hello = time.perf_counter() - t0
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
        if state is None:
            state = protocol.start(active, self.seed)
        summaries = SummaryStore(list(active))   # what the server keeps to forget a device
        while (request := protocol.next_request(state)) is not None:
            targets = round_targets(request, active, log)
            rec.before_round(request, self.meter.rounds)   # written ahead of any release
            if request.action in self.summed:
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
            with one_blas_thread():  # the same rounding on every transport and machine
                protocol.server_step(state, request, replies)
            rec.after_round(state, log, self.meter, active)
        rec.finish(log)
        log.participants = [z for z in active if z not in log.failed and z not in log.rejected]
        with one_blas_thread():
            result = protocol.finish(state, log)
        if late and hasattr(protocol, "assign_late"):
            self._assign_late(result, sorted(late))
        t_rounds = time.perf_counter() - t0 - t_hello
        outputs = self._finish(result, ids)
        extra = dict(protocol.run_extra(state)) if hasattr(protocol, "run_extra") else {}
        extra.update({"nodes": {str(z): n for z, n in self.node_of.items()},
                 "nodes_failed": {str(n): t for n, t in node_failed.items()},
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
    return _Server(grid, spec).run()


# --------------------------------------------------------------------------- client
_DATA_CACHE: dict[tuple[str, float], tuple[np.ndarray, int | None]] = {}


def load_node_data(context: Context, data_dir: str | Path | None = None) -> tuple[int, np.ndarray]:
    """Default loader: ``(device_id, X)`` of this SuperNode.

    The file is node config ``data-path`` (deployment: ``flower-supernode
    --node-config "data-path='/data/dev0.npz'"``), else ``DATA_DIR/part-<partition-id>.npz``
    with ``DATA_DIR`` from the argument or the run config's ``data-dir``. The device
    id is node config ``device-id``, else the file's ``device_id``, else ``partition-id``.
    """
    nc = context.node_config
    if "data-path" in nc:
        path = Path(str(nc["data-path"]))
    else:
        data_dir = data_dir or context.run_config.get("data-dir") or None
        if data_dir is None or "partition-id" not in nc:
            raise ValidationError(
                f"SuperNode {context.node_id} has no data: pass --node-config "
                "\"data-path='/path/to/device.npz'\" (or partition-id with a data-dir)")
        path = Path(str(data_dir)) / f"part-{int(nc['partition-id'])}.npz"
    key = (str(path.resolve()), path.stat().st_mtime)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = load_device_file(path)
    X, z = _DATA_CACHE[key]
    if "device-id" in nc:
        z = int(nc["device-id"])
    elif z is None:
        if "partition-id" not in nc:
            raise ValidationError(f"{path}: no device_id in the file and no partition-id/device-id "
                                  "in the node config")
        z = int(nc["partition-id"])
    return z, X


def _data_shape(data: Any) -> tuple[int, int]:
    """(rows, columns) of a node's data (-1 columns: a table, encoded by the protocol)."""
    from ..sites import RawTable

    if isinstance(data, RawTable):
        return data.n_rows, -1
    X = np.asarray(data[0] if isinstance(data, tuple) else data)
    return int(X.shape[0]), int(X.shape[1]) if X.ndim == 2 else -1


def _load_state(context: Context, key: str = _STATE) -> dict[str, np.ndarray]:
    rec = context.state.array_records.get(key)
    return {} if rec is None else record_to_arrays(rec, sender="client state")


def _save_state(context: Context, state: Mapping[str, np.ndarray], key: str = _STATE) -> None:
    context.state[key] = arrays_to_record(state)


def _check(pol: DevicePolicy, context: Context, protocol: Protocol, action: str, me: str, *,
           secure: bool, round_index: int | None = None) -> None:
    """The node's policy on a data request; what it charged and the rounds it answered
    stay in ``context.state``."""
    seen = _load_state(context, _POLICY_STATE)
    pol.check_request(protocol, action, seen, me, secure=secure, round_index=round_index)
    _save_state(context, seen, _POLICY_STATE)


def node_identity(context: Context, data_dir: str | Path | None = None
                  ) -> DeviceIdentity | None:
    """This SuperNode's secure-aggregation identity, or None when it has none.

    Node config ``secagg-identity-key`` (its Ed25519 PEM) and ``secagg-directory``
    (every device's public key, :func:`fedclust.flower.pki.write_secagg_identities`);
    else ``DATA_DIR/secagg-<partition-id>.pem`` and ``DATA_DIR/secagg-identities.json``
    when both exist (simulation). A node with an identity insists on the
    malicious-server checks.
    """
    from .pki import SECAGG_DIRECTORY, load_secagg_identity

    nc = context.node_config
    key, directory = nc.get("secagg-identity-key"), nc.get("secagg-directory")
    if key is None and directory is None:
        data_dir = data_dir or context.run_config.get("data-dir") or None
        if data_dir is None or "partition-id" not in nc:
            return None
        key = Path(str(data_dir)) / f"secagg-{int(nc['partition-id'])}.pem"
        directory = Path(str(data_dir)) / SECAGG_DIRECTORY
        if not (key.exists() and directory.exists()):
            return None
    if key is None or directory is None:
        raise ValidationError(f"SuperNode {context.node_id}: node config needs both "
                              "secagg-identity-key and secagg-directory")
    return load_secagg_identity(str(key), str(directory))


def node_policy(context: Context) -> DevicePolicy:
    """This SuperNode's :class:`~fedclust.core.policy.DevicePolicy`: its node config's
    ``policy-*`` entries (``flower-supernode --node-config "policy-epsilon=2.0 ..."``),
    defaults for the others (no per-point outputs, no server-chosen noise seed).

    A budget (``policy-epsilon``) needs ``policy-ledger``, a file on the node: a
    deployed SuperNode starts a ClientApp process per message, so a ledger in
    memory would not outlive one message.
    """
    policy = DevicePolicy.from_node_config(context.node_config)
    if policy.epsilon is not None and policy.ledger is None:
        raise ValidationError(f"SuperNode {context.node_id}: node config policy-epsilon needs "
                              "policy-ledger (a JSON file on the node that keeps the ledger "
                              "across messages and runs)")
    return policy


def make_client_app(load_data: Callable[[Context], tuple[int, np.ndarray]] | None = None, *,
                    data_dir: str | Path | None = None, tamper: Tamper | None = None,
                    identity: Callable[[Context], DeviceIdentity | None] | None = None,
                    policy: Callable[[Context], DevicePolicy] | None = None) -> ClientApp:
    """A ``ClientApp`` serving every registered protocol.

    ``load_data(context) -> (device_id, X)`` defaults to :func:`load_node_data`;
    ``identity(context)`` (secure aggregation's malicious-server variant) to
    :func:`node_identity`; ``policy(context)`` (what the node agrees to,
    whatever the server asks) to :func:`node_policy`. A node with an identity
    key insists on signed secure aggregation for every summable round.
    ``tamper(device_id, round, arrays) -> arrays`` rewrites this client's replies
    (tests of Byzantine / faulty clients, as with ``InProcessTransport``).
    """
    app = ClientApp()
    policies: dict[tuple, DevicePolicy] = {}  # one per node: its in-memory ledger lives on

    def policy_of(context: Context, ident: DeviceIdentity | None) -> DevicePolicy:
        key = (context.node_id, tuple(sorted((str(k), str(v)) for k, v in
                                             context.node_config.items())))
        if key not in policies:
            policies[key] = policy(context) if policy is not None else node_policy(context)
        pol = policies[key]
        return pol.at_least_signed() if ident is not None else pol

    def handle(msg: Message, context: Context) -> Message:
        device_id = None
        try:
            protocol, request, seed, head = content_to_request(msg.content)
            if load_data is not None:
                device_id, X = load_data(context)
            else:
                device_id, X = load_node_data(context, data_dir)
            me = f"device {device_id}"
            if request.action == HELLO_ACTION:
                n, d = _data_shape(X)
                content = RecordDict({HELLO: ConfigRecord({
                    "device-id": int(device_id), "n-points": n, "n-features": d})})
                return Message(content, reply_to=msg)
            ident = (identity(context) if identity is not None
                     else node_identity(context, data_dir))
            pol = policy_of(context, ident)
            if pol.secure_aggregation == "signed" and ident is None:
                raise PolicyRefusal(f"{me}: its policy requires signed secure aggregation but "
                                    "the node has no identity key (node config "
                                    "secagg-identity-key, secagg-directory)")
            if request.action == GRAPH_ACTION:
                # the server only relays sealed packets between neighbours; it sums nothing
                _check(pol, context, protocol, request.action, me, secure=True)
                X = protocol.node_data(X, me)
                content = relay_client(msg, context, protocol, seed, head, int(device_id), X,
                                       tamper=tamper, load_state=_load_state,
                                       save_state=_save_state)
            elif head.get(SECAGG_STAGE):
                stage = str(head[SECAGG_STAGE])
                inbound = record_to_arrays(msg.content.array_records[SECAGG], sender="server")
                state = _load_state(context)
                plain = None
                if stage == "mask":
                    _check(pol, context, protocol, request.action, me, secure=True,
                           round_index=request.round)
                    X = protocol.node_data(X, me)
                    with one_blas_thread():
                        reply = protocol.client_step(request, X, device_id=int(device_id),
                                                     seed=seed, state=state)
                    plain = reply.to_arrays()
                    if tamper is not None:
                        plain = tamper(int(device_id), request.round, plain)
                out = secure_sum_client(stage, inbound, state, device_id=int(device_id),
                                        reply=plain, identity=ident, policy=pol,
                                        action=request.action)
                content = RecordDict({SECAGG: arrays_to_record(out)})
                _save_state(context, state)
            elif request.action == FORGET_ACTION:
                from .forget import forget_reply

                content = forget_reply(protocol, request, seed, head, int(device_id), X,
                                       context, pol)
            elif request.action == FINISH_ACTION:
                collect = bool(head.get("collect"))
                pol.check_finish(protocol, collect, me)
                X = protocol.node_data(X, me)
                out = protocol.client_finish(request.payload, X, _load_state(context))
                content = RecordDict({OUTPUT: arrays_to_record(out if collect else {})})
            else:
                _check(pol, context, protocol, request.action, me, secure=False,
                       round_index=request.round)
                state = _load_state(context)
                X = protocol.node_data(X, me)
                # one BLAS thread, as a simulated device in process: same rounding on both
                with one_blas_thread():
                    reply = protocol.client_step(request, X, device_id=int(device_id), seed=seed,
                                                 state=state)
                arrays = reply.to_arrays()
                if tamper is not None:
                    arrays = tamper(int(device_id), request.round, arrays)
                content = RecordDict({REPLY: arrays_to_record(arrays)})
                _save_state(context, state)
        except (FedClustError, OSError) as exc:
            if isinstance(exc, PolicyRefusal):  # one line on the device too
                flwr_log(_WARNING, "fedclust: %s", one_line_cause(exc))
            content = RecordDict({ERROR: ConfigRecord({"type": type(exc).__name__,
                                                       "message": str(exc)})})
        return Message(content, reply_to=msg)

    for action in (HELLO_ACTION, FINISH_ACTION, FORGET_ACTION, GRAPH_ACTION, *all_actions()):
        app.query(action)(handle)
    return app
