"""The device side of a secure sum: one answer per stage, under the device's own rules.

See :mod:`fedclust.core.secure_sum` for the protocol. Whatever the request says, a
device answers each stage at most once per round and in order, computes its
threshold from the size of the group it is given (refusing a group below its
policy's minimum), and, with an identity key, insists on the malicious-server
checks. This module does not import flwr.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .exceptions import ValidationError
from .policy import DevicePolicy
from .secagg import (SHARE_BYTES, Entropy, array_to_bytes, bytes_to_array, encode_fixed,
                     open_sealed, pair_mask_seed, prg_mask, seal, shamir_split, sign, verify,
                     x25519_keypair)
from .secure_sum import STATE_PREFIX as _P
from .secure_sum import DeviceIdentity, advert, survivor_claim

__all__ = ["secure_sum_client"]


def _check_adverts(inbound: Mapping[str, np.ndarray], ids: list[int], z: int, r: int,
                   identity: DeviceIdentity) -> None:
    """Every group member's keys must carry its identity signature (and ours be ours)."""
    if "sig" not in inbound:
        raise ValidationError(f"device {z}: the server sent its group's keys without their "
                              "signatures; refusing to share secrets")
    for i, v in enumerate(ids):
        c_pk, s_pk = array_to_bytes(inbound["c_pk"][i]), array_to_bytes(inbound["s_pk"][i])
        if not verify(identity.public_of(v, f"device {z}"), array_to_bytes(inbound["sig"][i]),
                      advert(r, v, c_pk, s_pk)):
            raise ValidationError(f"device {z}: the keys the server gives for device {v} are "
                                  "not signed by its identity key; refusing to share secrets")


def _check_confirmed(inbound: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray],
                     ids: list[int], z: int, r: int, identity: DeviceIdentity) -> None:
    """Reveal only for the survivor set this device signed, with t group signatures on it."""
    if _P + "confirmed" not in state:
        raise ValidationError(f"device {z}: asked to reveal shares before signing the survivor "
                              "set; refusing")
    mine = state[_P + "confirmed"].tolist()
    named = sorted(set(np.asarray(inbound["survivors"], np.int64).tolist()))
    if named != mine:
        raise ValidationError(f"device {z}: the server now names survivors {named[:10]}, not "
                              f"the set it signed {mine[:10]}; refusing to reveal shares")
    t = int(state[_P + "threshold"])
    good = set()
    for v, sig in zip(np.asarray(inbound.get("signers", np.zeros(0)), np.int64).tolist(),
                      inbound.get("sigs", np.zeros((0, 64), np.uint8))):
        if v in ids and v in mine and v not in good:
            s_pk = array_to_bytes(state[_P + "s_pk"][ids.index(v)])
            if verify(identity.public_of(v, f"device {z}"), array_to_bytes(sig),
                      survivor_claim(r, s_pk, mine)):
                good.add(v)
    if len(good) < t:
        raise ValidationError(f"device {z}: only {len(good)} of its group signed the survivor "
                              f"set the server names (threshold {t}); refusing to reveal shares")

def _b(state: Mapping[str, np.ndarray], key: str) -> bytes:
    return array_to_bytes(state[_P + key])


#: the stage each stage must follow on a device (``keys`` opens a round)
_AFTER = {"share": "keys", "mask": "share", "unmask": "mask"}
_SIGNED_AFTER = {"share": "keys", "mask": "share", "confirm": "mask", "unmask": "confirm"}


def _advance(stage: str, state: dict[str, np.ndarray], z: int, r: int, signed: bool,
             action: str) -> None:
    """The device's state machine: each stage at most once per round, in order, and a
    round (of an action) is keyed once (:func:`_answered` marks a stage once the device
    has answered it)."""
    after = _SIGNED_AFTER if signed else _AFTER
    if stage != "keys" and stage not in after:
        raise ValidationError(f"device {z}: unknown secure aggregation stage {stage!r}"
                              + ("" if signed else " (or a signed stage without an identity "
                                 "key)"))
    if stage == "keys":
        keyed = array_to_bytes(state.get(_P + "keyed", np.zeros(0, np.uint8))).decode()
        if f"{action}@{r}" in keyed.split(","):
            raise ValidationError(f"device {z}: secure aggregation stage 'keys' already "
                                  f"answered in round {r}" + (f" ({action})" if action else "")
                                  + "; refusing to answer it again")
        return
    if int(state.get(_P + "round", np.asarray(-1))) != r:
        raise ValidationError(f"device {z}: secure aggregation stage {stage!r} for round {r} "
                              "without its key stage")
    if array_to_bytes(state.get(_P + "action", np.zeros(0, np.uint8))).decode() != action:
        raise ValidationError(f"device {z}: secure aggregation stage {stage!r} of round {r} "
                              f"for another action than its key stage ({action!r})")
    done = array_to_bytes(state[_P + "done"]).decode("ascii").split(",")
    if stage in done:
        raise ValidationError(f"device {z}: secure aggregation stage {stage!r} already "
                              f"answered in round {r}; refusing to answer it again")
    if done[-1] != after[stage]:
        raise ValidationError(f"device {z}: secure aggregation stage {stage!r} out of order in "
                              f"round {r} (after {done[-1]!r}; it follows {after[stage]!r})")


