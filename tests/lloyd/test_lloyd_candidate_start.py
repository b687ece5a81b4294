"""The candidate start's two server steps wired as documented: the moments noised
with the moments release from the server's stream of round 0 (unless the devices
noise them), the principal subspace of min(k, d) directions, M candidates from the
candidates release's count noise drawn from the server stream 1; then the candidate
sums noised with the candidates release (round 1) and k centers from them (stream 2).
The building blocks are checked on their own in tests/privacy; here each step is
recomposed from them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.random import server_rng, sklearn_seed
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy, noise_rng
from fedclust.privacy import kmeans as pk
from fedclust.privacy.mechanisms import SERVER

B, D, K = 3.0, 4, 2


def _devices():
    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(size=(150, D)) * 0.4 + 1.0, rng.normal(size=(150, D)) * 0.4 - 1.0])
    return np.array_split(X[rng.permutation(len(X))], 3)


@pytest.mark.parametrize("eps", [2.0, math.inf])
def test_the_candidate_start_by_its_documented_steps(eps):
    dp = DifferentialPrivacy(eps, 1e-6, data_bound=B, noise_seed=4)
    p = DistributedLloydProtocol(K, init="candidates", privacy=dp, n_features=D)
    devices = _devices()
    state = p.start([0, 1, 2], seed=9)
    req = p.next_request(state)
    replies = {z: p.client_step(req, X, device_id=z, seed=9, state={})
               for z, X in enumerate(devices)}
    n = float(sum(float(r.n) for r in replies.values()))
    s = sum(r.s for r in replies.values())
    Q = sum(r.Q for r in replies.values())
    count_std = 0.0
    if p.noisy:
        n, s, Q = pk.noisy_moments(n, s, Q, p.plan.releases[0], B, noise_rng(4, SERVER, 0))
        count_std = p.plan.release(pk.CANDIDATES).noise_std / pk.count_weight(B, min(K, D))
    mean, basis, lam = pk.gaussian_subspace(n, s, Q, min(K, D))
    M = pk.n_candidates(n, count_std, K)
    coords = pk.draw_candidates(mean, basis, lam, M, server_rng(9, 1))
    p.server_step(state, req, replies)
    cb = state.candidates
    assert basis.shape == (D, K) and len(cb.coords) == M
    np.testing.assert_array_equal(cb.mean, mean)
    np.testing.assert_array_equal(cb.basis, basis)
    np.testing.assert_array_equal(cb.coords, coords)

    req = p.next_request(state)
    assert req.action == "candidates" and req.round == 1
    replies = {z: p.client_step(req, X, device_id=z, seed=9, state={})
               for z, X in enumerate(devices)}
    sums = sum(r.sums.astype(float) for r in replies.values())
    counts = sum(r.counts.astype(float) for r in replies.values())
    min_count, bound = 1.0, None
    if p.plan is not None:
        rel = p.plan.release(pk.CANDIDATES)
        bound = B
        if p.noisy:
            sums, counts = pk.noisy_cluster_sums(sums, counts, rel, B, noise_rng(4, SERVER, 1))
        min_count = max(1.0, 3.0 * rel.noise_std / pk.count_weight(B, sums.shape[1]))
    centers, _ = pk.centers_from_candidates(sums, counts, K, bound=bound, min_count=min_count,
                                            seed=sklearn_seed(server_rng(9, 2)))
    p.server_step(state, req, replies)
    np.testing.assert_allclose(state.centers, pk.lift(centers, mean, basis), rtol=0, atol=1e-12)
    if not p.noisy:   # without noise the two clusters are found
        assert np.allclose(np.sort(state.centers[:, 0]), [-1.0, 1.0], atol=0.1)


def test_the_box_start_by_its_documented_steps():
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=B, noise_seed=6)
    p = DistributedLloydProtocol(K, init="box", privacy=dp, n_features=D)
    devices = _devices()
    state = p.start([0, 1, 2], seed=9)
    req = p.next_request(state)
    assert (req.round, req.action) == (0, "candidates")
    coords = req.payload.coords
    replies = {z: p.client_step(req, X, device_id=z, seed=9, state={})
               for z, X in enumerate(devices)}
    sums = sum(r.sums.astype(float) for r in replies.values())
    counts = sum(r.counts.astype(float) for r in replies.values())
    rel = p.plan.release(pk.CANDIDATES)
    r = pk.box_radius(len(coords), D, B)
    assert r < B
    # the server's noise at the box radius (no device noise here), then the step
    sums, counts = pk.noisy_relative_sums(sums, counts, rel, r, B, noise_rng(6, SERVER, 0))
    centroids = pk.relative_step(coords, sums, counts, min_count=1.0, radius=r, bound=B,
                                 sum_std=rel.noise_std * r / B)
    min_count = max(1.0, 3.0 * rel.noise_std / pk.count_weight(B, D))
    centers, _ = pk.centers_from_candidates(sums, counts, K, bound=B, min_count=min_count,
                                            seed=sklearn_seed(server_rng(9, 2)),
                                            centroids=centroids)
    p.server_step(state, req, replies)
    np.testing.assert_allclose(state.centers, centers, rtol=0, atol=1e-12)
