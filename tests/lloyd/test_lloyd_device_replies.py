"""A device's distributed-Lloyd replies written out by hand: device-level clipping of
the joint (sums, γ·counts) contribution (box start and ε = ∞ rounds), and the k-FED
start's local step drawn from the device's own stream."""

from __future__ import annotations

import math

import numpy as np

from fedclust.core.protocol import Request
from fedclust.core.random import device_rng
from fedclust.kfed.local import local_kmeans
from fedclust.lloyd.messages import CenterBroadcast
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy import kmeans as pk

B, D, CLIP = 2.0, 3, 0.5


def _points(n=400, seed=0):
    return 1.5 * np.random.default_rng(seed).standard_normal((n, D))


def _clip_rows(X, bound):
    nrm = np.linalg.norm(X, axis=1, keepdims=True)
    return np.where(nrm > bound, X * bound / np.maximum(nrm, 1e-300), X)


def _device_clip(sums, counts, gamma, cap):
    norm = math.sqrt((sums ** 2).sum() + gamma ** 2 * (counts ** 2).sum())
    f = min(1.0, cap / norm)
    return sums * f, counts * f, norm


def test_box_start_candidate_reply_is_clipped_per_device_at_the_box_radius():
    dp = DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=B, clip_norm=CLIP)
    proto = DistributedLloydProtocol(2, init="box", privacy=dp, n_features=D)
    state = proto.start([0], seed=0)
    req = proto.next_request(state)
    assert req.action == "candidates"
    coords = req.payload.coords
    r = pk.box_radius(len(coords), D, B)
    X = _clip_rows(_points(), B)
    lab = ((X[:, None] - coords[None]) ** 2).sum(-1).argmin(1)
    diff = _clip_rows(X - coords[lab], r)
    sums = np.stack([diff[lab == j].sum(0) for j in range(len(coords))])
    counts = np.bincount(lab, minlength=len(coords)).astype(float)
    cap = r * math.sqrt(1 + 1 / D) * CLIP / B        # the release's sensitivity at radius r
    want_s, want_c, norm = _device_clip(sums, counts, r / math.sqrt(D), cap)
    assert norm > 10 * cap                             # 400 points: the clip binds
    reply = proto.client_step(req, _points(), device_id=0, seed=0, state={})
    np.testing.assert_allclose(reply.sums, want_s, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(reply.counts, want_c, rtol=1e-12, atol=1e-15)


def test_an_infinite_epsilon_round_clips_each_device_as_a_private_one_would():
    dp = DifferentialPrivacy(math.inf, 1e-6, unit="device", data_bound=B, clip_norm=CLIP)
    proto = DistributedLloydProtocol(3, init="candidates", privacy=dp, n_features=D)
    C = np.array([[0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.5, 0.5]])
    X = _clip_rows(_points(seed=1), B)
    lab = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
    sums = np.stack([X[lab == j].sum(0) for j in range(3)])
    counts = np.bincount(lab, minlength=3).astype(float)
    cap = B * math.sqrt(1 + 1 / D) * CLIP / B
    want_s, want_c, norm = _device_clip(sums, counts, B / math.sqrt(D), cap)
    assert norm > 10 * cap
    reply = proto.client_step(Request(2, "lloyd", CenterBroadcast(C)), _points(seed=1),
                              device_id=0, seed=0, state={})
    np.testing.assert_allclose(reply.sums, want_s, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(reply.counts, want_c, rtol=1e-12, atol=1e-15)


def test_the_kfed_start_is_the_devices_local_kmeans_from_its_own_stream():
    proto = DistributedLloydProtocol(5, init="kfed")
    X = np.random.default_rng(2).uniform(size=(300, 2))    # no clear clusters: seeds matter
    req = Request(0, "kfed")
    got = [proto.client_step(req, X, device_id=4, seed=s, state={}) for s in (7, 7, 8)]
    want = local_kmeans(X, 5, device_rng(7, 4, 0), device="device 4").message
    np.testing.assert_array_equal(got[0].centers, want.centers)
    np.testing.assert_array_equal(got[1].centers, want.centers)
    np.testing.assert_array_equal(got[0].counts, want.counts)
    assert not np.array_equal(got[2].centers, want.centers)
