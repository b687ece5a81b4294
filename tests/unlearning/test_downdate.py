"""The paper's server (farthest-first + one Lloyd round) forgets by a downdate: the leaving
devices' share is subtracted from the Lloyd round's sums when none of their centers was
picked by farthest-first, and the full step runs otherwise. Each state is compared with a
fresh fit on what remains (same seed, same device ids)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedclust import KFed
from fedclust.unlearning.forget import DOWNDATE_RTOL, ForgetRecord, results_close


def _federation(rng, n_devices, d=6, k=5):
    means = rng.normal(size=(k, d)) * 8
    Xs = []
    for _ in range(n_devices):
        n = int(rng.integers(30, 70))
        own = rng.choice(k, size=3, replace=False)
        Xs.append(means[own[rng.integers(3, size=n)]] + rng.normal(size=(n, d)))
    return Xs


def _paper(**kw):
    return KFed(5, 3, server="farthest-lloyd1", random_state=4, **kw)


def _check_against_fresh(model, Xs, ids, gone, make):
    keep = [i for i, z in enumerate(ids) if z not in gone]
    fresh = make().fit([Xs[i] for i in keep], device_ids=[ids[i] for i in keep])
    scale = np.abs(fresh.cluster_centers_).max()
    assert np.abs(model.cluster_centers_ - fresh.cluster_centers_).max() <= DOWNDATE_RTOL * scale
    assert model.device_ids_ == fresh.device_ids_
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        assert np.array_equal(a, b)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        assert np.array_equal(a, b)
    assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
    assert results_close(model._unlearning_.result, fresh._unlearning_.result)
    return fresh


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("trial", range(2))
def test_random_device_forgets_downdate_or_replay_and_equal_a_retrain(weighted, trial):
    rng = np.random.default_rng(50 + trial)
    Xs = _federation(rng, 14)
    ids = [int(z) for z in rng.choice(500, size=14, replace=False)]
    make = lambda: _paper(weighted=weighted)   # noqa: E731
    model = make().fit(Xs, device_ids=ids)
    trace = model._unlearning_.trace
    assert trace is not None and trace.ids == sorted(ids)
    gone: list[int] = []
    paths = []
    # a device with no picked center, then the seed device (its centers start the traversal)
    unpicked = [z for z in ids if z not in set(trace.picked.tolist())]
    order = [unpicked[0], trace.seed] + [z for z in rng.permutation(ids)
                                         if z not in (unpicked[0], trace.seed)][:4]
    for z in order:
        t = model._unlearning_.trace
        picked = t is not None and (z == t.seed or z in set(t.picked.tolist()))
        model.forget(devices=[int(z)])
        gone.append(int(z))
        rec = model.forget_log_[-1]
        paths.append(rec.path)
        assert rec.path == ("replay" if picked else "downdate")
        assert rec.recomputed == [] and not rec.retrained
        fresh = _check_against_fresh(model, Xs, ids, gone, make)
        if rec.path == "replay":   # the server's step in full: bit for bit
            assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
        report = model.verify()
        assert report.summaries and report.retrain
    assert paths[:2] == ["downdate", "replay"]


def test_a_row_deletion_on_the_seed_device_runs_the_full_step_and_the_record_keeps_its_path():
    rng = np.random.default_rng(7)
    Xs = _federation(rng, 8)
    ids = list(range(10, 18))
    model = _paper().fit(Xs, device_ids=ids)
    tr = model._unlearning_.trace
    unpicked = [z for z in ids if z not in set(tr.picked.tolist())]
    model.forget(devices=[unpicked[0]])
    assert model.forget_log_[-1].path == "downdate"
    assert not model._unlearning_.exact
    seed = tr.seed   # its centers start the traversal: its new ones could start another
    model.forget(rows={seed: [0, 3]})
    assert model.forget_log_[-1].path == "replay" and model._unlearning_.exact
    doc = json.loads(json.dumps(model.forget_log_[0].to_json()))
    assert doc["path"] == "downdate" and ForgetRecord.from_json(doc).path == "downdate"
    remaining = [Xs[i] if z != seed else np.delete(Xs[i], [0, 3], axis=0)
                 for i, z in enumerate(ids) if z != unpicked[0]]
    fresh = _paper().fit(remaining, device_ids=[z for z in ids if z != unpicked[0]])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_other_servers_never_downdate():
    rng = np.random.default_rng(3)
    Xs = _federation(rng, 8)
    for make in (lambda: KFed(5, 3, server="kmeans++", random_state=1),
                 lambda: KFed(5, 3, server="farthest-lloyd1", first_device="random",
                              random_state=1),
                 lambda: KFed(5, 3, server="farthest-lloyd", random_state=1)):
        model = make().fit(Xs)
        assert model._unlearning_.trace is None
        model.forget(devices=[2])
        assert model.forget_log_[-1].path == "replay"
        fresh = make().fit([X for i, X in enumerate(Xs) if i != 2],
                           device_ids=[i for i in range(8) if i != 2])
        assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_verify_after_a_downdate_compares_within_the_stated_tolerance():
    rng = np.random.default_rng(11)
    Xs = _federation(rng, 10)
    model = _paper().fit(Xs)
    unpicked = [z for z in range(10) if z not in set(model._unlearning_.trace.picked.tolist())]
    model.forget(devices=[unpicked[0]])
    assert model.forget_log_[-1].path == "downdate"
    assert model.verify().ok
    # a result off by more than the tolerance is caught
    model._unlearning_.result.centers = model._unlearning_.result.centers * (1 + 1e-9)
    assert not model.verify().summaries


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_row_deletions_enter_the_downdate_trace_and_equal_a_retrain(weighted, trial):
    # interleaved device forgets and row deletions under the paper's server: a deletion on
    # a device that holds no pick enters the trace (its new pieces take their slots, the
    # farthest-first start certified unchanged); one on the seed device runs the step in
    # full; each state against a fresh fit (centers within 1e-12, labels, summaries and
    # the explanation warning equal)
    rng = np.random.default_rng(70 + trial)
    Xs = _federation(rng, 16)
    ids = [int(z) for z in rng.choice(500, size=16, replace=False)]
    make = lambda: _paper(weighted=weighted)   # noqa: E731
    model = make().fit(Xs, device_ids=ids)
    gone: list[int] = []
    paths = {"rows": [], "devices": []}
    for step in range(7):
        tr = model._unlearning_.trace
        seed = tr.seed
        left = [z for z in ids if z not in gone]
        free = [z for z in left if tr is not None and z != tr.seed
                and z not in set(tr.picked.tolist())]
        if step == 3:   # the seed device's rows: its step in full
            z = seed
        else:
            z = free[int(rng.integers(len(free)))] if free else left[0]
        i = ids.index(z)
        if step % 3 == 2 and z != seed:
            model.forget(devices=[z])
            gone.append(z)
            paths["devices"].append(model.forget_log_[-1].path)
        else:
            rows = rng.choice(len(Xs[i]), size=int(rng.integers(1, 6)), replace=False)
            model.forget(rows={z: rows.tolist()}, relabel=True)
            Xs[i] = np.delete(Xs[i], rows, axis=0)
            rec = model.forget_log_[-1]
            assert rec.recomputed == [(0, z)] and not rec.retrained
            paths["rows"].append(rec.path)
            if z == seed:
                assert rec.path == "replay"
        fresh = _check_against_fresh(model, Xs, ids, gone, make)
        assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings
        assert model.verify().ok
    assert paths["rows"].count("downdate") >= 2
    assert not model._unlearning_.exact or model.forget_log_[-1].path == "replay"


def test_a_new_piece_farther_than_a_farthest_first_step_takes_the_full_step():
    # the certificate against the fit's own farthest-first distances: a device's new
    # summary as it was passes; one center moved beyond every other row would be picked
    # (the fresh step's start changes) and one spread wider than the seed device would
    # seed the traversal: both take the full step, and the model still equals a retrain
    from dataclasses import replace

    from fedclust.kfed import downdate_rows

    rng = np.random.default_rng(5)
    Xs = _federation(rng, 12)
    ids = list(range(12))
    model = _paper().fit(Xs, device_ids=ids)
    tr = model._unlearning_.trace
    z = next(x for x in ids if x != tr.seed and x not in set(tr.picked.tolist()))
    msg = model._unlearning_.store.rounds[0].replies[z]
    assert downdate_rows.entering(tr, {z: msg}, set()) is not None
    far = msg.centers.copy()
    far[0] = far[0] + 10 * np.abs(tr.C).max()
    assert downdate_rows.entering(tr, {z: replace(msg, centers=far)}, set()) is None
    wide = msg.centers * 1e3
    assert downdate_rows.entering(tr, {z: replace(msg, centers=wide)}, set()) is None
    # the fresh step on the moved center does pick it: the certificate refused a real change
    from fedclust.kfed.server import farthest_first

    C = tr.C.copy()
    lo = tr.offsets[tr.row_of[z]]
    C[lo] = far[0]
    seed_rows = np.arange(tr.offsets[tr.row_of[tr.seed]], tr.offsets[tr.row_of[tr.seed] + 1])
    assert lo in farthest_first(C, len(tr.init), start=seed_rows)
    assert lo not in farthest_first(tr.C, len(tr.init), start=seed_rows)


def test_a_new_piece_that_crosses_a_bisector_is_labelled_again():
    # one dimension, the paper's unweighted step: the widest device's centers 0 and 10
    # start; the third device's pieces 0.5 and 4.0 become 0.5 and 4.9 when the row 3.1
    # goes. The final centers move from (1.5, 8.15) to (1.8, 8.15): 4.9 is nearer 8.15 at
    # the old centers (by 0.15) and nearer 1.8 at the new ones, while the old piece 4.0
    # was 1.65 from the bisector. The new piece's own margin must put it in doubt.
    col = lambda *v: np.array(v, float)[:, None]   # noqa: E731
    devices = [col(*[0.0] * 5, *[10.0] * 5), col(*[7.0] * 5, *[7.45] * 5),
               col(*[0.5] * 5, 4.9, 3.1)]
    make = lambda: KFed(2, 2, server="farthest-lloyd1", random_state=0)   # noqa: E731
    model = make().fit(devices)
    np.testing.assert_allclose(model._unlearning_.result.local_centers[2].ravel(), [0.5, 4.0])
    assert model.center_labels_[2].tolist() == [0, 0]
    model.forget(rows={2: [6]})
    fresh = make().fit(devices[:2] + [devices[2][:6]])
    assert model.forget_log_[-1].path == "downdate"
    np.testing.assert_allclose(model.cluster_centers_, fresh.cluster_centers_, rtol=1e-12)
    assert fresh.center_labels_[2].tolist() == [0, 0]   # 4.9 is nearer 1.8 than 8.15
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        np.testing.assert_array_equal(a, b)
