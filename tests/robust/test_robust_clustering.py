"""Robust clusterers: equal to Lloyd on clean data, order-free, robust to planted outliers."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from fedclust import NotFittedError, ValidationError
from fedclust.robust import EdgeCutting, KGeomedians, KMeansLloyd, TrimmedKMeans


def _blobs(seed=0, n=300, k=4, d=8, sep=12.0):
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=(k, d))
    mu *= sep / np.linalg.norm(mu[:, None] - mu[None], axis=2)[np.triu_indices(k, 1)].min()
    lab = np.r_[np.arange(k), rng.integers(0, k, n - k)]
    return mu[lab] + rng.normal(size=(n, d)), lab, mu


def _outliers(seed, n, d, scale=1e3):
    return scale * np.random.default_rng(seed).normal(size=(n, d))


# trimming must exceed the contamination a cluster sees (~12% below): beta=0.25, keep 75%
ROBUST = [
    lambda k, **kw: TrimmedKMeans(k, **kw),
    lambda k, **kw: TrimmedKMeans(k, center="trimmed-mean", beta=0.25, **kw),
    lambda k, **kw: TrimmedKMeans(k, radius_rule="quantile", radius=0.75, **kw),
    lambda k, **kw: TrimmedKMeans(k, radius_rule="median", **kw),
    lambda k, **kw: KGeomedians(k, **kw),
]


def _geomedian_gradient(c, P):
    """Norm of the gradient of Σ ‖c − p‖ at c: 0 at the geometric median."""
    u = c - P
    return float(np.linalg.norm((u / np.linalg.norm(u, axis=1, keepdims=True)).sum(axis=0)))


@pytest.mark.parametrize("rule", ["trim-default", "trim-mean", "trim-quantile", "trim-median",
                                  "geomedian", "lloyd"])
def test_equals_lloyd_on_clean_separated_data(rule):
    """Same partition as scikit-learn's Lloyd; each centre is its own rule's centre of that
    partition, computed independently (mean, scipy's trimmed mean, or the point where the
    geometric median's gradient vanishes)."""
    from scipy.stats import trim_mean

    make = dict(zip(["trim-default", "trim-mean", "trim-quantile", "trim-median", "geomedian"],
                    ROBUST)).get(rule, lambda k, **kw: KMeansLloyd(k, **kw))
    X, lab, _ = _blobs(0)
    init = X[[np.flatnonzero(lab == j)[0] for j in range(4)]]
    ref = KMeans(4, init=init, n_init=1, algorithm="lloyd", tol=0).fit(X)
    est = make(4, init=init).fit(X)
    np.testing.assert_array_equal(est.labels_, ref.labels_)
    np.testing.assert_array_equal(est.predict(X), est.labels_)
    C, L = est.cluster_centers_, ref.labels_
    if rule in ("trim-default", "trim-median", "lloyd"):   # nothing trimmed on clean data
        np.testing.assert_allclose(C, ref.cluster_centers_, rtol=0, atol=1e-10)
    elif rule == "trim-mean":
        tm = np.array([trim_mean(X[L == j], 0.25, axis=0) for j in range(4)])
        np.testing.assert_allclose(C, tm, rtol=0, atol=1e-10)
    elif rule == "trim-quantile":           # the mean of the 75 % kept
        keep = est.inlier_mask_
        assert keep.mean() == pytest.approx(0.75, abs=0.01)
        kept = np.array([X[(L == j) & keep].mean(axis=0) for j in range(4)])
        np.testing.assert_allclose(C, kept, rtol=0, atol=1e-10)
    else:
        assert max(_geomedian_gradient(C[j], X[L == j]) for j in range(4)) < 1e-6
        # the geometric median is not the mean: the rule really differs from Lloyd's
        assert np.abs(C - ref.cluster_centers_).max() > 1e-3


def test_trimmed_kmeans_default_radius_keeps_all_clean_points_exactly_lloyd():
    X, lab, _ = _blobs(1, d=10)
    init = X[[np.flatnonzero(lab == j)[0] for j in range(4)]]
    ref = KMeans(4, init=init, n_init=1, algorithm="lloyd", tol=0).fit(X)
    est = TrimmedKMeans(4, init=init).fit(X)
    assert est.inlier_mask_.all()
    np.testing.assert_allclose(est.cluster_centers_, ref.cluster_centers_, atol=1e-10)


@pytest.mark.parametrize("make", ROBUST + [lambda k, **kw: KMeansLloyd(k, **kw)])
def test_robust_init_recovers_clean_clusters(make):
    X, lab, _ = _blobs(2)
    est = make(4, random_state=0).fit(X)
    assert adjusted_rand_score(lab, est.labels_) == 1.0


def test_edge_cutting_on_clean_data_finds_the_clusters_without_k():
    X, lab, _ = _blobs(3)
    ec = EdgeCutting().fit(X)
    assert ec.n_clusters_ == 4
    assert adjusted_rand_score(lab, ec.labels_) == 1.0
    ref = KMeans(4, n_init=10, random_state=0).fit(X)
    assert adjusted_rand_score(ref.labels_, ec.labels_) == 1.0


@pytest.mark.parametrize("make", ROBUST + [lambda k, **kw: EdgeCutting(n_clusters=k)])
def test_machine_order_invariance(make):
    X, lab, _ = _blobs(4)
    X = np.vstack([X, _outliers(4, 30, X.shape[1])])
    perm = np.random.default_rng(0).permutation(len(X))
    kw = {} if "EdgeCutting" in repr(make(4)) else {"random_state": 0}
    a = make(4, **kw).fit(X)
    b = make(4, **kw).fit(X[perm])
    assert adjusted_rand_score(a.labels_[perm], b.labels_) == 1.0
    A = np.array(sorted(map(tuple, np.round(a.cluster_centers_, 8))))
    B = np.array(sorted(map(tuple, np.round(b.cluster_centers_, 8))))
    np.testing.assert_allclose(A, B, atol=1e-6)


@pytest.mark.parametrize("make", ROBUST + [lambda k, **kw: EdgeCutting(n_clusters=k)])
def test_robust_to_planted_outliers_where_lloyd_breaks(make):
    X, lab, mu = _blobs(5)
    Xo = np.vstack([X, _outliers(5, 40, X.shape[1])])   # ~12% far outliers
    kw = {} if "EdgeCutting" in repr(make(4)) else {"random_state": 0}
    est = make(4, **kw).fit(Xo)
    assert adjusted_rand_score(lab, est.labels_[:len(X)]) == 1.0
    C = est.cluster_centers_
    err = max(np.linalg.norm(C - m, axis=1).min() for m in mu)
    assert err < 0.6
    lloyd = KMeansLloyd(4, init="k-means++", random_state=0).fit(Xo)   # same robust seeding
    bad = KMeans(4, n_init=10, random_state=0).fit(Xo)                  # plain k-means++
    assert adjusted_rand_score(lab, bad.labels_[:len(X)]) < 0.9
    assert max(np.linalg.norm(lloyd.cluster_centers_ - m, axis=1).min() for m in mu) > 2.0


def test_trimmed_kmeans_marks_far_points_as_outliers():
    X, lab, _ = _blobs(6)
    Xo = np.vstack([X, _outliers(6, 30, X.shape[1])])
    est = TrimmedKMeans(4, random_state=0).fit(Xo)
    assert not est.inlier_mask_[len(X):].any()
    assert est.inlier_mask_[:len(X)].mean() > 0.99
    ec = EdgeCutting().fit(Xo)
    assert (ec.labels_[len(X):] == -1).all() and (ec.labels_[:len(X)] >= 0).all()


def test_pooled_radius_survives_a_cluster_taken_over_by_outliers():
    # 30 spread outliers all nearest cluster 0 (25 honest points): a per-cluster median
    # distance is inflated by them and keeps them; one pooled noise scale drops them
    X, lab, mu = _blobs(10, n=100, k=4, d=8, sep=30.0)
    rng = np.random.default_rng(10)
    u = rng.normal(size=(30, 8))
    out = mu[0] + 10.0 * u / np.linalg.norm(u, axis=1)[:, None]
    Xo = np.vstack([X, out])
    init = mu + 0.1
    pooled = TrimmedKMeans(4, init=init).fit(Xo)
    per = TrimmedKMeans(4, init=init, radius_rule="median").fit(Xo)
    assert np.argmin(np.linalg.norm(out[0] - pooled.cluster_centers_, axis=1)) == 0
    err = lambda C: np.linalg.norm(C[0] - X[lab == 0].mean(axis=0))
    assert not pooled.inlier_mask_[len(X):].any()
    assert err(pooled.cluster_centers_) < 1e-9 < 0.5 < err(per.cluster_centers_)


def test_init_labels_history_and_misclustering_decay():
    X, lab, _ = _blobs(7, n=400)
    rng = np.random.default_rng(7)
    noisy = lab.copy()
    flip = rng.random(len(lab)) < 0.4
    noisy[flip] = rng.integers(0, 4, flip.sum())
    Xo = np.vstack([X, _outliers(7, 50, X.shape[1])])
    init = np.r_[noisy, rng.integers(0, 4, 50)]
    tk = TrimmedKMeans(4).fit(Xo, init_labels=init)
    assert np.array_equal(tk.labels_history_[0], init)
    assert len(tk.labels_history_) == tk.n_iter_ + 1 and tk.converged_
    assert adjusted_rand_score(lab, tk.labels_[:400]) == 1.0
    lloyd = KMeansLloyd(4).fit(Xo, init_labels=init)
    assert adjusted_rand_score(lab, lloyd.labels_[:400]) < 0.9


def test_sample_weight_equals_repetition():
    X, lab, _ = _blobs(8, n=80)
    reps = np.random.default_rng(8).integers(1, 3, len(X))
    init = X[[np.flatnonzero(lab == j)[0] for j in range(4)]]
    for make in (lambda: TrimmedKMeans(4, init=init, duplicates="weight"),
                 lambda: KGeomedians(4, init=init, duplicates="weight")):
        a = make().fit(X, sample_weight=reps)
        b = make().fit(np.repeat(X, reps, 0))
        np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, atol=1e-7)


