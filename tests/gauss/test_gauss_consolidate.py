"""Consolidation of the merged clusters against their pieces (server and compact)."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedclust import EvolvingGaussians, FedGaussClustering
from fedclust.gauss.consolidate import consolidate, snapshot
from fedclust.gauss.datasets import separated_blobs
from fedclust.gauss.model import ClusterSet, Settings
from fedclust.gauss.stats import moments


def _bridged(seed, k, D, frac=0.05):
    """Separated blobs plus ``frac`` bridging rows (label 0) scattered around points on
    the segments between each blob centre and its nearest neighbour."""
    X, y = separated_blobs(seed, k, D, separation=2.5)
    rng = np.random.default_rng(seed + 1000)
    mu = np.array([X[y == c].mean(0) for c in range(1, k + 1)])
    d = np.linalg.norm(mu[:, None] - mu[None], axis=2)
    np.fill_diagonal(d, np.inf)
    m = int(frac * len(X))
    a = rng.integers(0, k, m)
    b = d[a].argmin(axis=1)
    t = rng.uniform(0.3, 0.7, m)[:, None]
    spread = 0.3 * X.std(0).mean() / k ** (1 / D)
    B = mu[a] + t * (mu[b] - mu[a]) + rng.normal(size=(m, D)) * spread
    return np.vstack([X, B]), np.r_[y, np.zeros(m, int)]


# cases not used to design the rule: separated blobs with bridging noise, several k and D
@pytest.mark.parametrize("seed, k, D", [(31, 7, 2), (32, 11, 2), (33, 9, 3), (34, 6, 4),
                                        (35, 14, 2), (36, 8, 6)])
def test_bridging_fragments_join_the_blobs(seed, k, D):
    X, y = _bridged(seed, k, D)
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), 3)
    fc = FedGaussClustering(random_state=seed).fit([X[p] for p in parts])
    blob = y > 0
    assert abs(fc.n_clusters_ - k) <= 1
    assert adjusted_rand_score(y[blob], fc.predict(X)[blob]) >= 0.95
    assert fc.counts_.sum() == len(X)
    m = EvolvingGaussians().fit(X)  # one owner: compact() consolidates the same way
    assert abs(m.n_clusters_ - k) <= 1 and m.counts_.sum() == len(X)


@pytest.mark.parametrize("full", [True, False])
def test_consolidate_keeps_the_pooled_moments_and_whole_pieces(full):
    rng = np.random.default_rng(3)
    D = 3
    X = np.vstack([rng.normal(size=(400, D)) + c for c in ([0, 0, 0], [6, 0, 0], [3, 5, 0])])
    X = np.vstack([X, rng.uniform(-2, 8, size=(60, D))])  # stray rows between the blobs
    cs = ClusterSet(D, Settings(covariance="full" if full else "diag"))
    cs.set_global(*moments(X))
    cs.set_birth_scale(X)
    cs.learn(X[rng.permutation(len(X))])
    pieces = snapshot(cs)
    cs.merge_all()
    before = cs.C
    consolidate(cs, pieces)
    assert 1 <= cs.C <= pieces["n"].size and before >= 1
    C = cs.C
    n, mu, S = cs.n[:C], cs.mu[:C], cs.S[:C]
    # the components partition the rows: total count, mean and scatter are the rows'
    assert n.sum() == pytest.approx(len(X))
    mean = (n[:, None] * mu).sum(0) / n.sum()
    np.testing.assert_allclose(mean, X.mean(0), atol=1e-9)
    Sd = np.diagonal(S, axis1=1, axis2=2) if full else S
    total = Sd.sum(0) + (n[:, None] * (mu - mean) ** 2).sum(0)
    np.testing.assert_allclose(total, ((X - X.mean(0)) ** 2).sum(0), rtol=1e-9)
    # every component is an exact pool of whole pieces (non-negative scatter, n integer)
    np.testing.assert_allclose(n, np.rint(n))
    assert (Sd > 0).all()


def test_consolidate_is_idle_on_the_volume_rule_and_on_one_cluster():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    cs = ClusterSet(2, Settings(merge_test="volume"))
    cs.set_global(*moments(X))
    cs.learn(X)
    pieces = snapshot(cs)
    C = cs.C
    assert consolidate(cs, pieces) == 0 and cs.C == C


def _lumped(X, n_pieces, seed, full=True):
    """A cluster set holding ``n_pieces`` spatial tiles of X (k-means cells) as its pieces,
    all merged into one component by exact pooling, as a greedy merge could leave them."""
    from sklearn.cluster import KMeans

    tiles = KMeans(n_pieces, n_init=1, random_state=seed).fit_predict(X)
    D = X.shape[1]
    cs = ClusterSet(D, Settings(covariance="full" if full else "diag"))
    cs.set_global(*moments(X))
    cs.set_birth_scale(X)
    for t in range(n_pieces):
        R = X[tiles == t]
        E = R - R.mean(0)
        cs.add(R.mean(0)[None], (E.T @ E if full else (E * E).sum(0))[None],
               np.array([float(len(R))]), np.array([-1]), np.array([0]))
    pieces = snapshot(cs)
    while cs.C > 1:
        _, stats = cs._merge_scores(np.array([0]), np.array([cs.C - 1]))
        cs._merge_pair(0, cs.C - 1, stats, 0)
    return cs, pieces, tiles


def _bic_prefers_two(X, seed):
    from sklearn.mixture import GaussianMixture

    bic = [GaussianMixture(m, random_state=seed, n_init=3).fit(X).bic(X) for m in (1, 2)]
    return bic[1] < bic[0]


@pytest.mark.parametrize("seed, D, gap, full", [(41, 2, 5.0, True), (42, 3, 4.5, True),
                                                (43, 5, 5.0, False), (44, 2, 4.0, False)])
def test_a_component_of_two_gaussians_splits_on_its_pieces(seed, D, gap, full):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(500, D))
    B = rng.normal(size=(350, D)) * 0.7 + gap * np.eye(D)[0]
    X = np.vstack([A, B])
    assert _bic_prefers_two(X, seed)  # scikit-learn's BIC on the same rows: two Gaussians
    cs, pieces, tiles = _lumped(X, 24, seed, full)
    assert consolidate(cs, {k: v.copy() for k, v in pieces.items()}, split=False) == 0
    assert cs.C == 1  # without the split nothing can undo the lump
    cs, pieces, tiles = _lumped(X, 24, seed, full)
    consolidate(cs, pieces)
    assert cs.C == 2
    # the two components are the two Gaussians up to the tiles that straddle the gap
    order = np.argsort(cs.mu[:2, 0])
    np.testing.assert_allclose(cs.n[:2][order], [500, 350], atol=25)
    np.testing.assert_allclose(cs.mu[:2][order], [A.mean(0), B.mean(0)], atol=0.25)
    assert cs.n[:2].sum() == pytest.approx(len(X))


@pytest.mark.parametrize("seed, D, full", [(51, 2, True), (52, 10, True), (53, 10, False),
                                           (54, 1, True)])
def test_a_component_of_one_gaussian_does_not_split(seed, D, full):
    X = np.random.default_rng(seed).normal(size=(3000, D)) * np.linspace(1, 3, D)
    assert not _bic_prefers_two(X, seed)  # scikit-learn's BIC on the same rows: one
    cs, pieces, _ = _lumped(X, 30, seed, full)
    consolidate(cs, pieces)
    assert cs.C == 1 and cs.n[0] == pytest.approx(len(X))
