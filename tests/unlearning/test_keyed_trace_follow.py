"""Following a keyed fit's trace after a forget: the stacked follow against the per-iteration
replay, exact means over the remaining rows, seeding resumed from known seeds, margins,
the quiet certificate of the explanation warning, partitions compared between starts."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import KFed
from fedclust.kfed import keyed, keyed_remaining, keyed_result, keyed_trace, keyed_unlearn

from .keyed_helpers import K, federation, make_keyed, check_fresh, splits_are_the_remaining_rows, seed_holders, fewest_starts_to_rerun


def _spy(monkeypatch, name, log):
    real = getattr(keyed_unlearn, name)

    def spy(*a, **kw):
        out = real(*a, **kw)
        log.append((a, out, a[0].alive.copy()))   # the rows remaining at that forget
        return out

    monkeypatch.setattr(keyed_unlearn, name, spy)


def test_the_stacked_follow_equals_the_per_iteration_replay(monkeypatch):
    rng = np.random.default_rng(21)
    Xs = federation(rng, 120)
    ids = list(range(120))
    model = make_keyed().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    real, pairs = keyed_unlearn._follow, []

    def both(*a):   # at each call, the per-iteration replay of the same start beside it
        out = real(*a)
        if out is not None:
            pairs.append((out, keyed_unlearn._replay(*a[:4])))
        return out

    monkeypatch.setattr(keyed_unlearn, "_follow", both)
    gone = []
    for z in [z for z in ids if z not in seed_holders(trace)][:3]:
        model.forget(devices=[z])
        gone.append(z)
        assert model.forget_log_[-1].path == "trace"
        check_fresh(model, Xs, ids, gone)
    assert pairs   # the stacked follow served some starts
    for out, again in pairs:   # the same centers, stop and rows assigned again
        assert np.array_equal(out[0], again[0]) and out[2] == again[2]
        assert len(again[1][0]) == 0 and out[4] == again[4]


def test_a_start_the_stacked_follow_cannot_certify_is_followed_per_iteration(monkeypatch):
    # every row in doubt at every iteration and only 4 margins stacked: the stacked follow
    # declines every start, the per-iteration replay assigns every row again
    rng = np.random.default_rng(22)
    Xs = federation(rng, 60)
    ids = list(range(60))
    model = make_keyed().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    z = fewest_starts_to_rerun(trace, ids)
    follows: list = []
    _spy(monkeypatch, "_follow", follows)
    monkeypatch.setattr(keyed_unlearn, "PREFIX", 4)
    monkeypatch.setattr(trace, "slack", 1e-3)
    for run in trace.runs:   # the sorted margins all below the slack: every row in doubt
        run.stack[1][:] = np.minimum(run.stack[1], 0.0)
    model.forget(devices=[z])
    assert follows and all(out is None for _, out, _ in follows)
    assert model.forget_log_[-1].path == "trace"
    assert model._unlearning_.trace.rechecked >= len(trace.C) - 40
    check_fresh(model, Xs, ids, [z])


def test_exact_means_are_the_update_over_the_remaining_rows_alone():
    from fedclust.core.kmeans import update_centers

    rng = np.random.default_rng(23)
    C = rng.normal(size=(500, 7)) * 1e3
    w = rng.integers(1, 50, size=500).astype(float)
    labels = rng.integers(0, 6, size=500)
    alive = rng.random(500) > 0.3
    Cw = C * w[:, None]
    want, _ = update_centers(C[alive], labels[alive], 6, w[alive], np.zeros((6, 7)),
                             C[alive] * w[alive][:, None])
    got = keyed_unlearn.exact_means(Cw, w, labels, alive, 6)
    np.testing.assert_array_equal(got, want)   # the same bits, not only close
    # the leaving rows' values do not enter: scaling them changes nothing
    Cw2 = Cw.copy()
    Cw2[~alive] *= 1e9
    np.testing.assert_array_equal(keyed_unlearn.exact_means(Cw2, w, labels, alive, 6), want)


def test_a_forget_that_changes_the_start_count_takes_the_full_step(monkeypatch):
    import fedclust.kfed.server as server

    rng = np.random.default_rng(24)
    Xs = federation(rng, 40)
    ids = list(range(40))
    model = make_keyed().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    z = fewest_starts_to_rerun(trace, ids)
    n, n_z = len(trace.C), len(model.local_centers_[ids.index(z)])
    # a start budget where N k gives 14 starts and N k less z's centers 15
    budget = (n - n_z) * K * 15
    monkeypatch.setattr(server, "WEIGHTED_START_BUDGET", budget)
    assert server.weighted_starts(n, K) == 14 and server.weighted_starts(n - n_z, K) == 15
    model = make_keyed().fit(Xs, device_ids=ids)   # the fit with that budget: 14 starts
    assert len(model._unlearning_.trace.runs) == 14   # the keyed starts (no farthest-first start)
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "replay"
    assert model._unlearning_.trace is None or len(model._unlearning_.trace.runs) == 15
    check_fresh(model, Xs, ids, [z])


@pytest.mark.parametrize("d", [3, 50])
def test_keyed_seeding_goes_on_from_known_seeds_bit_for_bit(d):
    # a run given its first j seeds draws the steps j.. as the whole run drew them: the
    # same seeds, candidates, potentials (to the bit) and picks
    rng = np.random.default_rng(40 + d)
    C = rng.normal(size=(600, d))
    w = rng.uniform(1, 5, size=600)
    owner, j = np.repeat(np.arange(150), 4), np.tile(np.arange(4), 150)
    keys = keyed.row_keys(3, owner, j)
    c_sq = (C * C).sum(axis=1)
    seeds, cand, pots, pick = keyed.keyed_kmeans_plusplus(C, 12, w, c_sq, keys, 1, spare=4)
    for first in range(1, 12):
        got = keyed.keyed_kmeans_plusplus(C, 12, w, c_sq, keys, 1, spare=4,
                                          known=seeds[:first])
        assert np.array_equal(got[0], seeds)
        assert np.array_equal(got[1][first:], cand[first:])
        assert np.array_equal(got[2][first:], pots[first:])
        assert np.array_equal(got[3][first:], pick[first:])


@pytest.mark.parametrize("first", [2, 3])
def test_a_start_whose_later_pick_is_in_doubt_goes_on_from_that_step(first, monkeypatch):
    # forced certificate failures: every start's pick at step ``first`` counts as possibly
    # changed; each start runs again from that step with its earlier seeds kept, and the
    # forget equals a retrain bit for bit
    rng = np.random.default_rng(13)
    Xs = federation(rng, 120)
    ids = [int(z) for z in rng.choice(5000, size=120, replace=False)]
    model = make_keyed().fit(Xs, device_ids=ids)
    stable = keyed_unlearn._seeds_stable

    def doubtful(tr, R, alive, *more):
        pots, why, at = stable(tr, R, alive, *more)
        forced = np.minimum(at, first)
        return pots, [y or "forced" for y in why], forced

    known_lengths = []
    plusplus = keyed_unlearn.keyed_kmeans_plusplus

    def recording(*a, known=None, **kw):
        known_lengths.append(0 if known is None else len(known))
        return plusplus(*a, known=known, **kw)

    monkeypatch.setattr(keyed_unlearn, "_seeds_stable", doubtful)
    monkeypatch.setattr(keyed_unlearn, "keyed_kmeans_plusplus", recording)
    gone = []
    for z in [z for z in ids if z not in seed_holders(model._unlearning_.trace)][:3]:
        model.forget(devices=[z])
        gone.append(z)
        assert model.forget_log_[-1].path == "trace"
        trace = model._unlearning_.trace
        assert len(trace.reruns) == len(trace.runs)
        check_fresh(model, Xs, ids, gone)
        assert model.verify().ok
    assert first in known_lengths


def test_assign_margin_matches_a_full_sort_of_the_distances():
    # labels, runner-up and the second/third margins against a full sort of every row's
    # distances to every center (rows with exact ties included: duplicated centers)
    rng = np.random.default_rng(21)
    X = rng.normal(size=(700, 4))
    centers = np.vstack([rng.normal(size=(5, 4)), X[:1]])
    centers = np.vstack([centers, centers[:1]])   # a duplicated center: margin 0 rows
    x_sq = (X * X).sum(axis=1)
    lab, margin, runner, margin3, nearest = keyed_trace._assign_margin(X, centers, x_sq)
    D = np.maximum(x_sq[:, None] - 2.0 * (X @ centers.T) + (centers ** 2).sum(axis=1), 0.0)
    dist = np.sqrt(D)
    srt = np.sort(dist, axis=1)
    assert np.array_equal(lab, D.argmin(axis=1))
    assert np.array_equal(nearest, D.min(axis=1))
    assert np.array_equal(margin, srt[:, 1] - srt[:, 0])
    assert np.array_equal(margin3, srt[:, 2] - srt[:, 0])
    assert (runner != lab).all()
    assert np.array_equal(dist[np.arange(len(X)), runner], srt[:, 1])
    assert (margin == 0).any()


def test_expanding_a_run_over_the_remaining_rows_keeps_the_stable_sort():
    # a run traced over the remaining rows, put back at the trace's row indices: its
    # sorted margins and order equal a stable sort of the full margins (others at -inf)
    rng = np.random.default_rng(22)
    Xs = federation(rng, 40)
    model = make_keyed().fit(Xs, device_ids=list(range(40)))
    trace = model._unlearning_.trace
    n0 = len(trace.C)
    rows = np.sort(rng.choice(n0, size=n0 - 30, replace=False))
    C, w = trace.C[rows], trace.w[rows]
    c_sq = (C * C).sum(axis=1)
    run = keyed_trace.traced_lloyd(C, C[:K], w, C * w[:, None], c_sq, C.var(axis=0).mean(),
                                   trace.max_iter, trace.tol)
    out = keyed_remaining.expand(run, rows, n0)
    for t in range(len(run.cs)):
        full = np.full(n0, -np.inf)
        full[rows[run.order[t]]] = run.margin_sorted[t]
        ref = np.argsort(full, kind="stable")
        assert np.array_equal(out.order[t], ref)
        assert np.array_equal(out.margin_sorted[t], full[ref])


@pytest.mark.parametrize("certify", ["sums", "bounds", "none"])
def test_the_quiet_certificate_and_its_fallback_give_the_retrains_warning(certify,
                                                                       monkeypatch):
    # six groups well apart in 20 dimensions (the warning is quiet, each group's pieces
    # spread little against the whole cost): with the certificate from the sums, forgets
    # work out no split (stale entries); from the per-center bounds (the sums' forced to
    # fail), no split either; with both failing, every stale split is worked out again,
    # bit for bit the remaining rows' own. The warning (none) is a fresh fit's each time
    from fedclust.kfed.explain import surely_quiet

    if certify == "bounds":
        monkeypatch.setattr(keyed_trace, "surely_quiet",
                            lambda *a: len(a) == 6 and surely_quiet(*a))
    elif certify == "none":
        monkeypatch.setattr(keyed_trace, "surely_quiet", lambda *a: False)
    rng = np.random.default_rng(41)
    means = rng.normal(size=(6, 20)) * 4
    Xs = []
    for _ in range(40):
        own = rng.choice(6, size=2, replace=False)
        n = int(rng.integers(40, 70))
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, 20)))
    ids = list(range(40))

    def make():
        return KFed(6, 2, server="weighted-kmeans++-keyed", random_state=7)

    model = make().fit(Xs, device_ids=ids)
    assert not model.run_log_.warnings
    gone = []
    stale = []
    for z in [int(z) for z in rng.permutation(ids)[:4]]:
        model.forget(devices=[z])
        gone.append(z)
        keep = [i for i in ids if i not in gone]
        fresh = make().fit([Xs[i] for i in keep], device_ids=keep)
        assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings
        np.testing.assert_array_equal(model.cluster_centers_, fresh.cluster_centers_)
        assert np.array_equal(np.concatenate(model.center_labels_),
                              np.concatenate(fresh.center_labels_))
        if model.forget_log_[-1].path == "trace":
            tr = model._unlearning_.trace
            stale.append(sum(s is keyed_trace.STALE for s in tr.expl.splits))
            splits_are_the_remaining_rows(tr)
    assert stale and (all(n > 0 for n in stale) if certify != "none" else not any(stale))


def test_exact_means_from_a_reference_sums_only_the_changed_clusters():
    from fedclust.core.kmeans import update_centers

    rng = np.random.default_rng(29)
    n, d, k = 400, 5, 7
    C = rng.normal(size=(n, d)) * 1e2
    w = rng.integers(1, 30, size=n).astype(float)
    Cw = C * w[:, None]
    labels = rng.integers(0, k, size=n)
    alive = rng.random(n) > 0.2
    first = keyed_unlearn.exact_means(Cw, w, labels, alive, k)
    # a device's rows leave and a few rows change label: clusters 0 and 1 only
    alive2 = alive.copy()
    alive2[np.flatnonzero(labels == 0)[:5]] = False
    labels2 = labels.copy()
    move = np.flatnonzero(alive2 & (labels == 1))[:3]
    labels2[move] = 0
    marked = first.copy()
    marked[2:] = 12345.0   # the untouched clusters' means come from the reference
    got = keyed_unlearn.exact_means(Cw, w, labels2, alive2, k, (labels, alive, marked))
    want, _ = update_centers(C[alive2], labels2[alive2], k, w[alive2], np.zeros((k, d)),
                             Cw[alive2])
    np.testing.assert_array_equal(got[:2], want[:2])   # summed again: the fresh bits
    assert (got[2:] == 12345.0).all()
    # with the true reference every mean is the fresh step's, bit for bit
    np.testing.assert_array_equal(
        keyed_unlearn.exact_means(Cw, w, labels2, alive2, k, (labels, alive, first)), want)


def test_partition_classes_name_starts_that_group_the_remaining_rows_alike():
    rng = np.random.default_rng(5)
    n, k = 300, 6
    a = rng.integers(0, k, size=n)
    perm = rng.permutation(k)
    b = perm[a]                                   # a relabelling: the same partition
    c = a.copy()
    c[7] = (a[7] + 1) % k                         # one row moved: another partition
    alive = np.ones(n, bool)
    sizes = [1, 1, 1, 2]
    e = rng.integers(0, k, size=n)                # another partition with other sizes
    none = [None] * 4
    assert keyed_result.partition_classes([a, b, c, e], sizes, alive, k, none)[0] == [0, 0, 2, 3]
    # row 7 gone: c groups the remaining rows as a does
    alive[7] = False
    assert keyed_result.partition_classes([a, b, c, e], sizes, alive, k, none)[0] == [0, 0, 0, 3]
    # a merge of two clusters (a function, not one-to-one) is another partition
    m = np.where(a == 1, 0, a)
    assert keyed_result.partition_classes([a, m], [1, 1], alive, k, [None] * 2)[0] == [0, 1]
    # names known from the last forget (labels unchanged since) are taken as they are
    assert keyed_result.partition_classes([a, e], [1, 1], alive, k,
                                       [(3, None), (3, None)])[0] == [0, 0]


def test_traced_lloyd_from_a_variance_estimate_gives_the_exact_runs_bits():
    # the stop rule decided from an estimate with an error bound: the exact variance is
    # worked out only where a shift lies within the bound, and the run is the same
    rng = np.random.default_rng(8)
    means = rng.normal(size=(5, 4)) * 3
    C = means[rng.integers(5, size=600)] + rng.normal(size=(600, 4))
    w = rng.integers(1, 20, size=600).astype(float)
    c_sq, Cw = (C * C).sum(axis=1), C * w[:, None]
    var = C.var(axis=0).mean()
    init = C[rng.choice(600, size=5, replace=False)]
    for tol in (1e-4, 1e-2, 0.3):
        want = keyed_trace.traced_lloyd(C, init, w, Cw, c_sq, var, 100, tol)
        for err in (var * 1e-11, np.inf):   # a close estimate; none at all
            calls = []

            def exact():
                calls.append(1)
                return var

            got = keyed_trace.traced_lloyd(C, init, w, Cw, c_sq,
                                           (var * (1 + 1e-12), err, exact), 100, tol)
            assert got.reason == want.reason
            np.testing.assert_array_equal(got.cs, want.cs)
            np.testing.assert_array_equal(got.A, want.A)
            if err == np.inf:   # every shift in doubt: worked out once, at the first
                assert len(calls) == (len(want.cs) > 1)
    # far from every stop by shift, the exact variance is never asked for
    never = (var, var * 1e-11, lambda: 1 / 0)
    run = keyed_trace.traced_lloyd(C, init, w, Cw, c_sq, never, 100, 1e-12)
    np.testing.assert_array_equal(
        run.cs, keyed_trace.traced_lloyd(C, init, w, Cw, c_sq, var, 100, 1e-12).cs)


def test_the_shift_stop_rule_over_every_iteration_equals_it_shift_by_shift():
    # the stacked follow decides every iteration's stop rule at once: each decision is the
    # one worked out on that shift alone in Python floats (math.sqrt is correctly rounded,
    # as np.sqrt), including shifts within the rounding allowance of tol x variance
    import math
    from types import SimpleNamespace

    rng = np.random.default_rng(5)
    tr = SimpleNamespace(scale2=37.5, tol=1e-4)
    k, var_err, abs_tol = 7, 3e-9, 2.5e-4
    err0 = 1e-20 * tr.scale2 * k + tr.tol * var_err
    shifts = np.concatenate([
        [0.0, abs_tol, abs_tol * (1 + 1e-13), abs_tol * (1 - 1e-13), 1e6],
        abs_tol + rng.uniform(-3, 3, 40) * err0,      # near the threshold either way
        abs_tol * np.exp(rng.uniform(-20, 20, 40))])   # far from it
    near, stops = keyed_unlearn.shift_stops(shifts, abs_tol, tr, k, var_err)
    ref_near, ref_stop = [], []
    for shift in shifts.tolist():
        err = 2.0 * math.sqrt(shift) * 1e-10 * math.sqrt(tr.scale2 * k) \
            + 1e-20 * tr.scale2 * k + tr.tol * var_err \
            + keyed_unlearn.SHIFT_RTOL * max(shift, abs_tol)
        ref_near.append(abs(shift - abs_tol) <= err)
        ref_stop.append(shift <= abs_tol)
    assert near.tolist() == ref_near and stops.tolist() == ref_stop
    assert 0 < sum(ref_near) < len(shifts) and 0 < sum(ref_stop) < len(shifts)
