"""DP Gaussian classifier (noisy per-class moments, PSD repair)."""

from __future__ import annotations

import math

import numpy as np

from fedclust import FedGaussClassifier
from fedclust.privacy import DifferentialPrivacy
from conftest import KeepOutput


def two_classes(seed=0, n=300, d=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.standard_normal((n, d)) + 3.0 * y[:, None]
    return np.array_split(X, 4), np.array_split(y, 4), X, y


def test_infinite_epsilon_is_the_exact_per_class_gaussian():
    Xs, ys, X, y = two_classes()
    m = FedGaussClassifier(privacy=DifferentialPrivacy(math.inf, 1e-6, data_bound=100.0),
                           classes=[0, 1], random_state=0).fit(Xs, ys)
    for c in (0, 1):
        Xc = X[y == c]
        i = list(m.cluster_classes_).index(c)
        assert np.allclose(m.means_[i], Xc.mean(0))
        assert np.allclose(m.scatters_[i], (Xc - Xc.mean(0)).T @ (Xc - Xc.mean(0)))
    assert m.score(X, y) > 0.95


def test_noisy_model_is_psd_and_budget_holds():
    Xs, ys, X, y = two_classes(1, n=200, d=4)
    dp = DifferentialPrivacy(0.5, 1e-6, data_bound=6.0, noise_seed=0)
    t = KeepOutput()
    m = FedGaussClassifier(privacy=dp, classes=[0, 1], random_state=0).fit(Xs, ys, transport=t)
    for S in m.scatters_:
        assert np.allclose(S, S.T)
        assert np.linalg.eigvalsh(S).min() > 0              # the PSD repair
    assert m.privacy_["epsilon_spent"] <= 0.5
    assert m.privacy_["releases"][0]["sensitivity"] == 2 * 6.0 ** 2
    assert t.clipped(range(4)) == [int((np.linalg.norm(Xz, axis=1) > 6.0).sum()) for Xz in Xs]
    assert np.isfinite(m.predict_proba(X)).all()


def test_accuracy_improves_with_budget():
    Xs, ys, X, y = two_classes(2, n=2000, d=3)
    acc = [np.mean([FedGaussClassifier(privacy=DifferentialPrivacy(
        eps, 1e-6, data_bound=8.0, noise_seed=s), classes=[0, 1], random_state=0).fit(Xs, ys).score(X, y)
        for s in range(3)]) for eps in (0.05, 4.0)]
    assert acc[1] > 0.95 and acc[1] >= acc[0]
