"""Secure aggregation maths: fixed-point vectors, pairwise masks, Shamir shares.

The building blocks of :mod:`fedclust.core.secure_sum` (SecAgg / SecAgg+:
Bonawitz et al., CCS 2017; Bell et al., CCS 2020). All cryptography comes from
the ``cryptography`` library: X25519 key agreement, HKDF-SHA256 key
derivation, ChaCha20 as the seeded pseudo-random generator of the masks,
AES-GCM for the shares that travel through the server, Ed25519 for the
signatures of the malicious-server variant. Written here: the
fixed-point encoding (integers mod 2**64) and Shamir secret sharing over the
prime field GF(2**521 - 1) (polynomial evaluation and Lagrange interpolation;
no cipher).

Fixed point
    A float ``x`` travels as ``round(x * 2**frac_bits)`` in two's complement
    mod 2**64, an integer field exactly (scale 1). Sums mod 2**64 are exact, so
    the unmasked sum is the sum of the rounded values: its error per entry is at
    most ``n_devices * 2**-(frac_bits + 1)``, and it is the same on every
    transport. Each value must satisfy ``|x| * 2**frac_bits * n_devices <
    2**63`` (checked on the device, which names the field and the limit, never the value).
"""

from __future__ import annotations

import functools
import json
import os
import struct
from typing import Callable, Mapping, Sequence

import numpy as np

from .exceptions import ValidationError

__all__ = ["PRIME", "SHARE_BYTES", "Entropy", "encode_fixed", "decode_fixed", "prg_mask",
           "x25519_keypair", "agree", "shamir_split", "shamir_combine", "seal", "open_sealed",
           "layout_of", "bytes_to_array", "array_to_bytes", "ed25519_keypair", "sign",
           "verify", "shamir_decode", "InconsistentSharesError"]

#: the Mersenne prime 2**521 - 1: Shamir's field holds any 256-bit secret
PRIME = (1 << 521) - 1
SHARE_BYTES = 66  # ceil(521 / 8)
_MASK_INFO = b"fedclust secagg mask"
_SEAL_INFO = b"fedclust secagg share encryption"

#: ``entropy(n) -> n random bytes``; ``os.urandom`` unless a test pins it
Entropy = Callable[[int], bytes]


# --------------------------------------------------------------------------- fixed point
def layout_of(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, str, tuple[int, ...]]]:
    """``[(name, dtype, shape)]`` of a reply's arrays, in name order."""
    out = []
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        if a.dtype.kind not in "fiu":
            raise ValidationError(f"secure aggregation sums numbers: field {name!r} has dtype "
                                  f"{a.dtype}")
        out.append((name, a.dtype.str, tuple(int(s) for s in a.shape)))
    return out


def encode_fixed(arrays: Mapping[str, np.ndarray], frac_bits: int, n_devices: int, *,
                 sender: str = "device") -> tuple[np.ndarray, str]:
    """Arrays -> one uint64 vector (fixed point, mod 2**64) and its layout as JSON text."""
    layout = layout_of(arrays)
    limit = 2.0 ** 63 / max(int(n_devices), 1)
    parts = []
    for name, dtype, _ in layout:
        kind = "f" if np.dtype(dtype).kind == "f" else "i"
        a = np.asarray(arrays[name])
        scale = 2.0 ** frac_bits if kind == "f" else 1.0
        flat = a.astype(np.float64, copy=False).ravel() * scale
        if flat.size:
            if not np.isfinite(flat).all():
                raise ValidationError(f"{sender}: field {name!r} has non-finite values; "
                                      "secure aggregation sums finite numbers only")
            worst = float(np.abs(flat).max())
            if worst >= limit:
                # the message reaches the server: it names the limit, never the value
                raise ValidationError(
                    f"{sender}: field {name!r} has a value too large to sum over {n_devices} "
                    f"devices with frac_bits={frac_bits} (limit {limit / scale:.6g} in "
                    "magnitude); lower frac_bits")
        if kind == "i":  # integers exactly, even beyond 2**53
            parts.append(a.astype(np.int64, copy=False).ravel().view(np.uint64))
        else:
            parts.append(np.rint(flat).astype(np.int64).view(np.uint64))
    vec = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return vec, json.dumps(layout)


