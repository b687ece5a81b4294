"""The owner's split of a cluster on its own rows, and the row tracking it rests on."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from fedclust import EvolvingGaussians, FedGaussClustering
from fedclust.gauss.model import ClusterSet, Settings
from fedclust.gauss.stats import moments


def _scatter(Z):
    m = Z.mean(0)
    return (Z - m).T @ (Z - m)


@pytest.mark.parametrize("merge_test", ["bic", "volume"])
@pytest.mark.parametrize("fast", [True, False])
def test_rows_are_traced_to_their_cluster_through_merges_and_removals(merge_test, fast,
                                                                       monkeypatch):
    monkeypatch.setattr(ClusterSet, "use_fast", fast)
    for seed in range(4):
        rng = np.random.default_rng(300 + seed)
        D, n = int(rng.integers(1, 5)), int(rng.integers(100, 2500))
        X = rng.normal(size=(n, D)) * rng.uniform(0.3, 3, D) + 5 * rng.integers(0, 4, (n, 1))
        cs = ClusterSet(D, Settings(max_clusters=int(rng.integers(3, 30)),
                                    merge_test=merge_test))
        cs.set_global(*moments(X))
        lab = np.empty(n, np.int64)
        cs.learn(X, None, lab)
        slot = cs.row_clusters(lab)
        # exact: every cluster's count, mean and scatter are those of the rows traced to it
        counts = np.bincount(slot[slot >= 0], minlength=cs.C)
        np.testing.assert_allclose(counts, cs.n[:cs.C])
        assert (slot < 0).sum() == pytest.approx(cs.removed)
        for k in np.flatnonzero(counts > 1):
            np.testing.assert_allclose(X[slot == k].mean(0), cs.mu[k], atol=1e-9)
            np.testing.assert_allclose(_scatter(X[slot == k]), cs.S[k], rtol=1e-7, atol=1e-7)


def _one_cluster(X):
    cs = ClusterSet(X.shape[1], Settings())
    cs.set_global(*moments(X))
    cs.add(X.mean(0)[None], _scatter(X)[None], np.array([float(len(X))]), np.array([-1]),
           np.zeros(1, np.int64))
    return cs, np.full(len(X), cs.uid[0])


def test_a_cluster_of_two_blobs_splits_into_their_exact_statistics():
    rng = np.random.default_rng(5)
    wide = rng.normal(size=(1500, 3)) * 2.0
    narrow = rng.normal(size=(300, 3)) * 0.3 + [5.0, 0.0, 0.0]  # inside the wide 99 % region
    X = np.vstack([wide, narrow])
    cs, lab = _one_cluster(X)
    assert cs.split_by_rows(X, lab) == 1 and cs.C == 2
    k = int(np.argmin(cs.n[:2]))
    # the small half is the narrow blob up to the few wide rows that fall on it
    assert abs(cs.n[k] - 300) <= 10
    np.testing.assert_allclose(cs.n[:2].sum(), 1800)
    # the halves' statistics are exact: they pool back to the cluster's (Chan)
    m = (cs.n[0] * cs.mu[0] + cs.n[1] * cs.mu[1]) / 1800
    d = cs.mu[0] - cs.mu[1]
    S = cs.S[0] + cs.S[1] + cs.n[0] * cs.n[1] / 1800 * np.outer(d, d)
    np.testing.assert_allclose(m, X.mean(0), atol=1e-9)
    np.testing.assert_allclose(S, _scatter(X), rtol=1e-9)
    assert np.linalg.norm(cs.mu[k] - narrow.mean(0)) < 0.2


@pytest.mark.parametrize("D, n, seed", [(1, 3000, 0), (2, 800, 1), (6, 2000, 2)])
def test_one_gaussian_is_not_split(D, n, seed):
    rng = np.random.default_rng(400 + seed)
    A = rng.normal(size=(D, D)) + 2 * np.eye(D)
    X = rng.normal(size=(n, D)) @ A.T
    cs, lab = _one_cluster(X)
    assert cs.split_by_rows(X, lab) == 0 and cs.C == 1


@pytest.mark.parametrize("seed", [3, 8, 11, 12])
def test_two_close_equal_blobs_on_one_owner_are_two_clusters(seed):
    # 4 sigma apart, 3,000 rows each, one stream: the wide cluster formed at the cap used
    # to swallow the neighbour's tail or leave it in strips (12-18 clusters for seeds 3, 8)
    X, y = make_blobs(n_samples=[3000, 3000], centers=np.array([[0.0, 0.0], [4.0, 0.0]]),
                      cluster_std=1.0, random_state=seed)
    m = EvolvingGaussians().fit(X)
    assert m.n_clusters_ == 2
    assert adjusted_rand_score(y, m.labels_) > 0.85
    assert m.counts_.sum() + m.removed_samples_ == 6000


def test_a_narrow_blob_beside_a_wide_one_survives_the_federation():
    rng = np.random.default_rng(9)
    wide = rng.normal(size=(3000, 4)) * 2.0
    narrow = rng.normal(size=(400, 4)) * 0.4 + [5.5, 0, 0, 0]
    X = np.vstack([wide, narrow])
    y = np.r_[np.zeros(3000), np.ones(400)]
    parts = np.array_split(rng.permutation(len(X)), 3)
    fc = FedGaussClustering(random_state=0).fit([X[p] for p in parts])
    assert fc.n_clusters_ == 2
    assert adjusted_rand_score(y, fc.predict(X)) > 0.9
    assert fc.counts_.sum() == len(X) and fc.removed_samples_ == 0


def test_the_split_respects_max_clusters():
    rng = np.random.default_rng(2)
    X = np.vstack([rng.normal(size=(400, 2)) * 2.0, rng.normal(size=(100, 2)) * 0.2 + [4.5, 0]])
    cs, lab = _one_cluster(X)
    capped = ClusterSet(2, Settings(max_clusters=1))
    capped.set_global(*moments(X))
    capped.add(cs.mu[:1], cs.S[:1], cs.n[:1], cs.cls[:1], cs.last[:1])
    assert capped.split_by_rows(X, np.full(len(X), capped.uid[0])) == 0 and capped.C == 1
    assert cs.split_by_rows(X, lab) == 1  # the same cluster splits without the cap
