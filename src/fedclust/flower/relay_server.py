"""The relay's side of a graph protocol on Flower (:func:`run_relay`): it hands each node the
packets addressed to it and checks the nodes agree (see :mod:`fedclust.flower.relay`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Mapping

import numpy as np
from flwr.app import ConfigRecord, Message

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.protocol import Request, RunLog, RunOutput
from ..core.registry import RESULT_TYPES
from ..core.secagg import agree
from .codec import arrays_to_record, record_to_arrays, request_to_content


from .relay import (GRAPH_ACTION, PACKETS, HEADS, PEERS, KEY, SIGS, DONE, RESULT, OUTPUT,
                    result_from_arrays, result_digest, GraphMeter, graph_edges, adjacency)

__all__ = ["run_relay"]


def run_relay(server: Any) -> tuple[RunOutput, dict[str, Any]]:
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
    if spec.resume:
        # the nodes compute the whole graph protocol between them; the relay keeps no
        # rounds to resume from, and the same seed gives the same result again
        log.warnings.append("resume: a graph run keeps no rounds on the server; it runs "
                            "again from the start (the same result for the same seed)")
        flwr_log(INFO, "fedclust: %s", log.warnings[-1])
    node_failed = server.hello()
    ids = sorted(server.node_of)
    adj = adjacency(spec.graph_edges)
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
    signers: set[int] = set()
    for z, r in exchange("keys", {z: {} for z in ids}).items():
        try:
            rec = r.content.config_records[KEY]
            publics[z] = np.frombuffer(bytes.fromhex(str(rec["public"])), dtype=np.uint8).copy()
            if publics[z].size != 32:
                raise ValueError("not 32 bytes")
        except (KeyError, ValueError) as exc:
            log.rejected[z] = f"device {z}: bad public key ({exc})"
            continue
        if bool(rec.get("signs", False)):
            signers.add(z)
    live = [z for z in ids if z in publics]
    peers = {z: arrays_to_record({str(v): publics[v] for v in adj.get(z, []) if v in publics})
             for z in live}
    key_bytes = {"public_keys": 32 * sum(v in publics for z in live for v in adj.get(z, [])),
                 "signatures": 0}
    first_records: dict[int, dict[str, Any]] = {z: {PEERS: peers[z]} for z in live}
    if signers:
        # nodes with an identity sign their key for each edge; each signature goes to the
        # neighbour it names, which checks it before sealing anything
        given: dict[int, dict[str, str]] = defaultdict(dict)
        for z, r in exchange("sign", {z: {"records": {PEERS: peers[z]}} for z in live}).items():
            try:
                for v, sig in r.content.config_records.get(SIGS, ConfigRecord({})).items():
                    if int(v) in adj.get(z, []):
                        given[int(v)][str(z)] = str(sig)
                        key_bytes["signatures"] += len(str(sig)) // 2
            except ValueError as exc:
                log.rejected.setdefault(z, f"device {z}: malformed key signatures ({exc})")
        live = [z for z in live if z not in log.failed]
        first_records = {z: {SIGS: ConfigRecord(given.get(z, {}))} for z in live}
    # 2-3. protocol rounds: compute, then relay steps until flooding is over
    done: dict[int, Message] = {}
    first = True
    while True:
        parts = {z: {"head": {"rounds-done": meter.rounds, "report-result": z == min(live),
                              "collect": bool(spec.collect_outputs)},
                     "records": first_records[z] if first else {}} for z in live}
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
            who = min(log.failed)
            raise ValidationError(f"every node of the graph failed (device {who}: "
                                  f"{log.failed[who]})")
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
             "graph": meter.summary(), "graph_key_bytes": key_bytes,
             "signed_relay_keys": sorted(signers), "result_digest": digest,
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
