"""The composition of Gaussian releases against the exact one: n releases of noise
multiplier z are one release of multiplier z / sqrt(n) (Dong, Roth & Su 2022, GDP)."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from fedclust.core.composition import composed_epsilon


def exact_epsilon(z: float, delta: float) -> float:
    """Balle & Wang (2018), Thm 8: the ε at which one Gaussian release of multiplier z has δ."""
    def excess(eps):
        return (norm.cdf(-eps * z + 1 / (2 * z)) - math.exp(eps) * norm.cdf(-eps * z - 1 / (2 * z))
                - delta)
    return brentq(excess, 1e-9, 200.0, xtol=1e-12)


@pytest.mark.parametrize("z,n", [(2.0, 2), (3.0, 2), (4.0, 3), (1.5, 1)])
def test_n_releases_compose_as_one_with_multiplier_over_sqrt_n(z, n):
    delta = 1e-6
    want = exact_epsilon(z / math.sqrt(n), delta)
    got = composed_epsilon([(z, n)], delta)
    # the accountant is pessimistic (never below the exact ε), by at most ~1 %
    assert want * (1 - 1e-6) <= got <= want * 1.01
    # the same as n separate releases, and as n releases sampled with probability 1
    assert composed_epsilon([(z, 1)] * n, delta) == pytest.approx(got, rel=1e-4)
    assert composed_epsilon([(z, n, 1.0)], delta) == pytest.approx(got, rel=1e-4)
