"""scikit-learn's ``score`` on every clusterer: the negative k-means cost (``KMeans.score``)
for the k-means family, the average log-likelihood (``GaussianMixture.score``) for the
Gaussians; so ``GridSearchCV`` runs without a scorer."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV, KFold

import fedclust as fc
from fedclust.core.exceptions import NotFittedError, ValidationError
from fedclust.robust import EdgeCutting, KGeomedians, KMeansLloyd, TrimmedKMeans


def _blobs(seed=0, n=240, d=3):
    X, _ = make_blobs(n, centers=3, n_features=d, cluster_std=0.6, random_state=seed)
    return X


def _sklearn_kmeans_at(centers: np.ndarray) -> KMeans:
    """A fitted scikit-learn KMeans whose centers are exactly ``centers`` (fitted on the
    centers themselves: each is its own cluster's mean, to rounding)."""
    km = KMeans(len(centers), init=centers, n_init=1).fit(centers)
    np.testing.assert_allclose(km.cluster_centers_, centers, rtol=1e-13, atol=1e-13)
    return km


KMEANS_FAMILY = [
    lambda: fc.KFed(3, 3, random_state=0),
    lambda: fc.DistributedLloyd(3, random_state=0),
    lambda: fc.DistributedKMeans(3, coreset_size=60, random_state=0),
    lambda: TrimmedKMeans(3, random_state=0),
    lambda: KGeomedians(3, random_state=0),
    lambda: KMeansLloyd(3, random_state=0),
    lambda: EdgeCutting(),
]


@pytest.mark.parametrize("make", KMEANS_FAMILY,
                         ids=["KFed", "DistributedLloyd", "DistributedKMeans", "TrimmedKMeans",
                              "KGeomedians", "KMeansLloyd", "EdgeCutting"])
def test_kmeans_family_score_is_sklearns_kmeans_score(make):
    X = _blobs()
    model = make().fit(X[:180])
    ref = _sklearn_kmeans_at(model.cluster_centers_)
    test = X[180:]
    assert model.score(test) == pytest.approx(ref.score(test), rel=1e-12)
    w = np.random.default_rng(1).uniform(0.0, 2.0, len(test))
    assert model.score(test, sample_weight=w) == pytest.approx(
        ref.score(test, sample_weight=w), rel=1e-12)
    assert model.score(test) < 0.0
    # the nearest center's squared distance, by hand, for one row
    d2 = ((model.cluster_centers_ - test[0]) ** 2).sum(axis=1).min()
    assert model.score(test[:1]) == pytest.approx(-d2, rel=1e-12)


def test_kmeans_score_errors():
    X = _blobs()
    with pytest.raises(NotFittedError):
        fc.KFed(3, 3).score(X)
    m = fc.KFed(3, 3, random_state=0).fit(X)
    with pytest.raises(ValidationError, match="features"):
        m.score(X[:, :2])
    with pytest.raises(ValidationError, match="sample_weight"):
        m.score(X, sample_weight=-np.ones(len(X)))


def _sklearn_mixture_at(model, covariance_type: str) -> GaussianMixture:
    """A GaussianMixture holding the model's weights, means and covariances (precision
    Cholesky factors computed here, as scikit-learn defines them)."""
    gm = GaussianMixture(model.n_clusters_, covariance_type=covariance_type)
    gm.weights_ = model.counts_ / model.counts_.sum()
    gm.means_ = model.means_
    gm.covariances_ = model.covariances_
    if covariance_type == "full":
        gm.precisions_cholesky_ = np.stack([np.linalg.inv(np.linalg.cholesky(c)).T
                                            for c in model.covariances_])
    else:
        gm.precisions_cholesky_ = 1.0 / np.sqrt(model.covariances_)
    gm.n_features_in_ = model.means_.shape[1]
    return gm


@pytest.mark.parametrize("covariance", ["full", "diag"])
@pytest.mark.parametrize("federated", [True, False])
def test_gaussian_score_is_sklearns_gaussian_mixture_score(covariance, federated):
    X = _blobs(2)
    if federated:
        model = fc.FedGaussClustering(covariance=covariance).fit(
            X[:180], groups=np.arange(180) % 3)
    else:
        model = fc.EvolvingGaussians(covariance=covariance).fit(X[:180])
    assert model.n_clusters_ >= 2
    ref = _sklearn_mixture_at(model, covariance)
    test = X[180:]
    np.testing.assert_allclose(model.score_samples(test), ref.score_samples(test), rtol=1e-9)
    assert model.score(test) == pytest.approx(ref.score(test), rel=1e-9)


def test_gaussian_score_uses_the_shrunk_scoring_covariances():
    X = _blobs(3)
    plain = fc.FedGaussClustering().fit(X, groups=np.arange(len(X)) % 2)
    shrunk = fc.FedGaussClustering(pooled_shrinkage=0.5).fit(X, groups=np.arange(len(X)) % 2)
    np.testing.assert_array_equal(plain.means_, shrunk.means_)   # learning is unchanged
    assert shrunk.score(X) != pytest.approx(plain.score(X), rel=1e-6)


def test_grid_search_without_a_scorer_kmeans():
    X = _blobs(4, n=300)
    cv = KFold(3)
    search = GridSearchCV(fc.KFed(1, 3, random_state=0), {"n_clusters": [1, 2, 3]},
                          cv=cv).fit(X)
    assert search.best_params_ == {"n_clusters": 3}
    # the grid's held-out scores are scikit-learn's KMeans.score on the fitted centers
    for k, got in zip([1, 2, 3], search.cv_results_["mean_test_score"]):
        want = []
        for train, test in cv.split(X):
            m = fc.KFed(k, 3, random_state=0).fit(X[train])
            want.append(_sklearn_kmeans_at(m.cluster_centers_).score(X[test]))
        assert got == pytest.approx(np.mean(want), rel=1e-10)


def test_grid_search_without_a_scorer_gaussians():
    X = _blobs(5, n=300)
    # merge_tol = 5 nats per sample merges the three blobs into one Gaussian
    search = GridSearchCV(fc.FedGaussClustering(), {"merge_tol": [0.01, 5.0]},
                          cv=KFold(3, shuffle=True, random_state=0)).fit(X)
    assert search.best_params_ == {"merge_tol": 0.01}
    assert search.best_estimator_.n_clusters_ == 3
    assert fc.FedGaussClustering(merge_tol=5.0).fit(X).n_clusters_ == 1
