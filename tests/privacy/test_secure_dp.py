"""Distributed DP noise under secure aggregation (DP Lloyd, DP-FedAvg)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import make_structured_federation

from fedclust.baselines import DistributedLloyd
from fedclust.core.exceptions import ValidationError
from fedclust.core.protocol import Request
from fedclust.core.secure_sum import SUMMED
from fedclust.lloyd.messages import CenterBroadcast
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy.distributed import min_noise_devices
from fedclust.sim.transport import InProcessTransport

B = 30.0


@pytest.fixture(scope="module")
def fed():
    devices, _, _ = make_structured_federation(k=4, k_local=2, m0=3, d=5, n_per=20, seed=3)
    return devices  # 6 devices


def test_min_noise_devices_is_the_secure_sum_threshold():
    assert [min_noise_devices(n) for n in (2, 3, 4, 6, 9, 10, 100)] == [2, 2, 3, 4, 6, 7, 67]
    with pytest.raises(ValidationError, match="at least 2 devices"):
        min_noise_devices(1)


def test_summed_device_noise_has_the_calibrated_variance(fed):
    """Over n_min devices the summed noise has the central mechanism's variance σ²
    (sums) and (σ/γ)² (counts); each device's own reply only σ²/n_min."""
    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-5, data_bound=B)
    n_min = min_noise_devices(len(fed))
    centers = np.linspace(-5, 5, 20).reshape(4, 5)
    req = Request(4, "lloyd", CenterBroadcast(centers))  # rounds 2-4 are Lloyd's: the last
    sum_noise, count_noise, own = [], [], []
    for s in range(150):
        p = DistributedLloydProtocol(4, init="candidates", max_rounds=3, n_features=5,
                                     privacy=DifferentialPrivacy(epsilon=1.0, delta=1e-5,
                                                                 data_bound=B, noise_seed=s),
                                     noise_devices=n_min)
        if s == 0:   # the exact (trust-radius) replies the noise is added to
            ref = [p._plain_step(req, X, device_id=z, seed=0, state={})
                   for z, X in enumerate(fed[:n_min])]
            ref_sums = sum(r.sums for r in ref)
            ref_counts = sum(r.counts for r in ref)
        reps = [p.client_step(req, X, device_id=z, seed=0, state={})
                for z, X in enumerate(fed[:n_min])]
        sum_noise.append(sum(r.sums for r in reps) - ref_sums)
        count_noise.append(sum(r.counts for r in reps) - ref_counts)
        own.append(reps[0].sums - ref[0].sums)
    rel = p._release(4, "lloyd")
    assert rel is p.plan.releases[-1] and p._release(3, "lloyd") is p.plan.releases[2]
    sigma = rel.noise_std
    assert sigma == DistributedLloydProtocol(4, init="candidates", max_rounds=3, n_features=5,
                                             privacy=dp).plan.releases[-1].noise_std
    gamma = B / math.sqrt(5)
    # 150 draws x 20 entries: the variance estimate is within ~4 % (2 sd)
    assert np.var(sum_noise) / sigma ** 2 == pytest.approx(1.0, rel=0.08)
    assert np.var(count_noise) / (sigma / gamma) ** 2 == pytest.approx(1.0, rel=0.2)
    assert np.var(own) / (sigma ** 2 / n_min) == pytest.approx(1.0, rel=0.08)


def test_fedavg_device_noise_adds_up_to_sigma():
    from fedclust.fl.protocol import FedAvgProtocol

    dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, unit="device", clip_norm=0.5, noise_seed=9)
    p = FedAvgProtocol(model="softmax", n_features=16, n_classes=3, rounds=2, privacy=dp,
                       secure_sum=True, noise_devices=4)
    big = np.full(p.new_model().get_params().shape, 10.0)
    clipped = big * 0.5 / np.linalg.norm(big)
    # 40 rounds (each its own noise stream) of 4 devices' updates, 51 parameters each
    noise = np.concatenate([sum(p._noisy_update(big, z, r).delta for z in range(4)) - 4 * clipped
                            for r in range(40)])
    counts = np.array([sum(float(p._noisy_update(big, z, r).count) for z in range(4)) - 4
                       for r in range(40)])
    sigma = p.plan.releases[0].noise_std
    assert np.var(noise) / sigma ** 2 == pytest.approx(1.0, rel=0.1)
    assert abs(np.mean(noise)) < 4 * sigma / math.sqrt(noise.size)
    assert np.var(counts) / (sigma / 0.5) ** 2 == pytest.approx(1.0, rel=0.6)  # 40 draws


