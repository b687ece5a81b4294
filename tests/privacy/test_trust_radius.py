"""The trust-radius private Lloyd: sensitivity, accounting, distributed noise, quality."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.protocol import Request
from fedclust.lloyd import DistributedLloyd
from fedclust.lloyd.messages import RadiusBroadcast
from fedclust.lloyd.protocol import DistributedLloydProtocol, private_start
from fedclust.privacy import DifferentialPrivacy, composed_epsilon, noise_rng
from fedclust.privacy import kmeans as pk
from fedclust.privacy.distributed import min_noise_devices


def _release_vector(sums, counts, radius):
    d = sums.shape[1]
    return np.concatenate([sums.ravel(), pk.count_weight(radius, d) * counts])


@pytest.mark.parametrize("radius", [0.05, 0.4, 3.0])
def test_one_point_moves_the_relative_release_by_at_most_its_sensitivity(radius):
    rng = np.random.default_rng(0)
    d, B = 4, 2.0
    spec = DifferentialPrivacy(1.0, 1e-5, data_bound=B)
    X = rng.uniform(-1, 1, (60, d))
    centers = rng.uniform(-1, 1, (3, d))
    sens = pk.sums_release(spec, d, radius=radius).sensitivity
    assert sens == pytest.approx(radius * math.sqrt(1 + 1 / d))
    s, c, D, _ = pk.relative_sums(X, centers, radius, spec, spread=True)
    worst, worst_spread = 0.0, 0.0
    for i in range(len(X)):
        s1, c1, D1, _ = pk.relative_sums(np.delete(X, i, 0), centers, radius, spec, spread=True)
        worst = max(worst, float(np.linalg.norm(_release_vector(s, c, radius)
                                                - _release_vector(s1, c1, radius))))
        worst_spread = max(worst_spread, abs(D - D1))
    assert worst <= sens * (1 + 1e-12)
    assert worst_spread <= pk.spread_release(spec).sensitivity
    # a point farther than the radius from its center attains the bound
    if radius < 0.5:
        assert worst == pytest.approx(sens, rel=1e-9)
    # the sums are of x - c clipped to the radius: recomputed by hand
    labels = np.argmin(((X[:, None] - centers[None]) ** 2).sum(-1), axis=1)
    diff = X - centers[labels]
    nrm = np.linalg.norm(diff, axis=1, keepdims=True)
    diff = diff * np.minimum(1.0, radius / nrm)
    np.testing.assert_allclose(s, np.array([diff[labels == j].sum(0) for j in range(3)]))
    np.testing.assert_array_equal(c, np.bincount(labels, minlength=3))
    assert D == pytest.approx(np.minimum(nrm[:, 0], B).sum())


def test_device_level_relative_contribution_is_clipped_to_its_sensitivity():
    rng = np.random.default_rng(1)
    d, B, C, r = 3, 2.0, 5.0, 0.7
    spec = DifferentialPrivacy(1.0, 1e-5, unit="device", data_bound=B, clip_norm=C)
    X = rng.uniform(-1, 1, (400, d))
    s, c, D, clipped = pk.relative_sums(X, rng.uniform(-1, 1, (4, d)), r, spec, spread=True)
    assert clipped
    sens = pk.sums_release(spec, d, radius=r).sensitivity
    assert sens == pytest.approx(r * math.sqrt(1 + 1 / d) * C / B)
    assert np.linalg.norm(_release_vector(s, c, r)) == pytest.approx(sens)
    assert D == pytest.approx(C) and pk.spread_release(spec).sensitivity == pytest.approx(C)


@pytest.mark.parametrize("init,rounds", [("box", 2), ("candidates", 3), ("box", 4)])
def test_the_epsilon_accounted_is_the_declared_composition(init, rounds):
    d, k, T = 4, 3, rounds
    dp = DifferentialPrivacy(1.0, 1e-3, data_bound=2.0)
    p = DistributedLloydProtocol(k, init=init, max_rounds=T, privacy=dp, n_features=d)
    rel = {r.what: r for r in p.plan.releases}
    expected = ([] if init == "box" else [pk.MOMENTS]) + [pk.CANDIDATES, pk.LLOYD, pk.SPREAD,
                                                           pk.FINAL]
    assert list(rel) == expected
    assert rel[pk.LLOYD].repeats == T - 1
    # one scale z: multiplier z / sqrt(share), shares T + 1 (candidates, final),
    # 1 (middle rounds, moments) and SPREAD_SHARE (the spread)
    z = rel[pk.LLOYD].noise_multiplier
    assert rel[pk.FINAL].noise_multiplier == pytest.approx(z / math.sqrt(T + 1))
    assert rel[pk.CANDIDATES].noise_multiplier == pytest.approx(z / math.sqrt(T + 1))
    assert rel[pk.SPREAD].noise_multiplier == pytest.approx(z / math.sqrt(pk.SPREAD_SHARE))
    eps = composed_epsilon([(r.noise_multiplier, r.repeats) for r in p.plan.releases], 1e-3)
    assert eps == pytest.approx(p.plan.epsilon_spent) and eps <= 1.0
    assert eps > 0.99     # the calibration spends the budget (to its 1e-3 bisection)


def test_relative_noise_scales_with_the_radius():
    spec = DifferentialPrivacy(1.0, 1e-5, data_bound=2.0)
    rel = pk.sums_release(spec, 4, share=1.0)
    from dataclasses import replace
    rel = replace(rel, noise_multiplier=3.0)
    sums, counts = np.zeros((50, 4)), np.zeros(50)
    r = 0.25
    draws = [pk.noisy_relative_sums(sums, counts, rel, r, 2.0, noise_rng(s)) for s in range(200)]
    s_std = np.std([a for a, _ in draws])
    c_std = np.std([b for _, b in draws])
    assert s_std == pytest.approx(3.0 * r * math.sqrt(1 + 1 / 4), rel=0.03)
    # counts: std / γ, γ = r/√d: the count noise does not shrink with the radius
    assert c_std == pytest.approx(3.0 * math.sqrt(5), rel=0.05)


def test_summed_device_noise_at_a_trust_radius_has_the_central_variance():
    """Distributed noise at radius r: n_min devices' shares add up to (σ r/B)²."""
    rng = np.random.default_rng(2)
    B, r, d = 4.0, 0.5, 3
    fed = [rng.uniform(-1, 1, (30, d)) for _ in range(5)]
    n_min = min_noise_devices(len(fed))
    req = Request(2, "lloyd", RadiusBroadcast(rng.uniform(-1, 1, (4, d)), np.asarray(r)))
    noise, spread_noise = [], []
    for s in range(120):
        p = DistributedLloydProtocol(4, init="box", max_rounds=3, n_features=d,
                                     privacy=DifferentialPrivacy(1.0, 1e-5, data_bound=B,
                                                                 noise_seed=s),
                                     noise_devices=n_min)
        assert p._spread_round(1) and not p._spread_round(2)
        exact = [p._plain_step(req, X, device_id=z, seed=0, state={}) for z, X in
                 enumerate(fed[:n_min])]
        reps = [p.client_step(req, X, device_id=z, seed=0, state={}) for z, X in
                enumerate(fed[:n_min])]
        noise.append(sum(x.sums for x in reps) - sum(x.sums for x in exact))
        spread_noise.append(sum(float(x.cost) for x in reps))
    sigma = p._release(2, "lloyd").noise_std * r / B
    assert np.var(noise) / sigma ** 2 == pytest.approx(1.0, rel=0.1)
    # round 2 is not the spread round: the cost field stays 0 (nothing released)
    assert spread_noise == [0.0] * 120


