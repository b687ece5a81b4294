"""A run left without the valid replies its protocol needs stops with TooFewReplies, naming
the round and why each device gave none, on the in-process transport and on Flower's apps
(in-process grid); a cluster that keeps its model through rounds nobody answered says so."""

import numpy as np
import pytest

from fedclust import KFed, DistributedLloyd
from fedclust.core.exceptions import TooFewReplies
from fedclust.coreset import DistributedKMeans
from fedclust.fl import FedAvg, IFCA
from fedclust.gauss import FedGaussClassifier, FedGaussClustering
from fedclust.robust import RobustClusteredRegression, make_mixture_regression
from fedclust.sim.transport import InProcessTransport


def _flower(**kw):
    pytest.importorskip("flwr")
    from fedclust.flower import FlowerInMemoryTransport

    return FlowerInMemoryTransport(**kw)


def _inprocess(**kw):
    return InProcessTransport(on_client_error="drop", **kw)


TRANSPORTS = {"in-process": _inprocess, "flower": _flower}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request):
    return TRANSPORTS[request.param]


def _blobs(n_devices=6, n=30, d=3, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(n, d)) + 6.0 * (z % 3) for z in range(n_devices)]
    ys = [(X[:, 0] > np.median(X[:, 0])).astype(np.int64) for X in Xs]
    return Xs, ys


def _nan_from(first_round, devices=None):
    """Replies of ``devices`` (all: None) from ``first_round`` on carry a NaN: rejected."""
    def tamper(z, r, arrays):
        if r < first_round or (devices is not None and z not in devices):
            return arrays
        out = dict(arrays)
        for key, v in out.items():
            if v.dtype.kind == "f" and v.ndim >= 1 and v.size:
                v = v.copy()
                v.flat[0] = np.nan
                out[key] = v
                break
        return out
    return tamper


