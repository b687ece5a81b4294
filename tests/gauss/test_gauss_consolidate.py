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


def _grouped(X, tiles, group_of_tile, full=True):
    """A cluster set whose pieces are the tiles of X, pooled exactly into the components
    ``group_of_tile`` (one entry per tile)."""
    D = X.shape[1]
    cs = ClusterSet(D, Settings(covariance="full" if full else "diag"))
    cs.set_global(*moments(X))
    cs.set_birth_scale(X)
    order = np.argsort(group_of_tile, kind="stable")
    for t in order:
        R = X[tiles == t]
        E = R - R.mean(0)
        cs.add(R.mean(0)[None], (E.T @ E if full else (E * E).sum(0))[None],
               np.array([float(len(R))]), np.array([-1]), np.array([0]))
    pieces = snapshot(cs)
    groups = np.asarray(group_of_tile)[order]
    for g in np.unique(groups)[::-1]:
        members = np.flatnonzero(groups == g)
        for b in members[:0:-1]:
            _, stats = cs._merge_scores(np.array([members[0]]), np.array([b]))
            cs._merge_pair(int(members[0]), int(b), stats, 0)
    return cs, pieces


@pytest.mark.parametrize("full", [True, False])
def test_the_piece_tied_likelihood_bounds_the_mixture_likelihood(full):
    """Against scikit-learn's GaussianMixture.score_samples on the rows: a lower bound for
    every piece, equal for one-row pieces."""
    from sklearn.mixture import GaussianMixture

    from fedclust.gauss.piece_stats import tied_loglik

    rng = np.random.default_rng(5)
    D = 3
    X = np.vstack([rng.normal(size=(300, D)), rng.normal(size=(200, D)) * 0.6 + 1.5])
    nk = np.array([260.0, 240.0])
    mk = np.array([X[:260].mean(0), X[260:].mean(0)])
    Sk = np.stack([(X[:260] - mk[0]).T @ (X[:260] - mk[0]),
                   (X[260:] - mk[1]).T @ (X[260:] - mk[1])])
    ridge = np.full(D, 0.05)
    covs = (Sk + np.diag(ridge)) / nk[:, None, None]
    gm = GaussianMixture(2, covariance_type="full" if full else "diag")
    gm.weights_, gm.means_ = nk / nk.sum(), mk
    gm.covariances_ = covs if full else np.diagonal(covs, axis1=1, axis2=2)
    gm.precisions_cholesky_ = (np.linalg.cholesky(np.linalg.inv(covs)) if full
                               else 1 / np.sqrt(gm.covariances_))
    rows = gm.score_samples(X)
    const = 0.5 * D * np.log(2 * np.pi)
    Skf = Sk if full else np.diagonal(Sk, axis1=1, axis2=2)
    one = tied_loglik(np.ones(len(X)), X, np.zeros((len(X), D, D) if full else (len(X), D)),
                      nk, mk, Skf, ridge, nk.sum(), full) - const
    np.testing.assert_allclose(one, rows, rtol=1e-9, atol=1e-9)
    tiles = np.arange(len(X)) % 25
    for t in range(25):
        R = X[tiles == t]
        E = R - R.mean(0)
        b = tied_loglik(np.array([len(R) * 1.0]), R.mean(0)[None],
                        (E.T @ E if full else (E * E).sum(0))[None], nk, mk, Skf, ridge,
                        nk.sum(), full)[0] - len(R) * const
        assert b <= rows[tiles == t].sum() + 1e-9


