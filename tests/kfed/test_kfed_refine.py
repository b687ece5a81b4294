"""k-FED refined by distributed Lloyd rounds (``KFed(refine_rounds=r)``).

References: the same run split by hand (k-FED, then DistributedLloyd started from its
centers) and scikit-learn's KMeans started from the k-FED centers on the pooled rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust import KFed
from fedclust.baselines import DistributedLloyd
from fedclust.core.exceptions import ValidationError
from fedclust.lloyd.refine import RefinedKFedProtocol
from fedclust.privacy import DifferentialPrivacy


def _overlapping_federation(seed, k=4, d=5, n_sites=10, spread=1.8):
    """k overlapping groups; every site holds 1-3 of them in Dirichlet shares, 20-60 rows."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread, size=(k, d))
    devices = []
    for _ in range(n_sites):
        held = rng.choice(k, size=rng.integers(1, 4), replace=False)
        n = int(rng.integers(20, 61))
        g = held[rng.choice(len(held), size=n, p=rng.dirichlet(np.ones(len(held))))]
        devices.append(means[g] + rng.normal(size=(n, d)))
    return devices


def _cost(X, C):
    return float(((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum())


K = 4


@pytest.fixture(scope="module")
def fed():
    # heavily overlapping: Lloyd from the k-FED centers takes 16 iterations to settle,
    # so every r below runs exactly r rounds
    return _overlapping_federation(8, spread=1.0)


@pytest.fixture(scope="module")
def kfed_centers(fed):
    return KFed(K, random_state=7).fit(fed).cluster_centers_


@pytest.mark.parametrize("r", [1, 2, 4])
def test_refine_equals_kfed_then_distributed_lloyd_exactly(fed, kfed_centers, r):
    m = KFed(K, random_state=7, refine_rounds=r, tol=0.0).fit(fed)
    dl = DistributedLloyd(K, init=kfed_centers, max_rounds=r, tol=0.0, random_state=7).fit(fed)
    assert np.array_equal(m.kfed_centers_, kfed_centers)
    assert np.array_equal(m.cluster_centers_, dl.cluster_centers_)
    assert m.refine_cost_history_ == dl.cost_history_
    for a, b in zip(m.device_labels_, dl.device_labels_):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("r", [1, 3, 6])
def test_refine_equals_sklearn_kmeans_from_the_kfed_centers_on_pooled_rows(fed, kfed_centers, r):
    X = np.concatenate(fed)
    km = KMeans(K, init=kfed_centers, n_init=1, max_iter=r, tol=0.0, algorithm="lloyd").fit(X)
    m = KFed(K, random_state=7, refine_rounds=r, tol=0.0).fit(fed)
    assert m.communication_["refine"]["rounds"] == km.n_iter_ == r
    np.testing.assert_allclose(m.cluster_centers_, km.cluster_centers_, rtol=0, atol=1e-10)
    assert np.array_equal(m.labels_, km.predict(X))


def test_cost_never_rises_with_more_rounds(fed):
    X = np.concatenate(fed)
    costs = [_cost(X, KFed(K, random_state=2, refine_rounds=r).fit(fed).cluster_centers_)
             for r in range(6)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(costs, costs[1:])), costs
    assert costs[-1] < costs[0]     # the rounds do something on overlapping groups


def test_zero_rounds_is_plain_kfed(fed):
    a = KFed(K, random_state=4).fit(fed)
    b = KFed(K, random_state=4, refine_rounds=0).fit(fed)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.communication_ == b.communication_ and "refine" not in b.communication_


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bytes_per_round_are_counted_and_stated(fed, dtype):
    fed = [X.astype(dtype) for X in fed]
    d, Z, s = fed[0].shape[1], len(fed), np.dtype(dtype).itemsize
    plain = KFed(K, random_state=1).fit(fed).communication_
    m = KFed(K, random_state=1, refine_rounds=3, tol=0.0).fit(fed)
    ref = m.communication_["refine"]
    # sums in the data's dtype, int64 counts, a float64 cost; float64 centers down
    assert ref["bytes_up_per_device"] == K * d * s + K * 8 + 8
    assert ref["bytes_down_per_device"] == K * d * 8
    r = ref["rounds"]
    assert r == 3 and m.communication_["rounds"] == 1 + r
    assert m.communication_["bytes_up"] == plain["bytes_up"] + r * Z * ref["bytes_up_per_device"]
    assert (m.communication_["bytes_down"]
            == plain["bytes_down"] + r * Z * ref["bytes_down_per_device"])


def test_paper_server_refined_too(fed):
    X = np.concatenate(fed)
    paper = KFed(K, 2, server="farthest-lloyd1", random_state=0).fit(fed)
    refined = KFed(K, 2, server="farthest-lloyd1", random_state=0, refine_rounds=5).fit(fed)
    assert np.array_equal(refined.kfed_centers_, paper.cluster_centers_)
    assert _cost(X, refined.cluster_centers_) <= _cost(X, paper.cluster_centers_)
    # refined devices label each point by its nearest final center
    assert np.array_equal(refined.labels_, refined.predict(X))


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_bad_refine_rounds_is_named(fed, bad):
    with pytest.raises(ValidationError, match="refine_rounds"):
        KFed(K, refine_rounds=bad).fit(fed)


def test_refused_under_privacy_and_trim(fed):
    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-6, data_bound=10.0)
    with pytest.raises(ValidationError, match="privacy: refine_rounds is not available"):
        KFed(K, K, refine_rounds=2, privacy=dp).fit(fed)
    with pytest.raises(ValidationError, match="trim"):
        KFed(K, refine_rounds=2, trim=0.2).fit(fed)


def test_protocol_config_round_trip(fed):
    proto = RefinedKFedProtocol(K, 3, refine_rounds=4, server="weighted-kmeans++")
    again = RefinedKFedProtocol.from_config(proto.config())
    assert again.config() == proto.config()
    assert again.declared_rounds() == {"local_centers": 1, "lloyd": 4}


def test_forget_a_device_equals_a_fit_without_it(fed):
    ids = list(range(len(fed)))
    m = KFed(K, random_state=5, refine_rounds=3).fit(fed, device_ids=ids)
    m.forget(devices=[2])
    again = KFed(K, random_state=5, refine_rounds=3).fit(
        fed[:2] + fed[3:], device_ids=ids[:2] + ids[3:])
    assert np.array_equal(m.cluster_centers_, again.cluster_centers_)


def test_a_new_device_is_labelled_by_the_nearest_refined_center(fed):
    m = KFed(K, random_state=5, refine_rounds=2).fit(fed)
    X_new = np.random.default_rng(0).normal(size=(40, fed[0].shape[1]))
    assert np.array_equal(m.assign_device(X_new), m.predict(X_new))
