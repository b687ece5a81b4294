"""The privacy audit: empirical ε lower bounds stay below the accounted ε, and bite on
deliberately broken variants (noise off, an exact count released)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from fedclust.privacy.audit import empirical_epsilon, public_statistics

_SPEC = importlib.util.spec_from_file_location(
    "privacy_audit_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "privacy_audit.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _rr(eps, n, rng):
    """Randomized response on one bit: exactly eps-DP (delta 0); runs as statistic dicts."""
    p = math.exp(eps) / (1 + math.exp(eps))
    a = [{("bit",): float(rng.random() < 1 - p)} for _ in range(n)]
    b = [{("bit",): float(rng.random() < p)} for _ in range(n)]
    return a, b


def test_lower_bound_is_below_and_near_the_true_epsilon_of_randomized_response():
    rng = np.random.default_rng(0)
    a, b = _rr(2.0, 6000, rng)
    lb, stat = empirical_epsilon(a, b, delta=0.0)
    assert stat == ("bit",)
    assert 1.6 < lb <= 2.0          # Clopper-Pearson at 3,000 counted fits per side
    a, b = _rr(0.0, 2000, rng)
    assert empirical_epsilon(a, b, delta=0.0)[0] < 0.3


def test_public_statistics_reads_every_public_number():
    class Fitted:
        pass

    est = Fitted()
    est.centres_ = np.array([[1.0, 2.0]])
    est.counts_ = {"a": 3, "b": None}
    est.history_ = [{"loss": 0.5}]
    est._hidden_ = 9.0
    est.device_labels_ = [np.zeros(3)]      # each device's own output: not a release
    s = public_statistics(est)
    assert s[("centres_", 0)] == 1.0 and s[("centres_", "norm")] == pytest.approx(math.sqrt(5))
    assert s[("counts_", "a")] == 3.0 and s[("history_", 0, "loss")] == 0.5
    assert not [k for k in s if k[0] in ("_hidden_", "device_labels_")]


def _case(name):
    return next(c for c in bench.cases() if c["name"] == name)


@pytest.mark.parametrize("name", ["DistributedLloyd", "FedGaussClassifier"])
def test_audit_stays_below_the_accounted_epsilon(name):
    res = bench.run_case(_case(name), fits=60)
    assert res.epsilon <= bench.EPSILON
    assert res.epsilon_lower <= res.epsilon, res.row()


@pytest.mark.parametrize("variant", ["noise off", "exact count"])
def test_audit_bites_on_a_broken_variant(variant):
    res = bench.run_case(_case("DistributedLloyd"), fits=60, variant=variant)
    assert res.epsilon <= bench.EPSILON                 # what the accountant claims
    assert res.epsilon_lower > res.epsilon, res.row()   # what the fits show


@pytest.mark.slow
def test_full_audit_of_every_dp_estimator(capsys):
    rows = []
    for case in bench.cases():
        res = bench.run_case(case, fits=300)
        rows.append(res.row())
        assert res.epsilon_lower <= res.epsilon, res.row()
    for variant in ("noise off", "exact count"):
        res = bench.run_case(bench.cases()[2], fits=300, variant=variant)   # the classifier
        rows.append(res.row())
        assert res.epsilon_lower > res.epsilon, res.row()
    with capsys.disabled():
        for r in rows:
            print(f"\n{r['estimator']} | {r['release']} | {r['accounted_epsilon']:.3f} | "
                  f"{r['empirical_lower_bound']:.3f} | {r['statistic']}", end="")
        print()
