"""Row deletions under the keyed server: the device's new summary enters the fit's trace, and
every state equals a fresh fit on the remaining rows."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import KFed
from fedclust.kfed import keyed, keyed_unlearn
from fedclust.unlearning.forget import results_close

from .keyed_helpers import K, federation, make_keyed, check_fresh, splits_are_the_remaining_rows


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
    Xs = federation(rng, n_dev)
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
                splits_are_the_remaining_rows(tr)
        check_fresh(model, Xs, ids, gone, _make_auto)
        assert model.verify().ok
    assert seen["row"] >= 3 and seen["pieces"] >= 1 and seen["pick"] >= 1
    assert seen["emptied"] == 1


def test_a_new_summary_with_more_pieces_than_slots_takes_the_full_step():
    from dataclasses import replace

    rng = np.random.default_rng(41)
    Xs = federation(rng, 30)
    ids = list(range(30))
    model = make_keyed().fit(Xs, device_ids=ids)
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
    check_fresh(model, Xs, ids, [])


def test_a_new_piece_that_would_join_a_pick_s_candidates_is_caught():
    # the insertion certificate of the seeding against the fit's own keys: a piece placed
    # on a step's pick (its key then the smallest there) counts as joining that step
    rng = np.random.default_rng(43)
    Xs = federation(rng, 40)
    ids = list(range(40))
    model = make_keyed().fit(Xs, device_ids=ids)
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
    Xs = federation(rng, n_dev)
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
        check_fresh(model, Xs, ids, gone, _make_auto)
        assert model.verify().ok
    assert seen["kept"] >= 1 and seen["changed"] >= 1


def test_a_followed_trace_is_recorded_exact_and_verified_bit_for_bit():
    # a row deletion and a device forget that follow the keyed trace give the server step's
    # bits: the record says "trace", and verify compares bit for bit (one ulp off fails),
    # where a downdate would compare within DOWNDATE_RTOL
    from fedclust.unlearning.forget import ForgetRecord

    rng = np.random.default_rng(3)
    Xs = federation(rng, 30)
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


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_a_new_piece_s_potential_is_the_weighted_sum_over_the_remaining_rows(t):
    # the pruned potential (the potential before the step less what the piece lowers, over
    # the rows nearer to it than to its nearest seed and than to their labelled seed where
    # it came before the step) against the plain sum over all rows; some rows rewritten
    # since the runs were traced (their kept seed distances stale, not read)
    from fedclust.kfed import keyed_seeding

    rng = np.random.default_rng(50 + t)
    Xs = federation(rng, 30)
    model = make_keyed().fit(Xs, device_ids=list(range(30)))
    tr = model._unlearning_.trace
    alive = tr.alive.copy()
    alive[rng.choice(len(alive), size=20, replace=False)] = False
    tr.alive = alive
    stale = rng.choice(np.flatnonzero(alive & ~np.isin(np.arange(len(alive)), tr.seeds)),
                       size=5, replace=False)
    tr.C[stale] = tr.C[stale[::-1]] + rng.normal(scale=2.0, size=(5, 3))
    tr.c_sq[stale] = (tr.C[stale] ** 2).sum(axis=1)
    X = tr.C[rng.choice(np.flatnonzero(alive), size=4)] + rng.normal(scale=0.3, size=(4, 3))
    s = 1
    seeds = tr.seeds[s, :t]
    D = ((tr.C[:, None, :] - tr.C[seeds][None]) ** 2).sum(axis=2).min(axis=1)
    base = float(tr.w[alive] @ D[alive])
    Dp = ((tr.C[:, None, :] - X[None]) ** 2).sum(axis=2)
    want = tr.w[alive] @ np.minimum(D[alive, None], Dp[alive])
    got = keyed_seeding.piece_potentials(tr, s, t, X, (X * X).sum(axis=1),
                                         None if t == 1 else base, stale)
    np.testing.assert_allclose(got, want, rtol=1e-10)
    assert (got < base).all()