def _answered(stage: str, state: dict[str, np.ndarray]) -> None:
    if stage != "keys":
        done = array_to_bytes(state[_P + "done"]).decode("ascii")
        state[_P + "done"] = bytes_to_array(f"{done},{stage}".encode("ascii"))


def secure_sum_client(stage: str, inbound: Mapping[str, np.ndarray],
                      state: dict[str, np.ndarray], *, device_id: int,
                      reply: Mapping[str, np.ndarray] | None = None,
                      entropy: Entropy | None = None,
                      identity: DeviceIdentity | None = None,
                      policy: DevicePolicy | None = None,
                      action: str = "") -> dict[str, np.ndarray]:
    """One device's answer to a secure aggregation stage; keeps its secrets in ``state``.

    ``reply`` (stage ``mask``) is the device's plaintext reply arrays. Private
    keys, seeds and received shares stay in ``state`` (on Flower: the
    SuperNode's ``context.state``) and never leave the device, except the
    shares revealed in stage ``unmask``. With an ``identity`` the device signs
    its keys and insists on the malicious-server checks (module docstring).

    Whatever the request says, the device answers each stage at most once per
    round (``action``: the protocol action the round sums; a round of an action
    is keyed once) and in order, computes its threshold from the size of the group it
    is given and refuses a group below its ``policy``'s minimum
    (:meth:`~fedclust.core.policy.DevicePolicy.check_group`; default: 2).
    """
    entropy = entropy or os.urandom
    policy = policy or DevicePolicy()
    z = int(device_id)
    try:
        r = int(np.asarray(inbound["round"]))
    except (KeyError, TypeError, ValueError):
        raise ValidationError(f"device {z}: secure aggregation request without a round "
                              "number") from None
    _advance(stage, state, z, r, identity is not None, str(action))
    out = _answer(stage, inbound, state, z, r, reply, entropy, identity, policy, str(action))
    _answered(stage, state)
    return out


