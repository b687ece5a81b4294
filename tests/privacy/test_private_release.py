"""What a private fit releases: no exact per-device values, public label sets,
sampling the server cannot see (epsilon_spent always a number)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedclust import FedAvg, FedGaussClassifier, IFCA
from fedclust.core.exceptions import ValidationError
from fedclust.privacy import DifferentialPrivacy, composed_epsilon


def _fl_federation(Z=12, n=20, d=4, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d)
    Xs = [rng.standard_normal((n, d)) for _ in range(Z)]
    return Xs, [(X @ w > 0).astype(int) for X in Xs]




def test_secure_sampled_dp_fedavg_asks_every_device_and_accounts_a_number():
    Xs, ys = _fl_federation()
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=3)
    m = FedAvg("logistic", rounds=4, lr=0.5, clients_per_round=3, privacy=dp,
               secure_aggregation=True, random_state=0).fit(Xs, ys)
    spent = m.privacy_["epsilon_spent"]
    assert isinstance(spent, float) and math.isfinite(spent)
    rel = m.privacy_["releases"][0]
    # the devices' own coins keep the sample from the server: amplification holds and the
    # accountant's number is the Poisson-sampled composition of the calibrated multiplier
    assert rel["sampling"] == pytest.approx(3 / 12)
    assert spent == pytest.approx(composed_epsilon([(rel["noise_multiplier"], 4, 3 / 12)], 1e-5))
    assert spent <= 2.0
    # the server sent every round to all 12 devices: it cannot tell who was sampled
    assert [h["devices"] for h in m.history_] == [12] * 4


def test_device_coins_leave_unsampled_devices_out_of_the_sum():
    from fedclust.fl.protocol import FedAvgProtocol

    dp = DifferentialPrivacy(math.inf, 1e-5, unit="device", clip_norm=1.0, noise_seed=1)
    p = FedAvgProtocol(model="linear", n_features=2, n_classes=1, privacy=dp, sampling=0.3,
                       secure_sum=True, noise_devices=3)
    coins = [p._device_coin(z, r) for z in range(40) for r in range(10)]
    assert 0.2 < np.mean(coins) < 0.4   # Binomial(400, 0.3): 6 stds either side
    off = p._noisy_update(np.array([0.3, 0.4, 0.0]), 0, 0, sampled=False)
    on = p._noisy_update(np.array([0.3, 0.4, 0.0]), 0, 0, sampled=True)
    assert float(off.count) == 0.0 and np.all(off.delta == 0)
    assert float(on.count) == 1.0 and np.allclose(on.delta, [0.3, 0.4, 0.0])
