"""One seed for a whole federated run.

``random_state`` (int, Generator or None) is turned once into a root entropy
value. Every device draws from its own stream, keyed by its *device id* and
the round, and the server from a stream of its own. So the result does not
depend on the order in which devices run or reply, and a Flower client can
rebuild its stream from the seed and its partition id alone.
"""

from __future__ import annotations

import hashlib
import numbers
from typing import Sequence, Union

import numpy as np

from .exceptions import ValidationError

RandomState = Union[int, np.random.Generator, np.random.SeedSequence, None]

_DEVICE_BRANCH = 0
_SERVER_BRANCH = 1

__all__ = ["RandomState", "root_seed", "device_rng", "server_rng", "sklearn_seed",
           "device_uniforms", "row_keys", "key_uniforms",
           "key_uniforms_at", "named_device_id", "named_device_ids"]


def root_seed(random_state: RandomState) -> int:
    """Return a non-negative int from which every stream of a run is derived."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63))
    if isinstance(random_state, np.random.SeedSequence):
        return int(random_state.generate_state(2, np.uint32).view(np.uint64)[0] % (2**63))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValidationError(f"random_state={random_state} must be >= 0")
        return int(random_state)
    raise ValidationError(
        f"random_state={random_state!r} must be an int, a numpy Generator or None")


def device_rng(seed: int, device_id: int, round_index: int = 0) -> np.random.Generator:
    """The random stream of one device in one round."""
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(_DEVICE_BRANCH, int(device_id), int(round_index))))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_UNIFORMS_BRANCH = 2


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 arrays (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def device_uniforms(seed: int, device_ids, round_index: int, n: int) -> np.ndarray:
    """``n`` uniforms in [0, 1) for each device, (len(device_ids), n), in one vectorised draw.

    A counter-based stream keyed by (seed, device id, round): value j of device
    z is SplitMix64 of a key chained from the three, plus j, so a device gets
    the same numbers whether drawn alone or in a batch of any size or order,
    and no per-device generator object is built (creating 10^5 numpy
    ``SeedSequence`` generators costs seconds). k-FED's device step draws its
    k-means++ uniforms here; everything else uses :func:`device_rng`.
    """
    ids = np.asarray(device_ids, dtype=np.int64).astype(np.uint64).reshape(-1)
    with np.errstate(over="ignore"):
        key = _splitmix64(np.full(ids.shape, np.uint64(seed % (1 << 64))) ^ np.uint64(
            _UNIFORMS_BRANCH))
        key = _splitmix64(key + ids * _M1)
        key = _splitmix64(key + np.uint64(int(round_index) % (1 << 64)))
        j = np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN
        bits = _splitmix64(key[:, None] + j[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def row_keys(seed: int, owner: np.ndarray, local_index: np.ndarray,
             branch: np.uint64) -> np.ndarray:
    """A uint64 key per row from (seed, the row's device id, its index on the device) on
    the stream ``branch``: a row keeps its key whatever other rows are present."""
    with np.errstate(over="ignore"):
        base = _splitmix64(np.full(len(owner), np.uint64(seed % (1 << 64))) ^ np.uint64(branch))
        key = _splitmix64(base + np.asarray(owner).astype(np.uint64) * _M1)
        return _splitmix64(key + (np.asarray(local_index).astype(np.uint64) + np.uint64(1))
                           * _GOLDEN)


def key_uniforms(keys: np.ndarray, start: int, step: int) -> np.ndarray:
    """One uniform in [0, 1) per key for draw ``step`` of run ``start`` (counter-based:
    the same key gives the same number in any batch)."""
    return key_uniforms_steps(keys, start, np.array([step]))[0]


def key_uniforms_steps(keys: np.ndarray, start: int, steps: np.ndarray) -> np.ndarray:
    """:func:`key_uniforms` for every step of ``steps`` (m,) at once: (m, len(keys)), row i
    the uniforms of draw ``steps[i]`` of run ``start`` (the same bits)."""
    return key_uniforms_at(np.asarray(keys)[None, :], start,
                           np.asarray(steps).reshape(-1, 1))


def key_uniforms_at(keys: np.ndarray, starts, steps) -> np.ndarray:
    """:func:`key_uniforms` of each key at its own run and step: ``keys``, ``starts`` and
    ``steps`` broadcast together (the same bits as one call per run and step)."""
    with np.errstate(over="ignore"):
        code = _splitmix64((np.left_shift(np.asarray(starts, dtype=np.uint64), np.uint64(20))
                            + np.asarray(steps, dtype=np.uint64) + np.uint64(1)) * _M2)
        bits = _splitmix64(np.asarray(keys, dtype=np.uint64) ^ code)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def server_rng(seed: int, round_index: int = 0) -> np.random.Generator:
    """The random stream of the server in one round."""
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(_SERVER_BRANCH, int(round_index))))


def sklearn_seed(rng: np.random.Generator) -> int:
    """An int seed for scikit-learn functions that take ``random_state``."""
    return int(rng.integers(0, 2**31 - 1))


def named_device_id(name: str) -> int:
    """The device id of a device known by name (a site): the first 31 bits of the SHA-256 of
    its UTF-8 name, a non-negative int.

    The id keys the device's random streams, so a site draws the same numbers in every run
    that includes it, whichever other sites take part and in whatever order they are
    listed: a run without one site equals the same run with that site forgotten.
    """
    digest = hashlib.sha256(str(name).encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def named_device_ids(names: Sequence[str]) -> list[int]:
    """:func:`named_device_id` of every name, in order; two names with the same id (a
    one-in-two-billion coincidence per pair) are refused by name."""
    ids = [named_device_id(n) for n in names]
    seen: dict[int, str] = {}
    for n, z in zip(names, ids):
        if z in seen and seen[z] != n:
            raise ValidationError(f"sites {seen[z]!r} and {n!r} have the same device id {z} "
                                  "(the hash of their names); rename one of them")
        seen[z] = n
    return ids