def _answer(stage: str, inbound: Mapping[str, np.ndarray], state: dict[str, np.ndarray], z: int,
            r: int, reply: Mapping[str, np.ndarray] | None, entropy: Entropy,
            identity: DeviceIdentity | None, policy: DevicePolicy, action: str
            ) -> dict[str, np.ndarray]:
    if stage == "keys":
        keyed = array_to_bytes(state.get(_P + "keyed", np.zeros(0, np.uint8))).decode()
        for key in [k for k in state if k.startswith(_P)]:
            del state[key]
        state[_P + "keyed"] = bytes_to_array(",".join(
            [k for k in keyed.split(",") if k] + [f"{action}@{r}"]).encode())
        state[_P + "action"] = bytes_to_array(str(action).encode())
        c_sk, c_pk = x25519_keypair(entropy)
        s_sk, s_pk = x25519_keypair(entropy)
        state.update({_P + "round": np.asarray(r, np.int64),
                      _P + "done": bytes_to_array(b"keys"),
                      _P + "frac_bits": np.asarray(inbound["frac_bits"], np.int64),
                      _P + "n_devices": np.asarray(inbound["n_devices"], np.int64),
                      _P + "c_sk": bytes_to_array(c_sk), _P + "s_sk": bytes_to_array(s_sk),
                      _P + "own_s_pk": bytes_to_array(s_pk)})
        out = {"c_pk": bytes_to_array(c_pk), "s_pk": bytes_to_array(s_pk)}
        if identity is not None:
            out["sig"] = bytes_to_array(sign(identity.private, advert(r, z, c_pk, s_pk)))
        return out
    if stage == "share":
        ids = np.asarray(inbound["ids"], np.int64)
        xs = np.asarray(inbound["x"], np.int64).tolist()
        idl = ids.tolist()
        if z not in idl or len(set(idl)) != len(idl) or len(xs) != len(idl):
            raise ValidationError(f"device {z}: the group the server gives ({len(idl)} ids) "
                                  "leaves out this device or repeats a member; refusing")
        # the threshold is the device's own, from the group's size (the request's is ignored)
        t = policy.check_group(len(idl), f"device {z}")
        if identity is not None:
            _check_adverts(inbound, idl, z, r, identity)
        b = entropy(32)
        s_shares = shamir_split(_b(state, "s_sk"), xs, t, entropy)
        b_shares = shamir_split(b, xs, t, entropy)
        state.update({_P + "b": bytes_to_array(b), _P + "ids": ids,
                      _P + "x": np.asarray(xs, np.int64), _P + "threshold": np.asarray(t, np.int64),
                      _P + "c_pk": np.asarray(inbound["c_pk"], np.uint8),
                      _P + "s_pk": np.asarray(inbound["s_pk"], np.uint8)})
        dst, cts = [], []
        for i, v in enumerate(idl):
            plain = (s_shares[i].to_bytes(SHARE_BYTES, "big")
                     + b_shares[i].to_bytes(SHARE_BYTES, "big"))
            if v == z:
                state[_P + "own"] = bytes_to_array(plain)
                continue
            dst.append(v)
            # one seal per (fresh round key, direction): 'share' is answered once per round
            cts.append(bytes_to_array(seal(_b(state, "c_sk"), array_to_bytes(inbound["c_pk"][i]),
                                           z, v, r, plain)))
        return {"dst": np.asarray(dst, np.int64),
                "ct": np.stack(cts) if cts else np.zeros((0, 0), np.uint8)}
    ids = state[_P + "ids"].tolist()
    if stage == "mask":
        if reply is None:
            raise ValidationError(f"device {z}: stage 'mask' needs the device's reply")
        held, bad = {z: array_to_bytes(state[_P + "own"])}, []
        for u, ct in zip(np.asarray(inbound["src"], np.int64).tolist(), inbound["ct"]):
            if u not in ids:
                raise ValidationError(f"device {z}: shares from device {u}, not in its group")
            c_pk = array_to_bytes(state[_P + "c_pk"][ids.index(u)])
            try:
                plain = open_sealed(_b(state, "c_sk"), c_pk, u, z, r, array_to_bytes(ct))
            except ValidationError:
                bad.append(u)
                continue
            held[u] = plain
        state[_P + "held_ids"] = np.asarray(sorted(held), np.int64)
        state[_P + "held"] = np.stack([bytes_to_array(held[u]) for u in sorted(held)])
        vec, layout = encode_fixed(reply, int(state[_P + "frac_bits"]),
                                   int(state[_P + "n_devices"]), sender=f"device {z}")
        y = vec + prg_mask(_b(state, "b"), vec.size)
        s_sk = _b(state, "s_sk")
        for v in np.asarray(inbound["peers"], np.int64).tolist():
            if v == z or v in bad:
                continue
            if v not in ids:
                raise ValidationError(f"device {z}: asked to mask with device {v}, not in its group")
            m = prg_mask(pair_mask_seed(s_sk, array_to_bytes(state[_P + "s_pk"][ids.index(v)]), r),
                         vec.size)
            y = y + m if z < v else y - m
        return {"y": y, "layout": bytes_to_array(layout.encode("utf-8")),
                "bad_src": np.asarray(bad, np.int64)}
    if stage == "confirm":
        if identity is None:
            raise ValidationError(f"device {z}: a 'confirm' stage without an identity key")
        named = sorted(set(np.asarray(inbound["survivors"], np.int64).tolist()))
        if z not in named or len(set(named) & set(ids)) < int(state[_P + "threshold"]):
            raise ValidationError(f"device {z}: the survivor set {named[:10]} leaves out this "
                                  "device or leaves its group below the threshold; refusing")
        state[_P + "confirmed"] = np.asarray(named, np.int64)
        claim = survivor_claim(r, _b(state, "own_s_pk"), named)
        return {"sig": bytes_to_array(sign(identity.private, claim))}
    if stage == "unmask":
        if identity is not None:
            _check_confirmed(inbound, state, ids, z, r, identity)
        survivors = set(np.asarray(inbound["survivors"], np.int64).tolist())
        dropped = set(np.asarray(inbound["dropped"], np.int64).tolist())
        if survivors & dropped:
            raise ValidationError(f"device {z}: devices {sorted(survivors & dropped)} are named "
                                  "both survivor and dropped; refusing to reveal shares")
        t = int(state[_P + "threshold"])
        if len(survivors & set(ids)) < t:
            raise ValidationError(f"device {z}: only {len(survivors & set(ids))} survivors in its "
                                  f"group, threshold {t}; refusing to reveal shares")
        out_ids, kinds, shares = [], [], []
        for u, plain in zip(state[_P + "held_ids"].tolist(), state[_P + "held"]):
            if u in survivors:
                out_ids.append(u); kinds.append(0); shares.append(plain[SHARE_BYTES:])
            elif u in dropped:
                out_ids.append(u); kinds.append(1); shares.append(plain[:SHARE_BYTES])
        return {"ids": np.asarray(out_ids, np.int64), "kind": np.asarray(kinds, np.uint8),
                "share": (np.stack(shares) if shares else np.zeros((0, SHARE_BYTES), np.uint8))}
    raise ValidationError(f"unknown secure aggregation stage {stage!r}")