def decode_fixed(vec: np.ndarray, layout_json: str, frac_bits: int) -> dict[str, np.ndarray]:
    """The inverse of :func:`encode_fixed` for a sum, in the fields' dtypes (ints as int64)."""
    signed = np.asarray(vec, dtype=np.uint64).view(np.int64)
    out, at = {}, 0
    for name, dtype, shape in json.loads(layout_json):
        size = int(np.prod(shape, dtype=np.int64))
        part = signed[at:at + size].reshape(shape)
        at += size
        dt = np.dtype(dtype)
        out[name] = (np.asarray(part.astype(np.float64) / 2.0 ** frac_bits, dtype=dt)
                     if dt.kind == "f" else part.copy())
    if at != signed.size:
        raise ValidationError(f"secure sum has {signed.size} entries, its layout {at}")
    return out


# --------------------------------------------------------------------------- keys and masks
def x25519_keypair(entropy: Entropy | None = None) -> tuple[bytes, bytes]:
    """``(private, public)`` raw 32-byte X25519 keys."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                              PrivateFormat, PublicFormat)

    sk = X25519PrivateKey.from_private_bytes((entropy or os.urandom)(32))
    return (sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
            sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def agree(private: bytes, public: bytes, info: bytes) -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 over the X25519 shared secret."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import (X25519PrivateKey,
                                                                  X25519PublicKey)
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def prg_mask(seed: bytes, length: int) -> np.ndarray:
    """``length`` uint64 words of the ChaCha20 keystream of ``seed`` (32 bytes)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    enc = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(enc.update(bytes(8 * int(length))), dtype=np.uint64).copy()


def pair_mask_seed(private: bytes, public: bytes, round_id: int) -> bytes:
    return agree(private, public, _MASK_INFO + struct.pack(">q", int(round_id)))


def _nonce(src: int, dst: int) -> bytes:
    return struct.pack(">qi", int(src), int(dst) & 0x7FFFFFFF)


def seal(private: bytes, public: bytes, src: int, dst: int, round_id: int,
         plaintext: bytes) -> bytes:
    """AES-GCM encryption of ``src``'s shares for ``dst`` (key from X25519 + HKDF).

    Each direction of a pair encrypts one message per round under its own nonce.
    """
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = agree(private, public, _SEAL_INFO + struct.pack(">q", int(round_id)))
    return AESGCM(key).encrypt(_nonce(src, dst), plaintext, b"%d->%d" % (src, dst))


