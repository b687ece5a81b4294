"""DistributedLloyd started from given centers (``init=<array (k, d)>``)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from fedclust.baselines import DistributedLloyd
from fedclust.core.exceptions import ValidationError
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy


@pytest.fixture(scope="module")
def fed():
    rng = np.random.default_rng(11)
    means = rng.normal(scale=1.2, size=(3, 4))
    return [means[rng.integers(0, 3, size=n)] + rng.normal(size=(n, 4)) for n in (30, 45, 25, 60)]


@pytest.mark.parametrize("r", [1, 2, 5])
def test_given_start_is_sklearn_kmeans_from_the_same_centers(fed, r):
    X = np.concatenate(fed)
    C = X[[0, 40, 100]]
    km = KMeans(3, init=C, n_init=1, max_iter=r, tol=0.0, algorithm="lloyd").fit(X)
    dl = DistributedLloyd(3, init=C, max_rounds=r, tol=0.0).fit(fed)
    assert dl.n_rounds_ == km.n_iter_ == r       # no start round: every round is a Lloyd round
    np.testing.assert_allclose(dl.cluster_centers_, km.cluster_centers_, rtol=0, atol=1e-10)
    assert dl.communication_["bytes_up"] == r * len(fed) * (3 * (4 + 1) * 8 + 8)


def test_given_start_config_round_trip(fed):
    C = np.arange(12.0).reshape(3, 4)
    p = DistributedLloydProtocol(3, init=C, max_rounds=2)
    q = DistributedLloydProtocol.from_config(p.config())
    assert q.init == "given" and np.array_equal(q.init_centers, C)
    assert q.config() == p.config()
    assert all(isinstance(v, (int, float, str, bool, list)) for v in p.config().values())


@pytest.mark.parametrize("bad, what", [(np.zeros((2, 4)), "shape"), (np.zeros((3, 5)), "features"),
                                       (np.full((3, 4), np.nan), "NaN"), ("nope", "init")])
def test_bad_given_start_is_named(fed, bad, what):
    with pytest.raises(ValidationError, match=what):
        DistributedLloyd(3, init=bad).fit(fed)


def test_given_start_refused_under_privacy(fed):
    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-6, data_bound=10.0)
    with pytest.raises(ValidationError, match="privacy: init=<centers> is not available"):
        DistributedLloyd(3, init=np.zeros((3, 4)), privacy=dp).fit(fed)


def test_given_start_under_secure_aggregation_matches_plain_sums(fed):
    C = np.concatenate(fed)[[0, 40, 100]]
    plain = DistributedLloyd(3, init=C, max_rounds=3, tol=0.0).fit(fed)
    secure = DistributedLloyd(3, init=C, max_rounds=3, tol=0.0, secure_aggregation=True).fit(fed)
    assert secure.n_rounds_ == plain.n_rounds_ == 3
    # fixed-point sums: 2**-20 per device
    np.testing.assert_allclose(secure.cluster_centers_, plain.cluster_centers_, atol=1e-5)
