"""General communication graphs: topologies, checks, and a flooding simulator.

Nodes talk only to neighbours. A message spreads by **flooding**: a node that
receives a message it has not seen forwards it to every neighbour except
those it just received it from. In synchronous steps a message therefore
crosses an edge once when its ends are at different hop distances from the
origin and twice (both ends forward at the same step) when they are at the
same distance — never more. :func:`flood` simulates this step by step and
counts every crossing, per edge and per node.

:func:`run_on_graph` runs a :class:`~fedclust.coreset.protocol.CoresetProtocol`
with no coordinator: every node computes its reply, the replies are flooded,
and every node applies the protocol's server maths to the same set of
messages (identical inputs, identical seed: identical results; the maths is
computed once here and every node's inbox is checked to hold every message).
Flower has a server, so only the star case runs on Flower.

Topologies come from networkx (``gnp_random_graph``, ``grid_2d_graph``,
``barabasi_albert_graph``) — a well-kept library, no reason to hand-roll.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import networkx as nx
import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.protocol import RunLog
from ..core.random import root_seed, server_rng
from ..core.validation import check_choice, check_float, check_int
from ..core.threads import one_blas_thread

__all__ = ["make_graph", "check_graph", "flood", "FloodStats", "run_on_graph", "GraphRun",
           "TOPOLOGIES"]

TOPOLOGIES = ("star", "complete", "gnp", "grid", "preferential")
_GRAPH_BRANCH = 11  # server-stream index reserved for drawing random graphs


def make_graph(kind: str, n_nodes: int, *, p: float = 0.3, m: int = 2,
               random_state: Any = None, max_tries: int = 100) -> nx.Graph:
    """A connected topology of the papers on nodes ``0..n_nodes-1``.

    Parameters
    ----------
    kind : {"star", "complete", "gnp", "grid", "preferential"}
        ``"star"``: node 0 is the hub (the coordinator is then a node);
        ``"gnp"``: Erdős–Rényi G(n, p), redrawn (at most ``max_tries`` times)
        until connected; ``"grid"``: the most square r × c grid with r c = n
        (3 × 3 for 9 nodes; a prime n gives a path); ``"preferential"``:
        Barabási–Albert with ``m`` edges per new node.
    n_nodes : int
    p : float, default=0.3
    m : int, default=2
    random_state : int, Generator or None

    Returns
    -------
    networkx.Graph
    """
    check_choice(kind, "graph", TOPOLOGIES)
    n = check_int(n_nodes, "n_nodes", min_value=1)
    if kind == "star":
        return nx.star_graph(n - 1) if n > 1 else nx.empty_graph(1)
    if kind == "complete":
        return nx.complete_graph(n)
    if kind == "grid":
        rows = max(r for r in range(1, int(math.isqrt(n)) + 1) if n % r == 0)
        g = nx.grid_2d_graph(rows, n // rows)
        return nx.convert_node_labels_to_integers(g, ordering="sorted")
    rng = server_rng(root_seed(random_state), _GRAPH_BRANCH)
    if kind == "preferential":
        m = check_int(m, "m", min_value=1)
        if n <= m:
            return nx.complete_graph(n)
        return nx.barabasi_albert_graph(n, m, seed=int(rng.integers(2**31)))
    p = check_float(p, "p", min_value=0.0, max_value=1.0, min_inclusive=False)
    for _ in range(check_int(max_tries, "max_tries", min_value=1)):
        g = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31)))
        if nx.is_connected(g):
            return g
    raise ValidationError(
        f"G(n={n}, p={p}) was disconnected in all {max_tries} draws; raise p")


def check_graph(graph: Any, n_nodes: int) -> nx.Graph:
    """A networkx graph or a symmetric 0/1 (or weighted) adjacency matrix -> connected nx.Graph.

    Nodes must be exactly ``0..n_nodes-1``. Raises ValidationError for a size
    mismatch, a non-symmetric matrix, self-loops-only data, or a disconnected
    graph (naming its components).
    """
    if isinstance(graph, nx.Graph):
        if graph.is_directed():
            raise ValidationError("graph must be undirected (got a directed networkx graph)")
        nodes = set(graph.nodes)
        if nodes != set(range(n_nodes)):
            if len(nodes) != n_nodes:
                raise ValidationError(
                    f"graph has {graph.number_of_nodes()} nodes but there are {n_nodes} "
                    f"devices; nodes must be 0..{n_nodes - 1}")
            stray = sorted(map(repr, nodes - set(range(n_nodes))))
            raise ValidationError(
                f"graph's nodes must be the devices' positions 0..{n_nodes - 1}; got "
                f"{', '.join(stray[:5])}{' ...' if len(stray) > 5 else ''} (relabel them, e.g. "
                "networkx.convert_node_labels_to_integers)")
        g = nx.Graph()
        g.add_nodes_from(range(n_nodes))
        g.add_edges_from((u, v) for u, v in graph.edges if u != v)
    else:
        try:
            A = np.asarray(graph, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValidationError(
                f"graph must be None, 'star', a networkx graph or an adjacency matrix, got "
                f"{type(graph).__name__}") from None
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValidationError(f"adjacency matrix must be square, got shape {A.shape}")
        if A.shape[0] != n_nodes:
            raise ValidationError(
                f"adjacency matrix is {A.shape[0]} x {A.shape[0]} but there are {n_nodes} devices")
        if not np.isfinite(A).all():
            raise ValidationError("adjacency matrix contains NaN or inf")
        if not np.array_equal(A, A.T):
            i, j = np.argwhere(A != A.T)[0]
            raise ValidationError(
                f"adjacency matrix is not symmetric: A[{i}, {j}]={A[i, j]} but "
                f"A[{j}, {i}]={A[j, i]}")
        g = nx.Graph()
        g.add_nodes_from(range(n_nodes))
        g.add_edges_from((int(u), int(v)) for u, v in np.argwhere(np.triu(A, 1) != 0))
    if n_nodes > 1 and not nx.is_connected(g):
        comps = sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: c[0])
        shown = "; ".join(str(c[:10]) + ("..." if len(c) > 10 else "") for c in comps[:5])
        raise ValidationError(
            f"the communication graph is disconnected: {len(comps)} components ({shown}); "
            "flooding could never reach every node")
    return g


@dataclass
class FloodStats:
    """Crossings and bytes of flooded messages.

    ``edge_crossings[(u, v)]`` (u < v) counts message crossings of the edge,
    ``edge_bytes`` their bytes; ``sent``/``received`` bytes per node;
    ``max_crossings_per_message`` the most any one message crossed any edge.
    """

    edge_crossings: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    edge_bytes: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    sent: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    received: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    messages: int = 0
    max_crossings_per_message: int = 0

    @property
    def bytes_total(self) -> int:
        return sum(self.edge_bytes.values())


def flood(g: nx.Graph, origin: int, nbytes: int, stats: FloodStats) -> set[int]:
    """Flood one message of ``nbytes`` from ``origin``; return the set of nodes reached.

    Synchronous steps: every node that got the message for the first time in
    the previous step forwards it to all neighbours but its senders.
    """
    seen = {origin}
    frontier: dict[int, set[int]] = {origin: set()}
    crossings: dict[tuple[int, int], int] = defaultdict(int)
    while frontier:
        new: dict[int, set[int]] = defaultdict(set)
        for u, senders in frontier.items():
            for v in g.adj[u]:
                if v in senders:
                    continue
                e = (u, v) if u < v else (v, u)
                crossings[e] += 1
                stats.sent[u] += nbytes
                stats.received[v] += nbytes
                if v not in seen:
                    new[v].add(u)
        seen.update(new)
        frontier = new
    for e, c in crossings.items():
        stats.edge_crossings[e] += c
        stats.edge_bytes[e] += c * nbytes
    stats.messages += 1
    stats.max_crossings_per_message = max(stats.max_crossings_per_message,
                                          max(crossings.values(), default=0))
    return seen


@dataclass
class GraphRun:
    """What :func:`run_on_graph` returns (like the transports' RunOutput)."""

    result: Any
    device_outputs: dict[int, dict[str, np.ndarray]]
    stats: FloodStats
    log: RunLog
    seed: int
    rounds: int
    coreset_digests: dict[int, str]

    def summary(self) -> dict[str, Any]:
        """JSON-ready communication: totals, words, per edge and per node."""
        s = self.stats
        return {
            "topology": "graph",
            "rounds": self.rounds,
            "bytes_total": s.bytes_total,
            # no server: all traffic is node-to-node; bytes_up/down keep the star's keys
            "bytes_up": s.bytes_total,
            "bytes_down": 0,
            "words_total": s.bytes_total // 8,
            "messages": s.messages,
            "edge_crossings": sum(s.edge_crossings.values()),
            "max_crossings_per_message": s.max_crossings_per_message,
            "per_edge": {f"{u}-{v}": b for (u, v), b in sorted(s.edge_bytes.items())},
            "per_node": {str(z): {"sent": s.sent.get(z, 0), "received": s.received.get(z, 0)}
                         for z in sorted(set(s.sent) | set(s.received))},
        }


def run_on_graph(protocol: Any, devices: Mapping[int, np.ndarray], g: nx.Graph,
                 random_state: Any = None, *, tamper: Any = None) -> GraphRun:
    """Run ``protocol`` over ``devices`` (node id -> data) on the connected graph ``g``.

    Every reply goes through the message codec (validated, rejected by name
    on failure — that node's message is then not forwarded) and is flooded
    to all nodes; bytes are counted per edge and per node. ``tamper(node,
    round, arrays) -> arrays`` rewrites a node's message as it leaves it
    (as :class:`~fedclust.sim.InProcessTransport`'s hook does).
    """
    from ..core.protocol import round_targets

    seed = root_seed(random_state)
    ids = sorted(int(z) for z in devices)
    log = RunLog()
    states: dict[int, dict[str, np.ndarray]] = {z: {} for z in ids}
    stats = FloodStats()
    state = protocol.start(ids, seed)
    rounds = 0
    digests: dict[int, str] = {}
    while (request := protocol.next_request(state)) is not None:
        targets = round_targets(request, ids, log)
        inbox: dict[int, set[int]] = {z: set() for z in ids}
        replies = {}
        reply_type = protocol.reply_types[request.action]
        for z in targets:
            try:
                # one BLAS thread per simulated node, as the in-process transport does
                with one_blas_thread():
                    msg = protocol.client_step(request, devices[z], device_id=z, seed=seed,
                                               state=states[z])
                arrays = msg.to_arrays()
                if tamper is not None:
                    arrays = tamper(z, request.round, arrays)
                msg = reply_type.from_arrays(arrays, sender=f"device {z}")
                protocol.check_reply(state, request, z, msg)
            except IncompatibleMessageError as exc:
                log.rejected[z] = str(exc)
                continue
            for v in flood(g, z, msg.nbytes, stats):
                inbox[v].add(z)
            replies[z] = msg
        rounds += 1
        if not replies:
            raise ValidationError(f"round {request.round}: no node gave a valid reply")
        missing = {v: sorted(set(replies) - got) for v, got in inbox.items() if got != set(replies)}
        if missing:  # cannot happen on a connected graph; guards the simulator itself
            raise ValidationError(f"flooding left nodes without messages: {missing}")
        if request.action == "coreset":
            digests = {v: _digest([replies[o] for o in sorted(inbox[v])]) for v in ids}
        protocol.server_step(state, request, replies)
    log.participants = [z for z in ids if z not in log.failed and z not in log.rejected]
    result = protocol.finish(state, log)
    outputs = {}
    for z in ids:
        final = protocol.final_message(result, z)
        if final is not None:  # computed by node z itself: nothing crosses an edge
            with one_blas_thread():
                outputs[z] = protocol.client_finish(final, devices[z], states[z])
    return GraphRun(result, outputs, stats, log, seed, rounds, digests)


def _digest(portions: Sequence[Any]) -> str:
    """SHA-256 of a node's coreset as it assembles it (points then weights, origin order)."""
    h = hashlib.sha256()
    for p in portions:
        h.update(np.ascontiguousarray(p.points).tobytes())
        h.update(np.ascontiguousarray(p.weights).tobytes())
    return h.hexdigest()
