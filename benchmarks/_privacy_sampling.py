"""DP-FedAvg with client sampling (part of ``privacy.py``, ``--only sampling``).

scikit-learn's digits (1,797 images, pixels / 16), 1,400 training images over
200 devices of 7, the rest for testing; softmax model, ``lr = 0.5``,
``clip_norm = 1``, device level, δ = 1e-5. Every device in every round, or a
secret Poisson sample at rate q = 20 / 200 (``clients_per_round=20``), whose
rounds the accountant amplifies. Test accuracy (mean of the runs) and the
noise multiplier; for the sampled runs also the ε the same noise would give if
accounted as full participation.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.datasets import load_digits

from fedclust import FedAvg
from fedclust.privacy import DifferentialPrivacy, composed_epsilon

DELTA = 1e-5
SETTINGS = (("all devices, 30 rounds", None, 30), ("q = 0.1, 30 rounds", 20, 30),
            ("q = 0.1, 90 rounds", 20, 90))


def rows(runs: int, epsilons=(0.5, 1.0, 2.0, math.inf)):
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    idx = np.random.default_rng(0).permutation(len(X))
    X, y = X[idx], y[idx]
    Xs, ys = np.array_split(X[:1400], 200), np.array_split(y[:1400], 200)
    out, records = [], []
    for name, m, rounds in SETTINGS:
        for eps in epsilons:
            accs, z = [], math.nan
            for r in range(runs):
                dp = DifferentialPrivacy(eps, DELTA, unit="device", clip_norm=1.0)
                f = FedAvg("softmax", rounds=rounds, lr=0.5, clients_per_round=m, privacy=dp,
                           classes=10,
                           random_state=r).fit(Xs, ys)
                accs.append(float(f.score(X[1400:], y[1400:])))
                z = f.privacy_["releases"][0]["noise_multiplier"]
            unamplified = (composed_epsilon([(z, rounds)], DELTA)
                           if m is not None and z > 0 else "")
            out.append(["digits", name, eps, float(np.mean(accs)), z, unamplified])
            records.append({"setting": name, "epsilon": eps, "accuracy": accs,
                            "noise_multiplier": z, "epsilon_if_full_participation": unamplified})
    return out, records
