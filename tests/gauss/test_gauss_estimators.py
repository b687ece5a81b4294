"""Front doors: online model, classifier conventions, numeric edge cases, bad input."""

import numpy as np
import pytest
from sklearn.datasets import load_iris, load_wine
from sklearn.preprocessing import LabelEncoder

from fedclust import EvolvingGaussians, FedGaussClassifier, FedGaussClustering, ValidationError
from fedclust.core.exceptions import NotFittedError


def split(X, y, m=3, seed=0):
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), m)
    return [X[p] for p in parts], [y[p] for p in parts]


def test_online_model_is_valid_before_the_first_sample_and_learns_a_stream():
    m = EvolvingGaussians()
    assert m.n_clusters_ == 0 and m.means_.shape[0] == 0 and m.counts_.shape == (0,)
    assert m.ages_.shape == (0,) and m.covariances_.shape[0] == 0
    with pytest.raises(NotFittedError):
        m.predict(np.zeros((1, 2)))
    from sklearn.metrics import adjusted_rand_score

    from fedclust.gauss.hooks import gauss_blobs

    X, y = gauss_blobs(0, n_clusters=8, n_per_cluster=150)
    for x in X[:5]:
        m.learn_one(x)
    m.partial_fit(X[5:])
    assert m.n_samples_seen_ == 1200 and m.counts_.sum() == 1200
    assert m.n_clusters_ <= 200  # the stream over-segments; merges wait for compact()
    m.compact()
    assert m.counts_.sum() == 1200 and m.removed_samples_ == 0
    assert 8 <= m.n_clusters_ <= 12
    assert adjusted_rand_score(y, m.predict(X)) > 0.95
    big = np.argsort(m.counts_)[::-1][:8]
    truth = np.array([X[y == c].mean(axis=0) for c in range(8)])
    dist = np.linalg.norm(m.means_[big][:, None] - truth[None], axis=2)
    assert dist.min(axis=1).max() < 0.3
    P = m.predict_proba(X[:50])
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(P.argmax(axis=1), m.predict(X[:50]))
    assert (m.ages_ >= 0).all() and m.covariances_.shape == (m.n_clusters_, 2, 2)


def test_classifier_follows_sklearn_conventions_with_string_labels():
    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    Xs, ys = split(X, names)
    clf = FedGaussClassifier().fit(Xs, ys)
    np.testing.assert_array_equal(clf.classes_, LabelEncoder().fit(names).classes_)
    P = clf.predict_proba(X)
    assert P.shape == (150, 3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(clf.classes_[P.argmax(axis=1)], clf.predict(X))
    assert clf.score(X, names) == pytest.approx(np.mean(clf.predict(X) == names))
    assert clf.score(X, names) > 0.93
    assert set(clf.clusters_per_class_) == set(names)
    gamma = FedGaussClassifier(predict_rule="gamma").fit(Xs, ys)
    np.testing.assert_allclose(gamma.predict_proba(X).sum(axis=1), 1.0)
    assert gamma.score(X, names) > 0.9


def test_non_iid_owners_every_class_survives():
    X, y = load_wine(return_X_y=True)
    Xs = [X[y == 0], X[y == 1], X[y == 2]]  # each owner holds one class
    ys = [y[y == 0], y[y == 1], y[y == 2]]
    clf = FedGaussClassifier(max_clusters=3).fit(Xs, ys)
    assert all(v >= 1 for v in clf.clusters_per_class_.values())
    assert clf.score(X, y) > 0.9
    one = FedGaussClassifier().fit([X[y == 1]], [y[y == 1]])  # one owner, one class
    assert one.classes_.tolist() == [1] and (one.predict(X) == 1).all()
    np.testing.assert_allclose(one.predict_proba(X), 1.0)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_numeric_edge_cases_stay_finite_and_bounded(covariance):
    rng = np.random.default_rng(1)
    dup = np.repeat(rng.normal(size=(3, 4)), 50, axis=0)          # duplicates
    const = np.c_[rng.normal(size=(200, 3)), np.full(200, 7.0)]  # a constant feature
    one_d = rng.normal(size=(300, 1)) * np.repeat([1.0, 50.0], 150)[:, None]
    tiny = rng.normal(size=(1, 5))                                 # a single sample
    for X in (dup, const, one_d, tiny, np.zeros((10, 3))):
        fc = FedGaussClustering(covariance=covariance).fit([X])
        assert fc.n_clusters_ >= 1 and np.isfinite(fc.means_).all()
        assert np.isfinite(fc.covariances_).all()
        P = fc.predict_proba(X)
        assert np.isfinite(P).all() and np.allclose(P.sum(axis=1), 1.0)
        m = EvolvingGaussians(covariance=covariance).fit(X)
        assert np.isfinite(m.predict_proba(X)).all()
    wide = rng.normal(size=(400, 3)) * 100
    m = EvolvingGaussians(max_clusters=5, volume_fraction=1e-6, covariance=covariance).fit(wide)
    assert m.n_clusters_ <= 5 and m.counts_.sum() <= 400


def test_bad_input_names_the_owner_and_the_value():
    X, y = load_iris(return_X_y=True)
    bad = X.copy()
    bad[4, 2] = np.nan
    with pytest.raises(ValidationError, match=r"device 1 .*nan"):
        FedGaussClustering().fit([X, bad])
    with pytest.raises(ValidationError, match="device 1 has 3 features but device 0 has 4"):
        FedGaussClustering().fit([X, X[:, :3]])
    with pytest.raises(ValidationError, match="device 1 has 0 points"):
        FedGaussClustering().fit([X, X[:0]])
    with pytest.raises(ValidationError, match=r"device 0 must be 2-D, got an array of shape \(150,\)"):
        FedGaussClustering().fit([X[:, 0]])
    with pytest.raises(ValidationError, match=r"owner 1: y has shape \(149,\)"):
        FedGaussClassifier().fit([X, X], [y, y[:-1]])
    with pytest.raises(ValidationError, match="owner 0: y contains a non-finite label nan"):
        FedGaussClassifier().fit([X], [np.where(y == 1, np.nan, y)])
    with pytest.raises(ValidationError, match="owner 1: labels mix strings and numbers"):
        FedGaussClassifier().fit([X, X], [y, np.array(["a"] * 150)])
    with pytest.raises(ValidationError, match="owner 1: labels of dtype object"):
        FedGaussClassifier().fit([X, X], [y, np.array([None] * 150, dtype=object)])
    with pytest.raises(ValidationError, match="gate_quantile"):
        FedGaussClustering(gate_quantile=1.5).fit([X])
    with pytest.raises(ValidationError, match="X has 3 features"):
        FedGaussClustering().fit([X]).predict(X[:, :3])