def test_box_candidate_round_is_relative_at_the_box_radius_under_device_noise():
    """The box start's candidate round: sums of x − c clipped to box_radius(M, d, B),
    noise std σ·r/B summed over n_min devices; the first Lloyd round's radius is r too."""
    rng = np.random.default_rng(4)
    B, d, k = 2.0, 4, 3
    fed = [rng.uniform(-1, 1, (40, d)) for _ in range(4)]
    n_min = min_noise_devices(len(fed))
    noise = []
    for s in range(120):
        p = DistributedLloydProtocol(k, init="box", max_rounds=2, n_features=d,
                                     privacy=DifferentialPrivacy(1.0, 1e-5, data_bound=B,
                                                                 noise_seed=s),
                                     noise_devices=n_min)
        state = p.start(list(range(len(fed))), 0)
        req = p.next_request(state)
        assert req.action == "candidates"
        assert req.payload.coords.shape == (pk.BOX_CANDIDATES * k, d)
        coords = req.payload.coords
        r = pk.box_radius(len(coords), d, B)
        exact = [p._plain_step(req, X, device_id=z, seed=0, state={}) for z, X in
                 enumerate(fed[:n_min])]
        if s == 0:
            ref = [pk.relative_sums(X, coords, r, None)[0] for X in fed[:n_min]]
            np.testing.assert_allclose(sum(e.sums for e in exact), sum(ref))
        reps = [p.client_step(req, X, device_id=z, seed=0, state={}) for z, X in
                enumerate(fed[:n_min])]
        noise.append(sum(x.sums for x in reps) - sum(x.sums for x in exact))
    assert r < B and state.radius == r
    sigma = p._release(0, "candidates").noise_std * r / B
    assert np.var(noise) / sigma ** 2 == pytest.approx(1.0, rel=0.12)


