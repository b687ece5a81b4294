"""The noise sampler: OpenDP's discrete Gaussian on a fixed power-of-two grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fedclust.core.exceptions import ValidationError
from fedclust.privacy import SecureNoise, gaussian, noise_rng, symmetric_gaussian
from fedclust.privacy.mechanisms import GRID_BITS, GRID_SLACK, _grid


def test_unseeded_noise_is_the_cryptographic_sampler_and_a_gaussian_of_that_std():
    rng = noise_rng(None, 0, 1)
    assert isinstance(rng, SecureNoise)
    x = np.full(20000, 3.25)
    y = gaussian(x, 2.0, rng)
    # Kolmogorov-Smirnov against N(3.25, (2 * slack)^2), scipy's reference CDF
    assert stats.kstest(y, "norm", args=(3.25, 2.0 * GRID_SLACK)).pvalue > 1e-4
    assert abs(np.std(y) / 2.0 - 1.0) < 0.03
    # two unseeded draws differ (fresh entropy every time)
    assert not np.array_equal(gaussian(x[:100], 2.0, noise_rng(None)),
                              gaussian(x[:100], 2.0, noise_rng(None)))


@pytest.mark.parametrize("seed", [None, 5])
def test_release_is_on_a_grid_fixed_by_the_std_alone(seed):
    std = 0.37
    step = _grid(std)
    assert step == 2.0 ** (math.floor(math.log2(std)) - GRID_BITS)
    for x in (np.array([0.1, -7.3, 1e3]), np.array([math.pi, 2.0 ** -40, 0.0])):
        y = gaussian(x, std, noise_rng(seed, 0))
        k = y / step
        assert np.array_equal(k, np.rint(k))    # every output is a grid point
    # the low bits of the data do not survive: x and x + step/4 give the same outputs
    # under the same (seeded) noise
    a = gaussian(np.array([1.0]), std, noise_rng(3, 1))
    b = gaussian(np.array([1.0 + step / 4]), std, noise_rng(3, 1))
    assert np.array_equal(a, b)


def test_seeded_mode_is_reproducible_and_keyed():
    x = np.zeros(50)
    a = gaussian(x, 1.0, noise_rng(7, 0, 2, 3))
    assert np.array_equal(a, gaussian(x, 1.0, noise_rng(7, 0, 2, 3)))
    assert not np.array_equal(a, gaussian(x, 1.0, noise_rng(7, 0, 2, 4)))


def test_symmetric_noise_and_zero_std():
    S = np.arange(9.0).reshape(3, 3)
    S = S + S.T
    E = symmetric_gaussian(S, 0.5, noise_rng(None))
    assert np.array_equal(E, E.T) and not np.array_equal(E, S)
    assert gaussian(S, 0.0, noise_rng(None)) is S


def test_a_value_off_the_grid_range_is_refused_without_the_value():
    with pytest.raises(ValidationError, match="noise grid") as err:
        gaussian(np.array([1e30]), 1.0, noise_rng(None))
    assert "1e+30" not in str(err.value) and "\n" not in str(err.value)


def test_secure_uniform_draws():
    u = SecureNoise().random(20000)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    assert isinstance(SecureNoise().random(), float)
