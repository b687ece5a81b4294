"""A node's side of a graph protocol on Flower (:func:`relay_client`): keys (signed with the
node's identity when it has one), the replayed server state, sealing, opening and forwarding
packets (see :mod:`fedclust.flower.relay`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.policy import DevicePolicy, PolicyRefusal
from ..core.protocol import Protocol, Request, RunLog, round_targets
from ..core.secagg import array_to_bytes, bytes_to_array, sign, verify, x25519_keypair
from ..core.threads import one_blas_thread
from .codec import arrays_to_record, record_to_arrays


from .relay import (PACKETS, HEADS, PEERS, KEY, SIGS, DONE, RESULT, OUTPUT, result_to_arrays,
                    result_digest, seal_message, open_message, array_layout, relay_key_statement)

__all__ = ["relay_client"]

_RELAY_STATE = "fedclust.relay.state"   # ArrayRecord: private key, peer keys
_INBOX = "fedclust.relay.inbox"         # ArrayRecord: "round/origin/field" -> array
_REJECTED = "fedclust.relay.rejected"   # ConfigRecord: origin -> reason


def relay_client(msg: Message, context: Any, protocol: Protocol, seed: int,
                 head: Mapping[str, Any], device_id: int, X: Any, *, tamper: Any = None,
                 load_state: Any, save_state: Any, identity: Any = None,
                 policy: DevicePolicy | None = None) -> RecordDict:
    """A node's side of a relayed graph run (see the module docstring).

    ``identity`` (a :class:`~fedclust.core.secure_sum.DeviceIdentity`): the node
    signs its relay key for each neighbour and refuses, before sealing anything,
    a neighbour's key without a valid signature. A ``policy`` whose
    ``secure_aggregation`` is ``"signed"`` refuses unsigned keys as well.
    """
    stage = str(head["relay-stage"])
    z = int(device_id)
    cs = context.state
    if stage == "keys":
        private, public = x25519_keypair()
        cs[_RELAY_STATE] = arrays_to_record({"private": bytes_to_array(private),
                                             "public": bytes_to_array(public)})
        cs[_INBOX] = ArrayRecord()
        cs[_REJECTED] = ConfigRecord({})
        return RecordDict({KEY: ConfigRecord({"public": public.hex(),
                                              "signs": identity is not None})})
    if _RELAY_STATE not in cs.array_records:
        raise ValidationError(f"device {z}: a graph step before the key exchange")
    keys = record_to_arrays(cs.array_records[_RELAY_STATE], sender="relay state")
    neighbours = [int(v) for v in head["neighbours"]]
    if PEERS in msg.content.array_records and not any(k.startswith("peer.") for k in keys):
        # the first neighbour keys the relay gives are the ones this node signs and uses
        for v, pub in record_to_arrays(msg.content.array_records[PEERS], sender="relay").items():
            if int(v) in neighbours:
                keys[f"peer.{int(v)}"] = np.asarray(pub, dtype=np.uint8)
        cs[_RELAY_STATE] = arrays_to_record(keys)
    if stage == "sign":
        return RecordDict({SIGS: ConfigRecord(_sign_peer_keys(keys, identity, context.run_id,
                                                              z))})
    must_verify = identity is not None or (policy is not None
                                           and policy.secure_aggregation == "signed")
    if must_verify and "verified" not in keys:
        sigs = msg.content.config_records.get(SIGS)
        _check_peer_keys(keys, sigs, identity, context.run_id, z)
        keys["verified"] = np.ones(1, np.uint8)
        cs[_RELAY_STATE] = arrays_to_record(keys)
    ids = [int(v) for v in head["ids"]]
    inbox = _read_inbox(cs)
    rejected = {int(k): str(v) for k, v in cs.config_records[_REJECTED].items()}
    rounds_done = int(head["rounds-done"])
    pstate, request, log = _replay(protocol, ids, seed, inbox, rejected, rounds_done)
    private = array_to_bytes(keys["private"])

    def seal_for(v: int, origin: int, arrays: Mapping[str, np.ndarray]) -> tuple[str, np.ndarray]:
        header = {"src": z, "dst": v, "round": rounds_done, "origin": origin,
                  "action": request.action, "layout": array_layout(arrays)}
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


def _sign_peer_keys(keys: Mapping[str, np.ndarray], identity: Any, run_id: int,
                    z: int) -> dict[str, str]:
    """``{neighbour: signature (hex)}`` of this node's key for each edge; empty without an
    identity (the node then signs nothing)."""
    if identity is None:
        return {}
    own = array_to_bytes(keys["public"])
    out = {}
    for name in sorted(k for k in keys if k.startswith("peer.")):
        v = int(name[len("peer."):])
        statement = relay_key_statement(run_id, z, v, own, array_to_bytes(keys[name]))
        out[str(v)] = sign(identity.private, statement).hex()
    return out


def _check_peer_keys(keys: Mapping[str, np.ndarray], sigs: Any, identity: Any, run_id: int,
                     z: int) -> None:
    """Every neighbour's key must carry that neighbour's signature of this edge, run and
    both keys (against the identity directory); refuses the first that does not."""
    if identity is None:
        raise PolicyRefusal(f"device {z}: its policy requires signed relay keys but the node "
                            "has no identity key (node config secagg-identity-key, "
                            "secagg-directory)")
    own = array_to_bytes(keys["public"])
    for name in sorted((k for k in keys if k.startswith("peer.")),
                       key=lambda k: int(k[len("peer."):])):
        v = int(name[len("peer."):])
        pub = identity.directory.get(v)
        if pub is None:
            raise PolicyRefusal(f"device {z}: neighbour {v} has no identity key in the "
                                "directory; refusing to seal to its relay key")
        text = None if sigs is None else sigs.get(str(v))
        if text is None:
            raise PolicyRefusal(f"device {z}: the relay key of neighbour {v} comes without its "
                                "signature; refusing to seal to it")
        try:
            sig = bytes.fromhex(str(text))
        except ValueError:
            sig = b""
        statement = relay_key_statement(run_id, v, z, array_to_bytes(keys[name]), own)
        if not verify(pub, sig, statement):
            raise PolicyRefusal(f"device {z}: the relay key of neighbour {v} is not signed by "
                                f"device {v}'s identity key for this edge, run and key; "
                                "refusing to seal to it")


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
