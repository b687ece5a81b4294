"""The keyed weighted k-means++ server's draws: each keyed by (device, center), so a row that
leaves without having been drawn moves no seed; the sorted margins a forget wipes."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.kfed import keyed, keyed_trace

from .keyed_helpers import K, federation, make_keyed


def test_keyed_seeding_draws_in_proportion_to_weight():
    # the first seed is the smallest key -log(u)/w: P(row i) = w_i / sum w
    C = np.arange(4, dtype=float)[:, None]
    w = np.array([1.0, 2.0, 3.0, 4.0])
    wins = np.zeros(4)
    for seed in range(4000):
        keys = keyed.row_keys(seed, np.arange(4), np.zeros(4, np.int64))
        wins[keyed.keyed_kmeans_plusplus(C, 2, w, (C * C).ravel(), keys, 0)[0][0]] += 1
    assert np.allclose(wins / wins.sum(), w / w.sum(), atol=0.03)


def test_keyed_seeds_do_not_move_when_an_unchosen_row_leaves():
    # every draw is keyed by (device, center): dropping a row that was never a seed or a
    # candidate leaves each step's smallest key, hence the seeds, where they were
    rng = np.random.default_rng(5)
    C = rng.normal(size=(200, 3))
    w = rng.uniform(1, 5, size=200)
    owner, j = np.repeat(np.arange(50), 4), np.tile(np.arange(4), 50)
    keys = keyed.row_keys(9, owner, j)
    seeds, cand, _, _ = keyed.keyed_kmeans_plusplus(C, 6, w, (C * C).sum(axis=1), keys, 2)
    out = next(z for z in range(50) if not np.isin(np.flatnonzero(owner == z), cand).any())
    keep = owner != out
    again = keyed.keyed_kmeans_plusplus(C[keep], 6, w[keep], (C[keep] ** 2).sum(axis=1),
                                        keys[keep], 2)[0]
    assert np.array_equal(np.flatnonzero(keep)[again], seeds)
    # and a different start draws other seeds
    other = keyed.keyed_kmeans_plusplus(C, 6, w, (C * C).sum(axis=1), keys, 3)[0]
    assert not np.array_equal(other, seeds)


def test_canonical_numbers_clusters_by_first_appearance():
    assert keyed.canonical(np.array([3, 3, 1, 0, 1, 3])).tolist() == [0, 0, 1, 2, 1, 0]
    a = np.random.default_rng(0).integers(0, 7, size=50)
    perm = np.random.default_rng(1).permutation(7)
    assert np.array_equal(keyed.canonical(a), keyed.canonical(perm[a]))


def test_a_stream_of_devices_runs_the_keyed_server_on_its_summaries():
    from fedclust.kfed.server import aggregate_centers

    Xs = federation(np.random.default_rng(8), 30)
    b = make_keyed().fit(iter(Xs))
    again = aggregate_centers(list(b.local_centers_), K, counts=list(b.local_counts_),
                              method=keyed.KEYED_SERVER, device_ids=list(range(30)),
                              seed=b.seed_)
    np.testing.assert_array_equal(b.cluster_centers_, again.centers)
    with pytest.raises(Exception, match="seed or the server.s random stream"):
        aggregate_centers(list(b.local_centers_), K, counts=list(b.local_counts_),
                          method=keyed.KEYED_SERVER)


def test_wiping_sorted_margins_leaves_the_nearest_lower_remaining_value():
    # rows leave in random batches; after each, every removed row's sorted position holds
    # the value of the nearest lower remaining row (-inf below the first): nothing of its own
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        values = np.round(rng.normal(size=n), 1)   # ties included
        order = np.argsort(values, kind="stable")
        m = values[order].copy()
        rank = keyed_trace._rank(order)
        dead = np.zeros(n, bool)
        for batch in np.array_split(rng.permutation(n), int(rng.integers(1, 6))):
            dead[batch] = True
            keyed_trace._wipe_sorted(m, np.sort(rank[batch]), order, dead)
            ref = np.where(dead[order], -np.inf, values[order])
            np.maximum.accumulate(ref, out=ref)
            assert np.array_equal(m, ref)
