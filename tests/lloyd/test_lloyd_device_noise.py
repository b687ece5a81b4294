"""Distributed noise in a private Lloyd round, by hand: each device adds its share
(σ/√n_min) of the round's noise at the trust radius, and of the spread's noise on the
first Lloyd round, from its own stream; the plain reply is the same protocol's
without distributed noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.core.protocol import Request
from fedclust.lloyd.messages import RadiusBroadcast
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy, noise_rng
from fedclust.privacy import kmeans as pk
from fedclust.privacy.mechanisms import DEVICE, gaussian

B, D, NMIN = 3.0, 4, 3


@pytest.mark.parametrize("round_index,what", [(2, pk.LLOYD), (3, pk.LLOYD), (4, pk.FINAL)])
def test_a_devices_lloyd_noise_is_its_share_at_the_trust_radius(round_index, what):
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=B, noise_seed=11)
    kw = dict(init="candidates", privacy=dp, n_features=D, max_rounds=3)
    noisy = DistributedLloydProtocol(2, noise_devices=NMIN, **kw)
    plain = DistributedLloydProtocol(2, **kw)
    X = np.random.default_rng(0).normal(size=(60, D))
    r = 1.25                                      # a trust radius below the data bound
    req = Request(round_index, "lloyd", RadiusBroadcast(np.array([[1.0, 0, 0, 0], [-1, 0, 0, 0]]),
                                                         np.asarray(r)))
    got = noisy.client_step(req, X, device_id=5, seed=0, state={})
    ref = plain.client_step(req, X, device_id=5, seed=0, state={})
    sigma = noisy.plan.release(what).noise_std / math.sqrt(NMIN)
    rng = noise_rng(11, DEVICE, 5, round_index)
    want_s = gaussian(ref.sums, sigma * r / B, rng)
    want_c = gaussian(ref.counts, sigma * r / B / (r / math.sqrt(D)), rng)
    np.testing.assert_array_equal(got.sums, want_s)
    np.testing.assert_array_equal(got.counts, want_c)
    if round_index == 2:      # the first Lloyd round also releases the spread
        assert float(ref.cost) > 0
        spread = noisy.plan.release(pk.SPREAD).noise_std / math.sqrt(NMIN)
        assert float(got.cost) == float(gaussian(np.asarray(ref.cost), spread, rng))
    else:
        assert float(got.cost) == float(ref.cost) == 0.0
    assert int(got.n_devices) == 1