@pytest.mark.parametrize("seed, gap, n2", [(71, 3.5, 800), (72, 4.0, 500), (73, 3.7, 1200)])
def test_two_overlapping_gaussians_stay_two(seed, gap, n2):
    """Two overlapping Gaussians, each held as a few chunks: scikit-learn's BIC prefers two
    components, and so does the consolidation (it may join the chunks, not the two)."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(800, 2)), rng.normal(size=(n2, 2)) + [gap, 0]])
    truth = np.repeat([0, 1], [800, n2])
    assert _bic_prefers_two(X, seed)
    tiles = KMeans(60, n_init=1, random_state=seed).fit_predict(X)
    major = np.array([np.bincount(truth[tiles == t], minlength=2).argmax() for t in range(60)])
    cent = np.array([X[tiles == t].mean(0) for t in range(60)])
    group = 2 * major + (cent[:, 1] > 0)  # each Gaussian in an upper and a lower chunk
    cs, pieces = _grouped(X, tiles, group)
    consolidate(cs, pieces)
    assert cs.C == 2
    labels = np.argmin(np.linalg.norm(X[:, None] - cs.mu[None, :2], axis=2), axis=1)
    assert adjusted_rand_score(truth, labels) >= 0.7


def _regroup_once(cs, pieces):
    """Run the regrouping step alone on ``cs`` (pieces as :func:`consolidate` sees them)."""
    from fedclust.gauss.regroup import regroup

    slot = cs.row_clusters(pieces["uid"])
    n, center = pieces["n"], cs.g[1]
    mu = pieces["mu"] - center
    S = pieces["S"]
    T = S + n[:, None, None] * mu[:, :, None] * mu[:, None, :]
    return regroup(cs, slot, n, mu, S, T, cs.s0_rule, center, True)


def _row_labels(cs, X):
    return np.argmax(cs.log_scores(X, "likelihood"), axis=1)


def _three_in_a_row(seed, gap=4.5, n_tiles=60):
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(400, 2)) + [i * gap, 0] for i in range(3)])
    truth = np.repeat([0, 1, 2], 400)
    tiles = KMeans(n_tiles, n_init=1, random_state=seed).fit_predict(X)
    major = np.array([np.bincount(truth[tiles == t], minlength=3).argmax()
                      for t in range(n_tiles)])
    cent = np.array([X[tiles == t].mean(0) for t in range(n_tiles)])
    return X, truth, tiles, major, cent


def _gmm_bic(X, ks, seed):
    from sklearn.mixture import GaussianMixture

    return {k: GaussianMixture(k, random_state=seed, n_init=3).fit(X).bic(X) for k in ks}


@pytest.mark.parametrize("seed", [81, 82, 83])
def test_regroup_gives_a_shared_out_cluster_back_its_pieces(seed):
    """The middle Gaussian's border tiles went to its neighbours and its core is two
    chunks (4 components): scikit-learn's BIC on the rows prefers 3, and so does the
    regrouping, which gives the middle Gaussian its tiles back."""
    gap = 4.5
    X, truth, tiles, major, cent = _three_in_a_row(seed, gap)
    bic = _gmm_bic(X, (3, 4), seed)
    assert bic[3] < bic[4]
    group = np.where(major != 1, major, 3 + (cent[:, 1] > 0))
    group[(major == 1) & (cent[:, 0] < gap - 0.8)] = 0
    group[(major == 1) & (cent[:, 0] > gap + 0.8)] = 2
    cs, pieces = _grouped(X, tiles, group)
    assert cs.C == 4
    before = adjusted_rand_score(truth, _row_labels(cs, X))
    changed, _ = _regroup_once(cs, pieces)
    assert changed >= 1 and cs.C == 3
    assert cs.n[:3].sum() == pytest.approx(len(X))
    after = adjusted_rand_score(truth, _row_labels(cs, X))
    assert after >= 0.9 and after > before


@pytest.mark.parametrize("seed", [84, 85])
def test_regroup_splits_a_gaussian_shared_by_two_components(seed):
    """Two components each hold one outer Gaussian and half of the middle one:
    scikit-learn's BIC prefers 3 components, and so does the regrouping."""
    gap = 4.5
    X, truth, tiles, major, cent = _three_in_a_row(seed, gap)
    bic = _gmm_bic(X, (2, 3), seed)
    assert bic[3] < bic[2]
    group = np.where(major == 1, (cent[:, 0] > gap).astype(int), major // 2)
    cs, pieces = _grouped(X, tiles, group)
    assert cs.C == 2
    changed, _ = _regroup_once(cs, pieces)
    assert changed >= 1 and cs.C == 3
    assert adjusted_rand_score(truth, _row_labels(cs, X)) >= 0.9


@pytest.mark.parametrize("seed, gap", [(86, 3.5), (87, 4.5), (88, 6.0)])
def test_regroup_leaves_a_right_partition_alone(seed, gap):
    """Three Gaussians held as their own tiles: scikit-learn's BIC prefers 3 to 2 and 4,
    and the regrouping changes nothing."""
    X, truth, tiles, major, cent = _three_in_a_row(seed, gap)
    bic = _gmm_bic(X, (2, 3, 4), seed)
    assert bic[3] < min(bic[2], bic[4])
    cs, pieces = _grouped(X, tiles, major)
    n_before, mu_before = cs.n[:3].copy(), cs.mu[:3].copy()
    changed, _ = _regroup_once(cs, pieces)
    assert changed == 0 and cs.C == 3
    np.testing.assert_array_equal(cs.n[:3], n_before)
    np.testing.assert_array_equal(cs.mu[:3], mu_before)


@pytest.mark.parametrize("full", [True, False])
def test_the_group_score_matches_the_mixture_likelihood_of_its_rows(full):
    """One-row pieces: the group score is the change of the mixture BIC over the group's
    rows, the log-likelihoods from scikit-learn's GaussianMixture.score_samples (the
    group's components, then their pooled Gaussian, the other component unchanged)."""
    from sklearn.mixture import GaussianMixture

    from fedclust.gauss.consolidate import _soft_group_score

    rng = np.random.default_rng(11)
    D = 3
    centers = np.array([[0.0, 0, 0], [1.2, 0, 0], [0.6, 1.0, 0], [1.8, 1.2, 0.5]])
    sizes = [120, 90, 70, 150]
    X = np.vstack([c + rng.normal(size=(s, D)) * 0.7 for c, s in zip(centers, sizes)])
    z = np.repeat(np.arange(4), sizes)
    cs = ClusterSet(D, Settings(), 0)
    cs.set_global(*moments(X))
    mk = np.array([X[z == k].mean(0) for k in range(4)])
    Sk = np.stack([(X[z == k] - mk[k]).T @ (X[z == k] - mk[k]) for k in range(4)])
    nk = np.array(sizes, float)
    cs.add(mk, Sk, nk, np.zeros(4, np.int64), np.zeros(4, np.int64))
    G = [0, 1, 2]
    score = _soft_group_score(cs, G, z, np.ones(len(X)), X,
                              np.zeros((len(X), D, D)), full)

    def mixture(n, m, S):
        covs = (S + np.diag(cs.s0_rule)) / n[:, None, None]
        gm = GaussianMixture(len(n), covariance_type="full" if full else "diag")
        gm.weights_, gm.means_ = n / nk.sum(), m
        gm.covariances_ = covs if full else np.diagonal(covs, axis1=1, axis2=2)
        gm.precisions_cholesky_ = (np.linalg.cholesky(np.linalg.inv(covs)) if full
                                   else 1 / np.sqrt(gm.covariances_))
        return gm.score_samples(X[np.isin(z, G)]).sum()

    nG = nk[G].sum()
    mG = (nk[G, None] * mk[G]).sum(0) / nG
    SG = Sk[G].sum(0) + sum(nk[k] * np.outer(mk[k] - mG, mk[k] - mG) for k in G)
    if not full:   # the diagonal family: every scatter's diagonal
        Sk, SG = Sk * np.eye(D), SG * np.eye(D)
    before = mixture(nk, mk, Sk)
    after = mixture(np.r_[nG, nk[3]], np.vstack([mG, mk[3]]), np.stack([SG, Sk[3]]))
    npar = D + (D * (D + 1) // 2 if full else D) + 1
    want = ((-2 * (after - before) - 2 * npar * np.log(nk.sum())) / (2 * nG)
            - cs.s.merge_tol)
    assert score == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("seed, n_blobs", [(60, 6), (62, 9), (64, 9)])
def test_reused_splits_and_group_columns_are_the_ones_computed_again(monkeypatch, seed,
                                                                      n_blobs):
    """The split step and the group merge reuse a group of pieces' best split within one
    consolidation, and the group merge the other components' likelihood columns of a set
    of components it scored before: every reused answer, checked against the same
    computation done again, is equal bit for bit, and the reuse is taken."""
    from fedclust.gauss import consolidate as cons

    # the trie server: consolidations at its leaves and at the nodes above
    X, _ = separated_blobs(seed, n_blobs, 2, separation=1.5, size_range=(50, 150))
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), 8)
    cached = cons._SplitCache.__call__
    asked, computed = [], []
    real = cons._best_split

    def checked(self, rows):
        asked.append(1)
        h, score, halves = cached(self, rows)
        h2, score2, halves2 = real(self.cs, self.n[rows], self.mu[rows], self.S[rows],
                                   self.T[rows], self.ridge)
        assert (h is None) == (h2 is None) and np.array_equal(score, score2)
        if h is not None:
            assert np.array_equal(h, h2)
            assert all(np.array_equal(x, y) for x, y in zip(halves, halves2))
        return h, score, halves

    group_score = cons._soft_group_score
    reused = []

    def checked_group(cs, G, z, n, mu, S, fam, kept=None):
        reused.append(kept is not None and tuple(sorted(G)) in kept)
        score = group_score(cs, G, z, n, mu, S, fam, kept)
        assert np.array_equal(score, group_score(cs, G, z, n, mu, S, fam))
        return score

    monkeypatch.setattr(cons, "_soft_group_score", checked_group)
    monkeypatch.setattr(cons._SplitCache, "__call__", checked)
    monkeypatch.setattr(cons, "_best_split",
                        lambda *a, **kw: computed.append(1) or real(*a, **kw))
    FedGaussClustering(random_state=seed, server="tree").fit([X[p] for p in parts])
    assert 0 < len(computed) < len(asked)   # some groups were answered from the cache
    assert any(reused) and not all(reused)
