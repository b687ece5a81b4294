"""Graph protocols on Flower: the server only relays messages along the graph's edges.

A protocol that runs over a general communication graph (every node applies
the server maths itself to the messages flooded to it, as
:func:`fedclust.coreset.graph.run_on_graph` simulates) needs no coordinator.
Flower has one, so here the ServerApp is a **relay**: every packet names the
neighbour it is for, the relay checks that sender and receiver share an edge
and hands it to that neighbour and to no one else. The rounds run as follows:

1. ``keys``: every node draws a fresh X25519 key pair for the run and returns
   its public key; the relay gives each node its neighbours' public keys only.
2. ``compute`` (one per protocol round): each node rebuilds the protocol's
   server state by replaying the rounds so far on the messages in its inbox
   (identical inboxes, identical seed: identical state on every node), asks
   ``next_request``, runs ``client_step`` on its own data and seals its reply
   once per neighbour (AES-GCM under a key agreed with that neighbour).
3. ``relay`` steps: the relay hands each node the packets addressed to it; a
   node opens and validates them (the message codec, then ``check_reply``
   against its own replayed state) and forwards every message it sees for the
   first time to all neighbours except those it just got it from — flooding,
   exactly as :func:`~fedclust.coreset.graph.flood` counts it — until no packet
   is left. A message that fails validation is not forwarded and its origin
   is reported as rejected.
4. ``finish``: each node computes the result and its own output; every node
   returns a SHA-256 digest of the result, the lowest device id the result
   itself. The relay checks that all digests agree and names those that do not.

The relay sees who sends how many bytes to which neighbour and when, the
shapes and dtypes of each message (authenticated, not encrypted) and the final
result (one node reports it); it never holds a key, so the contents of the
relayed messages are hidden from it. Keys are not authenticated: a relay that
substitutes public keys at the ``keys`` step can read and alter the traffic
(a man in the middle); a true peer-to-peer network has no such party. Byte
counts per edge are the messages' payload bytes, as in process (the AES-GCM
tag and Flower's framing are not counted).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.protocol import Protocol, Request, RunLog, RunOutput, round_targets
from ..core.registry import RESULT_TYPES
from ..core.secagg import agree, array_to_bytes, bytes_to_array, x25519_keypair
from ..core.threads import one_blas_thread
from .codec import arrays_to_record, record_to_arrays, request_to_content

if TYPE_CHECKING:  # pragma: no cover
    from .apps import _Server

__all__ = ["GRAPH_ACTION", "GraphMeter", "graph_edges", "run_relay", "relay_client", "result_to_arrays",
           "result_from_arrays", "result_digest"]

GRAPH_ACTION = "fedclust_graph"
PACKETS = "fedclust.relay.packets"   # ArrayRecord: "i" -> sealed bytes (uint8)
HEADS = "fedclust.relay.heads"       # ConfigRecord: "i" -> JSON header of packet i
PEERS = "fedclust.relay.peers"       # ArrayRecord: neighbour id -> its public key
KEY = "fedclust.relay.key"           # ConfigRecord: the node's public key (hex)
DONE = "fedclust.relay.done"         # ConfigRecord: digest, rejections, result kinds
RESULT = "fedclust.relay.result"     # ArrayRecord: the result's arrays
OUTPUT = "fedclust.relay.output"     # ArrayRecord: the node's own output
_TAG = 16                            # AES-GCM tag bytes
_INFO = b"fedclust relay pair key"
_ALLOWED_KINDS = "biuf"              # no objects, no strings through the relay


# --------------------------------------------------------------------------- results
def result_to_arrays(result: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A result dataclass -> (arrays, kind of each field); the run log is left out."""
    import dataclasses

    arrays, kinds = {}, {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, RunLog):
            kinds[f.name] = "log"
        elif isinstance(v, np.ndarray):
            arrays[f.name], kinds[f.name] = v, "array"
        elif isinstance(v, (bool, np.bool_)):
            arrays[f.name], kinds[f.name] = np.asarray(bool(v)), "bool"
        elif isinstance(v, (int, np.integer)):
            arrays[f.name], kinds[f.name] = np.asarray(int(v), dtype=np.int64), "int"
        elif isinstance(v, (float, np.floating)):
            arrays[f.name], kinds[f.name] = np.asarray(float(v)), "float"
        else:
            raise ValidationError(f"result field {f.name!r} ({type(v).__name__}) cannot travel "
                                  "through the relay")
    return arrays, kinds


