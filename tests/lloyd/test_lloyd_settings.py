"""Distributed Lloyd's settings: each bad value refused by name at its edge, the
defaults, the box start's data-free candidates inside the cube of the data ball,
the box start's release, and the k-FED start's server step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.protocol import Request
from fedclust.core.random import server_rng
from fedclust.kfed.server import aggregate_centers
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy import kmeans as pk

DP = DifferentialPrivacy(1.0, 1e-6, data_bound=3.0)


@pytest.mark.parametrize("kw,msg", [
    (dict(n_clusters=0), "n_clusters=0 must be >= 1"),
    (dict(points_per_device=0), "points_per_device=0 must be >= 1"),
    (dict(max_rounds=0), "max_rounds=0 must be >= 1"),
    (dict(tol=-1e-9), "tol=-1e-09 must be >= 0"),
    (dict(noise_devices=-1), "noise_devices=-1 must be >= 0"),
])
def test_bad_settings_are_refused_by_name(kw, msg):
    kw = dict(kw)   # the parameters are shared by every run of this test in a process
    k = kw.pop("n_clusters", 2)
    with pytest.raises(ValidationError, match="^" + msg.replace("(", r"\(").replace(".", r"\.")):
        DistributedLloydProtocol(k, **kw)


def test_the_smallest_settings_and_the_defaults():
    p = DistributedLloydProtocol(1, points_per_device=1, max_rounds=1, tol=0.0, noise_devices=0)
    assert (p.n_clusters, p.points_per_device, p.max_rounds, p.tol) == (1, 1, 1, 0.0)
    d = DistributedLloydProtocol(2)
    assert (d.points_per_device, d.max_rounds, d.tol, d.init) == (10, 100, 1e-4, "sample")


@pytest.mark.parametrize("private", [True, False])
def test_box_candidates_fill_the_cube_inscribed_in_the_data_ball(private):
    d = 4
    bound = 3.0 if private else math.sqrt(d)      # without privacy: the unit cube's ball
    p = DistributedLloydProtocol(3, init="box", n_features=d, privacy=DP if private else None)
    coords = p.start([0], seed=0).candidates.coords
    a = bound / math.sqrt(d)
    assert coords.shape == (pk.BOX_CANDIDATES * 3, d)
    assert np.abs(coords).max() <= a and np.abs(coords).max() > a / 2


def test_the_box_start_declares_its_candidates_over_all_d_directions():
    d, k = 6, 2
    p = DistributedLloydProtocol(k, init="box", privacy=DP, n_features=d, max_rounds=2)
    cand = p.plan.release(pk.CANDIDATES)
    assert [r.what for r in p.plan.releases] == [pk.CANDIDATES, pk.LLOYD, pk.SPREAD, pk.FINAL]
    assert cand.sensitivity == pytest.approx(3.0 * math.sqrt(1 + 1 / d), rel=1e-12)


def test_the_kfed_start_merges_the_local_centers_by_weighted_kmeans_plusplus():
    rng = np.random.default_rng(3)
    devices = [rng.uniform(size=(80, 2)) for _ in range(3)]    # no clusters: seeding matters
    for seed in range(4):
        p = DistributedLloydProtocol(3, init="kfed")
        state = p.start([0, 1, 2], seed=seed)
        req = p.next_request(state)
        assert req == Request(0, "kfed")
        replies = {z: p.client_step(req, X, device_id=z, seed=seed, state={})
                   for z, X in enumerate(devices)}
        p.server_step(state, req, replies)
        want = aggregate_centers([replies[z].centers.astype(float) for z in range(3)], 3,
                                 counts=[replies[z].counts for z in range(3)],
                                 method="weighted-kmeans++", rng=server_rng(seed)).centers
        np.testing.assert_array_equal(state.centers, want)


def test_integer_start_centers_are_taken_as_floats():
    p = DistributedLloydProtocol(2, init=[[0, 0], [10, 0]], max_rounds=1)
    assert p.init_centers.dtype == np.float64
    state = p.start([0], seed=0)
    req = p.next_request(state)
    X = np.array([[0.0, 1.0], [1.0, 0.0], [9.0, 0.0], [10.0, 1.0]])
    p.server_step(state, req, {0: p.client_step(req, X, device_id=0, seed=0, state={})})
    np.testing.assert_array_equal(state.centers, [[0.5, 0.5], [9.5, 0.5]])


def test_box_start_without_n_features_is_refused_when_built():
    # its candidates are drawn before any data are read: the feature count must be given
    with pytest.raises(ValidationError, match=r"^init='box' needs n_features \(the candidates "
                                              r"are placed before any data are read\)$"):
        DistributedLloydProtocol(3, init="box")
    assert DistributedLloydProtocol(3, init="box", n_features=4).n_features == 4


def test_the_private_start_takes_two_rounds_after_a_box_start_in_both_of_its_cases():
    from fedclust.lloyd.protocol import private_start

    # k >= d: the moments would only fit one Gaussian
    assert private_start(1000, 5, 3, DP) == ("box", 2)
    # ε too small even for the moments start's releases: the probe is refused, the box
    # start follows with its 2 rounds (its candidate round is already one Lloyd step)
    tiny = DifferentialPrivacy(1e-3, 1e-6, data_bound=3.0)
    with pytest.raises(ValidationError, match="too small"):
        DistributedLloydProtocol(3, init="candidates", max_rounds=3, privacy=tiny, n_features=10)
    assert private_start(1000, 3, 10, tiny) == ("box", 2)
    # enough rows for the moments: the moments start and 3 rounds
    assert private_start(100_000, 3, 10, DP) == ("candidates", 3)
