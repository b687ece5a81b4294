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


def test_a_fit_without_new_releases_spends_what_its_prior_did_by_its_own_accountant():
    from fedclust.privacy import DifferentialPrivacy, Release, calibrate

    plain = calibrate(DifferentialPrivacy(math.inf, 1e-6, data_bound=1.0), [Release("x", 1.0)])
    assert plain.epsilon_spent == 0.0 and plain.releases[0].noise_multiplier == 0.0
    prior = (("moments", 2.0, 3, 1.7),)
    for acc in ("pld", "rdp"):
        spec = DifferentialPrivacy(50.0, 1e-6, data_bound=1.0, prior=prior, accountant=acc)
        got = calibrate(spec, []).epsilon_spent
        assert got == composed_epsilon([(1.7, 3)], 1e-6, acc)
    assert composed_epsilon([(1.7, 3)], 1e-6, "rdp") != composed_epsilon([(1.7, 3)], 1e-6, "pld")


@pytest.mark.parametrize("eps", [3.0, 8.0, 20.0])
def test_a_large_budget_is_calibrated_as_tightly_as_a_small_one(eps):
    # below multiplier 1 the bracket is found by halving: the bisection still ends
    # within 1e-3 of the multiplier that spends exactly ε, never above ε
    from fedclust.privacy import DifferentialPrivacy, Release, calibrate

    plan = calibrate(DifferentialPrivacy(eps, 1e-6, data_bound=1.0),
                     [Release("a", 1.0), Release("b", 1.0, repeats=3)])
    z = plan.releases[0].noise_multiplier
    assert plan.spec is not None and plan.releases[1].noise_multiplier == z
    spent = composed_epsilon([(z, 1), (z, 3)], 1e-6)
    assert spent == pytest.approx(plan.epsilon_spent, rel=1e-9)
    assert 0.99 * eps < spent <= eps
    assert composed_epsilon([(z / (1 + 2e-3), 1), (z / (1 + 2e-3), 3)], 1e-6) > eps
