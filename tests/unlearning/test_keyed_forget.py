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
from fedclust.kfed import keyed, keyed_trace, keyed_unlearn

from .keyed_helpers import K, federation, make_keyed, check_fresh, splits_are_the_remaining_rows, seed_holders


# one federation in the fast suite, the others with the slow checks
@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_random_forget_sequences_equal_a_retrain(trial):
    rng = np.random.default_rng(70 + trial)
    n_dev = 150
    Xs = federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(10_000, size=n_dev, replace=False)]
    model = make_keyed().fit(Xs, device_ids=ids)
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
                splits_are_the_remaining_rows(tr)
        check_fresh(model, Xs, ids, gone)
        assert model.verify().ok
    assert "trace" in paths   # the trace was followed at least once


@pytest.mark.parametrize("trial", [0, *(pytest.param(t, marks=pytest.mark.slow) for t in (1, 2))])
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
    model = make_keyed().fit(Xs, device_ids=ids)
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
        check_fresh(model, Xs, ids, gone)
        assert model.verify().ok
    assert "trace" in paths


def _twin_free(trace, Xs, ids):
    """A device whose forget follows the trace with no start run again (on a twin model)."""
    twin = make_keyed().fit(Xs, device_ids=ids)
    u = twin._unlearning_
    for z in ids:
        if z in seed_holders(trace):
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
    Xs = federation(np.random.default_rng(3), 60)
    ids = list(range(60))
    model = make_keyed().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    assert trace.ff_start == (holder == "widest")
    if holder == "keyed":
        z, start = int(trace.owner[trace.seeds[0, 1]]), 0
    else:
        z, start = trace.seed_device, 0
    model.forget(devices=[z])
    assert model.forget_log_[-1].path == "trace"
    assert start in model._unlearning_.trace.reruns
    check_fresh(model, Xs, ids, [z])
    # the start run again is traced: the next forgets follow it
    gone = [z]
    for z2 in [i for i in ids if i not in gone][:3]:
        model.forget(devices=[z2])
        gone.append(z2)
        check_fresh(model, Xs, ids, gone)
        assert model.verify().ok


@pytest.mark.parametrize("force", ["tie", "doubt", "stop"])
def test_each_uncertified_run_is_run_again(force, monkeypatch):
    rng = np.random.default_rng(11)
    Xs = federation(rng, 150)
    ids = list(range(150))
    model = make_keyed().fit(Xs, device_ids=ids)
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
    check_fresh(model, Xs, ids, [z])


@pytest.mark.parametrize("force", ["start-tie", "too-many"])
def test_a_doubt_between_starts_takes_the_full_step(force, monkeypatch):
    rng = np.random.default_rng(11)
    Xs = federation(rng, 150)
    ids = list(range(150))
    model = make_keyed().fit(Xs, device_ids=ids)
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
    check_fresh(model, Xs, ids, [z])


def test_every_start_run_again_gives_the_fresh_step_bit_for_bit(monkeypatch):
    rng = np.random.default_rng(12)
    Xs = federation(rng, 80)
    ids = [int(z) for z in rng.choice(5000, size=80, replace=False)]
    model = make_keyed().fit(Xs, device_ids=ids)

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
        fresh = make_keyed().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
        np.testing.assert_array_equal(model.cluster_centers_, fresh.cluster_centers_)
        check_fresh(model, Xs, ids, gone)


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
            splits_are_the_remaining_rows(model._unlearning_.trace)
        assert np.array_equal(np.concatenate(model.center_labels_),
                              np.concatenate(fresh.center_labels_))
    if rows == 40:   # local clusters of one point (no scatter) took part
        assert any(c <= 1 for cs in model.local_counts_ for c in cs)
    assert any(seen) or k == 8   # the warning was on in some of the compared states