def test_infinite_epsilon_gives_the_plain_secure_sum(fed):
    inf = DifferentialPrivacy(epsilon=math.inf, delta=1e-5, data_bound=B)
    n_min = min_noise_devices(len(fed))
    devs = dict(enumerate(fed))
    t = InProcessTransport(secure_aggregation=True)
    kw = dict(init="candidates", max_rounds=3, n_features=5, privacy=inf)
    central = t.run(DistributedLloydProtocol(4, **kw), devs, 4).result
    spread = t.run(DistributedLloydProtocol(4, noise_devices=n_min, **kw), devs, 4).result
    np.testing.assert_array_equal(central.centers, spread.centers)
    plain = InProcessTransport().run(DistributedLloydProtocol(4, **kw), devs, 4).result
    np.testing.assert_allclose(spread.centers, plain.centers, atol=1e-5)


def test_lloyd_estimator_uses_device_noise_and_the_server_sees_only_noisy_sums(fed):
    seen = []

    class Spy(DistributedLloydProtocol):
        def server_step(self, state, request, replies):
            seen.append((request.action, dict(replies)))
            super().server_step(state, request, replies)

    dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, data_bound=B, noise_seed=1)
    kw = dict(init="candidates", rounds=3, random_state=2, privacy=dp)
    m = DistributedLloyd(4, secure_aggregation=True, **kw).fit(fed)
    central = DistributedLloyd(4, **kw).fit(fed)
    assert m.privacy_["releases"] == central.privacy_["releases"]
    assert m.privacy_["epsilon_spent"] == central.privacy_["epsilon_spent"]
    assert m.communication_["secure_exchanges"] == 3 * 5  # moments, candidates, 3 Lloyd rounds
    p = Spy(4, init="candidates", max_rounds=3, n_features=5, privacy=dp, noise_devices=4)
    InProcessTransport(secure_aggregation=True).run(p, dict(enumerate(fed)), 2)
    assert [a for a, _ in seen] == ["moments", "candidates", "lloyd", "lloyd", "lloyd"]
    assert all(list(r) == [SUMMED] and int(r[SUMMED].n_devices) == 6 for _, r in seen)
    # the moments sum is noisy: its count is not the number of points
    assert float(seen[0][1][SUMMED].n) != sum(len(X) for X in fed)


def test_distributed_noise_refuses_plain_replies_and_too_few_devices(fed):
    dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, data_bound=B, noise_seed=1)
    devs = dict(enumerate(fed))
    p = DistributedLloydProtocol(4, init="candidates", max_rounds=2, n_features=5, privacy=dp,
                                 noise_devices=4)
    with pytest.raises(ValidationError, match="needs secure aggregation .* run it with "
                                              "secure_aggregation=True$"):
        InProcessTransport().run(p, devs, 0)
    p6 = DistributedLloydProtocol(4, init="candidates", max_rounds=2, n_features=5, privacy=dp,
                                  noise_devices=6)
    t = InProcessTransport(secure_aggregation=True, drop_after_masking=[2],
                           on_client_error="drop")
    with pytest.raises(ValidationError, match="holds 5 devices' noise, fewer than the 6 .* "
                                              "release would be under-noised$"):
        t.run(p6, devs, 0)
    with pytest.raises(ValidationError, match="needs privacy"):
        DistributedLloydProtocol(4, n_features=5, noise_devices=4)


