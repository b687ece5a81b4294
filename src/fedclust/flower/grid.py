"""Run the real ServerApp / ClientApp in this process (FLOWER.md testing tier 2).

:class:`LocalGrid` is a ``flwr.serverapp.Grid`` that delivers each message to a
``ClientApp`` synchronously, **round-tripping every message (and every node's
``Context``) through Flower's protobuf serialisation**, as a SuperLink and
SuperNode would. It catches codec bugs in well under a second, without Ray or
sockets. Nodes listed as ``unresponsive`` never answer; ``silent_after_hello``
ones register, then time out on every protocol round. :meth:`LocalGrid.stop`,
:meth:`LocalGrid.restart` and :meth:`LocalGrid.add_node` play a SuperNode that
dies, comes back (its state lost, under a new node id or its old one) or
connects late; ``on_push(grid, messages)`` runs before each delivery, so a
test can do that at a chosen round.

:class:`FlowerInMemoryTransport` has the ``run(protocol, devices,
random_state) -> RunOutput`` interface of
:class:`~fedclust.sim.InProcessTransport` on top of it, so any test written for
the in-process transport can run through the Flower apps too.

This uses flwr internals (``flwr.common.serde``, ``TaskIdentity``), hence the
pin ``flwr<1.43``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence
from uuid import uuid4

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import (context_from_proto, context_to_proto, message_from_proto,
                               message_to_proto)
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=E0611
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from ..core.random import root_seed
from ..core.validation import check_float
from ..core.policy import DevicePolicy
from ..core.protocol import Protocol
from ..sim.transport import RunOutput, Tamper
from .apps import make_client_app, make_server_app
from .spec import ServerAppFailed, ServerSpec
from .codec import HELLO_ACTION

HELLO_TYPE = f"query.{HELLO_ACTION}"

__all__ = ["LocalGrid", "FlowerInMemoryTransport", "run_server_app"]


def _wire(msg: Message) -> tuple[Message, int]:
    data = message_to_proto(msg).SerializeToString()
    return message_from_proto(ProtoMessage.FromString(data)), len(data)


class LocalGrid(Grid):
    """A Grid whose nodes are contexts of one ``ClientApp`` in this process."""

    def __init__(self, client_app: ClientApp, node_configs: Sequence[Mapping[str, Any]], *,
                 run_config: Mapping[str, Any] | None = None, unresponsive: Iterable[int] = (),
                 silent_after_hello: Iterable[int] = (), run_id: int = 4242,
                 on_push: Callable[["LocalGrid", list[Message]], None] | None = None):
        self.client_app = client_app
        self._run = Run.create_empty(run_id)
        self._run_config = dict(run_config or {})
        self.node_ids: list[int] = []
        self.contexts: dict[int, Context] = {}
        self.activations: dict[int, int] = {}   # node id -> times Flower activated it
        for cfg in node_configs:
            self.add_node(cfg)
        self.unresponsive = set(unresponsive)  # node ids that never answer
        self.silent_after_hello = set(silent_after_hello)  # answer the hello, then time out
        self.on_push = on_push
        self._replies: dict[str, Message] = {}
        self.bytes_down = 0  # serialised protobuf bytes, server -> nodes
        self.bytes_up = 0

    def add_node(self, node_config: Mapping[str, Any]) -> int:
        """A SuperNode that connects now (a fresh node id, empty state); returns its id."""
        node = 1000 + 17 * len(self.contexts)
        self.contexts[node] = Context(run_id=self._run.run_id, node_id=node,
                                      node_config=dict(node_config), state=RecordDict(),
                                      run_config=dict(self._run_config))
        self.node_ids.append(node)
        self.activations[node] = 1
        return node

    def stop(self, node: int) -> None:
        """The node's process dies: it stays listed (as Flower lists a node until its
        heartbeat lapses) and never answers."""
        self.unresponsive.add(node)

    def restart(self, node: int, *, same_id: bool = False) -> int:
        """The node's SuperNode starts again with the same node config and an empty state:
        under a new node id (``same_id=False``: Flower without node authentication, which
        registers a fresh key per start) or its old one, activated anew (with
        authentication: the id belongs to the registered key). Returns its node id."""
        config = self.contexts[node].node_config
        if not same_id:
            self.node_ids.remove(node)   # the old id is gone; messages to it are lost
            return self.add_node(config)
        self.contexts[node] = Context(run_id=self._run.run_id, node_id=node,
                                      node_config=dict(config), state=RecordDict(),
                                      run_config=dict(self._run_config))
        self.unresponsive.discard(node)
        self.silent_after_hello.discard(node)
        self.activations[node] += 1
        return node

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def get_nodes(self) -> list[NodeInfo]:
        return [NodeInfo(node_id=n, status="online",
                         last_activated_at=f"activation {self.activations[n]}")
                for n in self.node_ids]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        messages = list(messages)
        if self.on_push is not None:
            self.on_push(self, messages)
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid4().hex
            received, nbytes = _wire(msg)
            self.bytes_down += nbytes
            node = received.metadata.dst_node_id
            if node not in self.contexts:
                raise ValueError(f"no node {node} in this grid")
            ids.append(msg.metadata.message_id)
            if (node in self.unresponsive or node not in self.node_ids
                    or (node in self.silent_after_hello
                        and received.metadata.message_type != HELLO_TYPE)):
                continue
            # the node's Context crosses a process boundary in a real SuperNode
            context = context_from_proto(context_to_proto(self.contexts[node]))
            try:
                reply = self.client_app(received, context)
                self.contexts[node] = context
            except Exception as ex:  # what Flower's ClientApp runtime does
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{type(ex)}:<'{ex}'>"), reply_to=received)
            reply.metadata.__dict__["_message_id"] = uuid4().hex
            back, nbytes = _wire(reply)
            self.bytes_up += nbytes
            self._replies[msg.metadata.message_id] = back
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> list[Message]:
        # Delivery is synchronous: an unresponsive node has "timed out" at once.
        return self.pull_messages(self.push_messages(messages))


def run_server_app(server_app: ServerApp, grid: Grid, run_config: Mapping[str, Any] | None = None
                   ) -> None:
    """Call ``server_app`` on ``grid`` the way Flower's runtime does (task identity set)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = grid.run.run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    try:
        context = Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID, node_config={},
                          state=RecordDict(), run_config=dict(run_config or {}))
        server_app(grid, context)
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@dataclass
class FlowerInMemoryTransport:
    """The Flower ServerApp and ClientApp over a :class:`LocalGrid` (fast, no Ray).

    Same parameters and result as :class:`~fedclust.sim.InProcessTransport`,
    plus ``unresponsive`` (device ids whose node registers, then never answers a
    round: a timed-out client). Failing clients
    are always dropped and named (what a Flower server does). ``last_grid_`` and
    ``last_extra_`` hold the grid (protobuf byte counts) and the server's extra
    info after a run.
    """

    dropout: float = 0.0
    late: float = 0.0
    dropped: Sequence[int] = ()
    late_devices: Sequence[int] = ()
    tamper: Tamper | None = None
    unresponsive: Sequence[int] = ()
    collect_outputs: bool = True
    secure_aggregation: Any = False
    policies: Any = None
    #: the ServerApp's result folder: its checkpoint after every round (``None``: none)
    result_dir: str | None = None
    #: continue the run checkpointed in ``result_dir``
    resume: bool = False
    #: each node keeps its device state in ``state_dir/node-<partition>``
    #: (node config ``state-dir``; ``None``: in its Flower context only)
    state_dir: str | None = None
    #: the Flower run id of the grid (a resumed run is another Flower run)
    run_id: int = 4242
    #: ``run(..., graph=)`` relays a general communication graph
    runs_graphs = True

    def _grid(self, client_app: ClientApp, configs: list[dict[str, Any]]) -> "LocalGrid":
        """The grid the run uses (a test's subclass may return one that fails)."""
        return LocalGrid(client_app, configs, run_id=self.run_id)

    def run(self, protocol: Protocol, devices: Mapping[int, np.ndarray],
            random_state: Any = None, *, graph: Any = None) -> RunOutput:
        """``graph`` (networkx graph or edge list over the device ids): the server only
        relays messages between neighbours (:mod:`fedclust.flower.relay`)."""
        from .relay import graph_edges

        check_float(self.dropout, "dropout", min_value=0.0, max_value=1.0)
        check_float(self.late, "late", min_value=0.0, max_value=1.0)
        seed = root_seed(random_state)
        ids = sorted(int(z) for z in devices)
        data = {i: (z, devices[z] if isinstance(devices[z], tuple) else np.asarray(devices[z]))
                for i, z in enumerate(ids)}
        spec = ServerSpec.for_protocol(
            protocol, seed, dropout=self.dropout, late=self.late, dropped=list(self.dropped),
            late_devices=list(self.late_devices), min_nodes=len(ids), node_wait_s=0.0,
            round_timeout_s=None, collect_outputs=self.collect_outputs,
            graph_edges=[] if graph is None else graph_edges(graph),
            result_dir=None if self.result_dir is None else str(self.result_dir),
            resume=bool(self.resume),
            **secure_spec(self.secure_aggregation))
        box: dict[str, Any] = {}
        server_app = make_server_app(spec, on_result=lambda out, extra: box.update(
            out=out, extra=extra))
        from ..core.secure_sum import SecureAggregation, make_identities

        sa = SecureAggregation.coerce(self.secure_aggregation)
        idn = make_identities(ids) if sa is not None and sa.signed else {}
        from ..core.policy import policy_for

        default = DevicePolicy(allow_collect=bool(self.collect_outputs), allow_noise_seed=True)
        client_app = make_client_app(
            lambda ctx: data[int(ctx.node_config["partition-id"])], tamper=self.tamper,
            identity=lambda ctx: idn.get(data[int(ctx.node_config["partition-id"])][0]),
            policy=lambda ctx: policy_for(self.policies, data[int(
                ctx.node_config["partition-id"])][0], default))
        configs = [{"partition-id": i, "num-partitions": len(ids)} for i in range(len(ids))]
        if self.state_dir is not None:
            for cfg in configs:
                cfg["state-dir"] = str(Path(self.state_dir) / f"node-{cfg['partition-id']}")
        pos = {z: i for i, z in enumerate(ids)}
        grid = self._grid(client_app, configs)
        grid.silent_after_hello = {grid.node_ids[pos[z]] for z in self.unresponsive}
        try:
            run_server_app(server_app, grid)
        except ServerAppFailed as exc:  # the caller gets the error that stopped the run
            raise (exc.original or exc) from None
        self.last_grid_ = grid
        self.last_extra_ = box["extra"]
        return box["out"]


def secure_spec(value: Any) -> dict[str, Any]:
    """ServerSpec fields for a transport's ``secure_aggregation`` setting."""
    from ..core.secure_sum import SecureAggregation

    sa = SecureAggregation.coerce(value)
    if sa is None:
        return {}
    return {"secure_aggregation": True, "secagg_frac_bits": sa.frac_bits,
            "secagg_neighbors": sa.neighbors or 0, "secagg_signed": bool(sa.signed)}
