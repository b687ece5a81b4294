"""The mechanisms: clip to the user's bound, then add discrete Gaussian noise.

* :func:`clip_points` — every row to Euclidean norm ``bound`` (rows inside the
  bound are left bit-for-bit untouched); returns the count it clipped.
* :func:`clip_contribution` — one device's whole contribution (several arrays
  read as one vector, each with a weight) to norm ``bound``: all arrays are
  scaled by the same factor, so a device's centroids are unchanged and only
  its weight shrinks (device-level DP).
* :func:`gaussian` / :func:`symmetric_gaussian` — the Gaussian mechanism's
  noise, drawn from :func:`noise_rng`.

The sampler. A float64 Gaussian added to a float64 value leaks through the
low-order bits of the result (Mironov, CCS 2012), and numpy's generators are
not cryptographic. :func:`gaussian` therefore releases a point of a fixed
grid: with ``γ = 2^(⌊log2 std⌋ − GRID_BITS)`` (a power of two fixed by the
public noise std, never by the data) it returns ``γ · (round(x / γ) + Z)``,
``Z`` a discrete Gaussian on the integers of scale ``std / γ · GRID_SLACK``
(Canonne, Kamath & Steinke, NeurIPS 2020) drawn by OpenDP's exact sampler from
its cryptographic generator (OpenSSL). Everything after the draw is a
function of the integer ``round(x / γ) + Z``, so no floating-point rounding
of the data survives in the output.

Accounting. For an integer-valued statistic of L2 sensitivity Δ the discrete
Gaussian of scale σ is (Δ² / 2σ²)-zCDP, the continuous Gaussian's Rényi
curve (CKS, Theorem 14), and the sum of n independent ones, as in
distributed noise, adds a term of order ``e^(−2π² σ²/2)`` (Kairouz, Liu &
Steinke, ICML 2021), i.e. 0 at ``σ ≥ 2^GRID_BITS``; its privacy-loss
distribution equals the continuous one up to terms of the same order (Poisson
summation), so ``dp-accounting``'s Gaussian events account it. Rounding to the
grid moves each coordinate by at most γ/2, so the sensitivity of the rounded
statistic is at most ``Δ + γ √N`` for N released coordinates: in noise-std
units at most ``2^-GRID_BITS √N`` more. With noise multipliers at most
:data:`~fedclust.privacy.accounting.MAX_NOISE_MULTIPLIER` and
``N ≤ MAX_COORDINATES`` per release, scaling the noise by
:data:`GRID_SLACK` absorbs it: the rounded release is at least as private as
the accounted Gaussian of multiplier z.

Noise never comes from a run's ``random_state``: :func:`noise_rng` returns the
cryptographic source, unless the user set ``noise_seed`` (tests and
reproduction only: numpy's seeded generator then draws ``Z`` by rounding a
normal of the same scale, and **the guarantee is void**).
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Sequence, Union

import numpy as np

from ..core.exceptions import ValidationError
from .accounting import MAX_NOISE_MULTIPLIER

__all__ = ["clip_points", "clip_contribution", "noise_rng", "gaussian", "symmetric_gaussian",
           "SecureNoise", "NoiseSource", "GRID_BITS", "GRID_SLACK", "MAX_COORDINATES",
           "SERVER", "DEVICE"]

#: first element of the noise stream key: noise added by the server / by a device
SERVER = 0
DEVICE = 1

#: the noise std is 2^GRID_BITS to 2^(GRID_BITS+1) grid steps
GRID_BITS = 36
#: the most coordinates one release may have for :data:`GRID_SLACK` to cover its rounding
MAX_COORDINATES = 2 ** 30
#: noise scale factor covering the grid rounding (see the module docstring)
GRID_SLACK = 1.0 + MAX_NOISE_MULTIPLIER * math.sqrt(MAX_COORDINATES) * 2.0 ** -GRID_BITS
# grid values stay below 2^61 (int64 with room for the noise)
_MAX_GRID = 2 ** 61


class SecureNoise:
    """The privacy-noise source of an unseeded run: OpenDP's discrete Gaussian
    sampler (OpenSSL's generator) and the operating system's CSPRNG for
    uniform draws (secret sampling coins)."""

    def random(self, size: int | tuple | None = None) -> np.ndarray | float:
        """Uniform draws in [0, 1) (53 bits each) from ``os.urandom``."""
        n = int(np.prod(size)) if size is not None else 1
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        u = bits.astype(np.float64) * 2.0 ** -53
        return float(u[0]) if size is None else u.reshape(size)

    def integers_noise(self, scale: float, n: int) -> np.ndarray:
        """``n`` independent discrete Gaussians of scale ``scale`` (int64)."""
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(_opendp_sampler(float(scale))([0] * n), dtype=np.int64)


#: what :func:`noise_rng` returns: the secure source, or a seeded numpy generator (tests)
NoiseSource = Union[SecureNoise, np.random.Generator]


@lru_cache(maxsize=256)
def _opendp_sampler(scale: float):
    try:
        import opendp.prelude as odp
    except ImportError:  # pragma: no cover - part of the privacy and dev extras
        raise ImportError("differential privacy needs OpenDP's sampler: "
                          "pip install 'fedclust[privacy]' (opendp)") from None
    odp.enable_features("contrib")
    return odp.m.make_gaussian(odp.vector_domain(odp.atom_domain(T=odp.i64)),
                               odp.l2_distance(T=odp.i64), scale=scale)

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


def noise_rng(noise_seed: int | None, *key: int) -> NoiseSource:
    """The privacy-noise stream: the cryptographic :class:`SecureNoise`, or, with
    ``noise_seed`` (tests and reproduction only: **voids the guarantee**), numpy's
    generator seeded by ``noise_seed`` keyed by ``key`` (who adds it, device id,
    round) so both transports draw the same noise."""
    if noise_seed is None:
        return SecureNoise()
    return np.random.default_rng(np.random.SeedSequence(int(noise_seed),
                                                        spawn_key=tuple(int(k) for k in key)))


def _grid(std: float) -> float:
    """The grid step for noise of std ``std``: a power of two, 2^-GRID_BITS of it or finer."""
    return math.ldexp(1.0, math.floor(math.log2(std)) - GRID_BITS)


def _grid_noise(x: np.ndarray, std: float, rng: NoiseSource) -> np.ndarray:
    """``γ (round(x / γ) + Z)`` on the grid of ``std`` (see the module docstring)."""
    if not (std > 0 and math.isfinite(std)):
        raise ValidationError(f"privacy: noise std {std!r} must be a finite number > 0")
    x = np.asarray(x, dtype=np.float64)
    step = _grid(std)
    scaled = x / step
    if not np.all(np.abs(scaled) < _MAX_GRID):
        raise ValidationError(
            "privacy: a released value is not finite or more than "
            f"2^{61 - GRID_BITS} noise stds from 0; the release cannot be put on the noise grid "
            "(lower the data bound or split the federation)")
    scale = std / step * GRID_SLACK
    n = int(x.size)
    if isinstance(rng, SecureNoise):
        z = rng.integers_noise(scale, n)
    else:   # seeded (tests only): numpy's normal rounded to the grid
        z = np.rint(rng.normal(0.0, scale, size=n)).astype(np.int64)
    grid = np.rint(scaled).astype(np.int64).reshape(-1) + z
    return (grid.astype(np.float64) * step).reshape(x.shape)


def gaussian(x: np.ndarray, std: float, rng: NoiseSource) -> np.ndarray:
    """``x`` plus Gaussian noise of std ``std`` entrywise, released on the noise grid, as
    float64; ``x`` itself (no draw) when ``std == 0``."""
    if std == 0:
        return x
    return _grid_noise(x, std, rng)


def symmetric_gaussian(S: np.ndarray, std: float, rng: NoiseSource) -> np.ndarray:
    """Symmetric matrix plus noise: std ``std`` on the upper triangle (diagonal
    included), mirrored. Releasing the upper triangle of ``S`` costs no more
    than its Frobenius sensitivity."""
    if std == 0:
        return S
    S = np.asarray(S, dtype=np.float64)
    d = S.shape[0]
    iu = np.triu_indices(d)
    E = np.zeros((d, d))
    E[iu] = _grid_noise(S[iu], std, rng)
    return np.triu(E) + np.triu(E, 1).T