def test_a_third_dropping_still_leaves_sigma(fed):
    """Two of six devices drop after masking: the four survivors' noise (each σ²/n_min,
    n_min = 4) still adds up to the calibrated σ² in the sum the server unmasks."""
    n_min = min_noise_devices(len(fed))
    assert n_min == 4
    alive = [z for z in range(len(fed)) if z not in (1, 4)]
    exact_n = sum(len(fed[z]) for z in alive)
    # each device clips its rows onto the ball of radius B
    exact_s = sum((fed[z] * np.minimum(1.0, B / np.linalg.norm(fed[z], axis=1))[:, None]
                   ).sum(axis=0) for z in alive)

    class Stop(Exception):
        pass

    class Spy(DistributedLloydProtocol):
        def server_step(self, state, request, replies):
            (summed,) = replies.values()
            seen.append((int(summed.n_devices), float(summed.n) - exact_n,
                         np.asarray(summed.s, float) - exact_s))
            raise Stop   # the moments round is all this test reads

    seen = []
    for seed in range(60):
        dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, data_bound=B, noise_seed=seed)
        p = Spy(4, init="candidates", max_rounds=3, n_features=5, privacy=dp, noise_devices=n_min)
        t = InProcessTransport(secure_aggregation=True, drop_after_masking=[1, 4],
                               on_client_error="drop")
        with pytest.raises(Stop):
            t.run(p, dict(enumerate(fed)), 2)
    sigma = p.plan.releases[0].noise_std
    assert {m for m, _, _ in seen} == {4}
    # 60 draws of the count (std σ/B²) and 300 of the sum (std σ/B): within ~3 sd
    assert np.var([c for _, c, _ in seen]) / (sigma / B ** 2) ** 2 == pytest.approx(1.0, rel=0.55)
    assert np.var([s for _, _, s in seen]) / (sigma / B) ** 2 == pytest.approx(1.0, rel=0.25)
    # and the run itself names the two and completes
    dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, data_bound=B, noise_seed=1)
    t = InProcessTransport(secure_aggregation=True, drop_after_masking=[1, 4],
                           on_client_error="drop")
    m = DistributedLloyd(4, random_state=2, privacy=dp, secure_aggregation=True).fit(
        fed, transport=t)
    assert sorted(m.run_log_.failed) == [1, 4] and np.isfinite(m.cluster_centers_).all()


def test_fedavg_distributed_noise_on_both_transports():
    pytest.importorskip("flwr")
    from fedclust.fl import FedAvg, rotated_federation
    from fedclust.flower.grid import FlowerInMemoryTransport

    fed = rotated_federation(2, n_devices=4, n_train=20, n_test=5)
    dp = DifferentialPrivacy(epsilon=50.0, delta=1e-5, unit="device", clip_norm=1.0,
                             noise_seed=2)
    kw = dict(rounds=2, lr=0.2, random_state=6, privacy=dp, secure_aggregation=True, classes=10)
    a = FedAvg("softmax", **kw).fit(fed.devices, fed.labels)
    b = FedAvg("softmax", **kw).fit(fed.devices, fed.labels,
                                     transport=FlowerInMemoryTransport(secure_aggregation=True))
    np.testing.assert_array_equal(a.models_, b.models_)
    assert np.abs(a.models_).max() > 0  # the noisy updates moved the model
    inf = DifferentialPrivacy(epsilon=math.inf, delta=1e-5, unit="device", clip_norm=1.0)
    kw.update(privacy=inf)
    c = FedAvg("softmax", **kw).fit(fed.devices, fed.labels)
    central = FedAvg("softmax", **{**kw, "secure_aggregation": False}).fit(fed.devices, fed.labels)
    np.testing.assert_allclose(c.models_, central.models_, atol=1e-5)


def test_lloyd_distributed_noise_on_both_transports(fed):
    pytest.importorskip("flwr")
    from fedclust.flower.grid import FlowerInMemoryTransport

    dp = DifferentialPrivacy(epsilon=2.0, delta=1e-5, data_bound=B, noise_seed=4)
    kw = dict(random_state=2, privacy=dp, secure_aggregation=True, max_rounds=2)
    a = DistributedLloyd(4, **kw).fit(fed[:4])
    b = DistributedLloyd(4, **kw).fit(fed[:4],
                                      transport=FlowerInMemoryTransport(secure_aggregation=True))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.communication_ == b.communication_


def test_a_devices_noise_is_fresh_every_round_and_reproducible_with_a_seed():
    """Distributed noise: each round of each device draws its own noise (noise reused
    across rounds would not compose as independent Gaussian releases)."""
    from fedclust.lloyd.messages import RadiusBroadcast

    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=3.0, noise_seed=11)
    p = DistributedLloydProtocol(2, init="box", max_rounds=5, n_features=2, privacy=dp,
                                 noise_devices=3)
    X = np.random.default_rng(0).uniform(-1, 1, (40, 2))
    C = np.array([[-0.5, 0.0], [0.5, 0.0]])

    def reply(r, device_id=0):
        req = Request(r, "lloyd", RadiusBroadcast(C, np.asarray(1.0)))
        return p.client_step(req, X, device_id=device_id, seed=0, state={})

    a, b, again = reply(2), reply(3), reply(2)
    np.testing.assert_array_equal(a.sums, again.sums)
    np.testing.assert_array_equal(a.counts, again.counts)
    assert not np.allclose(a.sums, b.sums) and not np.allclose(a.counts, b.counts)
    other = reply(2, device_id=1)
    assert not np.allclose(a.sums, other.sums)


