"""The server's bounded BIC merges give merge_all's result bit for bit, and the bound holds."""

import copy

import numpy as np
import pytest

from fedclust.gauss.lazy_merge import _Bounds, _RowMinima, merge_all_lazy
from fedclust.gauss.merging import moments_full
from fedclust.gauss.model import ARRAYS, ClusterSet, Settings
from fedclust.gauss.stats import merge_clusters, moments


def _fragments(seed, D, n_classes=0, correlated=False):
    """A cluster set of fragments (1 to ~80 rows) of a few Gaussians, as the server gets."""
    rng = np.random.default_rng(seed)
    k = 4
    means = rng.normal(scale=6.0, size=(k, D))
    if correlated:
        mix = [rng.normal(size=(D, D)) * rng.uniform(0.2, 2.0, size=D) for _ in range(k)]
    else:
        mix = [np.eye(D) * rng.uniform(0.5, 2.0) for _ in range(k)]
    cs = ClusterSet(D, Settings(), n_classes)
    rows = []
    for _ in range(60):
        j = int(rng.integers(k))
        m = int(rng.choice([1, 2, 5, 20, 80]))
        R = means[j] + rng.normal(size=(m, D)) @ mix[j]
        rows.append((R, j % max(n_classes, 1) if n_classes else -1))
    cs.set_global(*moments(np.concatenate([R for R, _ in rows])))
    for R, c in rows:
        n, mu, S = moments_full(R, True)
        cs.add(mu[None], S[None], np.array([n]), np.array([c]), np.array([0]))
    return cs


@pytest.mark.parametrize("seed,D,n_classes,correlated", [
    (0, 6, 0, False), (1, 12, 0, True), (2, 8, 2, True), (3, 20, 0, False)])
def test_bounded_merges_equal_merge_all_bit_for_bit(seed, D, n_classes, correlated):
    a = _fragments(seed, D, n_classes, correlated)
    b = copy.deepcopy(a)
    merges = a.merge_all()
    assert merges > 0
    assert merge_all_lazy(b) == merges
    assert a.C == b.C and a.joined == b.joined
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name)[:a.C], getattr(b, name)[:b.C],
                                      err_msg=name)


def test_bounded_merges_stop_at_until_like_merge_all():
    a = _fragments(4, 8)
    b = copy.deepcopy(a)
    assert a.merge_all(until=30) == merge_all_lazy(b, until=30)
    assert a.C == b.C == 30
    np.testing.assert_array_equal(a.S[:a.C], b.S[:b.C])


def test_the_log_det_bound_is_below_the_pooled_log_det():
    cs = _fragments(5, 10, correlated=True)
    C = cs.C
    bound = _Bounds(cs, C)
    p, q = np.triu_indices(C, 1)
    n, _, S = merge_clusters(cs.n[p], cs.mu[p], cs.S[p], cs.n[q], cs.mu[q], cs.S[q])
    exact = np.linalg.slogdet((S + np.diag(cs.s0_rule)) / n[:, None, None])[1]
    low = bound.log_det_low(p, q, n, cs.n[p] * cs.n[q] / n, cs.mu[q] - cs.mu[p])
    assert np.all(low <= exact + 1e-9 * np.abs(exact))
    # and it is informative: close to the exact value for most pairs
    assert np.median(exact - low) < 0.25 * np.median(np.abs(exact))


def test_pairs_the_bound_sets_apart_cannot_merge_and_are_skipped():
    """Far-apart pairs get +inf without their determinant; their exact score is >= 0, so
    the greedy merge could never take them (and the merges stay merge_all's)."""
    from fedclust.gauss.lazy_merge import _scores

    rng = np.random.default_rng(4)
    D, k = 8, 5   # well-populated correlated pieces: the full family wins, far pairs abound
    means = rng.normal(scale=8.0, size=(k, D))
    mix = [rng.normal(size=(D, D)) for _ in range(k)]
    parts = [means[j] + rng.normal(size=(int(rng.integers(150, 400)), D)) @ mix[j]
             for j in rng.integers(k, size=30)]
    cs = ClusterSet(D, Settings(), 0)
    cs.set_global(*moments(np.concatenate(parts)))
    for R in parts:
        n, mu, S = moments_full(R, True)
        cs.add(mu[None], S[None], np.array([n]), np.array([-1]), np.array([0]))
    b = copy.deepcopy(cs)
    a = copy.deepcopy(cs)
    assert merge_all_lazy(b) == a.merge_all() > 0
    np.testing.assert_array_equal(a.S[:a.C], b.S[:b.C])
    C = cs.C
    p, q = np.triu_indices(C, 1)
    cs._ld_cache = cs._bic_logdets(cs.n[:C].copy(), cs.S[:C])
    fast = _scores(cs, _Bounds(cs, C), p, q)
    exact = cs._merge_scores(p, q)[0]
    cs._ld_cache = None
    apart = np.isinf(fast)
    assert apart.sum() > len(p) // 4            # the far pairs are skipped
    assert np.all(exact[apart] >= 0.0)          # and none of them could merge
    np.testing.assert_array_equal(fast[~apart], exact[~apart])


@pytest.mark.parametrize("seed", range(6))
def test_row_minima_pick_the_pair_of_a_full_argmin_under_merge_updates(seed):
    """The kept row minima give np.argmin(R)'s pair after every merge-like update,
    with many exact ties (scores on a coarse grid) and rows that become all +inf."""
    rng = np.random.default_rng(seed)
    C = 40
    R = rng.integers(-3, 2, size=(C, C)).astype(float)
    R = np.minimum(R, R.T)
    R[rng.random((C, C)) < 0.2] = np.inf
    R = np.minimum(R, R.T)
    np.fill_diagonal(R, np.inf)
    best = _RowMinima(R)
    alive = np.ones(C, bool)
    for _ in range(C - 1):
        p, q = divmod(int(np.argmin(R)), C)
        if R[p, q] == np.inf:
            break
        assert best.first() == (p, q)
        alive[q] = False
        R[q, :] = np.inf
        R[:, q] = np.inf
        row = np.where(alive, rng.integers(-3, 2, size=C).astype(float), np.inf)
        row[rng.random(C) < 0.3] = np.inf
        R[p, :] = row
        R[:, p] = row
        R[p, p] = np.inf
        best.update(p, q)
    assert not alive.all()


def test_exact_ties_between_duplicated_owners_merge_as_merge_all_does():
    """Owners holding the same data send the same clusters: their pair scores tie
    exactly, and the kept row minima must break every tie as np.argmin over the whole
    score matrix does (the same merges, in the same order, the same uids joined)."""
    base = _fragments(7, 6)
    cs = ClusterSet(base.D, Settings(), 0)
    cs.set_global(*base.g)
    for _ in range(3):   # three owners with identical clusters
        cs.add(base.mu[:base.C], base.S[:base.C], base.n[:base.C], base.cls[:base.C],
               base.last[:base.C])
    a, b = copy.deepcopy(cs), copy.deepcopy(cs)
    merges = a.merge_all()
    assert merges > base.C   # duplicates merge with each other as well
    assert merge_all_lazy(b) == merges
    assert a.C == b.C and a.joined == b.joined
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name)[:a.C], getattr(b, name)[:b.C],
                                      err_msg=name)