def result_from_arrays(cls: type, arrays: Mapping[str, np.ndarray], kinds: Mapping[str, str],
                       log: RunLog) -> Any:
    """Inverse of :func:`result_to_arrays` (the log is the relay's)."""
    values: dict[str, Any] = {}
    for name, kind in kinds.items():
        if kind == "log":
            values[name] = log
            continue
        if name not in arrays:
            raise IncompatibleMessageError(f"the reported result has no field {name!r}")
        a = np.asarray(arrays[name])
        values[name] = {"array": lambda: a, "bool": lambda: bool(a), "int": lambda: int(a),
                        "float": lambda: float(a)}[kind]()
    return cls(**values)


def result_digest(result: Any) -> str:
    """SHA-256 over a result's fields (names, dtypes, shapes and bytes)."""
    arrays, _ = result_to_arrays(result)
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- sealing
def _nonce(header: Mapping[str, Any]) -> bytes:
    # unique per pair key: a node forwards one origin's message of a round to a neighbour once
    text = f"{header['src']}>{header['dst']}|{header['round']}|{header['origin']}"
    return hashlib.sha256(text.encode()).digest()[:12]


def _aad(header: Mapping[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True).encode()


def seal_message(private: bytes, peer_public: bytes, header: Mapping[str, Any],
                 arrays: Mapping[str, np.ndarray]) -> bytes:
    """AES-GCM of the arrays' raw bytes (layout in ``header``, authenticated)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    raw = b"".join(np.ascontiguousarray(arrays[name]).tobytes() for name, _, _ in
                   header["layout"])
    return AESGCM(agree(private, peer_public, _INFO)).encrypt(_nonce(header), raw, _aad(header))


def open_message(private: bytes, peer_public: bytes, header: Mapping[str, Any],
                 sealed: bytes) -> dict[str, np.ndarray]:
    """Open :func:`seal_message`'s output; IncompatibleMessageError when altered or malformed."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    src = header.get("src")
    try:
        raw = AESGCM(agree(private, peer_public, _INFO)).decrypt(_nonce(header), sealed,
                                                                 _aad(header))
    except InvalidTag:
        raise IncompatibleMessageError(
            f"the packet from device {src} (origin {header.get('origin')}) was altered on the "
            "way (authentication failed)") from None
    out, at = {}, 0
    for name, dtype, shape in header["layout"]:
        dt = np.dtype(dtype)
        if dt.kind not in _ALLOWED_KINDS:
            raise IncompatibleMessageError(f"device {src}: field {name!r} has dtype {dt}")
        size = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        if at + size > len(raw):
            raise IncompatibleMessageError(f"device {src}: packet shorter than its layout")
        out[str(name)] = np.frombuffer(raw[at:at + size], dtype=dt).reshape(shape).copy()
        at += size
    if at != len(raw):
        raise IncompatibleMessageError(f"device {src}: packet longer than its layout")
    return out


def _layout(arrays: Mapping[str, np.ndarray]) -> list[list[Any]]:
    out = []
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        if a.dtype.kind not in _ALLOWED_KINDS:
            raise IncompatibleMessageError(f"field {name!r} has dtype {a.dtype}; refusing to "
                                           "send it")
        out.append([name, a.dtype.str, [int(s) for s in a.shape]])
    return out


# --------------------------------------------------------------------------- meter
class GraphMeter:
    """Crossings and payload bytes per edge and per node of a relayed run.

    ``summary()`` has the keys of :meth:`fedclust.coreset.graph.GraphRun.summary`
    (the in-process flooding run), plus ``relay_bytes`` (sealed bytes the relay
    forwarded, tags included).
    """

    def __init__(self) -> None:
        self.edge_crossings: dict[tuple[int, int], int] = defaultdict(int)
        self.edge_bytes: dict[tuple[int, int], int] = defaultdict(int)
        self.sent: dict[int, int] = defaultdict(int)
        self.received: dict[int, int] = defaultdict(int)
        self.messages = 0
        self.rounds = 0
        self.relay_bytes = 0
        self._per_message: dict[tuple[int, int, tuple[int, int]], int] = defaultdict(int)

    def record(self, src: int, dst: int, rnd: int, origin: int, nbytes: int, sealed: int) -> None:
        e = (src, dst) if src < dst else (dst, src)
        self.edge_crossings[e] += 1
        self.edge_bytes[e] += nbytes
        self.sent[src] += nbytes
        self.received[dst] += nbytes
        self.relay_bytes += sealed
        self._per_message[(rnd, origin, e)] += 1

    @property
    def bytes_total(self) -> int:
        return sum(self.edge_bytes.values())

    # the star meter's names, for the saved run (every byte goes node -> node)
    @property
    def up(self) -> dict[int, int]:
        return dict(self.sent)

    @property
    def down(self) -> dict[int, int]:
        return {}

    @property
    def messages_up(self) -> int:
        return self.messages

    messages_down = 0

    def summary(self) -> dict[str, Any]:
        if getattr(self, "_summary", None) is not None:
            return dict(self._summary)
        total = self.bytes_total
        return {
            "topology": "graph", "rounds": self.rounds, "bytes_total": total,
            "bytes_up": total, "bytes_down": 0, "words_total": total // 8,
            "messages": self.messages, "edge_crossings": sum(self.edge_crossings.values()),
            "max_crossings_per_message": max(self._per_message.values(), default=0),
            "per_edge": {f"{u}-{v}": b for (u, v), b in sorted(self.edge_bytes.items())},
            "per_node": {str(z): {"sent": self.sent.get(z, 0), "received": self.received.get(z, 0)}
                         for z in sorted(set(self.sent) | set(self.received))},
            "relay_bytes": self.relay_bytes,
        }

    @classmethod
    def from_summary(cls, s: Mapping[str, Any]) -> "GraphMeter":
        """Rebuild (totals per edge and node) from :meth:`summary` (a saved result)."""
        m = cls()
        m.rounds, m.messages, m.relay_bytes = int(s["rounds"]), int(s["messages"]), \
            int(s.get("relay_bytes", 0))
        for key, b in s["per_edge"].items():
            u, v = (int(x) for x in key.split("-"))
            m.edge_bytes[(u, v)] = int(b)
        for z, d in s["per_node"].items():
            m.sent[int(z)], m.received[int(z)] = int(d["sent"]), int(d["received"])
        m._summary = dict(s)
        return m


# --------------------------------------------------------------------------- server
def graph_edges(graph: Any) -> list[list[int]]:
    """``[[u, v], ...]`` of a networkx graph or an edge list (device ids)."""
    edges = graph.edges() if hasattr(graph, "edges") else graph
    return [[int(u), int(v)] for u, v in edges]


def _edges(spec_edges: Any) -> dict[int, list[int]]:
    adj: dict[int, set[int]] = defaultdict(set)
    for e in spec_edges:
        u, v = int(e[0]), int(e[1])
        if u != v:
            adj[u].add(v)
            adj[v].add(u)
    return {z: sorted(n) for z, n in adj.items()}


def run_relay(server: "_Server") -> tuple[RunOutput, dict[str, Any]]:
    """The ServerApp's loop for a graph run (``spec.graph_edges`` set): relay only."""
    import time

    from logging import INFO

    from .codec import reply_failure as _reason
    from flwr.common.logger import log as flwr_log

    t0 = time.perf_counter()
    spec, protocol, log = server.spec, server.protocol, server.log
    if spec.dropout or spec.late or spec.dropped or spec.late_devices:
        raise ValidationError("a graph run has no coordinator to drop or delay devices: "
                              "dropout/late must be 0 with graph_edges")
    if server.secure is not None:
        raise ValidationError("secure aggregation needs a server that sums; a graph run only "
                              "relays (its packets are encrypted between neighbours instead)")
    node_failed = server.hello()
    ids = sorted(server.node_of)
    adj = _edges(spec.graph_edges)
    if set(adj) - set(ids) or (len(ids) > 1 and set(ids) - set(adj)):
        raise ValidationError(
            f"the graph's nodes {sorted(adj)[:10]} are not the connected devices {ids[:10]}; "
            f"without node(s) {sorted(set(ids) ^ set(adj))[:10]}")
    meter = GraphMeter()

    def exchange(stage: str, per_node: dict[int, dict[str, Any]]) -> dict[int, Message]:
        msgs = []
        for z, parts in per_node.items():
            head = {"relay-stage": stage, "ids": ids, "neighbours": adj.get(z, []),
                    **parts.get("head", {})}
            content = request_to_content(protocol, Request(meter.rounds, GRAPH_ACTION), server.seed,
                                         **head)
            for name, rec in parts.get("records", {}).items():
                content[name] = rec
            msgs.append(Message(content, dst_node_id=server.node_of[z],
                                message_type=f"query.{GRAPH_ACTION}",
                                group_id=f"graph.{meter.rounds}.{stage}"))
        got = server._exchange(msgs, list(per_node))
        out = {}
        for z, r in got.items():
            why = "no reply (timed out)" if r is None else _reason(r)
            if why is not None:
                log.failed.setdefault(z, f"device {z} (graph {stage}): {why}")
                continue
            out[z] = r
        return out

    # 1. keys: each node's public key goes to its neighbours only
    publics: dict[int, np.ndarray] = {}
    for z, r in exchange("keys", {z: {} for z in ids}).items():
        try:
            publics[z] = np.frombuffer(bytes.fromhex(str(r.content.config_records[KEY]["public"])),
                                       dtype=np.uint8).copy()
            if publics[z].size != 32:
                raise ValueError("not 32 bytes")
        except (KeyError, ValueError) as exc:
            log.rejected[z] = f"device {z}: bad public key ({exc})"
    live = [z for z in ids if z in publics]
    peers = {z: arrays_to_record({str(v): publics[v] for v in adj.get(z, []) if v in publics})
             for z in live}
    # 2-3. protocol rounds: compute, then relay steps until flooding is over
    done: dict[int, Message] = {}
    first = True
    while True:
        parts = {z: {"head": {"rounds-done": meter.rounds, "report-result": z == min(live),
                              "collect": bool(spec.collect_outputs)},
                     "records": {PEERS: peers[z]} if first else {}} for z in live}
        first = False
        replies = exchange("compute", parts)
        done = {z: r for z, r in replies.items() if DONE in r.content.config_records}
        if done:
            break
        pending = _collect_packets(replies, adj, meter, log, rnd=meter.rounds, first_hop=True)
        while pending:
            per_dst: dict[int, list[tuple[dict, np.ndarray]]] = defaultdict(list)
            for header, sealed in pending:
                per_dst[header["dst"]].append((header, sealed))
            parts = {z: {"head": {"rounds-done": meter.rounds},
                         "records": {PACKETS: arrays_to_record(
                             {str(i): s for i, (_, s) in enumerate(p)}),
                             HEADS: ConfigRecord({str(i): json.dumps(h) for i, (h, _) in
                                                  enumerate(p)})}}
                     for z, p in per_dst.items() if z in server.node_of and z not in log.failed}
            pending = _collect_packets(exchange("relay", parts), adj, meter, log,
                                       rnd=meter.rounds)
        meter.rounds += 1
        flwr_log(INFO, "fedclust: graph round %d relayed (%d edge crossings so far)",
                 meter.rounds - 1, sum(meter.edge_crossings.values()))
        live = [z for z in live if z not in log.failed]
        if not live:
            raise ValidationError("every node of the graph failed")
    # 4. the result, and every node's digest of it
    for z, r in done.items():
        info = r.content.config_records[DONE]
        for origin, why in json.loads(str(info.get("rejected", "{}"))).items():
            log.rejected.setdefault(int(origin), why)
    reporter = min(done)
    info = done[reporter].content.config_records[DONE]
    kinds = json.loads(str(info["kinds"]))
    arrays = record_to_arrays(done[reporter].content.array_records[RESULT],
                              sender=f"device {reporter}")
    log.participants = [z for z in ids if z not in log.failed and z not in log.rejected]
    result = result_from_arrays(RESULT_TYPES[protocol.name], arrays, kinds, log)
    digest = result_digest(result)
    dissent = sorted(z for z, r in done.items()
                     if str(r.content.config_records[DONE]["digest"]) != digest)
    if dissent:
        raise ValidationError(
            f"the nodes do not agree on the result: devices {dissent[:10]} computed another one "
            f"than device {reporter}")
    outputs = {}
    if spec.collect_outputs:
        for z, r in done.items():
            if OUTPUT in r.content.array_records:
                outputs[z] = record_to_arrays(r.content.array_records[OUTPUT],
                                              sender=f"device {z}")
    extra = {"nodes": {str(z): n for z, n in server.node_of.items()},
             "nodes_failed": {str(n): t for n, t in node_failed.items()},
             "graph": meter.summary(), "result_digest": digest,
             "time_s": {"total": time.perf_counter() - t0}}
    return RunOutput(result, outputs, meter, log, server.seed), extra


def _collect_packets(replies: Mapping[int, Message], adj: Mapping[int, list[int]],
                     meter: GraphMeter, log: RunLog, *, rnd: int, first_hop: bool = False
                     ) -> list[tuple[dict, np.ndarray]]:
    """Packets in the nodes' replies: only along an edge, ``src`` set by the relay."""
    out = []
    for src, r in replies.items():
        heads = r.content.config_records.get(HEADS)
        if heads is None:
            continue
        try:
            sealed = record_to_arrays(r.content.array_records[PACKETS], sender=f"device {src}")
            origins = set()
            for key, text in heads.items():
                header = json.loads(str(text))
                dst = int(header["dst"])
                if dst not in adj.get(src, []):
                    raise IncompatibleMessageError(
                        f"device {src}: sent a packet to device {dst}, which is not a neighbour")
                header.update(src=src, dst=dst, round=rnd)
                s = np.asarray(sealed[key], dtype=np.uint8)
                nbytes = sum(np.dtype(dt).itemsize * int(np.prod(sh, dtype=np.int64))
                             for _, dt, sh in header["layout"])
                meter.record(src, dst, rnd, int(header["origin"]), nbytes, s.size)
                origins.add(int(header["origin"]))
                out.append((header, s))
            if first_hop:
                meter.messages += len(origins)
        except (KeyError, ValueError, TypeError, IncompatibleMessageError) as exc:
            log.rejected.setdefault(src, f"device {src}: malformed relay packets ({exc})")
    return out


# --------------------------------------------------------------------------- client
_RELAY_STATE = "fedclust.relay.state"   # ArrayRecord: private key, peer keys
_INBOX = "fedclust.relay.inbox"         # ArrayRecord: "round/origin/field" -> array
_REJECTED = "fedclust.relay.rejected"   # ConfigRecord: origin -> reason


def relay_client(msg: Message, context: Any, protocol: Protocol, seed: int,
                 head: Mapping[str, Any], device_id: int, X: Any, *, tamper: Any = None,
                 load_state: Any, save_state: Any) -> RecordDict:
    """A node's side of a relayed graph run (see the module docstring)."""
    stage = str(head["relay-stage"])
    z = int(device_id)
    cs = context.state
    if stage == "keys":
        private, public = x25519_keypair()
        cs[_RELAY_STATE] = arrays_to_record({"private": bytes_to_array(private)})
        cs[_INBOX] = ArrayRecord()
        cs[_REJECTED] = ConfigRecord({})
        return RecordDict({KEY: ConfigRecord({"public": public.hex()})})
    if _RELAY_STATE not in cs.array_records:
        raise ValidationError(f"device {z}: a graph step before the key exchange")
    keys = record_to_arrays(cs.array_records[_RELAY_STATE], sender="relay state")
    if PEERS in msg.content.array_records and not any(k.startswith("peer.") for k in keys):
        for v, pub in record_to_arrays(msg.content.array_records[PEERS], sender="relay").items():
            keys[f"peer.{int(v)}"] = np.asarray(pub, dtype=np.uint8)
        cs[_RELAY_STATE] = arrays_to_record(keys)
    ids = [int(v) for v in head["ids"]]
    neighbours = [int(v) for v in head["neighbours"]]
    inbox = _read_inbox(cs)
    rejected = {int(k): str(v) for k, v in cs.config_records[_REJECTED].items()}
    rounds_done = int(head["rounds-done"])
    pstate, request, log = _replay(protocol, ids, seed, inbox, rejected, rounds_done)
    private = array_to_bytes(keys["private"])

    def seal_for(v: int, origin: int, arrays: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray]:
        header = {"src": z, "dst": v, "round": rounds_done, "origin": origin,
                  "action": request.action, "layout": _layout(arrays)}
        pub = array_to_bytes(keys[f"peer.{v}"])
        return json.dumps(header), bytes_to_array(seal_message(private, pub, header, arrays))

    out_heads, out_sealed = {}, {}

    def send(origin: int, arrays: Mapping[str, np.ndarray], skip: set[int]) -> None:
        for v in neighbours:
            if v in skip or f"peer.{v}" not in keys:
                continue
            h, s = seal_for(v, origin, arrays)
            out_heads[str(len(out_heads))] = h
            out_sealed[str(len(out_sealed))] = s

    if stage == "compute":
        if request is None:
            return _finish(protocol, pstate, log, ids, rejected, z, X, head,
                           load_state(context))
        targets = round_targets(request, ids, log)
        if z in targets:
            client_state = load_state(context)
            with one_blas_thread():
                reply = protocol.client_step(request, X, device_id=z, seed=seed,
                                             state=client_state)
            save_state(context, client_state)
            arrays = reply.to_arrays()
            if tamper is not None:
                arrays = tamper(z, request.round, arrays)
            if _accept(protocol, pstate, request, z, arrays, rejected):
                inbox.setdefault(rounds_done, {})[z] = arrays
            send(z, arrays, set())
    elif stage == "relay":
        if request is None:
            raise ValidationError(f"device {z}: relayed packets after the protocol ended")
        heads = msg.content.config_records.get(HEADS, ConfigRecord({}))
        sealed = record_to_arrays(msg.content.array_records.get(PACKETS, ArrayRecord()),
                                  sender="relay")
        fresh: dict[int, tuple[dict[str, np.ndarray], set[int]]] = {}
        for key, text in heads.items():
            header = json.loads(str(text))
            src, origin = int(header["src"]), int(header["origin"])
            if (int(header["dst"]) != z or int(header["round"]) != rounds_done
                    or header.get("action") != request.action or src not in neighbours):
                raise IncompatibleMessageError(
                    f"device {z}: the relay delivered a packet for another node, round or "
                    f"action ({header})")
            seen = origin == z or origin in inbox.get(rounds_done, {}) or origin in rejected
            if seen:
                continue  # already had it: a crossing, but nothing to forward
            if origin in fresh:
                fresh[origin][1].add(src)
                continue
            try:
                arrays = open_message(private, array_to_bytes(keys[f"peer.{src}"]), header,
                                      array_to_bytes(sealed[key]))
            except KeyError:
                raise IncompatibleMessageError(
                    f"device {z}: a packet from device {src}, which sent no key") from None
            fresh[origin] = (arrays, {src})
        for origin in sorted(fresh):
            arrays, senders = fresh[origin]
            if _accept(protocol, pstate, request, origin, arrays, rejected):
                inbox.setdefault(rounds_done, {})[origin] = arrays
                send(origin, arrays, senders)
    else:
        raise IncompatibleMessageError(f"device {z}: unknown graph stage {stage!r}")
    _write_inbox(cs, inbox)
    cs[_REJECTED] = ConfigRecord({str(k): v for k, v in rejected.items()})
    content = RecordDict({PACKETS: arrays_to_record(out_sealed)})
    content[HEADS] = ConfigRecord(out_heads)
    return content


def _accept(protocol: Protocol, pstate: Any, request: Request, origin: int,
            arrays: Mapping[str, np.ndarray], rejected: dict[int, str]) -> bool:
    reply_type = protocol.reply_types[request.action]
    try:
        m = reply_type.from_arrays(dict(arrays), sender=f"device {origin}")
        protocol.check_reply(pstate, request, origin, m)
    except IncompatibleMessageError as exc:
        rejected[origin] = str(exc)
        return False
    return True


def _replay(protocol: Protocol, ids: list[int], seed: int,
            inbox: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]],
            rejected: Mapping[int, str], rounds_done: int) -> tuple[Any, Request | None, RunLog]:
    """The protocol's server state after ``rounds_done`` rounds, rebuilt from the inbox."""
    log = RunLog()
    state = protocol.start(ids, seed)
    request = protocol.next_request(state)
    for r in range(rounds_done):
        if request is None:
            break
        reply_type = protocol.reply_types[request.action]
        got = inbox.get(r, {})
        replies = {o: reply_type.from_arrays(dict(got[o]), sender=f"device {o}")
                   for o in sorted(got)}
        if not replies:
            raise ValidationError(f"round {request.round}: no node gave a valid reply")
        log.rejected = {o: why for o, why in rejected.items()}
        with one_blas_thread():
            protocol.server_step(state, request, replies)
        request = protocol.next_request(state)
    log.rejected = dict(rejected)
    return state, request, log


