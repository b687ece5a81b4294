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
def test_consolidate_keeps_the_pooled_moments_and_never_adds_clusters(full):
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
    assert 1 <= cs.C <= before
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
