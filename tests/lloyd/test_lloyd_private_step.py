"""A private Lloyd round, server and devices, against the step written out by hand:
clipped points, relative sums clipped to the trust radius, the server's noise at that
radius, the shrunk and cut step, and the trust radius the first round's spread sets.

The noise is drawn from the seeded stream the server uses (``noise_seed``: tests only),
so the reference adds the very same noise; everything else is computed here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy, noise_rng
from fedclust.privacy import kmeans as pk
from fedclust.privacy.mechanisms import SERVER, gaussian

B, D, K = 4.0, 3, 3


def _devices(seed=0):
    rng = np.random.default_rng(seed)
    means = np.array([[2.0, 0.0, 0.0], [-2.0, 0.5, 0.0], [0.0, 0.0, 2.5]])
    X = np.concatenate([means[i] + 0.7 * rng.standard_normal((n, D))
                        for i, n in enumerate((400, 300, 2))])
    X = np.concatenate([X, [[9.0, 9.0, 0.0]]])          # beyond the data bound: clipped
    return np.array_split(X[rng.permutation(len(X))], 3)


def _by_hand(devices, C, r):
    """Σ over devices of clip_r(clip_B(x) − c(x)) per cluster, the counts and Σ min(‖·‖, B)."""
    X = np.concatenate(devices)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    X = np.where(norms > B, X * B / norms, X)
    lab = ((X[:, None] - C[None]) ** 2).sum(-1).argmin(1)
    diff = X - C[lab]
    dn = np.linalg.norm(diff, axis=1, keepdims=True)
    clipped = np.where(dn > r, diff * r / np.maximum(dn, 1e-300), diff)
    S = np.stack([clipped[lab == j].sum(0) for j in range(K)])
    N = np.bincount(lab, minlength=K).astype(float)
    return S, N, float(np.minimum(dn[:, 0], B).sum())


def _step(C, S, N, sigma, r):
    new = C.copy()
    for j in range(K):
        if N[j] <= 1.0:                      # a noisy count of at most 1 keeps its center
            continue
        m = S[j] / N[j]
        m = m * max(0.0, 1.0 - D * (sigma / N[j]) ** 2 / (m @ m))
        if np.linalg.norm(m) > r:
            m = m * r / np.linalg.norm(m)
        new[j] = C[j] + m
        if np.linalg.norm(new[j]) > B:
            new[j] = new[j] * B / np.linalg.norm(new[j])
    return new


def test_private_rounds_equal_the_step_by_hand():
    devices = _devices()
    kept = moved_just_above_one = False
    for noise_seed in range(40):
        for N_hat, moved in _private_rounds(devices, noise_seed):
            kept |= bool(np.any(N_hat <= 1.0))
            moved_just_above_one |= bool(np.any((N_hat > 1.0) & (N_hat <= 2.0) & moved))
        if kept and moved_just_above_one and noise_seed >= 2:
            break
    # the two-point cluster's noisy count fell at or below 1 (its center kept) and just
    # above 1 with a step the shrinkage did not cancel (its center moved)
    assert kept and moved_just_above_one


def _private_rounds(devices, noise_seed):
    dp = DifferentialPrivacy(8.0, 1e-6, data_bound=B, noise_seed=noise_seed)
    T = 3
    proto = DistributedLloydProtocol(K, init="candidates", privacy=dp, n_features=D, max_rounds=T)
    state = proto.start([0, 1, 2], seed=0)
    C = np.array([[1.5, 0.0, 0.0], [-1.5, 0.0, 0.0], [0.0, 0.5, 2.0]])
    state.round, state.centers = 2, C.copy()        # the first Lloyd round follows the start
    r = B
    seen = []
    for t, round_index in enumerate(range(2, 2 + T)):
        req = proto.next_request(state)
        assert (req.round, req.action) == (round_index, "lloyd")
        assert float(req.payload.radius) == pytest.approx(r, rel=1e-12)
        np.testing.assert_allclose(req.payload.centers, C, rtol=0, atol=1e-12)
        replies = {z: proto.client_step(req, X, device_id=z, seed=0, state={})
                   for z, X in enumerate(devices)}
        S, N, spread = _by_hand(devices, C, r)
        got_S = sum(rep.sums for rep in replies.values())
        np.testing.assert_allclose(got_S, S, rtol=0, atol=1e-12)
        assert np.array_equal(sum(rep.counts for rep in replies.values()), N)
        first = t == 0
        got_spread = float(sum(float(rep.cost) for rep in replies.values()))
        assert got_spread == (pytest.approx(spread, rel=1e-12) if first else 0.0)

        # the server's noise: the sums at std σ r/B, the counts at (σ r/B)/(r/√d), then
        # (first round of T >= 2 only) the spread at the spread release's std
        last = t == T - 1
        sigma = proto.plan.release(pk.FINAL if last else pk.LLOYD).noise_std
        rng = noise_rng(noise_seed, SERVER, round_index)
        S_hat = gaussian(S, sigma * r / B, rng)
        N_hat = gaussian(N, sigma * r / B / (r / math.sqrt(D)), rng)
        want = _step(C, S_hat, N_hat, sigma * r / B, r)
        seen.append((N_hat, np.any(want != C, axis=1)))
        proto.server_step(state, req, replies)
        np.testing.assert_allclose(state.centers, want, rtol=1e-12, atol=1e-12)
        if first:
            sp = proto.plan.release(pk.SPREAD).noise_std
            spread_hat = float(gaussian(np.asarray(spread), sp, rng))
            r = min(2.0 * (spread_hat + sp) / max(N_hat.sum(), 1.0), B)
            assert r < B
        assert state.radius == pytest.approx(r, rel=1e-12)
        C = want
    assert proto.next_request(state) is None and state.lloyd_rounds == T
    return seen
