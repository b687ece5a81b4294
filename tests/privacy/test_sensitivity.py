"""One record's (point level) or one device's (device level) contribution to every
private release, measured in that release's own norm, never exceeds the sensitivity
the fit declares to the accountant.

The norm of each release is the one in which its Gaussian noise is isotropic (each
entry scaled by noise std / entry std), written here from the mechanisms' documented
form, not taken from the code:

* k-means moments: (B² n, B s, upper triangle of Q);
* cluster and candidate sums: (sums, γ counts), γ = B/√p with p the summed dimension;
* Gaussian classifier: (B² n_c, B s_c, upper triangle of Q_c) per class (diag: (B² n,
  B s, Σ x²)); Gaussian clustering: (n, Σ u, upper triangle of Σ u uᵀ) (diag: Σ u²);
* DP-FedAvg: (sum of clipped updates, C·count);
* preprocessing: (rows, count_j, Σ u_j, Σ (u_j² − 1/2)), u = (x − c)/w.

Point level: a row anywhere (inside the bound or 100× outside) is added to a device;
device level: the whole reply of a device (against no device) is measured.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from fedclust.core.protocol import Request
from fedclust.fl.messages import ModelUpdate
from fedclust.fl.protocol import FedAvgProtocol
from fedclust.gauss.private import PrivateGaussClassifierProtocol
from fedclust.gauss.private_clustering import (GaussDPModel, GaussDPModelDiag,
                                               PrivateGaussProtocol)
from fedclust.kfed.protocol import KFedProtocol
from fedclust.lloyd.messages import CandidateBroadcast, CenterBroadcast
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.sites.preprocess import PreprocessProtocol
from fedclust.privacy import DifferentialPrivacy, clip_points
from fedclust.privacy import columns as pc
from fedclust.privacy import kmeans as pk

TOL = 1e-9


def triu(Q):
    Q = np.asarray(Q, float)
    i, j = np.triu_indices(Q.shape[-1])
    return Q[..., i, j]


def moments_norm(n, s, Q, B):
    return math.sqrt(float(np.sum((B * B * np.asarray(n, float)) ** 2))
                     + B * B * float(np.sum(np.asarray(s, float) ** 2))
                     + float(np.sum(triu(Q) ** 2)))


def sums_norm(sums, counts, B):
    g = B / math.sqrt(np.shape(sums)[1])
    return math.sqrt(float(np.sum(np.asarray(sums, float) ** 2))
                     + g * g * float(np.sum(np.asarray(counts, float) ** 2)))


def extra_rows(rng, d, B):
    """Rows well inside, at and far outside the data bound, in random directions."""
    dirs = rng.standard_normal((30, d))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    return dirs * (B * np.array([0.05, 0.5, 0.99, 1.0, 3.0, 100.0] * 5))[:, None]


def lloyd_requests(rng, d, k, p):
    basis = np.linalg.qr(rng.standard_normal((d, p)))[0]
    cand = CandidateBroadcast(mean=rng.standard_normal(d), basis=basis,
                              coords=rng.standard_normal((12, p)))
    centers = CenterBroadcast(rng.standard_normal((k, d)) * 3.0)
    return [(Request(0, "moments"), 0), (Request(1, "candidates", cand), 1),
            (Request(2, "lloyd", centers), 2), (Request(4, "lloyd", centers), -1)]


def lloyd_norm(action, reply, B):
    if action == "moments":
        return moments_norm(reply.n, reply.s, reply.Q, B)
    return sums_norm(reply.sums, reply.counts, B)


def diff(a, b):
    """Field-by-field difference of two replies of one type."""
    return SimpleNamespace(**{f: np.asarray(getattr(a, f), float) - np.asarray(getattr(b, f), float)
                              for f in type(a).schema})


# -- distributed Lloyd --------------------------------------------------------------------
def test_lloyd_one_point_moves_each_release_by_at_most_its_sensitivity():
    rng = np.random.default_rng(0)
    d, k, B = 4, 3, 2.0
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=B, noise_seed=0)
    proto = DistributedLloydProtocol(k, init="candidates", max_rounds=3, privacy=dp,
                                     n_features=d)
    rels = proto.plan.releases
    X = rng.standard_normal((60, d)) * 1.5
    for req, r in lloyd_requests(rng, d, k, min(k, d)):
        base = proto.client_step(req, X, device_id=0, seed=0, state={})
        worst = max(lloyd_norm(req.action, diff(proto.client_step(
            req, np.vstack([X, row]), device_id=0, seed=0, state={}), base), B)
            for row in extra_rows(rng, d, B))
        assert worst <= rels[r].sensitivity * (1 + TOL), (req.action, worst)
        assert worst >= 0.5 * rels[r].sensitivity, (req.action, worst)   # the bound is reached


@pytest.mark.parametrize("B,C", [(8.0, 40.0), (1.0, 3.0), (0.5, 50.0)])
def test_lloyd_one_device_moves_each_release_by_at_most_its_sensitivity(B, C):
    """Device level: the whole reply of a large device, in the release's norm. With
    B/√d ≠ 1 the counts weigh differently from the sums in the clip."""
    rng = np.random.default_rng(1)
    d, k = 4, 3
    dp = DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=B, clip_norm=C, noise_seed=0)
    proto = DistributedLloydProtocol(k, init="candidates", max_rounds=3, privacy=dp,
                                     n_features=d)
    rels = proto.plan.releases
    for n in (3, 400):
        X = rng.standard_normal((n, d)) * B
        for req, r in lloyd_requests(rng, d, k, min(k, d)):
            reply = proto.client_step(req, X, device_id=0, seed=0, state={})
            got = lloyd_norm(req.action, reply, B)
            assert got <= rels[r].sensitivity * (1 + TOL), (req.action, n, got)
            if n == 400:        # a large device is clipped onto the bound (moments: the clip
                # measures both triangles of Q, the release one)
                low = 0.7 if req.action == "moments" else 1 - 1e-6
                assert got >= low * rels[r].sensitivity, (req.action, got)
                if req.action == "moments":   # the clip: ‖Σ a aᵀ‖_F, a = (B, x), at the bound
                    full = math.sqrt((B * B * float(reply.n)) ** 2 + 2 * B * B * float(
                        np.sum(reply.s ** 2)) + float(np.sum(reply.Q ** 2)))
                    assert full == pytest.approx(rels[r].sensitivity, rel=1e-9)


# -- k-FED ------------------------------------------------------------------------------
def test_kfed_one_point_moves_the_device_releases_by_at_most_their_sensitivity():
    """k-FED's devices release their own noisy moments and candidate sums (on the device,
    calibrated to the declared releases): one clipped point moves each statistic by at
    most the declared sensitivity."""
    rng = np.random.default_rng(2)
    d, k, B = 5, 3, 4.0
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=B, noise_seed=0)
    proto = KFedProtocol(k, k, n_features=d, privacy=dp)
    mom, cand = proto.plan.releases
    p = min(k, d)
    basis = np.linalg.qr(rng.standard_normal((d, p)))[0]
    mean, coords = rng.standard_normal(d), rng.standard_normal((10, p)) * 2
    X = clip_points(rng.standard_normal((80, d)) * 3, B)[0]
    n0, s0, Q0 = pk.device_moments(X, dp)
    S0, c0, _ = pk.candidate_sums(X, mean, basis, coords, dp)
    wm = wc = 0.0
    for row in extra_rows(rng, d, B):
        Xr = clip_points(np.vstack([X, row]), B)[0]
        n, s, Q = pk.device_moments(Xr, dp)
        wm = max(wm, moments_norm(n - n0, s - s0, Q - Q0, B))
        S, c, _ = pk.candidate_sums(Xr, mean, basis, coords, dp)
        wc = max(wc, sums_norm(S - S0, c - c0, B))
    assert wm <= mom.sensitivity * (1 + TOL) and wm >= 0.5 * mom.sensitivity
    assert wc <= cand.sensitivity * (1 + TOL) and wc >= 0.5 * cand.sensitivity


# -- Gaussian classifier ----------------------------------------------------------------
def classifier(dp, covariance, d=3, M=3):
    return PrivateGaussClassifierProtocol(privacy=dp, classes=list(range(M)), n_features=d,
                                          covariance=covariance)


def class_norm(msg, B, diag, d):
    M = msg.n.shape[0]
    if diag:
        return math.sqrt(float(np.sum((B * B * msg.n) ** 2)) + B * B * float(np.sum(msg.s ** 2))
                         + float(np.sum(msg.Q ** 2)))
    Q = np.asarray(msg.Q, float).reshape(M, d, d)
    return math.sqrt(sum(moments_norm(msg.n[c], msg.s[c], Q[c], B) ** 2 for c in range(M)))


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_gauss_classifier_one_row_moves_the_release_by_at_most_its_sensitivity(covariance):
    rng = np.random.default_rng(3)
    d, B = 3, 2.0
    proto = classifier(DifferentialPrivacy(1.0, 1e-6, data_bound=B), covariance, d)
    sens = proto.plan.releases[0].sensitivity
    X, y = rng.standard_normal((40, d)), rng.integers(0, 3, 40)
    req = proto.next_request(proto.start([0], 0))
    base = proto.client_step(req, (X, y), device_id=0, seed=0, state={})
    worst = 0.0
    for i, row in enumerate(extra_rows(rng, d, B)):
        m = proto.client_step(req, (np.vstack([X, row]), np.append(y, i % 3)), device_id=0,
                              seed=0, state={})
        worst = max(worst, class_norm(diff(m, base), B, covariance == "diag", d))
    assert 0.5 * sens <= worst <= sens * (1 + TOL)


@pytest.mark.parametrize("covariance", ["full", "diag"])
@pytest.mark.parametrize("B,C", [(3.0, 20.0), (0.5, 30.0)])
def test_gauss_classifier_one_device_weighs_at_most_its_sensitivity(covariance, B, C):
    rng = np.random.default_rng(4)
    d = 3
    dp = DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=B, clip_norm=C)
    proto = classifier(dp, covariance, d)
    sens = proto.plan.releases[0].sensitivity
    req = proto.next_request(proto.start([0], 0))
    for n in (2, 500):
        X, y = rng.standard_normal((n, d)) * B, rng.integers(0, 3, n)
        got = class_norm(proto.client_step(req, (X, y), device_id=0, seed=0, state={}), B,
                         covariance == "diag", d)
        assert got <= sens * (1 + TOL)
        if n == 500:    # clipped onto the bound (full: measured on both triangles of Q)
            assert got >= (0.7 if covariance == "full" else 1 - 1e-6) * sens


# -- Gaussian clustering (device level; the point level is in test_privacy_gauss_clustering)
@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_gauss_clustering_one_device_weighs_at_most_its_sensitivity(covariance):
    rng = np.random.default_rng(5)
    d, K = 3, 4
    dp = DifferentialPrivacy(1.0, 1e-6, unit="device", data_bound=5.0, clip_norm=40.0)
    proto = PrivateGaussProtocol(privacy=dp, n_features=d, covariance=covariance)
    sens = proto.plan.releases[0].sensitivity
    if covariance == "diag":
        model = GaussDPModelDiag(means=rng.standard_normal((K, d)),
                                 maps=rng.uniform(0.5, 2.0, (K, d)), log_weights=np.zeros(K))
    else:
        L = np.tril(rng.standard_normal((K, d, d))) + 2 * np.eye(d)
        model = GaussDPModel(means=rng.standard_normal((K, d)), maps=L, log_weights=np.zeros(K))
    req = Request(2, "gauss_component_moments", payload=model)
    for n in (2, 3000):
        m = proto.client_step(req, rng.standard_normal((n, d)) * 3, device_id=0, seed=0,
                              state={})
        Q = m.Q if covariance == "diag" else triu(np.asarray(m.Q).reshape(K, d, d))
        got = math.sqrt(float(np.sum(m.n ** 2) + np.sum(m.s ** 2) + np.sum(Q ** 2)))
        assert got <= sens * (1 + TOL)
        if n == 3000:   # clipped onto the bound (full: measured on both triangles of Q)
            assert got >= (0.7 if covariance == "full" else 1 - 1e-6) * sens


# -- DP-FedAvg ---------------------------------------------------------------------------
def test_fedavg_one_device_weighs_at_most_its_sensitivity():
    """ε = ∞: the server's average of one update beside a zero update is half the clipped
    update; the device adds it and a count of 1 (weight C in the release)."""
    rng = np.random.default_rng(6)
    C = 0.7
    dp = DifferentialPrivacy(math.inf, 1e-5, unit="device", clip_norm=C)
    proto = FedAvgProtocol(model="linear", n_features=4, n_classes=1, privacy=dp)
    sens = proto.plan.releases[0].sensitivity
    prev = rng.standard_normal((1, 5))
    worst = 0.0
    for scale in (0.01, 0.5, 1.0, 10.0, 1e4):
        u = rng.standard_normal(5)
        u *= scale / np.linalg.norm(u)
        replies = {0: ModelUpdate(params=prev[0] + u, cluster=np.int64(0), n_samples=np.int64(3),
                                  loss=np.float64(0.0)),
                   1: ModelUpdate(params=prev[0].copy(), cluster=np.int64(0),
                                  n_samples=np.int64(9), loss=np.float64(0.0))}
        contribution = 2.0 * (proto._aggregate(replies, prev, 0)[0] - prev[0])
        assert np.allclose(contribution, u * min(1.0, C / scale), rtol=0, atol=1e-12)
        worst = max(worst, math.hypot(float(np.linalg.norm(contribution)), C * 1.0))
    assert worst <= sens * (1 + TOL) and worst >= (1 - 1e-9) * sens


# -- preprocessing -------------------------------------------------------------------------
def column_vector(reply, low, high):
    """The preprocessing release (rows, count, Σ u, Σ (u² − 1/2)) of one reply."""
    c, w = (low + high) / 2.0, (high - low) / 2.0
    n = np.asarray(reply.count, float)
    mean = np.divide(reply.total, n, out=np.zeros(len(n)), where=n > 0)
    S = (reply.total - c * n) / w
    R = (reply.m2 + n * (mean - c) ** 2) / (w * w) - 0.5 * n
    return np.concatenate([[float(reply.n_rows)], n, S, R])


def test_preprocessing_one_row_moves_the_release_by_at_most_its_sensitivity():
    rng = np.random.default_rng(7)
    d = 3
    low, high = np.array([0.0, -5.0, 100.0]), np.array([10.0, 5.0, 400.0])
    proto = PreprocessProtocol(d, privacy=DifferentialPrivacy(1.0, 1e-6),
                               lower=low, upper=high)
    sens = proto.plan.releases[0].sensitivity
    X = rng.uniform(low, high, (30, d))
    X[rng.random((30, d)) < 0.2] = np.nan
    req = proto.next_request(proto.start([0], 0))
    base = column_vector(proto.client_step(req, X, device_id=0, seed=0, state={}), low, high)
    worst = 0.0
    for _ in range(200):
        row = rng.uniform(low - 3 * (high - low), high + 3 * (high - low))
        row[rng.random(d) < 0.2] = np.nan
        v = column_vector(proto.client_step(req, np.vstack([X, row]), device_id=0, seed=0,
                                            state={}), low, high)
        worst = max(worst, float(np.linalg.norm(v - base)))
    assert 0.7 * sens <= worst <= sens * (1 + TOL)


def test_preprocessing_one_site_weighs_at_most_its_sensitivity():
    rng = np.random.default_rng(8)
    d, site_rows = 2, 10
    low, high = np.array([0.0, -1.0]), np.array([1.0, 1.0])
    proto = PreprocessProtocol(d, privacy=DifferentialPrivacy(1.0, 1e-6, unit="device"),
                               lower=low, upper=high, site_rows=site_rows)
    sens = proto.plan.releases[0].sensitivity
    req = proto.next_request(proto.start([0], 0))
    for n in (3, 10, 500):
        X = rng.uniform(low - 1, high + 1, (n, d))
        reply = proto.client_step(req, X, device_id=0, seed=0, state={})
        (scaled,) = pc.clip_sites([reply], low, high, site_rows)
        got = float(np.linalg.norm(column_vector(scaled, low, high)))
        assert got <= sens * (1 + TOL)
        if n == 500:
            assert got >= (1 - 1e-9) * sens
