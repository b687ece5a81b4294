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
``context.state`` (an ArrayRecord; with node config ``state-dir`` also on the
node's disk, so that a resumed run finds it: :mod:`fedclust.flower.node_state`)
and calls the protocol's ``client_step``
with the run's seed — so a device draws from the same random stream as
in-process. Byte counts are payload ``nbytes`` as in-process (protobuf framing
and the hello/finish bookkeeping are not counted).

The server loop is :mod:`fedclust.flower.server`, what it runs :mod:`fedclust.flower.spec`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log as flwr_log
from flwr.serverapp import Grid, ServerApp

from ..core.exceptions import FedClustError, ValidationError
from ..core.protocol import Protocol
from ..sim.transport import RunOutput, Tamper
from ..core.policy import DevicePolicy, PolicyRefusal
from ..core.secure_sum_device import secure_sum_client
from ..core.secure_sum import DeviceIdentity
from .codec import (ERROR, FINISH_ACTION, FORGET_ACTION, HELLO, HELLO_ACTION, OUTPUT, REPLY,
                    SECAGG, SECAGG_STAGE, arrays_to_record, content_to_request, record_to_arrays)
from ..core.registry import all_actions, protocol_from_config
from ..core.threads import one_blas_thread
from .dataio import load_device_file, save_device_file
from .node_state import ASKED, RESUMED, STEP, NodeStateStore, data_digest, request_digest
from .relay import GRAPH_ACTION
from .relay_client import relay_client
from .results import save_error, save_run_output

from .server import run_server
from .spec import ServerAppFailed, ServerSpec, confine_result_dir, one_line_cause

__all__ = ["ServerSpec", "ServerAppFailed", "one_line_cause", "make_server_app", "make_client_app",
           "run_server", "node_policy", "confine_result_dir",
           "save_device_file", "load_device_file", "load_node_data"]

_STATE = "fedclust.state"
_POLICY_STATE = "fedclust.policy"  # the fits this run's node already charged to its ledger
_MARK = "fedclust.node-state"  # the state-dir file this Flower run's context was set from
_INFO = 20
_WARNING = 30
_ERROR = 40


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


# --------------------------------------------------------------------------- client
_DATA_CACHE: dict[tuple[str, float], tuple[np.ndarray, int | None]] = {}


def load_node_data(context: Context, data_dir: str | Path | None = None, *,
                   require_id: bool = True) -> tuple[int | None, np.ndarray]:
    """Default loader: ``(device_id, X)`` of this SuperNode.

    The file is node config ``data-path`` (deployment: ``flower-supernode
    --node-config "data-path='/data/dev0.npz'"``), else ``DATA_DIR/part-<partition-id>.npz``
    with ``DATA_DIR`` from the argument or the run config's ``data-dir``. The device
    id is node config ``device-id``, else the file's ``device_id``, else ``partition-id``;
    without any, an error, or ``None`` when not ``require_id`` (the protocol may know
    the device by its data: :meth:`~fedclust.core.protocol.Protocol.node_device_id`).
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
            if not require_id:
                return None, X
            raise ValidationError(f"{path}: no device_id in the file and no partition-id/device-id "
                                  "in the node config")
        z = int(nc["partition-id"])
    return z, X


def _data_shape(data: Any) -> tuple[int, int]:
    """(rows, columns) of a node's data (-1 columns: a table, encoded by the protocol)."""
    if hasattr(data, "as_arrays"):  # a site table (see Protocol.node_data)
        return int(data.n_rows), -1
    X = np.asarray(data[0] if isinstance(data, tuple) else data)
    return int(X.shape[0]), int(X.shape[1]) if X.ndim == 2 else -1


def _load_state(context: Context, key: str = _STATE) -> dict[str, np.ndarray]:
    rec = context.state.array_records.get(key)
    return {} if rec is None else record_to_arrays(rec, sender="client state")


def _save_state(context: Context, state: Mapping[str, np.ndarray], key: str = _STATE) -> None:
    context.state[key] = arrays_to_record(state)


def _set_back(context: Context, snapshot: Mapping[str, Any]) -> None:
    """The device state and policy records of a saved round; the secrets of the secure
    round under way (``secagg.*``, never saved) stay."""
    current = _load_state(context)
    _save_state(context, {**snapshot["state"],
                          **{k: v for k, v in current.items() if k.startswith("secagg.")}})
    _save_state(context, snapshot["policy"], _POLICY_STATE)


def _check(pol: DevicePolicy, context: Context, protocol: Protocol, action: str, me: str, *,
           secure: bool, round_index: int | None = None, payload: Any = None) -> None:
    """The node's policy on a data request; what it charged and the rounds it answered
    stay in ``context.state``."""
    seen = _load_state(context, _POLICY_STATE)
    pol.check_request(protocol, action, seen, me, secure=secure, round_index=round_index,
                      device_state=(_load_state(context) if hasattr(protocol, "policy_view")
                                    else None), payload=payload)
    _save_state(context, seen, _POLICY_STATE)


def _node_store(context: Context, protocol: Protocol, seed: int, device_id: int, data: Any,
                head: Mapping[str, Any], me: str) -> NodeStateStore | None:
    """This fit's state file in the node's ``state-dir`` (None without one).

    The first message of a Flower run sets ``context.state`` from the file's last
    snapshot when the run is a resumed one (the request says ``resumed-rounds``) or
    the same Flower run (the node restarted); a fresh run starts a new record."""
    folder = context.node_config.get("state-dir")
    if folder is None or STEP not in head:
        return None
    store = NodeStateStore(str(folder), protocol, seed, device_id,
                           data_digest(data, context.node_config, me), me)
    record = store.load()
    mark = context.state.config_records.get(_MARK)
    if mark is None or mark.get("key") != store.key:
        if record is not None and (RESUMED in head or record["flower_run"] == context.run_id):
            store.record = record
            latest = store.latest()
            if latest is not None:
                _set_back(context, latest)
            record["flower_run"] = int(context.run_id)
        else:
            record = store.new_record(context.run_id)
        context.state[_MARK] = ConfigRecord({"key": store.key})
    elif record is None:
        record = store.new_record(context.run_id)
    store.record = record
    return store


def _replayed(context: Context, store: NodeStateStore | None, request: Any, seed: int,
              protocol: Protocol, head: Mapping[str, Any]
              ) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """``(stored reply or None, request digest)``: a step the node answered already is
    answered with the reply it stored, its state set back to that round's."""
    if store is None:
        return None, None
    digest = request_digest(request, seed, protocol)
    snap = store.replay(int(head[STEP]), digest, request.round, request.action)
    if snap is None:
        return None, digest
    _set_back(context, snap)
    return dict(snap["reply"]), digest


def _require_kept_state(context: Context, store: NodeStateStore | None, protocol: Protocol,
                        request: Any, head: Mapping[str, Any], me: str) -> None:
    """In a resumed run, a round that reads what the device kept from earlier rounds
    (its action is not in ``protocol.rejoin_actions``; the device was asked before the
    crash) is refused by name when the node has no state for this fit: none kept across
    Flower runs, or no state file. A server that says the device was not asked before
    gets an answer from an empty state: a new fit for the node, charged again."""
    if (not head.get(RESUMED) or not head.get(ASKED, 1)
            or request.action in protocol.rejoin_actions):
        return   # nothing kept before: a fresh start, or a device not asked before the crash
    if store is None and _STATE in context.state.array_records:
        return   # it answered a round of this Flower run
    if store is not None and store.record["answered"]:
        return
    where = ("the node keeps no state across Flower runs (set node config state-dir)"
             if store is None else f"it has no state file for this fit ({store.path})")
    raise ValidationError(
        f"{me}: cannot answer {request.action!r} round {request.round} of the resumed run of "
        f"protocol {protocol.name!r}: it needs what the device kept from the rounds before "
        f"the crash, and {where}")


def _answer(context: Context, store: NodeStateStore | None, protocol: Protocol, request: Any,
            head: Mapping[str, Any], me: str, pol: DevicePolicy, X: Any, device_id: int,
            seed: int, state: dict[str, np.ndarray], digest: str | None, *,
            secure: bool) -> dict[str, np.ndarray]:
    """A round the node has not answered yet: the kept state and the policy checked, the
    client step run on ``state`` (updated in place), its reply stored with the state."""
    _require_kept_state(context, store, protocol, request, head, me)
    _check(pol, context, protocol, request.action, me, secure=secure,
           round_index=request.round, payload=request.payload)
    X = protocol.node_data(X, me)
    reply = _client_step(protocol, request, X, device_id, seed, state, head, store, me)
    arrays = reply.to_arrays()
    if store is not None:
        store.answer(int(head[STEP]), digest, state, _load_state(context, _POLICY_STATE), arrays)
    return arrays


def _client_step(protocol: Protocol, request: Any, X: Any, device_id: int, seed: int,
                 state: dict[str, np.ndarray], head: Mapping[str, Any],
                 store: NodeStateStore | None, me: str) -> Any:
    """``client_step``; in a resumed run, state the device lacks is refused by name."""
    try:
        with one_blas_thread():  # one BLAS thread, as a simulated device: same rounding
            return protocol.client_step(request, X, device_id=device_id, seed=seed,
                                        state=state)
    except KeyError as exc:
        if head.get(RESUMED) is None:
            raise
        where = ("the node keeps no state across Flower runs (set node config state-dir)"
                 if store is None else f"{store.path} holds none for this fit")
        raise ValidationError(
            f"{me}: cannot answer {request.action!r} round {request.round} of the resumed run: "
            f"it needs {exc.args[0]!r}, which the device kept from earlier rounds, and "
            f"{where}") from None


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
                device_id, X = load_node_data(context, data_dir, require_id=False)
            device_id = protocol.node_device_id(X, device_id)
            if device_id is None:
                raise ValidationError(f"SuperNode {context.node_id}: no device id: set node "
                                      "config device-id (or partition-id), or save device_id "
                                      "in its data file")
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
                                       save_state=_save_state, identity=ident, policy=pol)
            elif head.get(SECAGG_STAGE):
                stage = str(head[SECAGG_STAGE])
                inbound = record_to_arrays(msg.content.array_records[SECAGG], sender="server")
                state = _load_state(context)
                plain = None
                if stage == "mask":
                    store = _node_store(context, protocol, seed, int(device_id), X, head, me)
                    plain, digest = _replayed(context, store, request, seed, protocol, head)
                    state = _load_state(context)
                    if plain is None:
                        plain = _answer(context, store, protocol, request, head, me, pol, X,
                                        int(device_id), seed, state, digest, secure=True)
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
                _node_store(context, protocol, seed, int(device_id), X, head, me)
                X = protocol.node_data(X, me)
                out = protocol.client_finish(request.payload, X, _load_state(context))
                content = RecordDict({OUTPUT: arrays_to_record(out if collect else {})})
            else:
                store = _node_store(context, protocol, seed, int(device_id), X, head, me)
                arrays, digest = _replayed(context, store, request, seed, protocol, head)
                if arrays is None:
                    state = _load_state(context)
                    arrays = _answer(context, store, protocol, request, head, me, pol, X,
                                     int(device_id), seed, state, digest, secure=False)
                    _save_state(context, state)
                if tamper is not None:
                    arrays = tamper(int(device_id), request.round, arrays)
                content = RecordDict({REPLY: arrays_to_record(arrays)})
        except (FedClustError, OSError) as exc:
            if isinstance(exc, PolicyRefusal):  # one line on the device too
                flwr_log(_WARNING, "fedclust: %s", one_line_cause(exc))
            content = RecordDict({ERROR: ConfigRecord({"type": type(exc).__name__,
                                                       "message": str(exc)})})
        return Message(content, reply_to=msg)

    for action in (HELLO_ACTION, FINISH_ACTION, FORGET_ACTION, GRAPH_ACTION, *all_actions()):
        app.query(action)(handle)
    return app