def _blobs(seed, n=600, k=4, d=3):
    rng = np.random.default_rng(seed)
    means = rng.uniform(-0.6, 0.6, (k, d))
    X = means[rng.integers(0, k, n)] + 0.08 * rng.standard_normal((n, d))
    return np.clip(X, -1, 1)


def test_small_federation_quality_against_pooled_kmeans():
    """600 points in 3-D over 2 sites, ε = 1: close to pooled scikit-learn k-means."""
    from sklearn.cluster import KMeans

    ratios = []
    for seed in range(4):
        X = _blobs(seed)
        n, d = X.shape
        ref = KMeans(4, n_init=10, random_state=0).fit(X).inertia_
        dp = DifferentialPrivacy(1.0, 1 / (n * math.log(n)), data_bound=math.sqrt(d),
                                 noise_seed=seed)
        m = DistributedLloyd(4, privacy=dp, random_state=seed).fit([X[:300], X[300:]])
        C = m.cluster_centers_
        ratios.append(float((((X[:, None] - C[None]) ** 2).sum(-1)).min(1).sum()) / ref)
        assert m.privacy_["epsilon_spent"] <= 1.0
    assert np.mean(ratios) < 1.5


def test_private_start_reads_only_n_k_d_and_the_budget():
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=11.0)
    assert private_start(150, 3, 4, dp) == ("box", 2)          # noise swamps the moments
    assert private_start(5000, 15, 2, dp) == ("box", 2)        # k >= d
    assert private_start(100_000, 10, 100, dp) == ("candidates", 3)
    assert private_start(10, 3, 4, DifferentialPrivacy(math.inf, 1e-6, data_bound=1.0)) == \
        ("candidates", 3)


def test_a_server_cannot_widen_the_noise_free_part():
    """Whatever radius a server sends, the device clips to it and scales its noise by it."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (50, 2))
    p = DistributedLloydProtocol(2, init="box", max_rounds=2, n_features=2, noise_devices=2,
                                 privacy=DifferentialPrivacy(1.0, 1e-5, data_bound=1.5,
                                                             noise_seed=0))
    for r in (0.1, 1.0, 50.0):
        req = Request(1, "lloyd", RadiusBroadcast(np.zeros((2, 2)), np.asarray(r)))
        exact = p._plain_step(req, X, device_id=0, seed=0, state={})
        assert np.linalg.norm(exact.sums, axis=1).max() <= 50 * r
    with pytest.raises(Exception, match="radius"):
        RadiusBroadcast.from_arrays({"centers": np.zeros((2, 2)), "radius": np.asarray(-1.0)},
                                    sender="server")


def test_box_start_without_privacy_is_plain_lloyd_from_data_independent_candidates():
    from sklearn.cluster import KMeans

    X = _blobs(7)
    ref = KMeans(4, n_init=10, random_state=0).fit(X).inertia_
    m = DistributedLloyd(4, init="box", random_state=0).fit([X[:300], X[300:]])
    C = m.cluster_centers_
    assert float((((X[:, None] - C[None]) ** 2).sum(-1)).min(1).sum()) / ref < 1.05
    with pytest.raises(Exception, match="n_features"):
        DistributedLloydProtocol(4, init="box")
