"""Graph protocols on Flower: the server only relays messages along the graph's edges.

This module holds what both sides share (the sealed packets, the result as arrays,
the byte meter); the relay's side is :mod:`fedclust.flower.relay_server`, a node's
:mod:`fedclust.flower.relay_client`.

A protocol that runs over a general communication graph (every node applies
the server maths itself to the messages flooded to it, as
:func:`fedclust.coreset.graph.run_on_graph` simulates) needs no coordinator.
Flower has one, so here the ServerApp is a **relay**: every packet names the
neighbour it is for, the relay checks that sender and receiver share an edge
and hands it to that neighbour and to no one else. The rounds run as follows:

1. ``keys``: every node draws a fresh X25519 key pair for the run and returns
   its public key; the relay gives each node its neighbours' public keys only.
   When a node holds a secure-aggregation identity (Ed25519, node config
   ``secagg-identity-key`` and ``secagg-directory``), a ``sign`` step follows:
   each node signs, for every neighbour, :func:`relay_key_statement` (the
   Flower run id, both device ids, its own public key and the neighbour's as
   the relay gave it) and the relay hands each signature to that neighbour.
   Before sealing anything, a node with an identity checks every neighbour's
   signature against its directory (the one that neighbour made of *this*
   node's fresh key for *this* edge and run) and refuses a missing or bad one
   by name: a swapped key, a dropped signature or a key replayed from another
   run or edge all fail, at both ends of the edge.
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
relayed messages are hidden from it as long as it passes the public keys on
unchanged. With identities on every node, a relay that substitutes public keys
(a man in the middle) is caught before any packet is sealed. Without them the
keys are not authenticated: a relay that substitutes them at the ``keys`` step
can read and alter the traffic; a true peer-to-peer network has no such party.
Byte counts per edge are the messages' payload bytes, as in process (the
AES-GCM tag, the key exchange and Flower's framing are not counted; the run's
extra information gives the key exchange's bytes).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import defaultdict
from typing import Any, Mapping

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.protocol import RunLog
from ..core.secagg import agree



__all__ = ["GRAPH_ACTION", "GraphMeter", "graph_edges", "result_to_arrays", "result_from_arrays",
           "result_digest", "seal_message", "open_message", "array_layout", "adjacency",
           "relay_key_statement"]

GRAPH_ACTION = "fedclust_graph"
PACKETS = "fedclust.relay.packets"   # ArrayRecord: "i" -> sealed bytes (uint8)
HEADS = "fedclust.relay.heads"       # ConfigRecord: "i" -> JSON header of packet i
PEERS = "fedclust.relay.peers"       # ArrayRecord: neighbour id -> its public key
KEY = "fedclust.relay.key"           # ConfigRecord: the node's public key (hex), "signs"
SIGS = "fedclust.relay.sigs"         # ConfigRecord: neighbour id -> signature (hex)
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
def relay_key_statement(run_id: int, signer: int, peer: int, signer_key: bytes,
                        peer_key: bytes) -> bytes:
    """What ``signer`` signs for the edge to ``peer``: both fresh X25519 keys, both ids, the run.

    The peer's key is fresh for the run, so a signature does not verify in
    another run, on another edge or for another key.
    """
    return (b"fedclust relay key" + struct.pack(">Qqq", int(run_id) % (1 << 64), int(signer),
                                                int(peer)) + bytes(signer_key) + bytes(peer_key))


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


def array_layout(arrays: Mapping[str, np.ndarray]) -> list[list[Any]]:
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


def adjacency(spec_edges: Any) -> dict[int, list[int]]:
    adj: dict[int, set[int]] = defaultdict(set)
    for e in spec_edges:
        u, v = int(e[0]), int(e[1])
        if u != v:
            adj[u].add(v)
            adj[v].add(u)
    return {z: sorted(n) for z, n in adj.items()}