def open_sealed(private: bytes, public: bytes, src: int, dst: int, round_id: int,
                ciphertext: bytes) -> bytes:
    """Decrypt :func:`seal`'s output; raises ValidationError if it was altered."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key = agree(private, public, _SEAL_INFO + struct.pack(">q", int(round_id)))
    try:
        return AESGCM(key).decrypt(_nonce(src, dst), ciphertext, b"%d->%d" % (src, dst))
    except InvalidTag:
        raise ValidationError(f"the shares from device {src} to device {dst} were altered "
                              "on the way (authentication failed)") from None


# --------------------------------------------------------------------------- signatures
def ed25519_keypair() -> tuple[bytes, bytes]:
    """``(private, public)`` raw 32-byte Ed25519 identity keys."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption,
                                                              PrivateFormat, PublicFormat)

    sk = Ed25519PrivateKey.generate()
    return (sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption()),
            sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def sign(private: bytes, message: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``message``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(private).sign(message)


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """True if ``signature`` is ``public``'s Ed25519 signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# --------------------------------------------------------------------------- Shamir
def _random_below(p: int, entropy: Entropy) -> int:
    return int.from_bytes(entropy(SHARE_BYTES + 16), "big") % p  # bias < 2**-128


def shamir_split(secret: bytes, xs: Sequence[int], threshold: int,
                 entropy: Entropy | None = None) -> list[int]:
    """Shares ``f(x)`` for ``x`` in ``xs`` of a random degree ``threshold - 1``
    polynomial over GF(PRIME) with ``f(0) = secret``; any ``threshold`` of them
    give the secret back, fewer give no information about it."""
    entropy = entropy or os.urandom
    s = int.from_bytes(secret, "big")
    if s >= PRIME:
        raise ValidationError("secret too large for the Shamir field")
    if not 1 <= threshold <= len(xs):
        raise ValidationError(f"threshold={threshold} must be in [1, {len(xs)}] shares")
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ValidationError("share points must be distinct and non-zero")
    coef = [s] + [_random_below(PRIME, entropy) for _ in range(threshold - 1)]
    out = []
    for x in xs:
        y = 0
        for c in reversed(coef):  # Horner
            y = (y * x + c) % PRIME
        out.append(y)
    return out


class InconsistentSharesError(ValidationError):
    """Shares that do not lie on one polynomial of degree ``threshold - 1``.

    ``bad`` lists the share points (``x``) found inconsistent with the others
    (empty when there are too many to tell which).
    """

    def __init__(self, message: str, bad: Sequence[int] = ()):
        super().__init__(message)
        self.bad = sorted(int(x) for x in bad)


@functools.lru_cache(maxsize=256)
def _lagrange_at(xs: tuple[int, ...], at: int = 0) -> tuple[int, ...]:
    """Lagrange basis values at ``at`` for the points ``xs`` (shared by every secret
    reconstructed from the same holders)."""
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(out)


def _solve_mod(rows: list[list[int]], rhs: list[int]) -> list[int] | None:
    """One solution of ``rows @ v = rhs`` over GF(PRIME) (free unknowns 0), or None."""
    n_col = len(rows[0]) if rows else 0
    m = [r[:] + [b] for r, b in zip(rows, rhs)]
    pivots, r = [], 0
    for c in range(n_col):
        p = next((i for i in range(r, len(m)) if m[i][c] % PRIME), None)
        if p is None:
            continue
        m[r], m[p] = m[p], m[r]
        inv = pow(m[r][c], -1, PRIME)
        m[r] = [v * inv % PRIME for v in m[r]]
        for i in range(len(m)):
            if i != r and m[i][c]:
                f = m[i][c]
                m[i] = [(a - f * b) % PRIME for a, b in zip(m[i], m[r])]
        pivots.append(c)
        r += 1
    if any(row[-1] % PRIME for row in m[r:]):
        return None
    v = [0] * n_col
    for i, c in enumerate(pivots):
        v[c] = m[i][-1]
    return v


def _berlekamp_welch(pts: list[tuple[int, int]], threshold: int) -> list[int] | None:
    """Coefficients of the degree < ``threshold`` polynomial through all but at most
    ``(n - threshold) // 2`` of ``pts`` (Reed-Solomon decoding), or None."""
    e = (len(pts) - threshold) // 2
    rows, rhs = [], []
    for x, y in pts:
        powers = [pow(x, k, PRIME) for k in range(threshold + e + 1)]
        rows.append(powers[:threshold + e] + [(-y * powers[k]) % PRIME for k in range(e)])
        rhs.append(y * powers[e] % PRIME)
    sol = _solve_mod(rows, rhs)
    if sol is None:
        return None
    q, err = sol[:threshold + e], sol[threshold + e:] + [1]  # E is monic of degree e
    quotient = [0] * max(len(q) - e, 1)  # q / err, long division
    rem = q[:]
    for k in range(len(q) - 1, e - 1, -1):
        c = rem[k]
        quotient[k - e] = c
        for j in range(e + 1):
            rem[k - e + j] = (rem[k - e + j] - c * err[j]) % PRIME
    if any(rem[:e]) or any(quotient[threshold:]):
        return None
    return quotient[:threshold]


@functools.lru_cache(maxsize=64)
def _parity_check(xs: tuple[int, ...], threshold: int) -> tuple[int, ...]:
    """A secret random codeword ``(u_i g(x_i))`` of the dual of the Reed-Solomon code
    (``u_i = 1 / prod_{j != i} (x_i - x_j)``, ``g`` random of degree < n - threshold):
    ``sum_i c_i y_i = 0`` for shares ``y`` of any degree < threshold polynomial, and for
    inconsistent shares only with probability ``1 / PRIME`` (one inner product checks
    every extra share)."""
    g = [_random_below(PRIME, os.urandom) for _ in range(len(xs) - threshold)]
    out = []
    for i, xi in enumerate(xs):
        den = 1
        for j, xj in enumerate(xs):
            if i != j:
                den = den * (xi - xj) % PRIME
        out.append(pow(den, -1, PRIME) * _poly_at(g, xi) % PRIME)
    return tuple(out)


def _poly_at(coef: Sequence[int], x: int) -> int:
    y = 0
    for c in reversed(coef):
        y = (y * x + c) % PRIME
    return y


def shamir_decode(points: Mapping[int, int], threshold: int) -> tuple[int, list[int]]:
    """``(secret, bad)`` from shares ``{x: f(x)}``, checking every share beyond the
    first ``threshold``.

    All shares consistent: ``bad`` is empty. Otherwise Berlekamp-Welch decoding
    finds the polynomial through all but at most ``(n - threshold) // 2`` of them
    and ``bad`` names the others; beyond that an :class:`InconsistentSharesError`.
    """
    if len(points) < threshold:
        raise ValidationError(f"{len(points)} shares for a threshold of {threshold}: the secret "
                              "cannot be reconstructed")
    pts = sorted((int(x), int(y) % PRIME) for x, y in points.items())
    base = pts[:threshold]
    xs = tuple(x for x, _ in base)
    secret = sum(y * c for (_, y), c in zip(base, _lagrange_at(xs, 0))) % PRIME
    if len(pts) == threshold:
        return secret, []
    check = _parity_check(tuple(x for x, _ in pts), threshold)
    if sum(c * y for c, (_, y) in zip(check, pts)) % PRIME == 0:
        return secret, []
    coef = _berlekamp_welch(pts, threshold)
    bad = [] if coef is None else [x for x, y in pts if _poly_at(coef, x) != y]
    if coef is None or len(bad) > (len(pts) - threshold) // 2:
        raise InconsistentSharesError(
            f"{len(pts)} shares are inconsistent (not on one polynomial of degree "
            f"{threshold - 1}) and more than {(len(pts) - threshold) // 2} of them would have "
            "to be wrong: cannot tell which")
    return coef[0], bad


def shamir_combine(points: Mapping[int, int], threshold: int, size: int = 32, *,
                   strict: bool = False) -> bytes:
    """The secret from at least ``threshold`` shares ``{x: f(x)}``; every extra share is
    checked (:func:`shamir_decode`). ``strict``: an inconsistent share is an
    :class:`InconsistentSharesError` naming its point even when decoding corrects it."""
    s, bad = shamir_decode(points, threshold)
    if bad and strict:
        raise InconsistentSharesError(f"the shares at points {bad} are inconsistent with the "
                                      "others", bad)
    if s >= 1 << (8 * size):
        raise ValidationError("the shares do not belong to one secret (reconstruction out of "
                              "range)")
    return s.to_bytes(size, "big")


# --------------------------------------------------------------------------- wire helpers
def bytes_to_array(b: bytes) -> np.ndarray:
    return np.frombuffer(bytes(b), dtype=np.uint8).copy()


def array_to_bytes(a: np.ndarray) -> bytes:
    return np.asarray(a, dtype=np.uint8).tobytes()
