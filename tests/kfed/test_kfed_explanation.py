"""k-FED's warning that the one-shot answer is likely poor: hand cases, a brute-force
reference for a center's split, and fits of one data set summarised at several
finenesses."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from fedclust import KFed
from fedclust.core.kmeans import assign
from fedclust.kfed.explain import center_split, explanation_warning, poor_answer

# 1-D groups at 0, 10 and 20, each as two pieces of 5 points one unit either side, with
# scatter 5 (every point 1 from its piece's mean)
PIECES = np.array([[-1.0], [1.0], [9.0], [11.0], [19.0], [21.0]])
COUNTS = np.full(6, 5.0)
SCATTER = np.full(6, 5.0)


def _warn(final, labels, device_of=(0, 0, 1, 1, 2, 2)):
    devs = sorted(set(device_of))
    pick = [np.flatnonzero(np.asarray(device_of) == z) for z in devs]
    return explanation_warning([PIECES[p] for p in pick], [COUNTS[p] for p in pick],
                               [SCATTER[p] for p in pick], np.asarray(final, float),
                               [np.asarray(labels)[p] for p in pick], devs)


def test_merged_groups_by_hand():
    # center 0 at 5 covers the groups at 0 and 10; centers 1, 2 cut the group at 20 in two.
    # Cost: 5 (36 + 16 + 16 + 36) + 4 * 5 = 540 for center 0, 5 + 5 for the others: 550.
    # Splitting center 0 into {-1, 1} and {9, 11} removes 10 * 10 / 20 * 10² = 500, merging
    # the pieces at 19 and 21 adds 5 * 5 / 10 * 2² = 10: a 3-center answer costing 60
    got = _warn([[5.0], [19.0], [21.0]], [0, 0, 0, 0, 1, 2])
    assert got == ("k-FED: the one-shot answer is likely poor: its 3 centers cost 9.17x a "
                   "3-center answer built from the same device summaries, which splits final "
                   "center 0 (devices 0, 1) and merges two others: the server merged groups. "
                   "Try the default server, or refine with KFed(refine_rounds=r) or "
                   "DistributedLloyd(init='kfed')")
    # the right answer: any split gains 10 and any merge costs at least 500
    assert _warn([[0.0], [10.0], [20.0]], [0, 0, 1, 1, 2, 2]) is None


def test_a_final_center_away_from_its_pieces_mean_is_unsettled():
    # the right groups, but center 2 at 23 instead of 20: 10 * 3² = 90 more than the 60 at
    # the pieces' means, 150 > 1.10 * 60; at 20.7 only 10 * 0.49 more, 64.9 <= 66
    kind, center, value = poor_answer(_splits([0, 0, 1, 1, 2, 2]),
                                      np.array([[0.0], [10.0], [23.0]]))
    assert (kind, center) == ("unsettled", 2) and value == pytest.approx(150 / 60)
    assert poor_answer(_splits([0, 0, 1, 1, 2, 2]), np.array([[0.0], [10.0], [20.7]])) is None
    got = _warn([[0.0], [10.0], [23.0]], [0, 0, 1, 1, 2, 2])
    assert got.startswith("k-FED: the one-shot answer is likely poor: its 3 centers cost "
                          "2.50x the same groups' pieces about their own means (final center "
                          "2, devices 2, lies farthest")


def _splits(labels):
    labels = np.asarray(labels)
    return [center_split(PIECES[labels == j], COUNTS[labels == j], SCATTER[labels == j])
            for j in range(labels.max() + 1)]


def test_one_center_over_two_groups_is_too_few_clusters():
    # k = 1 over the groups at 0 and 10 (pieces 0-3): splitting removes 500 of 540
    got = explanation_warning([PIECES[:4]], [COUNTS[:4]], [SCATTER[:4]], np.array([[5.0]]),
                              [np.zeros(4, int)], [4])
    assert got == ("k-FED: final center 0 holds more than one group (devices 4): splitting it "
                   "would cut the cost by 93%. 1 clusters may be too few for the data; try "
                   "more clusters")
    # one group as two pieces: the split removes 10 of 30, a third (a single group)
    assert explanation_warning([PIECES[:2]], [COUNTS[:2]], [SCATTER[:2]],
                               np.array([[0.0]]), [np.zeros(2, int)], [4]) is None


@pytest.mark.parametrize("seed", range(6))
def test_center_split_against_every_two_way_partition(seed):
    # the pieces' summary against the points themselves, and the split's gain against the
    # best of all 2-partitions of the pieces (the cut and 2-means steps find it on these
    # small sets; they never report more than it)
    rng = np.random.default_rng(seed)
    m, d = 7, 3
    pts = [rng.normal(size=(int(rng.integers(1, 6)), d)) + rng.normal(scale=3, size=d)
           for _ in range(m)]
    C = np.stack([p.mean(axis=0) for p in pts])
    w = np.array([len(p) for p in pts], float)
    S = np.array([((p - p.mean(axis=0)) ** 2).sum() for p in pts])
    X = np.concatenate(pts)
    s = center_split(C, w, S)
    assert s.n == len(X)
    np.testing.assert_allclose(s.mean, X.mean(axis=0))
    np.testing.assert_allclose(s.cost, ((X - X.mean(axis=0)) ** 2).sum())
    best = 0.0
    for r in range(1, m):
        for side in itertools.combinations(range(m), r):
            a = np.concatenate([pts[i] for i in side])
            b = np.concatenate([pts[i] for i in range(m) if i not in side])
            cost = ((a - a.mean(0)) ** 2).sum() + ((b - b.mean(0)) ** 2).sum()
            best = max(best, s.cost - cost)
    assert s.gain <= best * (1 + 1e-12)
    assert s.gain >= 0.9 * best
    assert s.halves.sum() == pytest.approx(s.n)


@pytest.mark.parametrize("f", [1e100, 1e-100])
def test_center_split_and_warning_are_scale_equivariant(f):
    # data inside the scale check's limits: every measure scales as f^2 (none overflows
    # to inf or underflows to 0) and the warning says the same words
    rng = np.random.default_rng(5)
    C = np.concatenate([rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) + 8.0])
    w = rng.integers(1, 9, size=7).astype(float)
    S = rng.uniform(0.5, 2.0, size=7)
    s, t = center_split(C, w, S), center_split(C * f, w, S * f * f)
    for name in ("cost", "gain", "along"):
        assert np.isfinite(getattr(t, name)) and getattr(t, name) > 0
        assert getattr(t, name) == pytest.approx(getattr(s, name) * f * f, rel=1e-9)
    args = ([COUNTS[:4]], [SCATTER[:4]])
    ref = explanation_warning([PIECES[:4]], *args, np.array([[5.0]]), [np.zeros(4, int)], [4])
    got = explanation_warning([PIECES[:4] * f], [COUNTS[:4]], [SCATTER[:4] * f * f],
                              np.array([[5.0 * f]]), [np.zeros(4, int)], [4])
    assert ref is not None and got == ref


def test_a_negative_scatter_counts_as_zero():
    a = center_split(PIECES[:3], COUNTS[:3], np.array([-5.0, 5.0, 5.0]))
    b = center_split(PIECES[:3], COUNTS[:3], np.array([0.0, 5.0, 5.0]))
    assert a.cost == b.cost and a.gain == b.gain


@pytest.mark.parametrize("n_bad,listed", [(10, "0, 1, 2, 3, 4, 5, 6, 7, 8, 9"),
                                          (11, "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...")])
def test_the_warning_lists_at_most_ten_devices(n_bad, listed):
    # every device holds one piece at 0 and one at 10; one final center over all of them
    centers = [np.array([[0.0], [10.0]]) for _ in range(n_bad)]
    got = explanation_warning(centers, [np.array([4.0, 4.0])] * n_bad,
                              [np.array([4.0, 4.0])] * n_bad, np.array([[5.0]]),
                              [np.array([0, 0])] * n_bad, list(range(n_bad)))
    assert f"(devices {listed}): splitting it" in got


def _federation(seed=3):
    X, y = make_blobs(1200, centers=[[0, 0, 0], [6, 0, 0], [0, 6, 0], [6, 6, 6]],
                      cluster_std=1.3, random_state=seed)
    rng = np.random.default_rng(seed)
    sites = []
    for z in range(16):   # every site holds two or three of the four groups
        held = rng.choice(4, size=2 + z % 2, replace=False)
        sites.append(X[rng.choice(np.flatnonzero(np.isin(y, held)), 60, replace=False)])
    return sites, X, y


@pytest.mark.parametrize("n_local", [8, "auto", 32])   # 2k pieces, the ladder, 8k pieces
def test_quiet_on_a_good_fit_and_fires_on_merged_groups_at_any_fineness(n_local):
    sites, X, y = _federation()
    model = KFed(4, n_local, random_state=0).fit(sites)
    assert model.run_log_.warnings == []          # the default server's answer is right
    # the same pieces under a merged answer: groups 0 and 1 share a center, group 3 is cut
    # in two along its first axis
    means = np.stack([X[y == g].mean(axis=0) for g in range(4)])
    final = np.stack([(means[0] + means[1]) / 2, means[2], means[3] - [1, 0, 0],
                      means[3] + [1, 0, 0]])
    scatter, counts, labels = [], [], []
    for D, c in zip(sites, model.local_centers_):
        lab, d2 = assign(D, c)
        scatter.append(np.bincount(lab, weights=d2, minlength=len(c)))
        counts.append(np.bincount(lab, minlength=len(c)).astype(float))
        labels.append(assign(c, final)[0])
    got = explanation_warning(model.local_centers_, counts, scatter, final, labels,
                              list(range(16)))
    assert got is not None and "likely poor" in got and "splits final center 0" in got
    right = explanation_warning(model.local_centers_, counts, scatter, means,
                                [assign(c, means)[0] for c in model.local_centers_],
                                list(range(16)))
    assert right is None



@pytest.mark.parametrize("seed", range(8))
def test_surely_quiet_holds_for_every_split_of_the_pieces(seed):
    # small sets of 1-D and 2-D pieces under k final centers: where surely_quiet says
    # quiet, poor_answer is None for every choice of each center's 2-way partition of its
    # pieces (not only center_split's), enumerated in full; and it says quiet on some
    from fedclust.kfed.explain import CenterSplit, split_bound, surely_quiet

    rng = np.random.default_rng(seed)
    d, k = 1 + seed % 2, 3
    quiet_seen = 0
    for trial in range(12):
        spread = [0.3, 1.0, 4.0][trial % 3]
        means = rng.normal(size=(k, d)) * 10
        lab = np.repeat(np.arange(k), 4)
        C = means[lab] + rng.normal(size=(len(lab), d)) * spread
        w = rng.integers(1, 9, size=len(lab)).astype(float)
        S = rng.random(len(lab)) * w * d
        final = np.stack([(C[lab == j] * w[lab == j, None]).sum(0) / w[lab == j].sum()
                          for j in range(k)]) + rng.normal(size=(k, d)) * 0.1 * (trial % 2)
        n = np.bincount(lab, weights=w, minlength=k)
        sums = np.stack([(C[lab == j] * w[lab == j, None]).sum(0) for j in range(k)])
        sq = np.bincount(lab, weights=w * (C * C).sum(1), minlength=k)
        sc = np.bincount(lab, weights=S, minlength=k)
        bound = np.array([split_bound(C[lab == j], w[lab == j]) for j in range(k)])
        plain = surely_quiet(n, sums, sq, sc, final)
        assert not plain or surely_quiet(n, sums, sq, sc, final, bound)   # tighter
        if not surely_quiet(n, sums, sq, sc, final, bound):
            continue
        quiet_seen += 1
        options = []
        for j in range(k):
            Cj, wj, Sj = C[lab == j], w[lab == j], S[lab == j]
            base = center_split(Cj, wj, Sj)
            opts = []
            for mask in itertools.product([True, False], repeat=len(Cj)):
                side = np.array(mask)
                if side.all() or not side.any():
                    continue
                h = np.array([wj[side].sum(), wj[~side].sum()])
                hm = np.stack([(Cj[side] * wj[side, None]).sum(0) / h[0],
                               (Cj[~side] * wj[~side, None]).sum(0) / h[1]])
                diff = hm[0] - hm[1]
                gain = float(h[0] * h[1] / base.n * (diff ** 2).sum())
                assert gain <= bound[j]   # every split's gain is within the bound
                # along: its least (the pieces' scatter alone) makes the one-group test
                # as easy to pass as it can be
                opts.append(CenterSplit(base.n, base.mean, base.cost, h, hm, gain,
                                        float(Sj.sum())))
            options.append(opts)
        for combo in itertools.product(*options):
            assert poor_answer(list(combo), final) is None
    assert quiet_seen >= 1


def test_surely_quiet_is_not_claimed_where_the_warning_fires():
    # the hand cases above that warn: merged groups, an unsettled center, one center over
    # two groups; with the per-center bounds too
    from fedclust.kfed.explain import split_bound, surely_quiet

    def stats(labels, k, P=PIECES):
        labels = np.asarray(labels)
        n = np.bincount(labels, weights=COUNTS, minlength=k)
        sums = np.stack([(P[labels == j] * COUNTS[labels == j, None]).sum(0)
                         for j in range(k)])
        sq = np.bincount(labels, weights=COUNTS * (P ** 2).sum(1), minlength=k)
        return n, sums, sq, np.bincount(labels, weights=SCATTER, minlength=k)

    def bounds(labels, k):
        labels = np.asarray(labels)
        return np.array([split_bound(PIECES[labels == j], COUNTS[labels == j])
                         for j in range(k)])

    for lab, final in (([0, 0, 0, 0, 1, 2], [[5.0], [19.0], [21.0]]),
                       ([0, 0, 1, 1, 2, 2], [[0.0], [10.0], [23.0]])):
        assert not surely_quiet(*stats(lab, 3), np.array(final))
        assert not surely_quiet(*stats(lab, 3), np.array(final), bounds(lab, 3))
    n, sums, sq, sc = stats([0, 0, 0, 0, 1, 1], 2)
    assert not surely_quiet(n[:1], sums[:1], sq[:1], sc[:1], np.array([[5.0]]))
    assert not surely_quiet(n[:1], sums[:1], sq[:1], sc[:1], np.array([[5.0]]),
                            bounds([0, 0, 0, 0, 1, 1], 2)[:1])
    # the right answer with tight groups (pieces 0.2 apart) is certified quiet
    tight = np.array([[-0.1], [0.1], [9.9], [10.1], [19.9], [20.1]])
    assert surely_quiet(*stats([0, 0, 1, 1, 2, 2], 3, tight), np.array([[0.0], [10.0], [20.0]]))


@pytest.mark.parametrize("seed", range(4))
def test_split_bound_covers_every_two_way_partition(seed):
    # the largest eigenvalue of the pieces' weighted scatter is at least every 2-way
    # partition's gain (enumerated), at most their whole spread, and nearly reached by
    # the best partition of pieces lying on a line
    from fedclust.kfed.explain import split_bound

    rng = np.random.default_rng(seed)
    C = rng.normal(size=(8, 3)) * [5.0, 1.0, 0.2]
    w = rng.integers(1, 9, size=8).astype(float)
    n = w.sum()
    mean = (C * w[:, None]).sum(0) / n
    spread = float((w * ((C - mean) ** 2).sum(1)).sum())
    b = split_bound(C, w)
    best = 0.0
    for mask in itertools.product([True, False], repeat=8):
        side = np.array(mask)
        if side.all() or not side.any():
            continue
        h0, h1 = w[side].sum(), w[~side].sum()
        m0 = (C[side] * w[side, None]).sum(0) / h0
        m1 = (C[~side] * w[~side, None]).sum(0) / h1
        best = max(best, h0 * h1 / n * float(((m0 - m1) ** 2).sum()))
    assert best <= b <= spread * (1 + 1e-8)
    line = np.outer(np.sign(rng.normal(size=8)), [1.0, 0.0, 0.0])   # two points, weighted
    assert split_bound(line, w) == pytest.approx(
        w[line[:, 0] > 0].sum() * w[line[:, 0] < 0].sum() / n * 4.0, rel=1e-8)
    assert split_bound(C[:1], w[:1]) == 0.0
