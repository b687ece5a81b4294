"""Differential privacy: calibration against the analytic Gaussian mechanism,
accounting, clipping, the noise's variance, ε = ∞ as the non-private run, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from conftest import KeepOutput
from fedclust import KFed
from fedclust.core.exceptions import ValidationError
from fedclust.lloyd import DistributedLloyd
from fedclust.privacy import (DifferentialPrivacy, Release, calibrate, clip_contribution,
                              clip_points, composed_epsilon, noise_rng)
from fedclust.privacy import kmeans as pk


def analytic_delta(eps: float, z: float) -> float:
    """Balle & Wang (2018), Thm 8: exact δ(ε) of the Gaussian mechanism with σ = z Δ."""
    return norm.cdf(-eps * z + 1 / (2 * z)) - math.exp(eps) * norm.cdf(-eps * z - 1 / (2 * z))


def analytic_multiplier(eps: float, delta: float) -> float:
    return brentq(lambda z: analytic_delta(eps, z) - delta, 1e-2, 1e4, xtol=1e-10)


def blobs(seed=0, Z=6, n=200, k=4, d=5, sep=8.0):
    rng = np.random.default_rng(seed)
    means = sep * rng.standard_normal((k, d)) / math.sqrt(d)
    devs = []
    for _ in range(Z):
        y = rng.integers(0, k, n)
        devs.append(means[y] + 0.5 * rng.standard_normal((n, d)))
    return devs


def cost(X, C):
    return float((((X[:, None, :] - C[None]) ** 2).sum(-1)).min(1).sum())


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-6), (0.3, 1e-5), (4.0, 1e-8)])
def test_single_release_matches_analytic_gaussian(eps, delta):
    plan = calibrate(DifferentialPrivacy(eps, delta), [Release("x", 3.0)])
    z = plan.releases[0].noise_multiplier
    z_star = analytic_multiplier(eps, delta)
    # the accountant is pessimistic: never less noise than the exact mechanism, at most ~1 % more
    assert z >= z_star * (1 - 1e-6)
    assert z <= z_star * 1.01
    assert analytic_delta(eps, z) <= delta * (1 + 1e-6)
    assert plan.releases[0].noise_std == pytest.approx(3.0 * z)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_composed_epsilon_never_exceeds_request(accountant):
    releases = [Release("moments", 200.0), Release("cand", 11.0, share=2.0),
                Release("rounds", 11.0, repeats=7)]
    for eps in (0.1, 0.5, 1.0, 3.0):
        plan = calibrate(DifferentialPrivacy(eps, 1e-6, accountant=accountant), releases)
        mult = [(r.noise_multiplier, r.repeats) for r in plan.releases]
        spent = composed_epsilon(mult, 1e-6, accountant)
        assert spent <= eps
        assert spent > 0.99 * eps            # the bisection does not waste the budget
        # the shares: multiplier ∝ 1/sqrt(share)
        assert plan.releases[0].noise_multiplier == pytest.approx(
            plan.releases[1].noise_multiplier * math.sqrt(2.0))


def test_clip_points_enforces_bound_and_counts():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 4)) * 3
    Xc, n = clip_points(X, 4.0)
    norms = np.linalg.norm(X, axis=1)
    assert n == int((norms > 4.0).sum()) > 0
    assert np.linalg.norm(Xc, axis=1).max() <= 4.0 * (1 + 1e-12)
    inside = norms <= 4.0
    assert np.array_equal(Xc[inside], X[inside])                  # untouched, bit for bit
    # clipped rows keep their direction
    cos = (Xc[~inside] * X[~inside]).sum(1) / (np.linalg.norm(Xc[~inside], axis=1) * norms[~inside])
    assert np.allclose(cos, 1.0)


def test_clip_contribution_scales_jointly():
    a, b = np.full((3, 2), 2.0), np.array([4.0, 1.0, 1.0])
    (a2, b2), clipped = clip_contribution([a, b], [1.0, 0.5], 1.0)
    assert clipped
    assert math.sqrt(np.vdot(a2, a2) + 0.25 * np.vdot(b2, b2)) == pytest.approx(1.0)
    assert np.allclose(a2 / a, (b2 / b)[0])  # one factor for everything
    (a3, _), clipped = clip_contribution([a, b], [1.0, 0.5], 100.0)
    assert not clipped and a3 is a


def test_device_clipping_counted_per_device():
    """ε = ∞ and a bound that clips many points: the fit is the non-private fit on the
    points clipped by hand (so the clipped rows, not the raw ones, are summed), and each
    device counts its own clipped points."""
    devs = blobs(1)
    bound = 2.0
    t = KeepOutput()
    dl = DistributedLloyd(4, max_rounds=4, privacy=DifferentialPrivacy(
        math.inf, 1e-6, data_bound=bound), random_state=0).fit(devs, transport=t)
    norms = [np.linalg.norm(X, axis=1) for X in devs]
    assert "clipped" not in dl.privacy_     # counted on each device, kept there
    clipped = t.clipped(range(len(devs)))
    assert clipped == [int((r > bound).sum()) for r in norms]
    assert sum(clipped) > 0.3 * sum(len(X) for X in devs)
    by_hand = [X * np.minimum(1.0, bound / r)[:, None] for X, r in zip(devs, norms)]
    ref = DistributedLloyd(4, max_rounds=4, tol=0.0, init="candidates", random_state=0
                           ).fit(by_hand)
    np.testing.assert_allclose(dl.cluster_centers_, ref.cluster_centers_, rtol=0, atol=1e-12)
    assert np.linalg.norm(dl.cluster_centers_, axis=1).max() <= bound * (1 + 1e-12)


def test_noise_variance_matches_calibration():
    spec = DifferentialPrivacy(0.7, 1e-6, data_bound=3.0)
    d = 4
    plan = calibrate(spec, [pk.moments_release(spec), pk.sums_release(spec, d)])
    mom, sums_rel = plan.releases
    sums, counts = np.zeros((2, d)), np.zeros(2)
    draws = [pk.noisy_cluster_sums(sums, counts, sums_rel, 3.0, noise_rng(s)) for s in range(3000)]
    S = np.stack([s for s, _ in draws])
    N = np.stack([c for _, c in draws])
    # sample std of 3000 Gaussian draws is within ~3 % of the truth at 4 sigma over 8 coords
    assert S.std(axis=0) == pytest.approx(np.full((2, d), sums_rel.noise_std), rel=0.06)
    assert N.std(axis=0) == pytest.approx(np.full(2, sums_rel.noise_std * math.sqrt(d) / 3.0),
                                          rel=0.06)
    Q = np.zeros((d, d))
    mq = [pk.noisy_moments(0.0, np.zeros(d), Q, mom, 3.0, noise_rng(s)) for s in range(2000)]
    Qs = np.stack([m[2] for m in mq])
    assert np.allclose(Qs, np.swapaxes(Qs, 1, 2))                           # symmetric release
    assert Qs.std(axis=0) == pytest.approx(np.full((d, d), mom.noise_std), rel=0.07)
    assert np.std([m[0] for m in mq]) == pytest.approx(mom.noise_std / 9.0, rel=0.07)
    assert mom.sensitivity == 2 * 3.0 ** 2      # ‖a aᵀ‖_F = ‖a‖², a = (B, x)


def test_infinite_epsilon_is_the_non_private_run_bit_for_bit():
    devs = blobs(2)
    bound = 1e6
    a = DistributedLloyd(4, init="candidates", max_rounds=6, random_state=3).fit(devs)
    b = DistributedLloyd(4, init="candidates", max_rounds=6, random_state=3, privacy=(
        DifferentialPrivacy(math.inf, 1e-6, data_bound=bound))).fit(devs)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.cost_history_ == b.cost_history_
    assert all(r["noise_std"] == 0 for r in b.privacy_["releases"])


def test_noise_seed_reproduces_and_os_noise_differs():
    devs = blobs(3)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=4.0, noise_seed=5)
    a = DistributedLloyd(4, privacy=dp, random_state=0).fit(devs).cluster_centers_
    b = DistributedLloyd(4, privacy=dp, random_state=0).fit(devs).cluster_centers_
    c = DistributedLloyd(4, privacy=DifferentialPrivacy(1.0, 1e-6, data_bound=4.0),
                         random_state=0).fit(devs).cluster_centers_
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_dp_lloyd_quality_and_privacy_record():
    devs = blobs(4, Z=10, n=1000, k=5, d=8, sep=10.0)
    X = np.concatenate(devs)
    from sklearn.cluster import KMeans
    ref = cost(X, KMeans(5, n_init=5, random_state=0).fit(X).cluster_centers_)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=16.0, noise_seed=1)
    dl = DistributedLloyd(5, max_rounds=3, privacy=dp, random_state=0).fit(devs)
    assert cost(X, dl.cluster_centers_) / ref < 1.05
    p = dl.privacy_
    assert p["epsilon"] == 1.0 and p["delta"] == 1e-6 and p["unit"] == "point"
    assert p["accountant"] == "pld" and p["epsilon_spent"] <= 1.0
    # moments, candidates, 2 middle rounds, the spread (first round), the final round
    assert [r["repeats"] for r in p["releases"]] == [1, 1, 2, 1, 1]
    assert dl.communication_["rounds"] == 2 + 3


def test_device_level_lloyd_runs_and_uses_clip_norm():
    devs = blobs(5, Z=40, n=30, k=3, d=4, sep=10.0)
    B, C = 8.0, 40.0
    dp = DifferentialPrivacy(2.0, 1e-6, unit="device", data_bound=B, clip_norm=C,
                             noise_seed=0)
    dl = DistributedLloyd(3, max_rounds=3, privacy=dp, random_state=0).fit(devs)
    # every release's sensitivity is the point-level one times C / B (the spread's is B)
    sens = [r["sensitivity"] for r in dl.privacy_["releases"]]
    assert sens == pytest.approx([2 * B * C, C * math.sqrt(1 + 1 / 3), C * math.sqrt(1 + 1 / 4),
                                  C, C * math.sqrt(1 + 1 / 4)], rel=1e-12)
    assert np.isfinite(dl.cluster_centers_).all()
    # ε = ∞: with a clip norm no device reaches, the device-level fit is the point-level
    # one; with a small one every device is scaled down by one factor per release, which
    # changes the weights of the devices and so the centers
    inf = dict(epsilon=math.inf, delta=1e-6, data_bound=B)
    point = DistributedLloyd(3, max_rounds=3, random_state=0,
                             privacy=DifferentialPrivacy(**inf)).fit(devs)
    loose = DistributedLloyd(3, max_rounds=3, random_state=0, privacy=DifferentialPrivacy(
        **inf, unit="device", clip_norm=1e9)).fit(devs)
    np.testing.assert_array_equal(loose.cluster_centers_, point.cluster_centers_)
    uneven = [X[: 5 + 25 * (z % 2)] for z, X in enumerate(devs)]
    tight = DistributedLloyd(3, max_rounds=3, random_state=0, privacy=DifferentialPrivacy(
        **inf, unit="device", clip_norm=B)).fit(uneven)
    plain = DistributedLloyd(3, max_rounds=3, random_state=0,
                             privacy=DifferentialPrivacy(**inf)).fit(uneven)
    assert np.abs(tight.cluster_centers_ - plain.cluster_centers_).max() > 1e-6


def test_kfed_point_level_privacy():
    devs = blobs(6, Z=8, n=1000, k=3, d=4, sep=10.0)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=16.0, noise_seed=2)
    km = KFed(3, 3, server="kmeans++", weighted=True, privacy=dp, random_state=0).fit(devs)
    assert len(km.privacy_["releases"]) == 2 and km.privacy_["epsilon_spent"] <= 2.0
    assert all(lab is not None and len(lab) == 1000 for lab in km.device_labels_)
    X = np.concatenate(devs)
    from sklearn.cluster import KMeans
    ref = cost(X, KMeans(3, n_init=5, random_state=0).fit(X).cluster_centers_)
    assert cost(X, km.cluster_centers_) / ref < 1.5


@pytest.mark.parametrize("kwargs,text", [
    (dict(epsilon=0.0, delta=1e-6), "epsilon=0.0 must be > 0"),
    (dict(epsilon=-1, delta=1e-6), "epsilon=-1 must be > 0"),
    (dict(epsilon=1.0, delta=1.0), "delta=1.0 must be in (0, 1)"),
    (dict(epsilon=1.0, delta=0), "delta=0 must be in (0, 1)"),
    (dict(epsilon=1.0, delta=1e-6, unit="record"), "unit='record' is unknown"),
    (dict(epsilon=1.0, delta=1e-6, data_bound=-2.0), "data_bound=-2.0 must be"),
    (dict(epsilon=1.0, delta=1e-6, accountant="moments"), "accountant='moments' is unknown"),
    (dict(epsilon="1", delta=1e-6), "epsilon='1' must be a real number"),
])
def test_bad_privacy_parameters(kwargs, text):
    with pytest.raises(ValidationError) as exc:
        DifferentialPrivacy(**kwargs)
    assert text in str(exc.value) and "\n" not in str(exc.value)


def test_bad_uses_of_privacy():
    devs = blobs(7)
    with pytest.raises(ValidationError, match="needs data_bound"):
        DistributedLloyd(4, privacy=DifferentialPrivacy(1.0, 1e-6)).fit(devs)
    with pytest.raises(ValidationError, match="needs clip_norm"):
        DistributedLloyd(4, privacy=DifferentialPrivacy(1.0, 1e-6, unit="device",
                                                        data_bound=3.0)).fit(devs)
    with pytest.raises(ValidationError, match="init='sample' sends raw points"):
        DistributedLloyd(4, init="sample",
                         privacy=DifferentialPrivacy(1.0, 1e-6, data_bound=3.0)).fit(devs)
    with pytest.raises(ValidationError, match="no device-level DP") as exc:
        KFed(4, 2, privacy=DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=3.0,
                                               clip_norm=5.0)).fit(devs)
    # the cost it names: std 2 z B √k per coordinate, z the exact one-release multiplier
    std = float(str(exc.value).split("√k = ")[1].split(" ")[0])
    assert std == pytest.approx(2 * analytic_multiplier(1.0, 1e-6) * 3.0 * math.sqrt(2),
                                rel=0.01)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        DistributedLloyd(4, max_rounds=50, privacy=DifferentialPrivacy(
            1e-4, 1e-6, data_bound=3.0)).fit(devs)
    msg = str(exc.value)
    assert "too small for the 52 releases" in msg and "smallest epsilon that works is" in msg
    eps_min = float(msg.split("works is ")[1].split(" ")[0])
    # the named ε does work
    DistributedLloyd(4, max_rounds=50, privacy=DifferentialPrivacy(
        eps_min * 1.01, 1e-6, data_bound=3.0, noise_seed=0), random_state=0).fit(devs)
    with pytest.raises(ValidationError, match="must be a fedclust.privacy.DifferentialPrivacy"):
        DistributedLloyd(4, privacy={"epsilon": 1.0}).fit(devs)


@pytest.mark.slow
def test_flower_simulation_gives_the_same_noisy_run():
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedclust.flower.transport import FlowerSimulationTransport

    devs = blobs(8, Z=3, n=60, k=3, d=3)
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=4.0, noise_seed=9)
    a = DistributedLloyd(3, max_rounds=2, privacy=dp, random_state=1).fit(devs)
    b = DistributedLloyd(3, max_rounds=2, privacy=dp, random_state=1).fit(
        devs, transport=FlowerSimulationTransport())
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    ka = KFed(3, 2, privacy=dp, random_state=1).fit(devs)
    kb = KFed(3, 2, privacy=dp, random_state=1).fit(devs, transport=FlowerSimulationTransport())
    assert np.array_equal(ka.cluster_centers_, kb.cluster_centers_)


def _config(algorithm, privacy):
    return {"seed": 3,
            "data": {"source": "gaussians", "n_features": 4, "n_clusters": 3,
                     "n_local_clusters": 3, "m0": 4, "separation": 30.0, "n_per_component": 60},
            "algorithm": algorithm, "privacy": privacy,
            "baselines": {"centralized": False}}


def test_config_privacy_table_reaches_the_estimator():
    import json
    from fedclust.config import check_config
    from fedclust.experiment import run_experiment

    cfg = check_config(_config({"name": "distributed-lloyd", "n_clusters": 3, "max_rounds": 2},
                               {"epsilon": 2.0, "delta": 1e-6, "unit": "point",
                                "data_bound": 200.0, "noise_seed": 1}))
    exp = run_experiment(cfg)
    rec = exp.result["privacy"]
    assert rec["epsilon"] == 2.0 and rec["epsilon_spent"] <= 2.0
    assert exp.model.privacy == DifferentialPrivacy(2.0, 1e-6, data_bound=200.0, noise_seed=1)
    json.dumps(exp.result, allow_nan=False)
    inf = run_experiment(check_config(_config(
        {"name": "distributed-lloyd", "n_clusters": 3, "max_rounds": 2},
        {"epsilon": "inf", "delta": 1e-6, "data_bound": 200.0})))
    json.dumps(inf.result, allow_nan=False)


@pytest.mark.parametrize("privacy,text", [
    ({"epsilon": 0.0, "delta": 1e-6, "data_bound": 2.0}, "[privacy] privacy: epsilon=0.0"),
    ({"epsilon": 1.0, "delta": 1e-6, "bound": 2.0}, "unknown key(s) ['bound']"),
    ({"delta": 1e-6}, "epsilon and delta are required"),
])
def test_config_privacy_table_errors(privacy, text):
    from fedclust.config import check_config
    from fedclust.core.exceptions import ConfigError

    with pytest.raises(ConfigError) as exc:
        check_config(_config({"name": "kfed", "n_clusters": 3, "n_local_clusters": 3}, privacy))
    assert text in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("make", [
    lambda dp: __import__("fedclust").DistributedKMeans(2, 10, privacy=dp).fit(blobs(9)),
    lambda dp: __import__("fedclust.robust", fromlist=["x"]).RobustClusteredRegression(
        2, privacy=dp).fit([np.ones((5, 2))] * 4, [np.ones(5)] * 4),
])
def test_families_without_dp_refuse_privacy(make):
    with pytest.raises(ValidationError) as exc:
        make(DifferentialPrivacy(1.0, 1e-6, data_bound=1.0))
    assert "has no differentially private version yet" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_private_protocols_rebuild_from_their_config():
    """What a Flower client rebuilds: the same noise scales, never recalibrated."""
    import json
    from fedclust.gauss.private import PrivateGaussClassifierProtocol
    from fedclust.kfed.protocol import KFedProtocol
    from fedclust.lloyd.protocol import DistributedLloydProtocol

    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=3.0, noise_seed=7)
    protos = [DistributedLloydProtocol(4, init="candidates", max_rounds=3, privacy=dp,
                                       n_features=5),
              KFedProtocol(4, 2, n_features=5, privacy=dp),
              PrivateGaussClassifierProtocol(privacy=dp, classes=[0, 1], n_features=5)]
    for proto in protos:
        cfg = json.loads(json.dumps(proto.config()))        # scalars only
        again = type(proto).from_config(cfg)
        assert again.privacy == dp
        assert [r.noise_std for r in again.plan.releases] == \
            [r.noise_std for r in proto.plan.releases]
    inf = DistributedLloydProtocol(4, init="candidates", privacy=DifferentialPrivacy(
        math.inf, 1e-6, data_bound=3.0), n_features=5)
    assert DistributedLloydProtocol.from_config(
        json.loads(json.dumps(inf.config()))).privacy.epsilon == math.inf


def test_kfed_new_device_runs_the_private_local_step():
    devs = blobs(10, Z=6, n=400, k=3, d=4, sep=10.0)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=16.0, noise_seed=1)
    km = KFed(3, 3, server="kmeans++", weighted=True, privacy=dp, random_state=0).fit(devs[:5])
    km.assign_device(devs[5])
    new_centers = km.local_centers_[-1]
    # the same device through a private fit sends the same (seeded) noisy centers
    again = KFed(3, 3, server="kmeans++", weighted=True, privacy=dp, random_state=0).fit(
        devs[5:], device_ids=[5])
    assert np.allclose(new_centers, again.local_centers_[0])
    plain = KFed(3, 3, server="kmeans++", weighted=True, random_state=0).fit(devs[5:],
                                                                             device_ids=[5])
    assert not np.allclose(new_centers, plain.local_centers_[0])
