"""One seed for a whole federated run.

``random_state`` (int, Generator or None) is turned once into a root entropy
value. Every device draws from its own stream, keyed by its *device id* and
the round, and the server from a stream of its own. So the result does not
depend on the order in which devices run or reply, and a Flower client can
rebuild its stream from the seed and its partition id alone.
"""

from __future__ import annotations

import numbers
from typing import Union

import numpy as np

from .exceptions import ValidationError

RandomState = Union[int, np.random.Generator, np.random.SeedSequence, None]

_DEVICE_BRANCH = 0
_SERVER_BRANCH = 1

__all__ = ["RandomState", "root_seed", "device_rng", "server_rng", "sklearn_seed"]


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


def server_rng(seed: int, round_index: int = 0) -> np.random.Generator:
    """The random stream of the server in one round."""
    return np.random.default_rng(
        np.random.SeedSequence(seed, spawn_key=(_SERVER_BRANCH, int(round_index))))


def sklearn_seed(rng: np.random.Generator) -> int:
    """An int seed for scikit-learn functions that take ``random_state``."""
    return int(rng.integers(0, 2**31 - 1))
