"""The DP Gaussian classifier's class-moment round as a secure sum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust import FedGaussClassifier, FedGaussClustering
from fedclust.core.exceptions import ValidationError
from fedclust.core.secure_sum import SUMMED
from fedclust.gauss.private import PrivateGaussClassifierProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.sim.transport import InProcessTransport


def owners(seed=0, n=240, d=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.standard_normal((n, d)) + 2.5 * y[:, None]
    return np.array_split(X, 5), np.array_split(y, 5), X, y


def _fit(privacy, secure, Xs, ys, **kw):
    t = InProcessTransport(secure_aggregation=secure, **kw)
    return FedGaussClassifier(privacy=privacy, classes=[0, 1, 2], random_state=0).fit(
        Xs, ys, transport=t)


@pytest.mark.parametrize("epsilon", [math.inf, 1.0])
def test_secure_class_moments_equal_the_plain_ones(epsilon):
    Xs, ys, X, y = owners()
    dp = DifferentialPrivacy(epsilon, 1e-6, data_bound=20.0, noise_seed=3)
    a = _fit(dp, False, Xs, ys)
    b = _fit(dp, True, Xs, ys)
    # per-class sums rounded to 2**-20 on each of 5 owners; the same noise on top
    np.testing.assert_allclose(b.means_, a.means_, atol=1e-6, rtol=0)
    np.testing.assert_allclose(b.scatters_, a.scatters_, rtol=1e-5, atol=1e-4)
    assert b.communication_["secure_exchanges"] == 3
    assert b.local_counts_ == a.local_counts_ == [None] * 5   # no owner's counts released
    if not math.isfinite(epsilon):
        for c in range(3):
            np.testing.assert_allclose(b.means_[list(b.cluster_classes_).index(c)],
                                       X[y == c].mean(0), atol=1e-6)


def test_server_gets_only_the_sum_and_it_does_not_move_with_one_reply():
    Xs, ys, _, _ = owners(1)
    dp = DifferentialPrivacy(math.inf, 1e-6, data_bound=20.0)
    seen = []

    class Spy(PrivateGaussClassifierProtocol):
        def server_step(self, state, request, replies):
            seen.append({z: r.to_arrays() for z, r in replies.items()})
            super().server_step(state, request, replies)

    def shift(z, rnd, arrays):
        if z not in (0, 1):
            return arrays
        return {**arrays, "s": arrays["s"] + (0.5 if z == 0 else -0.5)}

    data = {z: (X, y) for z, (X, y) in enumerate(zip(Xs, ys))}
    for tamper in (None, shift):
        p = Spy(privacy=dp, classes=[0, 1, 2], n_features=3)
        InProcessTransport(secure_aggregation=True, tamper=tamper).run(p, data, 0)
    assert all(list(r) == [SUMMED] for r in seen)
    for field in seen[0][SUMMED]:
        np.testing.assert_array_equal(seen[0][SUMMED][field], seen[1][SUMMED][field])


def test_a_third_of_the_owners_dropping_and_the_clustering_refusal():
    Xs, ys, X, y = owners(2)
    dp = DifferentialPrivacy(math.inf, 1e-6, data_bound=20.0)
    m = _fit(dp, True, Xs, ys, drop_after_masking=[3], on_client_error="drop")
    assert sorted(m.run_log_.failed) == [3]
    rows = np.array_split(np.arange(len(y)), 5)
    keep = np.concatenate([rows[z] for z in (0, 1, 2, 4)])
    c = list(m.cluster_classes_).index(1)
    np.testing.assert_allclose(m.means_[c], X[keep][y[keep] == 1].mean(0), atol=1e-6)
    with pytest.raises(ValidationError, match="no round whose replies the server only sums"):
        FedGaussClustering().fit(Xs, transport=InProcessTransport(secure_aggregation=True))


def test_flower_message_api_gives_the_in_process_secure_model():
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    Xs, ys, _, _ = owners(3)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=20.0, noise_seed=1)
    a = _fit(dp, True, Xs, ys)
    b = FedGaussClassifier(privacy=dp, classes=[0, 1, 2], random_state=0).fit(
        Xs, ys, transport=FlowerInMemoryTransport(secure_aggregation=True))
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.scatters_, b.scatters_)


def test_feature_selection_round_is_summed_and_selects_the_same_features():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 300)
    # two informative features (one far from the origin), three noise features
    X = np.c_[y * 2.0 + rng.standard_normal(300), 1e3 + y + 0.5 * rng.standard_normal(300),
              rng.standard_normal((300, 3))]
    Xs, ys = np.array_split(X, 6), np.array_split(y, 6)
    a = FedGaussClassifier(kappa_f=0.05, random_state=0).fit(Xs, ys)
    b = FedGaussClassifier(kappa_f=0.05, random_state=0).fit(
        Xs, ys, transport=InProcessTransport(secure_aggregation=True))
    from fedclust.gauss.stats import class_moments, fisher_scores

    want = fisher_scores(*class_moments(X, y, 3))
    np.testing.assert_allclose(a.fisher_scores_, want, rtol=1e-9)
    # Σx² − n x̄² in fixed point: the offset feature keeps ~1e-3 relative precision
    np.testing.assert_allclose(b.fisher_scores_, want, rtol=1e-3)
    np.testing.assert_array_equal(a.features_, b.features_)
    assert b.features_.tolist() == [1, 1, 0, 0, 0]
    assert b.communication_["secure_exchanges"] == 3
    np.testing.assert_allclose(b.means_, a.means_)  # the cluster round is as before
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    c = FedGaussClassifier(kappa_f=0.05, random_state=0).fit(
        Xs, ys, transport=FlowerInMemoryTransport(secure_aggregation=True))
    np.testing.assert_array_equal(c.fisher_scores_, b.fisher_scores_)
    np.testing.assert_array_equal(c.means_, b.means_)


def test_secure_aggregation_keyword_is_the_secure_transport():
    """``FedGaussClassifier(secure_aggregation=True)`` runs the fit as a secure transport
    does (the whole private fit; the selection round without privacy) and says when no
    round can be summed."""
    Xs, ys, X, y = owners(4)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=20.0, noise_seed=2)
    a = FedGaussClassifier(privacy=dp, classes=[0, 1, 2], secure_aggregation=True,
                           random_state=0).fit(Xs, ys)
    b = _fit(dp, True, Xs, ys)
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.scatters_, b.scatters_)
    assert a.communication_["secure_exchanges"] == 3
    assert FedGaussClassifier(privacy=dp, classes=[0, 1, 2]).fit(
        Xs, ys).communication_.get("secure_exchanges", 0) == 0
    c = FedGaussClassifier(kappa_f=0.05, secure_aggregation=True, random_state=0).fit(Xs, ys)
    d = FedGaussClassifier(kappa_f=0.05, random_state=0).fit(
        Xs, ys, transport=InProcessTransport(secure_aggregation=True))
    np.testing.assert_array_equal(c.fisher_scores_, d.fisher_scores_)
    np.testing.assert_array_equal(c.means_, d.means_)
    assert c.communication_["secure_exchanges"] == 3
    with pytest.raises(ValidationError, match="merges each owner's evolving clusters"):
        FedGaussClassifier(kappa_f=0.0, secure_aggregation=True).fit(Xs, ys)
    with pytest.raises(ValidationError, match="secure_aggregation off"):
        FedGaussClassifier(privacy=dp, classes=[0, 1, 2], secure_aggregation=True).fit(
            Xs, ys, transport=InProcessTransport())