def _finish(protocol: Protocol, pstate: Any, log: RunLog, ids: list[int],
            rejected: Mapping[int, str], z: int, X: Any, head: Mapping[str, Any],
            client_state: dict[str, np.ndarray]) -> RecordDict:
    log.participants = [v for v in ids if v not in rejected]
    with one_blas_thread():
        result = protocol.finish(pstate, log)
    final = protocol.final_message(result, z)
    arrays, kinds = result_to_arrays(result)
    info = {"digest": result_digest(result), "kinds": json.dumps(kinds),
            "rejected": json.dumps({str(k): v for k, v in rejected.items()})}
    content = RecordDict({DONE: ConfigRecord(info)})
    if head.get("report-result"):
        content[RESULT] = arrays_to_record(arrays)
    if final is not None and head.get("collect"):
        with one_blas_thread():
            content[OUTPUT] = arrays_to_record(protocol.client_finish(final, X, client_state))
    return content


def _read_inbox(cs: Any) -> dict[int, dict[int, dict[str, np.ndarray]]]:
    rec = cs.array_records.get(_INBOX)
    out: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    if rec is None:
        return out
    for key, a in record_to_arrays(rec, sender="relay inbox").items():
        r, o, name = key.split("/", 2)
        out.setdefault(int(r), {}).setdefault(int(o), {})[name] = a
    return out


def _write_inbox(cs: Any, inbox: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]]) -> None:
    cs[_INBOX] = arrays_to_record({f"{r}/{o}/{name}": a for r, msgs in inbox.items()
                                   for o, arrays in msgs.items() for name, a in arrays.items()})

