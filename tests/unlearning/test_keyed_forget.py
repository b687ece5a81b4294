"""The keyed weighted k-means++ server (the default, ``server="weighted-kmeans++"``) forgets a
device by following its fit's trace (seeds kept, each start's Lloyd replayed with
certified labels) where it can, and by its step in full otherwise. Each state is compared
with a fresh fit on what remains (same seed, same device ids): centers bit for bit (the
kept start's last update is recomputed over the remaining rows), every label equal,
``verify`` agreeing."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import KFed
from fedclust.kfed import keyed, keyed_remaining, keyed_result, keyed_trace, keyed_unlearn
from fedclust.kfed.explain import center_split
from fedclust.unlearning.forget import results_close

K = 4


def _federation(rng, n_devices, d=3):
    means = rng.normal(size=(K, d)) * 6
    Xs = []
    for _ in range(n_devices):
        n = int(rng.integers(25, 45))
        own = rng.choice(K, size=2, replace=False)
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, d)))
    return Xs


def _make():
    return KFed(K, 2, server="weighted-kmeans++-keyed", random_state=7)


def _check(model, Xs, ids, gone, make=None):
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = (make or _make)().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
    # bit for bit after the step in full and after following the trace alike
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert model.device_ids_ == fresh.device_ids_
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        assert np.array_equal(a, b)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        assert np.array_equal(a, b)
    assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
    assert results_close(model._unlearning_.result, fresh._unlearning_.result)
    assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings


def _splits_are_the_remaining_rows(tr):
    """The warning's kept per-center splits are those of the remaining rows, bit for bit
    (nothing of a forgotten row stays in them)."""
    from fedclust.kfed.explain import split_bound

    ex = tr.expl
    assert np.array_equal(ex.alive, tr.alive)
    for j, got in enumerate(ex.bounds):   # kept bounds: those of the remaining rows
        if got is not keyed_trace.STALE:
            rows = np.flatnonzero(ex.alive & (ex.labels == j))
            assert got == split_bound(tr.C[rows], tr.w[rows])
    for j, got in enumerate(ex.splits):
        if got is keyed_trace.STALE:   # not worked out since its rows changed
            continue
        rows = np.flatnonzero(ex.alive & (ex.labels == j))
        if not len(rows):
            assert got is None
            continue
        want = center_split(tr.C[rows], tr.w[rows], tr.scatter[rows])
        for f in ("n", "cost", "gain", "along"):
            assert getattr(got, f) == getattr(want, f)
        for f in ("mean", "halves", "half_means"):
            assert np.array_equal(getattr(got, f), getattr(want, f))


def _seed_holders(trace):
    return {trace.seed_device, *trace.ff_owners.tolist(),
            *trace.owner[trace.seeds.ravel()].tolist()}


def _fewest_starts_to_rerun(trace, ids):
    """A device holding no first seed and the fewest k-means++ seeds: the fewest starts to
    run again when it leaves."""
    held = trace.owner[trace.seeds.ravel()].tolist()
    return min((z for z in ids if z != trace.seed_device and z not in trace.ff_owners),
               key=held.count)


@pytest.mark.parametrize("trial", range(2))
def test_random_forget_sequences_equal_a_retrain(trial):
    rng = np.random.default_rng(70 + trial)
    n_dev = 150
    Xs = _federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(10_000, size=n_dev, replace=False)]
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    assert isinstance(trace, keyed_trace.KeyedTrace)
    free = [int(z) for z in rng.permutation(ids)]   # seed holders included
    gone: list[int] = []
    paths = []
    for step in range(6):
        if step == 3:   # a row deletion between the device forgets: that device's step again
            z = free[-1]
            model.forget(rows={z: [0, 1]}, relabel=True)
            Xs[ids.index(z)] = Xs[ids.index(z)][2:]
        else:   # one device, or two at once (step 5)
            zs = free[step:step + 1] if step < 5 else free[5:7]
            model.forget(devices=zs)
            gone.extend(zs)
        paths.append(model.forget_log_[-1].path)
        if paths[-1] == "trace":   # nothing of the forgotten rows stays in the trace
            tr = model._unlearning_.trace
            dead = ~tr.alive
            assert dead.sum() >= 2 and not tr.C[dead].any() and not tr.w[dead].any()
            assert not tr.c_sq[dead].any() and not tr.labels[dead].any()
            assert tr.means_ref is None or not tr.means_ref[0][dead].any()
            if tr.cand_rows is not None:   # the candidates' gathered rows
                slot = tr.cand_rows[0].ravel()
                gone_slot = (slot >= 0) & dead[np.maximum(slot, 0)]
                assert not tr.cand_rows[1][gone_slot].any()
                assert not tr.cand_rows[2][gone_slot].any()
            for run in tr.runs:
                assert not run.A[:, dead].any()
                for order, m in zip(run.order, run.margin_sorted):
                    pos = np.flatnonzero(dead[order])
                    prev = np.where(pos > 0, m[np.maximum(pos - 1, 0)], -np.inf)
                    assert np.array_equal(m[pos], prev) and np.all(m[1:] >= m[:-1])
            ex = tr.expl
            if ex is not None:   # the explanation warning's reference
                assert not ex.labels[dead].any() and not ex.alive[dead].any()
                _splits_are_the_remaining_rows(tr)
        _check(model, Xs, ids, gone)
        assert model.verify().ok
    assert "trace" in paths   # the trace was followed at least once


@pytest.mark.parametrize("trial", range(3))
def test_overlapping_small_devices_rows_and_devices_interleaved(trial):
    # overlapping groups (means 2.5 apart on the scale of the noise), devices of 8 to 20
    # rows; a random sequence of device forgets (one or two at once, seed holders included)
    # and row deletions, each state against a fresh fit on what remains
    rng = np.random.default_rng(300 + trial)
    means = rng.normal(size=(K, 3)) * 2.5
    n_dev = 90
    Xs = []
    for _ in range(n_dev):
        n = int(rng.integers(8, 21))
        own = rng.choice(K, size=2, replace=False)
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, 3)))
    ids = [int(z) for z in rng.choice(100_000, size=n_dev, replace=False)]
    model = _make().fit(Xs, device_ids=ids)
    left = [int(z) for z in rng.permutation(ids)]
    gone: list[int] = []
    paths = []
    for step in range(8):
        if rng.random() < 0.3:   # a few rows of a remaining device
            z = left.pop()
            n = len(Xs[ids.index(z)])
            rows = rng.choice(n, size=int(rng.integers(1, 4)), replace=False)
            model.forget(rows={z: rows.tolist()}, relabel=True)
            Xs[ids.index(z)] = np.delete(Xs[ids.index(z)], rows, axis=0)
            left.insert(0, z)
        else:
            zs = [left.pop() for _ in range(int(rng.integers(1, 3)))]
            model.forget(devices=zs)
            gone.extend(zs)
        paths.append(model.forget_log_[-1].path)
        _check(model, Xs, ids, gone)
        assert model.verify().ok
    assert "trace" in paths


def _twin_free(trace, Xs, ids):
    """A device whose forget follows the trace with no start run again (on a twin model)."""
    twin = _make().fit(Xs, device_ids=ids)
    u = twin._unlearning_
    for z in ids:
        if z in _seed_holders(trace):
            continue
        got = keyed_unlearn.keyed_forget(u.protocol, u.trace, u.store.rounds[0].replies, [z])
        if got is not None and not got[1].reruns:
            return z
    raise AssertionError("no device whose forget follows the trace")


@pytest.mark.parametrize("holder", ["keyed", "widest"])
def test_a_seed_holder_runs_its_start_again(holder, monkeypatch):
    # keyed: a device holding a k-means++ seed; widest: the device whose centers seed the
    # farthest-first start, with that start switched on (every device sends at least k
    # centers: it holds every pick)
    from fedclust.kfed import keyed

    monkeypatch.setattr(keyed, "FARTHEST_START", holder == "widest")
    Xs = _federation(np.random.default_rng(3), 60)
    ids = list(range(60))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    assert trace.ff_start == (holder == "widest")
    if holder == "keyed":
        z, start = int(trace.owner[trace.seeds[0, 1]]), 0
    else:
        z, start = trace.seed_device, 0
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "trace"
    assert start in model._unlearning_.trace.reruns
    _check(model, Xs, ids, [z])
    # the start run again is traced: the next forgets follow it
    gone = [z]
    for z2 in [i for i in ids if i not in gone][:3]:
        model.forget(devices=[z2])
        gone.append(z2)
        _check(model, Xs, ids, gone)
        assert model.verify().ok


@pytest.mark.parametrize("force", ["tie", "doubt", "stop"])
def test_each_uncertified_run_is_run_again(force, monkeypatch):
    rng = np.random.default_rng(11)
    Xs = _federation(rng, 150)
    ids = list(range(150))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    # the same forget on a twin model follows the trace: the forced case is what stops it
    z = _twin_free(trace, Xs, ids)
    if force == "tie":       # every reassigned row counts as a near tie
        monkeypatch.setattr(keyed_trace, "TIE_RTOL", np.inf)
        monkeypatch.setattr(trace, "slack", np.inf)
        why = "tie"
    elif force == "doubt":   # no row may be assigned again
        monkeypatch.setattr(keyed_unlearn, "_DOUBT_SHARE", -1.0)
        monkeypatch.setattr(trace, "slack", np.inf)
        why = "too many rows"
    else:                    # every shift within "rounding" of tol x var
        monkeypatch.setattr(keyed_unlearn, "SHIFT_RTOL", np.inf)
        why = "shift within rounding"
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "trace"
    reruns = model._unlearning_.trace.reruns
    assert reruns and all(why in r for r in reruns.values())
    _check(model, Xs, ids, [z])


@pytest.mark.parametrize("force", ["start-tie", "too-many"])
def test_a_doubt_between_starts_takes_the_full_step(force, monkeypatch):
    rng = np.random.default_rng(11)
    Xs = _federation(rng, 150)
    ids = list(range(150))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    z = _twin_free(trace, Xs, ids)
    if force == "start-tie":
        monkeypatch.setattr(keyed_unlearn, "pick_start", lambda *a, **kw: None)
    else:   # a forget with a start to run again, and none allowed
        z = int(trace.owner[trace.seeds[0, 1]])
        monkeypatch.setattr(keyed_unlearn, "MAX_RERUN_SHARE", 0.0)
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "replay"
    assert trace.fallback is not None
    _check(model, Xs, ids, [z])


def test_every_start_run_again_gives_the_fresh_step_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(12)
    Xs = _federation(rng, 80)
    ids = [int(z) for z in rng.choice(5000, size=80, replace=False)]
    model = _make().fit(Xs, device_ids=ids)

    def uncertified(*a, **kw):
        raise keyed_unlearn._Full("forced")

    monkeypatch.setattr(keyed_unlearn, "_replay", uncertified)
    monkeypatch.setattr(keyed_unlearn, "_follow", lambda *a, **kw: None)
    gone = []
    for z in ids[5:8]:
        model.forget(devices=[z])
        gone.append(z)
        assert model.forget_log_[-1].path == "trace"
        assert len(model._unlearning_.trace.reruns) == len(model._unlearning_.trace.runs)
        keep = [i for i, y in enumerate(ids) if y not in gone]
        fresh = _make().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
        np.testing.assert_array_equal(model.cluster_centers_, fresh.cluster_centers_)
        _check(model, Xs, ids, gone)


@pytest.mark.parametrize("rows,k", [(40, 2), (200, 2), (60, 8)])
def test_the_explanation_warning_after_random_forgets_is_the_retrains(rows, k):
    # eight groups, each device holding two. k = 2: the final centers each hold several
    # groups (the warning fires); k = 8: it may come and go as devices leave.
    # With 40 rows some local clusters hold one point. A center whose rows did not change
    # keeps its split from the reference, the others are worked out again: the same text
    # as a fresh fit's, and the same splits as the remaining rows give
    rng = np.random.default_rng(21 + k)
    means = rng.normal(size=(8, 3)) * 8
    Xs = [means[rng.choice(8, size=2, replace=False)][rng.integers(2, size=rows)]
          + rng.normal(size=(rows, 3)) for _ in range(60)]
    ids = list(range(60))

    def make():
        return KFed(k, 2, server="weighted-kmeans++-keyed", random_state=7)

    model = make().fit(Xs, device_ids=ids)
    seen = [bool(model.run_log_.warnings)]
    gone = []
    for step in range(5):
        zs = [int(z) for z in rng.choice([i for i in ids if i not in gone],
                                         size=1 + step % 2, replace=False)]
        model.forget(devices=zs)
        gone.extend(zs)
        keep = [i for i in ids if i not in gone]
        fresh = make().fit([Xs[i] for i in keep], device_ids=keep)
        assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings
        seen.append(bool(fresh.run_log_.warnings))
        if model.forget_log_[-1].path == "trace":
            assert model._unlearning_.trace.expl is not None
            _splits_are_the_remaining_rows(model._unlearning_.trace)
        assert np.array_equal(np.concatenate(model.center_labels_),
                              np.concatenate(fresh.center_labels_))
    if rows == 40:   # local clusters of one point (no scatter) took part
        assert any(c <= 1 for cs in model.local_counts_ for c in cs)
    assert any(seen) or k == 8   # the warning was on in some of the compared states


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

    Xs = _federation(np.random.default_rng(8), 30)
    b = _make().fit(iter(Xs))
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


def _spy(monkeypatch, name, log):
    real = getattr(keyed_unlearn, name)

    def spy(*a, **kw):
        out = real(*a, **kw)
        log.append((a, out, a[0].alive.copy()))   # the rows remaining at that forget
        return out

    monkeypatch.setattr(keyed_unlearn, name, spy)


def test_the_stacked_follow_equals_the_per_iteration_replay(monkeypatch):
    rng = np.random.default_rng(21)
    Xs = _federation(rng, 120)
    ids = list(range(120))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    real, pairs = keyed_unlearn._follow, []

    def both(*a):   # at each call, the per-iteration replay of the same start beside it
        out = real(*a)
        if out is not None:
            pairs.append((out, keyed_unlearn._replay(*a[:4])))
        return out

    monkeypatch.setattr(keyed_unlearn, "_follow", both)
    gone = []
    for z in [z for z in ids if z not in _seed_holders(trace)][:3]:
        model.forget(devices=[z])
        gone.append(z)
        assert model.forget_log_[-1].path == "trace"
        _check(model, Xs, ids, gone)
    assert pairs   # the stacked follow served some starts
    for out, again in pairs:   # the same centers, stop and rows assigned again
        assert np.array_equal(out[0], again[0]) and out[2] == again[2]
        assert len(again[1][0]) == 0 and out[4] == again[4]


def test_a_start_the_stacked_follow_cannot_certify_is_followed_per_iteration(monkeypatch):
    # every row in doubt at every iteration and only 4 margins stacked: the stacked follow
    # declines every start, the per-iteration replay assigns every row again
    rng = np.random.default_rng(22)
    Xs = _federation(rng, 60)
    ids = list(range(60))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    z = _fewest_starts_to_rerun(trace, ids)
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
    _check(model, Xs, ids, [z])


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
    Xs = _federation(rng, 40)
    ids = list(range(40))
    model = _make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    z = _fewest_starts_to_rerun(trace, ids)
    n, n_z = len(trace.C), len(model.local_centers_[ids.index(z)])
    # a start budget where N k gives 14 starts and N k less z's centers 15
    budget = (n - n_z) * K * 15
    monkeypatch.setattr(server, "WEIGHTED_START_BUDGET", budget)
    assert server.weighted_starts(n, K) == 14 and server.weighted_starts(n - n_z, K) == 15
    model = _make().fit(Xs, device_ids=ids)   # the fit with that budget: 14 starts
    assert len(model._unlearning_.trace.runs) == 14   # the keyed starts (no farthest-first start)
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "replay"
    assert model._unlearning_.trace is None or len(model._unlearning_.trace.runs) == 15
    _check(model, Xs, ids, [z])


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
    Xs = _federation(rng, 120)
    ids = [int(z) for z in rng.choice(5000, size=120, replace=False)]
    model = _make().fit(Xs, device_ids=ids)
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
    for z in [z for z in ids if z not in _seed_holders(model._unlearning_.trace)][:3]:
        model.forget(devices=[z])
        gone.append(z)
        assert model.forget_log_[-1].path == "trace"
        trace = model._unlearning_.trace
        assert len(trace.reruns) == len(trace.runs)
        _check(model, Xs, ids, gone)
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
    lab, margin, runner, margin3 = keyed_trace._assign_margin(X, centers, x_sq)
    D = np.maximum(x_sq[:, None] - 2.0 * (X @ centers.T) + (centers ** 2).sum(axis=1), 0.0)
    dist = np.sqrt(D)
    srt = np.sort(dist, axis=1)
    assert np.array_equal(lab, D.argmin(axis=1))
    assert np.array_equal(margin, srt[:, 1] - srt[:, 0])
    assert np.array_equal(margin3, srt[:, 2] - srt[:, 0])
    assert (runner != lab).all()
    assert np.array_equal(dist[np.arange(len(X)), runner], srt[:, 1])
    assert (margin == 0).any()


def test_expanding_a_run_over_the_remaining_rows_keeps_the_stable_sort():
    # a run traced over the remaining rows, put back at the trace's row indices: its
    # sorted margins and order equal a stable sort of the full margins (others at -inf)
    rng = np.random.default_rng(22)
    Xs = _federation(rng, 40)
    model = _make().fit(Xs, device_ids=list(range(40)))
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


def _force_coreset(monkeypatch, n_centers):
    """The coreset path for a small federation: every size samples, m = 20 centers."""
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 20)
    monkeypatch.setattr(keyed, "SAMPLE_PER_CLUSTER", 1)
    assert keyed.sample_size(n_centers, K) == 20


def test_a_forget_of_a_coreset_fit_runs_the_step_again_and_equals_a_retrain(monkeypatch):
    # above SAMPLED_ABOVE device centers the starts run on a keyed coreset: a forget runs
    # the server step again on the kept summaries (no device computes), which must equal a
    # fresh fit on the remaining devices bit for bit, seed holders and coreset rows included
    rng = np.random.default_rng(41)
    n_dev = 60
    Xs = _federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(50_000, size=n_dev, replace=False)]
    full = _make().fit(Xs, device_ids=ids)   # every start on all device centers
    n_centers = sum(len(c) for c in full.local_centers_)
    _force_coreset(monkeypatch, n_centers)
    model = _make().fit(Xs, device_ids=ids)
    # the coreset path ran: its result is sampled_weighted_kmeans's on the same centers
    trace = model._unlearning_.trace
    assert trace is None   # no trace to follow: the starts saw a sample
    C = np.concatenate(model.local_centers_)
    w = np.concatenate(model.local_counts_).astype(float)
    owner = np.repeat(ids, [len(c) for c in model.local_centers_])
    local = np.concatenate([np.arange(len(c)) for c in model.local_centers_])
    order = np.argsort(owner, kind="stable")   # the server sees the devices by id
    res = keyed.sampled_weighted_kmeans(C[order], K, w[order], owner[order], local[order],
                                        model.seed_, 20, max_iter=300, tol=1e-4)
    assert np.array_equal(res.centers, model.cluster_centers_)
    # the coreset answer costs about what the all-centers one does on the pooled rows
    X = np.concatenate(Xs)
    cost = [float(((X[:, None] - m.cluster_centers_[None]) ** 2).sum(-1).min(1).sum())
            for m in (model, full)]
    assert cost[0] <= 1.05 * cost[1]
    gone: list[int] = []
    for zs in ([ids[3]], [ids[10], ids[40]], [int(owner[0])]):
        zs = [z for z in zs if z not in gone][:2]
        model.forget(devices=zs)
        gone.extend(zs)
        rec = model.forget_log_[-1]
        assert rec.path == "replay" and not rec.retrained   # the server step only
        _check(model, Xs, ids, gone)
        assert model.verify().ok


def test_keyed_coreset_draws_do_not_depend_on_device_order():
    # a device center's inclusion is keyed by (seed, device id, center index): the same
    # rows whatever order the devices come in, and weights w / pi with pi = min(1, m q)
    rng = np.random.default_rng(5)
    n_dev, per = 400, 3
    C = rng.normal(size=(n_dev * per, 4)) * rng.uniform(0.5, 3, size=(n_dev * per, 1))
    w = rng.integers(1, 30, size=n_dev * per).astype(float)
    owner = np.repeat(rng.choice(10**6, size=n_dev, replace=False), per)
    local = np.tile(np.arange(per), n_dev)
    rows, ws = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, 9, 300)
    perm = rng.permutation(n_dev)
    p_rows = (perm[:, None] * per + np.arange(per)).ravel()
    rows2, ws2 = keyed.keyed_coreset(C[p_rows], w[p_rows], (C[p_rows] ** 2).sum(1),
                                     owner[p_rows], local[p_rows], 9, 300)
    got = sorted(zip(owner[rows], local[rows]))
    got2 = sorted(zip(owner[p_rows][rows2], local[p_rows][rows2]))
    assert got == got2 and 200 < len(rows) < 400
    np.testing.assert_allclose(np.sort(ws), np.sort(ws2), rtol=1e-12)
    # weights by hand: q = w/2W + w d^2 / 2 sum(w d^2) about the weighted mean
    mu = w @ C / w.sum()
    wd = w * ((C - mu) ** 2).sum(1)
    pi = np.minimum(1.0, 300 * (0.5 * w / w.sum() + 0.5 * wd / wd.sum()))
    np.testing.assert_allclose(ws, w[rows] / pi[rows], rtol=1e-12)
    # with m so large that every pi is 1 the coreset is every center at its own weight
    rows_all, ws_all = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, 9, 10**9)
    assert np.array_equal(rows_all, np.arange(len(C))) and np.array_equal(ws_all, w)


def test_keyed_coreset_cost_is_unbiased():
    # for fixed centers Q the coreset's weighted cost averages to the full weighted cost
    # over seeds (Horvitz-Thompson): 400 seeds, within 4 standard errors
    rng = np.random.default_rng(8)
    C = np.concatenate([rng.normal(size=(1500, 3)), rng.normal(size=(500, 3)) * 4 + 6])
    w = rng.integers(1, 10, size=len(C)).astype(float)
    owner, local = np.arange(len(C)) // 2, np.arange(len(C)) % 2
    Q = rng.normal(size=(5, 3)) * 3
    d2 = ((C[:, None] - Q[None]) ** 2).sum(-1).min(1)
    full = float(w @ d2)
    est = []
    for seed in range(400):
        rows, ws = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, seed, 100)
        est.append(float(ws @ d2[rows]))
    est = np.array(est)
    assert abs(est.mean() - full) <= 4 * est.std() / np.sqrt(len(est))
    assert est.std() < 0.25 * full   # and the estimate is informative at m = 100


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
            _splits_are_the_remaining_rows(tr)
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
    assert keyed_result.partition_classes([a, b, c, e], sizes, alive, k, none) == [0, 0, 2, 3]
    # row 7 gone: c groups the remaining rows as a does
    alive[7] = False
    assert keyed_result.partition_classes([a, b, c, e], sizes, alive, k, none) == [0, 0, 0, 3]
    # a merge of two clusters (a function, not one-to-one) is another partition
    m = np.where(a == 1, 0, a)
    assert keyed_result.partition_classes([a, m], [1, 1], alive, k, [None] * 2) == [0, 1]
    # names known from the last forget (labels unchanged since) are taken as they are
    assert keyed_result.partition_classes([a, e], [1, 1], alive, k, [3, 3]) == [0, 0]


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


def _make_auto():
    # the default server with each device sizing its own summary ("auto"): a row deletion
    # can change how many pieces a device sends
    return KFed(K, random_state=11)


def _fresh_seeds_match(tr, model, Xs, ids, gone):
    """Every start's seeds in the trace after a forget are a fresh step's, row for row."""
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = _make_auto().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
    ft = fresh._unlearning_.trace
    rows = np.flatnonzero(tr.alive)   # the stacked rows of a fresh step, in its order
    assert np.array_equal(tr.C[rows], ft.C)
    assert np.array_equal(rows[ft.seeds], tr.seeds)


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow),
                                   pytest.param(2, marks=pytest.mark.slow)])
def test_row_deletions_follow_the_trace_and_equal_a_retrain(trial):
    # interleaved device forgets and row deletions on devices that size their own summary:
    # deletions that change a device's number of pieces, that change a k-means++ pick, and
    # one that empties a device; each state against a fresh fit on what remains
    rng = np.random.default_rng(500 + trial)
    n_dev = 70
    Xs = _federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(10_000, size=n_dev, replace=False)]
    model = _make_auto().fit(Xs, device_ids=ids)
    gone: list[int] = []
    seen = {"row": 0, "pieces": 0, "pick": 0, "emptied": 0}
    for step in range(9):
        left = [z for z in ids if z not in gone]
        z = left[int(rng.integers(len(left)))]
        i = ids.index(z)
        if step == 4:   # every row of a device: the device leaves
            model.forget(rows={z: list(range(len(Xs[i])))})
            assert model.forget_log_[-1].devices == [z] and z not in model.device_ids_
            gone.append(z)
            seen["emptied"] += 1
        elif step % 3 == 2:
            model.forget(devices=[z])
            gone.append(z)
        else:
            before = len(model.local_centers_[model.device_ids_.index(z)])
            rows = rng.choice(len(Xs[i]), size=int(rng.integers(1, 10)), replace=False)
            model.forget(rows={z: rows.tolist()}, relabel=True)
            Xs[i] = np.delete(Xs[i], rows, axis=0)
            rec = model.forget_log_[-1]
            assert rec.recomputed == [(0, z)] and not rec.retrained
            if rec.path == "trace":
                seen["row"] += 1
                tr = model._unlearning_.trace
                after = len(model.local_centers_[model.device_ids_.index(z)])
                seen["pieces"] += after != before
                seen["pick"] += any("pick" in y or "seed" in y or "join" in y
                                    for y in tr.reruns.values())
                _fresh_seeds_match(tr, model, Xs, ids, gone)
                _splits_are_the_remaining_rows(tr)
        _check(model, Xs, ids, gone, _make_auto)
        assert model.verify().ok
    assert seen["row"] >= 3 and seen["pieces"] >= 1 and seen["pick"] >= 1
    assert seen["emptied"] == 1


def test_a_new_summary_with_more_pieces_than_slots_takes_the_full_step():
    from dataclasses import replace

    rng = np.random.default_rng(41)
    Xs = _federation(rng, 30)
    ids = list(range(30))
    model = _make().fit(Xs, device_ids=ids)
    u = model._unlearning_
    tr = u.trace
    replies = dict(u.store.rounds[0].replies)
    old = replies[5]
    grown = replace(old, centers=np.vstack([old.centers, old.centers[:1] + 0.5]),
                    counts=np.append(old.counts, 1), scatter=np.append(old.scatter, 0.0))
    replies[5] = grown
    assert keyed_unlearn.keyed_forget(u.protocol, tr, replies, [], {5: grown}) is None
    assert tr.fallback == "a device's new summary does not fit its slots"
    # the same model forgets rows by the full step and still equals a retrain
    model.forget(rows={7: [0, 3]}, relabel=True)
    Xs[7] = np.delete(Xs[7], [0, 3], axis=0)
    _check(model, Xs, ids, [])


def test_a_new_piece_that_would_join_a_pick_s_candidates_is_caught():
    # the insertion certificate of the seeding against the fit's own keys: a piece placed
    # on a step's pick (its key then the smallest there) counts as joining that step
    rng = np.random.default_rng(43)
    Xs = _federation(rng, 40)
    ids = list(range(40))
    model = _make().fit(Xs, device_ids=ids)
    tr = model._unlearning_.trace
    from fedclust.kfed import keyed_rows, keyed_seeding

    s, t = 0, 2
    pick = tr.seeds[s, t]
    z = next(x for x in ids if x != tr.owner[pick] and x not in tr.owner[tr.seeds[s]])
    msg = model._unlearning_.store.rounds[0].replies[z]
    e = keyed_rows.entering(tr, {z: msg})
    e.C[:] = tr.C[pick]
    e.c_sq[:] = tr.c_sq[pick]
    e.w[:] = 1e6   # a heavy piece at the pick: its key is the smallest at that step
    alive = tr.alive.copy()
    cand = np.maximum(tr.cand, 0).ravel()
    _, before = keyed_seeding.share(tr, e.C, e.w, e.c_sq, tr.C[cand], tr.c_sq[cand])
    left = (tr.cand >= 0) & alive[np.maximum(tr.cand, 0)]
    joins, _, _ = keyed_seeding.seed_entries(tr, e, before, left, tr.C[cand], tr.c_sq[cand])
    assert joins[s, t]


def _fresh_candidates_match(tr, model, Xs, ids, gone):
    """Every step's first L remaining candidates in the trace are a fresh step's, in key
    order, with their potentials within rounding (the seeds and picks row for row)."""
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = _make_auto().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
    ft = fresh._unlearning_.trace
    rows = np.flatnonzero(tr.alive)
    assert np.array_equal(rows[ft.seeds], tr.seeds)
    L = keyed.n_trials(K)
    for s in range(tr.cand.shape[0]):
        for t in range(1, K):
            ok = (tr.cand[s, t] >= 0) & tr.alive[np.maximum(tr.cand[s, t], 0)]
            mine = tr.cand[s, t][ok][:L]
            fc = ft.cand[s, t][ft.cand[s, t] >= 0][:L]
            assert np.array_equal(mine, rows[fc])
            np.testing.assert_allclose(tr.pots[s, t][ok][:L], ft.pots[s, t][:len(fc)],
                                       rtol=1e-9)
            assert tr.cand[s, t][tr.pick[s, t]] == tr.seeds[s, t]


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_new_piece_enters_a_candidate_list_and_the_pick_is_decided_again(trial):
    # row deletions whose new pieces enter a k-means++ step's first candidates: the step
    # keeps its pick where the new piece's potential does not win (no start runs again)
    # and goes on from that step where it does; device forgets between them; each state
    # against a fresh fit on what remains
    rng = np.random.default_rng(trial)
    n_dev = 40
    Xs = _federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(10_000, size=n_dev, replace=False)]
    model = _make_auto().fit(Xs, device_ids=ids)
    gone: list[int] = []
    seen = {"kept": 0, "changed": 0}
    for step in range(6):
        left = [z for z in ids if z not in gone]
        z = left[int(rng.integers(len(left)))]
        i = ids.index(z)
        if step % 4 == 3:
            model.forget(devices=[z])
            gone.append(z)
        else:
            rows = rng.choice(len(Xs[i]), size=int(rng.integers(1, 10)), replace=False)
            old_seeds = model._unlearning_.trace.seeds.copy()
            model.forget(rows={z: rows.tolist()}, relabel=True)
            Xs[i] = np.delete(Xs[i], rows, axis=0)
            assert model.forget_log_[-1].path == "trace"
            tr = model._unlearning_.trace
            changed = {s for s, y in tr.reruns.items()
                       if y == "a new piece changes a k-means++ pick"}
            for s in changed:   # a genuine change: the fresh step's seeds differ
                assert not np.array_equal(old_seeds[s], tr.seeds[s])
            for s, _ in tr.entered:
                if s not in tr.reruns:
                    assert np.array_equal(old_seeds[s], tr.seeds[s])
            seen["kept"] += any(s not in tr.reruns for s, _ in tr.entered)
            seen["changed"] += len(changed)
            _fresh_candidates_match(tr, model, Xs, ids, gone)
        _check(model, Xs, ids, gone, _make_auto)
        assert model.verify().ok
    assert seen["kept"] >= 1 and seen["changed"] >= 1


def test_a_followed_trace_is_recorded_exact_and_verified_bit_for_bit():
    # a row deletion and a device forget that follow the keyed trace give the server step's
    # bits: the record says "trace", and verify compares bit for bit (one ulp off fails),
    # where a downdate would compare within DOWNDATE_RTOL
    from fedclust.unlearning.forget import ForgetRecord

    rng = np.random.default_rng(3)
    Xs = _federation(rng, 30)
    ids = list(range(30))
    model = _make_auto().fit(Xs, device_ids=ids)
    for request in ({"rows": {4: [0, 5, 9]}}, {"devices": [11]}):
        model.forget(**request, relabel=True)
        rec = model.forget_log_[-1]
        assert rec.path == "trace" and model._unlearning_.exact
        assert ForgetRecord.from_json(rec.to_json()).path == "trace"
        assert model.verify().ok
    u = model._unlearning_
    kept = u.result.centers.copy()
    u.result.centers[0, 0] = np.nextafter(kept[0, 0], np.inf)
    report = model.verify()
    assert not report.summaries and report.retrain is False
    Xs[4] = np.delete(Xs[4], [0, 5, 9], axis=0)
    keep = [z for z in ids if z != 11]
    fresh = _make_auto().fit([Xs[z] for z in keep], device_ids=keep)
    assert results_close(u.result, fresh._unlearning_.result)   # one ulp: within 1e-12
    u.result.centers[:] = kept
    assert model.verify().ok


@pytest.mark.parametrize("t", [1, 2, 3])
def test_a_new_piece_s_potential_is_the_weighted_sum_over_the_remaining_rows(t):
    # the pruned potential (the potential before the step less what the piece lowers, over
    # the rows nearer to it than to its nearest seed) against the plain sum over all rows
    from fedclust.kfed import keyed_seeding

    rng = np.random.default_rng(50 + t)
    Xs = _federation(rng, 30)
    model = _make().fit(Xs, device_ids=list(range(30)))
    tr = model._unlearning_.trace
    alive = tr.alive.copy()
    alive[rng.choice(len(alive), size=20, replace=False)] = False
    tr.alive = alive
    X = tr.C[rng.choice(np.flatnonzero(alive), size=4)] + rng.normal(scale=0.3, size=(4, 3))
    s = 1
    seeds = tr.seeds[s, :t]
    D = ((tr.C[:, None, :] - tr.C[seeds][None]) ** 2).sum(axis=2).min(axis=1)
    base = float(tr.w[alive] @ D[alive])
    Dp = ((tr.C[:, None, :] - X[None]) ** 2).sum(axis=2)
    want = tr.w[alive] @ np.minimum(D[alive, None], Dp[alive])
    got = keyed_seeding.piece_potentials(tr, s, t, X, (X * X).sum(axis=1),
                                         None if t == 1 else base)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert (got < base).all()
