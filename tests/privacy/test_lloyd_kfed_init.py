"""DistributedLloyd(init="kfed"): a k-FED round seeds Lloyd, with or without privacy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.cluster import KMeans

from conftest import KeepOutput
from fedclust.core.exceptions import ValidationError
from fedclust.lloyd import DistributedLloyd
from fedclust.privacy import DifferentialPrivacy, composed_epsilon


def federation(seed=0, Z=8, n=150, k=4, d=6, sep=10.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, sep, (k, d))
    devs = []
    for z in range(Z):
        own = rng.choice(k, size=2, replace=False)   # each device holds 2 of the k clusters
        lab = rng.choice(own, size=n)
        devs.append(centers[lab] + rng.normal(0, 1.0, (n, d)))
    return devs


def ratio(devs, C):
    X = np.vstack(devs)
    ref = KMeans(len(C), n_init=10, random_state=0).fit(X).inertia_
    return float(((X[:, None] - C[None]) ** 2).sum(-1).min(1).sum() / ref)


@pytest.mark.parametrize("seed", [0, 1])
def test_kfed_init_reaches_the_pooled_optimum(seed):
    devs = federation(seed)
    km = DistributedLloyd(4, init="kfed", random_state=seed).fit(devs)
    assert ratio(devs, km.cluster_centers_) < 1.01
    # round 0 is the k-FED round: k local centers and counts per device, no raw point
    assert km.run_log_ is not None and km.n_rounds_ == 1 + len(km.cost_history_)
    d = devs[0].shape[1]
    first = km.communication_["bytes_up"] - len(km.cost_history_) * len(devs) * (4 * (d + 1) * 8 + 8)
    assert first == len(devs) * 4 * (d * 8 + 8)


def test_private_kfed_init_is_accounted_and_clipped():
    devs = federation(2, n=400)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=30.0, noise_seed=4)
    t = KeepOutput()
    km = DistributedLloyd(n_clusters=4, rounds=5, init="kfed", privacy=dp, random_state=0).fit(
        devs, transport=t)
    rec = km.privacy_
    assert rec["releases"][0]["what"].startswith("k-FED round")
    # the k-FED moments and candidates, 5 Lloyd rounds and the first round's spread
    assert sum(r["repeats"] for r in rec["releases"]) == 2 + 5 + 1
    eps = composed_epsilon([(r["noise_multiplier"], r["repeats"]) for r in rec["releases"]], 1e-6)
    assert eps <= 2.0 and rec["epsilon_spent"] <= 2.0
    assert "clipped" not in rec   # counted on each device, kept there
    assert t.clipped(range(len(devs))) == [int((np.linalg.norm(X, axis=1) > 30.0).sum()) for X in devs]
    assert sum(t.clipped(range(len(devs)))) > 0
    assert km.cluster_centers_.shape == (4, 6) and np.isfinite(km.cluster_centers_).all()
    # same noise_seed, same run
    again = DistributedLloyd(n_clusters=4, rounds=5, init="kfed", privacy=dp,
                             random_state=0).fit(devs)
    np.testing.assert_array_equal(km.cluster_centers_, again.cluster_centers_)


def test_rounds_is_max_rounds():
    devs = federation(3)
    dp = DifferentialPrivacy(math.inf, 1e-6, data_bound=40.0)
    a = DistributedLloyd(4, rounds=2, privacy=dp, random_state=0).fit(devs)
    b = DistributedLloyd(4, max_rounds=2, privacy=dp, random_state=0).fit(devs)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.n_rounds_ == 2 + 2   # moments, candidates, two Lloyd rounds
    with pytest.raises(ValidationError, match="rounds=2 and max_rounds=3 are the same setting"):
        DistributedLloyd(4, rounds=2, max_rounds=3).fit(devs)


def test_device_level_kfed_init_is_refused():
    with pytest.raises(ValidationError) as exc:
        DistributedLloyd(4, init="kfed", privacy=DifferentialPrivacy(
            1.0, 1e-6, unit="device", data_bound=5.0, clip_norm=5.0)).fit(federation(0))
    assert "init='kfed' has no device-level DP" in str(exc.value)
    assert "\n" not in str(exc.value)
