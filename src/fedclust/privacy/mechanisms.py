"""The mechanisms: clip to the user's bound, then add Gaussian noise.

* :func:`clip_points` — every row to Euclidean norm ``bound`` (rows inside the
  bound are left bit-for-bit untouched); returns the count it clipped.
* :func:`clip_contribution` — one device's whole contribution (several arrays
  read as one vector, each with a weight) to norm ``bound``: all arrays are
  scaled by the same factor, so a device's centroids are unchanged and only
  its weight shrinks (device-level DP).
* :func:`gaussian` / :func:`symmetric_gaussian` — the Gaussian mechanism's
  noise, drawn from :func:`noise_rng`.

Noise never comes from a run's ``random_state``: :func:`noise_rng` reads the
operating system's entropy, unless the user set ``noise_seed`` (tests and
reproduction; the guarantee is then void).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["clip_points", "clip_contribution", "noise_rng", "gaussian", "symmetric_gaussian",
           "SERVER", "DEVICE"]

#: first element of the noise stream key: noise added by the server / by a device
SERVER = 0
DEVICE = 1


def clip_points(X: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Rows of ``X`` (n, d) scaled onto the ball of radius ``bound``; (clipped X, count)."""
    sq = np.einsum("ij,ij->i", X, X)
    over = sq > bound * bound
    n = int(over.sum())
    if n == 0:
        return X, 0
    X = X.copy()
    X[over] *= (bound / np.sqrt(sq[over]))[:, None]
    return X, n


def clip_contribution(arrays: Sequence[np.ndarray], weights: Sequence[float],
                      bound: float) -> tuple[list[np.ndarray], bool]:
    """Scale all ``arrays`` by one factor so that ``||(w_i a_i)_i||_2 <= bound``.

    Returns the arrays (unchanged objects when inside the bound) and whether
    they were clipped.
    """
    norm = float(np.sqrt(sum(w * w * float(np.vdot(a, a)) for a, w in zip(arrays, weights))))
    if norm <= bound:
        return list(arrays), False
    f = bound / norm
    return [a * f for a in arrays], True


def noise_rng(noise_seed: int | None, *key: int) -> np.random.Generator:
    """The privacy-noise stream: OS entropy, or ``noise_seed`` keyed by ``key``
    (who adds it, device id, round) so both transports draw the same noise."""
    if noise_seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence(int(noise_seed),
                                                        spawn_key=tuple(int(k) for k in key)))


def gaussian(x: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """``x + N(0, std^2)`` entrywise, as float64; ``x`` itself (no draw) when ``std == 0``."""
    if std == 0:
        return x
    return np.asarray(x, dtype=np.float64) + rng.normal(0.0, std, size=np.shape(x))


def symmetric_gaussian(S: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric matrix plus noise: N(0, std^2) on the upper triangle (diagonal
    included), mirrored. Releasing the upper triangle of ``S`` costs no more
    than its Frobenius sensitivity."""
    if std == 0:
        return S
    d = S.shape[0]
    iu = np.triu_indices(d)
    E = np.zeros((d, d))
    E[iu] = rng.normal(0.0, std, size=len(iu[0]))
    E = E + np.triu(E, 1).T
    return np.asarray(S, dtype=np.float64) + E
