"""Secure sums: the server learns the sum of the devices' replies, never one reply.

A protocol marks the actions whose replies its server only adds up
(:attr:`Protocol.summed_actions`, e.g. distributed Lloyd's per-cluster sums
and counts). A transport with secure aggregation on runs such a round as four
exchanges (five in the signed variant below) (SecAgg+, Bell et al., CCS 2020; SecAgg, Bonawitz et al., CCS 2017):

1. ``keys`` — each device makes two X25519 key pairs for this round (``c``: to
   encrypt shares, ``s``: to agree pairwise masks) and sends the public keys;
2. ``share`` — the server sends each device the public keys of its group
   (every other device, or ``neighbors`` of them on a random circulant graph
   for large federations); the device Shamir-shares its ``s`` private key and
   a fresh self-mask seed ``b`` among the group (threshold ``t``, which the
   device computes from the group's size and its policy, never from the
   request) and sends each peer's shares AES-GCM-encrypted for that peer,
   through the server;
3. ``mask`` — the device computes its reply (the protocol's ``client_step``),
   encodes it in fixed point mod 2**64 and adds ``PRG(b)`` and, for each peer
   ``v`` still in, ``+-PRG(s_uv)`` (``+`` if its id is smaller); the pairwise
   masks cancel in the sum. It also names peers whose shares failed
   authentication (they are rejected);
4. ``unmask`` — the server names the survivors (sent a masked reply) and the
   dropped (shared keys, then sent nothing). Each survivor reveals, per group
   member, the share of ``b`` (member survived) or of ``s`` (member dropped),
   never both. The server rebuilds the seeds, checking every share beyond
   ``t`` (Reed-Solomon decoding: a holder of a wrong share is named and
   corrected), removes the masks and decodes the sum.

Each device answers every stage at most once per round and in order (a
second ``mask`` request would give the server the difference of two replies;
a second ``share`` would seal two messages under one key and nonce), and
refuses a group smaller than its minimum (a group of one would hand the
server the device's own share of its self-mask).

Up to ``floor(g / 3)`` of a group of ``g`` may drop after step 2 (default
``t = g - floor(g / 3)``, at least a strict majority); more stops the round
with one line naming the device whose masks cannot be removed. The server
code of the protocol then receives one reply, the sum, under the key
:data:`SUMMED`; it runs unchanged with and without secure aggregation.

Security (honest-but-curious server, as SecAgg+): the server sees public
keys, ciphertexts, masked vectors (uniform mod 2**64 to anyone without the
seeds) and the sum. A device sees its group's public keys and its own shares.
Fewer than ``t`` colluding group members learn nothing about a seed. Nothing
protects against devices that lie about their values (that is what robust
servers and clipping are for).

Malicious server (``SecureAggregation(signed=True)``; Bonawitz et al. 2017,
§ 6): every device holds an Ed25519 identity key whose public part every other
device knows from a directory distributed outside the server (with the TLS
certificates; :class:`DeviceIdentity`). Two additions:

* signed key advertisements — each device signs ``(round, id, c_pk, s_pk)``;
  a device verifies every peer's signature before it shares a secret, so the
  server cannot put its own keys in the middle of a pair;
* a consistency check — a fifth exchange, ``confirm``, between ``mask`` and
  ``unmask``: the server sends the survivor set, each survivor signs it (bound
  to its fresh ``s_pk``, so old signatures cannot be replayed) and signs only
  one set per round; at ``unmask`` a device reveals shares only for the set it
  signed and only with at least ``t`` valid signatures on that set from its
  group. As ``2 t > g``, the server cannot get both a dropped device's mask key
  and its self-mask seed (which would unmask its reply) by naming it dropped to
  some devices and alive to others.

A device with an identity insists on both, whatever the server asks.

The device side is :mod:`fedclust.core.secure_sum_device` (``secure_sum_client``,
re-exported here). This module does not import flwr: a transport moves the four
stages' arrays.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from .policy import group_threshold
from .random import server_rng
from .secagg import (InconsistentSharesError, array_to_bytes, bytes_to_array, decode_fixed,
                     ed25519_keypair, pair_mask_seed, prg_mask, shamir_decode)

__all__ = ["SUMMED", "STAGES", "SIGNED_STAGES", "SecureAggregation", "SecureSumServer",
           "check_summable", "DeviceIdentity", "make_identities"]

#: the key under which a summed round's single reply (the sum) reaches ``server_step``
SUMMED = -1
STAGES = ("keys", "share", "mask", "unmask")
SIGNED_STAGES = ("keys", "share", "mask", "confirm", "unmask")
STATE_PREFIX = "secagg."  # prefix of the device state entries
_SECAGG_ROUND_BRANCH = 11  # server-stream index for the neighbour graph


@dataclass(frozen=True)
class SecureAggregation:
    """Settings of secure aggregation (``secure_aggregation=`` of transports and estimators).

    Parameters
    ----------
    frac_bits : int, default=20
        Fixed-point fractional bits: each summed float is rounded to a multiple
        of ``2**-frac_bits``; the sum is exact on those values (error per entry
        at most ``n_devices * 2**-(frac_bits + 1)``) and values must stay below
        ``2**(63 - frac_bits) / n_devices`` in magnitude.
    neighbors : int or None, default=None
        Peers each device masks with and shares to (SecAgg+'s graph degree);
        ``None``: all other devices (SecAgg). A few dozen keep a 1,000-device
        round cheap.
    signed : bool, default=False
        The malicious-server variant (see the module docstring): signed key
        advertisements and a consistency check of the survivor set, one more
        exchange. Every device needs a :class:`DeviceIdentity`.
    """

    frac_bits: int = 20
    neighbors: int | None = None
    signed: bool = False

    def __post_init__(self):
        if not 0 <= int(self.frac_bits) <= 52:
            raise ValidationError(f"frac_bits={self.frac_bits} must be in [0, 52]")
        if self.neighbors is not None and int(self.neighbors) < 2:
            raise ValidationError(f"neighbors={self.neighbors} must be >= 2 (or None)")

    @classmethod
    def coerce(cls, value: Any) -> "SecureAggregation | None":
        """``True`` -> defaults, ``False``/``None`` -> off, a dict -> its fields."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**value)
        raise ValidationError(f"secure_aggregation={value!r} must be True, False or a "
                              "SecureAggregation")


@dataclass(frozen=True)
class DeviceIdentity:
    """A device's Ed25519 identity: its private key and every device's public key.

    The directory must come from outside the server (e.g. distributed with the
    TLS certificates): the signatures are worth what the directory is.
    """

    private: bytes
    directory: Mapping[int, bytes]

    def public_of(self, device_id: int, where: str) -> bytes:
        try:
            return self.directory[int(device_id)]
        except KeyError:
            raise ValidationError(f"{where}: device {device_id} has no identity key in the "
                                  "directory; refusing to share secrets with it") from None


def make_identities(device_ids: Sequence[int]) -> dict[int, DeviceIdentity]:
    """Fresh identities for simulated devices (each private key stays with its device)."""
    keys = {int(z): ed25519_keypair() for z in device_ids}
    directory = {z: pk for z, (_, pk) in keys.items()}
    return {z: DeviceIdentity(sk, directory) for z, (sk, _) in keys.items()}


def advert(round_id: int, z: int, c_pk: bytes, s_pk: bytes) -> bytes:
    return b"fedclust secagg keys" + struct.pack(">qq", int(round_id), int(z)) + c_pk + s_pk


def survivor_claim(round_id: int, s_pk: bytes, survivors: Sequence[int]) -> bytes:
    """What a survivor signs at ``confirm``: the set, bound to its fresh mask key."""
    ids = np.asarray(sorted(int(v) for v in survivors), dtype=">i8").tobytes()
    return b"fedclust secagg survivors" + struct.pack(">q", int(round_id)) + s_pk + ids


def check_summable(protocol: Any) -> frozenset[str]:
    """The protocol's summed actions; a one-line error when it has none."""
    summed = frozenset(getattr(protocol, "summed_actions", ()))
    if not summed:
        why = getattr(protocol, "not_summable_reason", "its server needs each device's reply")
        raise ValidationError(
            f"secure aggregation: protocol {protocol.name!r} has no round whose replies the "
            f"server only sums ({why}); run it without secure_aggregation")
    return summed


_threshold = group_threshold  # the same rule on the server and on every device


class SecureSumServer:
    """The server's side of one securely summed round over ``device_ids``.

    Drive it stage by stage: ``requests(stage)`` gives each device's inbound
    arrays, ``take(stage, replies)`` takes the devices' answers (``None``: no
    answer). ``failed`` / ``rejected`` name devices left out, with reasons;
    :meth:`result` returns the decoded sum (field name -> array).
    """

    def __init__(self, device_ids: Sequence[int], round_id: int, settings: SecureAggregation,
                 seed: int):
        self.ids = sorted(int(z) for z in device_ids)
        self.round_id = int(round_id)
        if len(self.ids) < 2:
            raise ValidationError(
                f"secure aggregation round {round_id}: {len(self.ids)} device(s) in the round; "
                "the sum of one reply is that reply, so at least 2 are needed")
        self.settings = settings
        self.stages = SIGNED_STAGES if settings.signed else STAGES
        self.sigs: dict[int, np.ndarray] = {}      # key advertisement signatures
        self.confirms: dict[int, np.ndarray] = {}  # survivor-set signatures
        self.pos = {z: i for i, z in enumerate(self.ids)}
        self.group = self._groups(seed)
        self.threshold = {z: _threshold(len(g)) for z, g in self.group.items()}
        self.failed: dict[int, str] = {}
        self.rejected: dict[int, str] = {}
        #: survivors whose revealed shares were inconsistent (their replies are in the sum)
        self.distrusted: dict[int, str] = {}
        self.alive = list(self.ids)
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.forward: dict[int, list[tuple[int, bytes]]] = {}
        self.shared: set[int] = set()        # devices whose shares went out
        self.bad_pairs: set[tuple[int, int]] = set()  # (holder, sender) that did not mask
        self.masked: dict[int, np.ndarray] = {}
        self.layout: str | None = None
        self.survivors: list[int] = []
        self.dropped: list[int] = []
        self._sum: dict[str, np.ndarray] | None = None

    def _groups(self, seed: int) -> dict[int, list[int]]:
        n = len(self.ids)
        k = self.settings.neighbors
        if k is None or k >= n - 1:
            return {z: list(self.ids) for z in self.ids}
        order = [self.ids[i] for i in server_rng(seed, _SECAGG_ROUND_BRANCH + self.round_id)
                 .permutation(n)]
        at = {z: i for i, z in enumerate(order)}
        half = (int(k) + 1) // 2
        return {z: sorted({order[(at[z] + d) % n] for d in range(-half, half + 1)})
                for z in self.ids}

    # -- stages ------------------------------------------------------------
    def requests(self, stage: str) -> dict[int, dict[str, np.ndarray]]:
        r = np.asarray(self.round_id, dtype=np.int64)
        alive = set(self.alive)
        out: dict[int, dict[str, np.ndarray]] = {}
        for z in self.alive:
            if stage == "keys":
                out[z] = {"round": r, "frac_bits": np.asarray(self.settings.frac_bits, np.int64),
                          "n_devices": np.asarray(len(self.ids), np.int64)}
            elif stage == "share":
                g = [v for v in self.group[z] if v in alive]
                out[z] = {"round": r, "ids": np.asarray(g, np.int64),
                          "x": np.asarray([self.pos[v] + 1 for v in g], np.int64),
                          "c_pk": np.stack([bytes_to_array(self.keys[v][0]) for v in g]),
                          "s_pk": np.stack([bytes_to_array(self.keys[v][1]) for v in g])}
                # each device computes its threshold from its group's size (never sent)
                self.threshold[z] = _threshold(len(g))
                if self.settings.signed:
                    out[z]["sig"] = np.stack([self.sigs[v] for v in g])
            elif stage == "mask":
                got = [(u, ct) for u, ct in self.forward.get(z, []) if u in alive]
                width = max((len(ct) for _, ct in got), default=0)
                ct = np.zeros((len(got), width), np.uint8)
                for i, (_, c) in enumerate(got):
                    ct[i, :len(c)] = bytes_to_array(c)
                out[z] = {"round": r, "src": np.asarray([u for u, _ in got], np.int64), "ct": ct,
                          "peers": np.asarray([v for v in self.group[z] if v in alive and v != z],
                                              np.int64)}
            elif stage == "confirm":
                out[z] = {"round": r, "survivors": np.asarray(self.survivors, np.int64)}
            elif stage == "unmask":
                out[z] = {"round": r, "survivors": np.asarray(self.survivors, np.int64),
                          "dropped": np.asarray(self.dropped, np.int64)}
                if self.settings.signed:
                    # a device counts its own group's signatures only: send those
                    signers = [v for v in sorted(self.confirms) if v in self.group[z]]
                    out[z]["signers"] = np.asarray(signers, np.int64)
                    out[z]["sigs"] = (np.stack([self.confirms[v] for v in signers]) if signers
                                      else np.zeros((0, 64), np.uint8))
            else:
                raise ValidationError(f"unknown secure aggregation stage {stage!r}")
        return out

    def take(self, stage: str, replies: Mapping[int, Mapping[str, np.ndarray] | None],
             reasons: Mapping[int, str] | None = None) -> None:
        reasons = reasons or {}
        before = list(self.alive)
        if stage == "unmask":
            self._unmask(replies, reasons)
            return
        if stage == "confirm":  # a survivor that does not sign is still in the sum
            for z, rep in replies.items():
                sig = np.asarray(rep.get("sig", np.zeros(0)))
                if z in self.survivors and sig.shape == (64,) and sig.dtype == np.uint8:
                    self.confirms[z] = sig
            return
        for z in before:
            rep = replies.get(z)
            if rep is None:
                self.failed[z] = reasons.get(z) or (f"device {z}: no answer in secure "
                                                    f"aggregation stage {stage!r}")
                continue
            try:
                getattr(self, f"_take_{stage}")(z, rep)
            except (IncompatibleMessageError, ValidationError, KeyError, ValueError,
                    TypeError) as exc:
                self.rejected[z] = (str(exc) if str(exc).startswith("device") else
                                    f"device {z}: bad secure aggregation {stage!r} reply ({exc})")
        self.alive = [z for z in before if z not in self.failed and z not in self.rejected]
        if before and not self.alive:
            why = {**self.failed, **self.rejected}
            shown = "; ".join(why[z] for z in sorted(why)[:2])
            raise TooFewReplies(f"secure aggregation round {self.round_id}: no device answered "
                                f"stage {stage!r} ({shown})", reasons=why)
        if stage == "mask":
            self.survivors = list(self.alive)
            self.dropped = [z for z in before if z not in self.alive]
        self._check_groups(stage)

    def _check_groups(self, stage: str) -> None:
        alive = set(self.alive)
        for z in (self.alive if stage in ("keys", "share") else sorted(self.shared)):
            left = len(alive.intersection(self.group[z]))
            if left < self.threshold[z]:
                raise TooFewReplies(
                    f"secure aggregation round {self.round_id}: after stage {stage!r} only "
                    f"{left} of the {len(self.group[z])} devices holding device {z}'s shares "
                    f"remain (threshold {self.threshold[z]}); too many dropped out",
                    reasons={**self.failed, **self.rejected})

    def _take_keys(self, z: int, rep: Mapping[str, np.ndarray]) -> None:
        c, s = np.asarray(rep["c_pk"]), np.asarray(rep["s_pk"])
        if c.shape != (32,) or s.shape != (32,) or c.dtype != np.uint8 or s.dtype != np.uint8:
            raise IncompatibleMessageError(f"device {z}: public keys must be 32 uint8 each")
        if self.settings.signed:
            sig = np.asarray(rep.get("sig", np.zeros(0)))
            if sig.shape != (64,) or sig.dtype != np.uint8:
                raise IncompatibleMessageError(f"device {z}: no signature of its keys (64 uint8)")
            self.sigs[z] = sig
        # kept only once the reply is whole: the others' shares are expected for these keys
        self.keys[z] = (array_to_bytes(c), array_to_bytes(s))

    def _take_share(self, z: int, rep: Mapping[str, np.ndarray]) -> None:
        dst = np.asarray(rep["dst"], dtype=np.int64)
        ct = np.asarray(rep["ct"])
        expect = sorted(v for v in self.group[z] if v in self.keys and v != z)
        if sorted(dst.tolist()) != expect or ct.dtype != np.uint8 or ct.ndim != 2 \
                or ct.shape[0] != len(dst):
            raise IncompatibleMessageError(f"device {z}: shares for {sorted(dst.tolist())}, "
                                           f"expected one per group member {expect}")
        for v, c in zip(dst.tolist(), ct):
            self.forward.setdefault(v, []).append((z, array_to_bytes(c)))
        self.shared.add(z)

    def _take_mask(self, z: int, rep: Mapping[str, np.ndarray]) -> None:
        bad = np.asarray(rep.get("bad_src", np.zeros(0, np.int64)), dtype=np.int64).tolist()
        for u in bad:  # u's shares for z failed authentication: u is out, z did not mask with u
            self.bad_pairs.add((z, u))
            if u in self.pos and u not in self.rejected:
                self.rejected[u] = (f"device {u}: its encrypted shares for device {z} failed "
                                    "authentication (altered on the way)")
        y = np.asarray(rep["y"])
        layout = array_to_bytes(rep["layout"]).decode("utf-8")
        json.loads(layout)
        if y.dtype != np.uint64 or y.ndim != 1:
            raise IncompatibleMessageError(f"device {z}: masked reply must be a uint64 vector")
        if self.layout is None:
            self.layout = layout
        elif layout != self.layout or y.size != next(iter(self.masked.values())).size:
            raise IncompatibleMessageError(
                f"device {z}: reply fields/shapes {layout} differ from the other devices' "
                f"{self.layout}")
        self.masked[z] = y

    def _unmask(self, replies, reasons) -> None:
        # a survivor that does not help unmask is still in the sum: its masks need t shares
        b_shares: dict[int, dict[int, int]] = {}
        s_shares: dict[int, dict[int, int]] = {}
        for v in self.survivors:
            rep = replies.get(v)
            if rep is None:
                continue
            ids = np.asarray(rep["ids"], np.int64).tolist()
            kinds = np.asarray(rep["kind"], np.uint8).tolist()
            shares = np.asarray(rep["share"], np.uint8)
            for u, kind, sh in zip(ids, kinds, shares):
                want = u in self.survivors if kind == 0 else u in self.dropped
                if want and v in self.group.get(u, ()):
                    (b_shares if kind == 0 else s_shares).setdefault(u, {})[self.pos[v] + 1] = \
                        int.from_bytes(array_to_bytes(sh), "big")
        length = next(iter(self.masked.values())).size if self.masked else 0
        total = np.zeros(length, np.uint64)
        for v in self.survivors:
            total += self.masked[v]
        for u in self.survivors:
            b = self._combine(u, b_shares.get(u, {}), "self-mask")
            total -= prg_mask(b, length)
        alive = set(self.survivors)
        for u in self.dropped:
            s_sk = self._combine(u, s_shares.get(u, {}), "mask key")
            for v in self.group[u]:
                if v in alive and v != u and (v, u) not in self.bad_pairs:
                    m = prg_mask(pair_mask_seed(s_sk, self.keys[v][1], self.round_id), length)
                    total = total - m if v < u else total + m
        self._sum = decode_fixed(total, self.layout or "[]", self.settings.frac_bits)

    def _combine(self, u: int, shares: Mapping[int, int], what: str) -> bytes:
        """u's seed from the revealed shares; every share beyond the threshold is checked,
        a holder whose share is inconsistent is named (and decoding corrects it)."""
        where = f"secure aggregation round {self.round_id}: device {u}'s {what}"
        try:
            s, bad = shamir_decode(shares, self.threshold[u])
        except InconsistentSharesError as exc:
            raise ValidationError(f"{where} cannot be removed: {exc}") from None
        except ValidationError:
            raise ValidationError(
                f"{where} cannot be removed: {len(shares)} shares revealed, threshold "
                f"{self.threshold[u]}") from None
        holder = {x: v for v, x in ((v, self.pos[v] + 1) for v in self.ids)}
        for x in bad:
            v = holder.get(x)
            if v is not None:
                self.distrusted.setdefault(v, f"device {v}: its revealed share of device {u}'s "
                                              f"{what} is inconsistent with the others' "
                                              "(corrected)")
        if s >= 1 << 256:
            raise ValidationError(f"{where} cannot be removed: the shares do not belong to one "
                                  "secret")
        return s.to_bytes(32, "big")

    def result(self) -> dict[str, np.ndarray]:
        """The decoded sum over :attr:`survivors` (after stage ``unmask``)."""
        if self._sum is None:
            raise ValidationError("secure sum not complete: run the 'unmask' stage first")
        return self._sum


# the device side lives in its own module; importing it here keeps one entry point
