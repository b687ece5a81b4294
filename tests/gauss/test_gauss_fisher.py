"""Fisher-score feature selection: exact pooled per-class statistics, scores, the protocol."""

import warnings

import numpy as np
import pytest
from sklearn.datasets import load_wine
from sklearn.feature_selection import f_classif

from fedclust import FedGaussClassifier
from fedclust.flower import FlowerInMemoryTransport
from fedclust.gauss.stats import (class_moments, fisher_mask, fisher_scores,
                                  merge_class_moments)
from fedclust.sim.transport import InProcessTransport


def test_pooled_per_class_statistics_equal_numpy_on_the_union():
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(40, 3)), rng.normal(2, 3, size=(25, 3))
    ya, yb = rng.integers(0, 3, 40), rng.integers(0, 2, 25)  # class 2 missing on owner B
    n, mean, m2 = merge_class_moments(class_moments(A, ya, 3), class_moments(B, yb, 3))
    U, yu = np.vstack([A, B]), np.concatenate([ya, yb])
    for c in range(3):
        Z = U[yu == c]
        assert n[c] == len(Z)
        np.testing.assert_allclose(mean[c], Z.mean(0), rtol=1e-12)
        np.testing.assert_allclose(m2[c] / len(Z), Z.var(0), rtol=1e-11)


def test_fisher_score_by_hand_and_against_anova():
    # feature 0: class means 0 and 2 around the overall mean 1 -> between 2 * 1 + 2 * 1 = 4;
    # values +-1 around their class mean -> within 4 * 1 = 4; F = 1. Feature 1: equal
    # class means -> F = 0
    X = np.array([[-1, 5], [1, 7], [1, 5], [3, 7]], float)
    y = np.array([0, 0, 1, 1])
    F = fisher_scores(*class_moments(X, y, 2))
    np.testing.assert_allclose(F, [1.0, 0.0], atol=1e-15)
    # the ANOVA F statistic is the Fisher score times (N - M) / (M - 1)
    Xw, yw = load_wine(return_X_y=True)
    Fw = fisher_scores(*class_moments(Xw, yw, 3))
    np.testing.assert_allclose(Fw * (len(yw) - 3) / 2, f_classif(Xw, yw)[0], rtol=1e-10)
    keep = fisher_mask(Fw, 0.1)
    assert keep.tolist() == (Fw >= 0.1 * Fw.max()).tolist() and 0 < keep.sum() < 13
    assert fisher_mask(Fw, 0.0).all()
    const = fisher_scores(*class_moments(np.c_[np.ones(4), X[:, :1]], y, 2))
    assert const[0] == 0 and fisher_mask(const, 0.5).tolist() == [False, True]


def test_a_ratio_beyond_the_largest_float_scores_inf_quietly():
    # within-class scatter just above the smallest normal float, between-class far above it:
    # the ratio overflows, and the score is the inf a feature constant within classes gets
    counts = np.array([2, 2])
    means = np.array([[0.0, 0.0], [200.0, 1.0]])
    m2 = np.array([[1e-307, 1.0], [1e-307, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F = fisher_scores(counts, means, m2)
    assert F[0] == np.inf and F[1] == pytest.approx(0.5)


def _noisy_blobs(seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, 600)
    X = np.c_[4.0 * y + rng.normal(size=600), rng.normal(size=(600, 3)) * [1, 100, 1e-3]]
    parts = np.array_split(rng.permutation(600), 3)
    return X, y, [X[p] for p in parts], [y[p] for p in parts]


def test_classifier_selects_on_exact_pooled_scores_and_ignores_dropped_features():
    X, y, Xs, ys = _noisy_blobs()
    clf = FedGaussClassifier(kappa_f=0.01).fit(Xs, ys)
    want = fisher_scores(*class_moments(X, y, 3))  # centralised, on the union
    np.testing.assert_allclose(clf.fisher_scores_, want, rtol=1e-10)
    assert clf.features_.tolist() == (want >= 0.01 * want.max()).tolist()
    assert clf.features_[0] and clf.n_features_in_ == 4
    assert clf.means_.shape[1] == clf.features_.sum()
    Z = X.copy()
    Z[:, ~clf.features_] = 1e6  # a dropped feature cannot move a prediction
    np.testing.assert_array_equal(clf.predict(Z), clf.predict(X))
    assert clf.score(X, y) > 0.95
    off = FedGaussClassifier(kappa_f=0.0).fit(Xs, ys)
    assert off.features_.all() and off.fisher_scores_.size == 0
    assert off.communication_["rounds"] == clf.communication_["rounds"] - 1


def test_selection_round_same_on_flower_and_tampered_stats_are_rejected():
    _, _, Xs, ys = _noisy_blobs(1)
    a = FedGaussClassifier().fit(Xs, ys)
    b = FedGaussClassifier().fit(Xs, ys, transport=FlowerInMemoryTransport())
    np.testing.assert_array_equal(a.features_, b.features_)
    np.testing.assert_array_equal(a.means_, b.means_)

    def tamper(z, rnd, arrays):
        if z != 1 or "class_count" not in arrays or "means" in arrays:
            return arrays
        out = dict(arrays)
        out["class_count"] = arrays["class_count"] + 1  # no longer adds up to global_count
        return out

    c = FedGaussClassifier().fit(Xs, ys, transport=InProcessTransport(tamper=tamper))
    assert "device 1" in c.run_log_.rejected[1] and "add up" in c.run_log_.rejected[1]
    assert np.isfinite(c.means_).all()


def test_bad_kappa_f_is_named():
    _, _, Xs, ys = _noisy_blobs()
    with pytest.raises(ValueError, match="kappa_f"):
        FedGaussClassifier(kappa_f=-1).fit(Xs, ys)
