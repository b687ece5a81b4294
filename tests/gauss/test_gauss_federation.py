"""The protocol: server order invariance, codec, bytes, tampering, both transports."""

import numpy as np
import pytest

from fedclust import FedGaussClassifier, FedGaussClustering
from fedclust.core.messages import save_message, load_message
from fedclust.flower import FlowerInMemoryTransport
from fedclust.gauss.local import learn_local, to_message
from fedclust.gauss.messages import GaussClusters, message_numbers
from fedclust.gauss.model import Settings
from fedclust.gauss.server import merge_messages
from fedclust.gauss.stats import class_moments, moments
from fedclust.sim.transport import InProcessTransport


def blobs2d(seed=0, k=6, n=120):
    rng = np.random.default_rng(seed)
    means = np.array([[0, 0], [10, 0], [0, 10], [10, 10], [20, 5], [5, 20]], float)[:k]
    y = np.repeat(np.arange(k), n)
    X = means[y] + rng.normal(size=(len(y), 2)) @ np.array([[1.0, 0.3], [0.0, 0.7]])
    p = rng.permutation(len(y))
    return X[p], y[p]


def owners_of(X, y=None, m=3, seed=0):
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), m)
    return [X[p] for p in parts], (None if y is None else [y[p] for p in parts])


def test_server_result_does_not_depend_on_owner_order():
    X, _ = blobs2d()
    owners, _ = owners_of(X, m=4)
    s = Settings()
    msgs = [to_message(learn_local(Z, None, s, 0), 1, moments(Z)) for Z in owners]
    a = merge_messages(msgs, s, 0)
    b = merge_messages(msgs[::-1], s, 0)
    c = merge_messages([msgs[2], msgs[0], msgs[3], msgs[1]], s, 0)
    for other in (b, c):
        assert other.C == a.C
        np.testing.assert_array_equal(other.mu[:a.C], a.mu[:a.C])
        np.testing.assert_array_equal(other.S[:a.C], a.S[:a.C])
        np.testing.assert_array_equal(other.n[:a.C], a.n[:a.C])


def test_devices_permuted_with_their_ids_give_the_same_model():
    X, _ = blobs2d(1)
    owners, _ = owners_of(X)
    a = FedGaussClustering().fit(owners)
    b = FedGaussClustering().fit(owners[::-1], device_ids=[2, 1, 0])
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.device_labels_[0], b.device_labels_[2])


def test_codec_round_trip_is_bit_for_bit(tmp_path):
    X, y = blobs2d(2)
    s = Settings()
    msg = to_message(learn_local(X, y, s, 6), 1, moments(X),
                     own_class_moments=class_moments(X, y, 6))
    back = GaussClusters.from_arrays(msg.to_arrays(), sender="owner 0")
    for k, v in msg.to_arrays().items():
        np.testing.assert_array_equal(back.to_arrays()[k], v)
        assert back.to_arrays()[k].dtype == v.dtype
    save_message(msg, tmp_path / "m.npz")
    disk = load_message(tmp_path / "m.npz")
    np.testing.assert_array_equal(disk.scatters, msg.scatters)


@pytest.mark.parametrize("covariance,kappa_f", [("full", 0.0), ("diag", 0.0), ("full", 0.01)])
def test_bytes_per_owner_follow_the_formula(covariance, kappa_f):
    X, y = blobs2d(3)
    Xs, ys = owners_of(X, y)
    clf = FedGaussClassifier(covariance=covariance, kappa_f=kappa_f).fit(Xs, ys)
    D, M = 2, 6
    Ds = int(clf.features_.sum())
    stats = (2 * D + 1 + M * (2 * D + 1)) if kappa_f else 0  # the selection round
    for z, counts in enumerate(clf.local_counts_):
        c = len(counts)
        want = 8 * (message_numbers(c, Ds, M, covariance) + stats)
        width = Ds * (Ds + 1) // 2 if covariance == "full" else Ds
        assert want == 8 * (c * (Ds + width + 2 + M) + 2 * Ds + 1 + M * (2 * Ds + 1) + stats)
        assert clf.communication_["per_device"][str(z)]["up"] == want
    K = clf.n_clusters_
    down = 8 * (message_numbers(K, Ds, M, covariance) + D + (D if kappa_f else 0))
    assert clf.communication_["per_device"]["0"]["down"] == down


def _tamper(kind):
    def tamper(z, rnd, arrays):
        if z != 1:
            return arrays
        a = dict(arrays)
        if kind == "psd":
            s = a["scatters"].copy()
            s[0, 0] = -abs(s[0, 0]) - 1.0  # negative variance: not PSD
            a["scatters"] = s
        elif kind == "count":
            c = a["counts"].copy()
            c[0] = -3
            a["counts"] = c
        else:
            m = a["means"].copy()
            m[0, 0] = np.nan
            a["means"] = m
        return a
    return tamper


@pytest.mark.parametrize("kind,text", [("psd", "positive semi-definite"),
                                       ("count", "counts must be >= 1"),
                                       ("nan", "non-finite")])
def test_tampered_statistics_are_rejected_by_name_and_the_run_goes_on(kind, text):
    X, _ = blobs2d(4)
    owners, _ = owners_of(X)
    fc = FedGaussClustering().fit(owners, transport=InProcessTransport(tamper=_tamper(kind)))
    assert 1 in fc.run_log_.rejected and text in fc.run_log_.rejected[1]
    assert "device 1" in fc.run_log_.rejected[1]
    assert fc.global_count_ == len(owners[0]) + len(owners[2])
    assert np.isfinite(fc.means_).all()


def test_clustering_same_result_in_process_and_on_flower():
    X, _ = blobs2d(5)
    owners, _ = owners_of(X)
    a = FedGaussClustering().fit(owners)
    b = FedGaussClustering().fit(owners, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.scatters_, b.scatters_)
    for la, lb in zip(a.device_labels_, b.device_labels_):
        np.testing.assert_array_equal(la, lb)
    assert a.communication_["bytes_up"] == b.communication_["bytes_up"]


def test_classifier_same_result_in_process_and_on_flower():
    X, y = blobs2d(6)
    Xs, ys = owners_of(X, y)
    a = FedGaussClassifier().fit(Xs, ys)
    b = FedGaussClassifier().fit(Xs, ys, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


def test_more_rounds_keep_the_statistics_exact():
    X, _ = blobs2d(7)
    owners, _ = owners_of(X)
    one = FedGaussClustering().fit(owners)
    three = FedGaussClustering(n_rounds=3).fit(owners)
    assert three.counts_.sum() <= len(X) and three.global_count_ == len(X)
    np.testing.assert_allclose(three.global_mean_, X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(three.global_var_, X.var(0), rtol=1e-10)
    assert three.communication_["rounds"] == 3
    assert abs(three.n_clusters_ - one.n_clusters_) <= 2