def test_box_start_candidate_noise_is_at_the_box_radius(fed):
    """The box start's candidate round releases sums of x − c clipped to the box radius r:
    its distributed noise is the release's σ scaled by r / B on the sums and by
    (σ r / B) / (r / √d) on the counts, summed over n_min devices (noise at the data bound
    B would drown the candidates)."""
    from fedclust.privacy.kmeans import box_radius

    d, k, n_min = 5, 4, min_noise_devices(len(fed))
    sum_noise, count_noise = [], []
    for s in range(120):
        p = DistributedLloydProtocol(k, init="box", max_rounds=2, n_features=d,
                                     privacy=DifferentialPrivacy(epsilon=1.0, delta=1e-5,
                                                                 data_bound=B, noise_seed=s),
                                     noise_devices=n_min)
        state = p.start(list(range(len(fed))), 0)
        req = p.next_request(state)
        assert (req.round, req.action) == (0, "candidates")
        if s == 0:   # the exact clipped relative sums the noise is added to
            ref = [p._plain_step(req, X, device_id=z, seed=0, state={})
                   for z, X in enumerate(fed[:n_min])]
            ref_sums, ref_counts = sum(r.sums for r in ref), sum(r.counts for r in ref)
        reps = [p.client_step(req, X, device_id=z, seed=0, state={})
                for z, X in enumerate(fed[:n_min])]
        sum_noise.append(sum(r.sums for r in reps) - ref_sums)
        count_noise.append(sum(r.counts for r in reps) - ref_counts)
    r = box_radius(len(req.payload.coords), req.payload.coords.shape[1], B)
    assert r < 0.75 * B   # noise at B would have twice the variance
    std = p._release(0, "candidates").noise_std * r / B
    # 120 draws x (M x p) entries: the variance estimate is within a few percent
    assert np.var(sum_noise) / std ** 2 == pytest.approx(1.0, rel=0.1)
    assert np.var(count_noise) / (std / (r / math.sqrt(d))) ** 2 == pytest.approx(1.0, rel=0.2)


@pytest.mark.parametrize("noise_devices", [0, 3])
def test_the_lloyd_server_step_adds_central_noise_only_without_device_noise(noise_devices,
                                                                            monkeypatch):
    """A private Lloyd round's server step: with central DP (no device noise) the sums and
    counts it steps from carry the release's noise (σ r / B on the sums); with distributed
    noise (the devices added it) the server adds nothing and steps from the sums as sent."""
    import fedclust.lloyd.protocol as lp
    from fedclust.lloyd.messages import ClusterSums

    k, d, r = 3, 4, 2.0
    rng = np.random.default_rng(0)
    sums = rng.normal(size=(k, d)) * 10
    counts = np.array([40.0, 25.0, 60.0])
    seen = []
    step = lp.pk.relative_step

    def spy(centers, s, c, **kw):
        seen.append((np.array(s), np.array(c)))
        return step(centers, s, c, **kw)

    monkeypatch.setattr(lp.pk, "relative_step", spy)
    diffs = []
    for s in range(60):
        p = DistributedLloydProtocol(k, init="candidates", max_rounds=3, n_features=d,
                                     privacy=DifferentialPrivacy(epsilon=1.0, delta=1e-5,
                                                                 data_bound=B, noise_seed=s),
                                     noise_devices=noise_devices)
        state = p.start([0, 1, 2], 0)
        state.centers, state.radius = np.zeros((k, d)), r
        last = p._first_lloyd + 1           # a Lloyd round that releases no spread
        assert not p._spread_round(last)
        reply = ClusterSums(sums=sums, counts=counts, cost=np.asarray(0.0))
        p._lloyd_step(state, Request(last, "lloyd", None), [reply])
        got_sums, _ = seen[-1]
        diffs.append(got_sums - sums)
    diffs = np.array(diffs)
    if noise_devices:
        assert np.all(diffs == 0)
    else:
        std = p._release(last, "lloyd").noise_std * r / B
        assert np.var(diffs) / std ** 2 == pytest.approx(1.0, rel=0.2)