def test_identical_colluders_count_once():
    # 4 clusters of 20 honest points, 20 liars sending one identical point next to cluster 0:
    # counted as 20 witnesses they outweigh cluster 0's own points; counted once they do not
    X, lab, _ = _blobs(11, n=80)
    true0 = X[lab == 0].mean(axis=0)
    spread = np.linalg.norm(X[lab == 0] - true0, axis=1).max()
    lie = true0 + 1.5 * spread * np.eye(X.shape[1])[0]
    Xb = np.vstack([X, np.repeat(lie[None], 20, axis=0)])
    init = Xb[[np.flatnonzero(lab == j)[0] for j in range(4)]]
    once = KGeomedians(4, init=init).fit(Xb)
    counted = KGeomedians(4, init=init, duplicates="weight").fit(Xb)
    err = lambda m: np.linalg.norm(m.cluster_centers_ - true0, axis=1).min()
    assert err(once) < 0.5 * spread
    assert err(counted) > err(once)
    with pytest.raises(ValidationError, match="duplicates"):
        KGeomedians(4, duplicates="maybe").fit(X)


def test_bad_input_named():
    X, _, _ = _blobs(9, n=20)
    with pytest.raises(ValidationError, match="n_clusters"):
        TrimmedKMeans(30).fit(X)
    with pytest.raises(ValidationError, match="beta"):
        TrimmedKMeans(2, center="trimmed-mean", beta=0.5).fit(X)
    with pytest.raises(ValidationError, match="radius_rule"):
        TrimmedKMeans(2, radius_rule="huge").fit(X)
    with pytest.raises(ValidationError, match="init_labels"):
        TrimmedKMeans(2).fit(X, init_labels=np.full(20, 5))
    with pytest.raises(ValidationError):
        KGeomedians(2).fit(np.r_[X, [[np.nan] * X.shape[1]]])
    with pytest.raises(ValidationError, match="init"):
        KGeomedians(2, init=np.zeros((3, 2))).fit(X)
    with pytest.raises(NotFittedError):
        KGeomedians(2).predict(X)
    with pytest.raises(ValidationError, match="threshold"):
        EdgeCutting(threshold="big").fit(X)