FAMILIES = {
    "kfed": lambda Xs, ys, t: KFed(3, 2, random_state=0).fit(Xs, transport=t),
    "lloyd": lambda Xs, ys, t: DistributedLloyd(3, random_state=0).fit(Xs, transport=t),
    "coreset": lambda Xs, ys, t: DistributedKMeans(3, 40, random_state=0).fit(Xs, transport=t),
    "gauss": lambda Xs, ys, t: FedGaussClustering(random_state=0).fit(Xs, transport=t),
    "gauss-classifier": lambda Xs, ys, t: FedGaussClassifier(random_state=0).fit(
        Xs, ys, transport=t),
    "fedavg": lambda Xs, ys, t: FedAvg("logistic", rounds=2, random_state=0).fit(
        Xs, ys, transport=t),
    "ifca": lambda Xs, ys, t: IFCA(2, "logistic", rounds=2, random_state=0).fit(
        Xs, ys, transport=t),
    "robust": lambda Xs, ys, t: RobustClusteredRegression(2, rounds=2, random_state=0).fit(
        Xs, [X[:, 0] * 2.0 + 0.1 * y for X, y in zip(Xs, ys)], transport=t),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_device_dropped_stops_the_run_naming_each(family, transport):
    Xs, ys = _blobs()
    ids = list(range(len(Xs)))
    with pytest.raises(TooFewReplies) as info:
        FAMILIES[family](Xs, ys, transport(dropped=ids))
    exc = info.value
    assert exc.round in (0, None)
    assert sorted(exc.reasons) == ids
    assert all("dropped out" in why for why in exc.reasons.values())
    assert "devices 0, 1, 2, 3, 4, 5: dropped out" in str(exc)


@pytest.mark.parametrize("family", ["lloyd", "coreset", "gauss-classifier", "fedavg", "ifca",
                                    "robust"])
def test_a_later_round_nobody_answers_stops_the_run(family, transport):
    """Round 0 succeeds; every reply of round 1 is rejected: the run stops at round 1 with
    each device's rejection (before, the robust pipeline kept its stage-2 models)."""
    Xs, ys = _blobs()
    with pytest.raises(TooFewReplies) as info:
        FAMILIES[family](Xs, ys, transport(tamper=_nan_from(1)))
    exc = info.value
    assert exc.round == 1
    assert str(exc).startswith("round 1: none of the")
    assert exc.reasons and all("non-finite" in why for why in exc.reasons.values())


def test_kfed_fewer_local_centers_than_clusters(transport):
    """Devices 0-3 drop out; 4 and 5 send one local center each: sum k_z = 2 < k = 3."""
    Xs, _ = _blobs()

    def one_center(z, r, arrays):   # every per-center field cut to its first row
        k_z = len(arrays["centers"])
        return {key: v[:1] if v.ndim and len(v) == k_z else v for key, v in arrays.items()}

    with pytest.raises(TooFewReplies) as info:
        KFed(3, 2, random_state=0).fit(Xs, transport=transport(dropped=[0, 1, 2, 3],
                                                               tamper=one_center))
    exc = info.value
    assert exc.round == 0
    assert "sent 2 local centers in all but n_clusters=3" in str(exc)
    assert sorted(exc.reasons) == [0, 1, 2, 3]


def test_lloyd_and_coreset_fewer_points_than_clusters(transport):
    Xs, _ = _blobs(n=1)       # one point a device
    with pytest.raises(TooFewReplies, match="the pooled sample has 2 points") as info:
        DistributedLloyd(3, random_state=0).fit(Xs, transport=transport(dropped=[0, 1, 2, 3]))
    assert sorted(info.value.reasons) == [0, 1, 2, 3]
    with pytest.raises(TooFewReplies, match="holds 2 points but n_clusters=3") as info:
        DistributedKMeans(3, 3, random_state=0).fit(
            Xs, transport=transport(dropped=[0, 1, 2, 3]))
    assert info.value.round == 1 and sorted(info.value.reasons) == [0, 1, 2, 3]


def test_robust_cluster_without_replies_keeps_its_model_and_says_so(transport):
    """Every member of one stage-2 cluster is rejected in stage 3, the other cluster's
    members answer: the run goes on, the silent cluster's model is its stage-2 centre,
    and the run log says which cluster, in how many rounds and why."""
    mix = make_mixture_regression(12, 40, 3, 2, noise=0.2, random_state=3)
    ref = RobustClusteredRegression(2, rounds=3, random_state=0).fit(mix.Xs, mix.ys)
    members = set(np.flatnonzero(ref.device_clusters_ == 0).tolist())
    r = RobustClusteredRegression(2, rounds=3, random_state=0).fit(
        mix.Xs, mix.ys, transport=transport(tamper=_nan_from(1, members)))
    np.testing.assert_array_equal(r.device_clusters_, ref.device_clusters_)
    coef = np.hstack([r.coef_, r.intercept_[:, None]])
    initial = r.stage_log_["initial_coef"]
    np.testing.assert_array_equal(coef[0], initial[0])
    assert not np.array_equal(coef[1], initial[1])
    np.testing.assert_allclose(coef[1], np.hstack([ref.coef_, ref.intercept_[:, None]])[1],
                               rtol=0, atol=1e-12)
    assert sorted(r.run_log_.rejected) == sorted(members)
    assert any("cluster 0 got no valid update in 3 of 3 stage-3 rounds" in w
               for w in r.run_log_.warnings)


def test_robust_fewer_erms_than_clusters(transport):
    mix = make_mixture_regression(5, 30, 3, 3, noise=0.2, random_state=2)
    with pytest.raises(TooFewReplies, match="only 2 machines sent an ERM but n_clusters=3") \
            as info:
        RobustClusteredRegression(3, rounds=2, random_state=0).fit(
            mix.Xs, mix.ys, transport=transport(dropped=[0, 2, 4]))
    assert info.value.round == 0 and sorted(info.value.reasons) == [0, 2, 4]
    assert "devices 0, 2, 4: dropped out (never replied)" in str(info.value)


def test_a_secure_round_nobody_answers_stops_with_the_reasons(transport):
    """Under secure aggregation a round whose every masked reply fails stops the same way:
    TooFewReplies with the round and each device's reason (not a bare ValidationError)."""
    Xs, ys = _blobs()
    with pytest.raises(TooFewReplies) as info:
        DistributedLloyd(3, random_state=0).fit(
            Xs, transport=transport(secure_aggregation=True, tamper=_nan_from(1)))
    exc = info.value
    assert exc.round == 1
    assert "no device answered stage 'mask'" in str(exc)
    assert sorted(exc.reasons) == list(range(len(Xs)))
    assert all(why.startswith(f"device {z}") for z, why in exc.reasons.items())
