"""The paper's server forgets a device by a downdate and keeps the labels of the remaining
device centers by a certificate: a center whose margin (second-nearest minus nearest
distance to the reference centers) exceeds twice the largest center shift, plus a rounding
slack, keeps its label; only the others are assigned again. Every state of random forget
sequences (devices and rows interleaved) is compared with a fresh fit on what remains."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.kmeans import assign
from fedclust.kfed import downdate as dd
from fedclust.unlearning.forget import DOWNDATE_RTOL, ForgetRecord, results_close


def _overlapping(rng, n_devices, d=3, k=4):
    """Small devices, clusters that overlap (means ~2 standard deviations apart)."""
    means = rng.normal(size=(k, d)) * 2.0
    Xs = []
    for _ in range(n_devices):
        n = int(rng.integers(8, 25))
        own = rng.choice(k, size=2, replace=False)
        Xs.append(means[own[rng.integers(2, size=n)]] + rng.normal(size=(n, d)))
    return Xs


def _make(weighted):
    return lambda: KFed(4, 2, server="farthest-lloyd1", weighted=weighted,  # noqa: E731
                        random_state=9)


def _assert_equals_fresh(model, data, make, device_labels=True):
    ids = [z for z in model.device_ids_]
    fresh = make().fit([data[z] for z in ids], device_ids=ids)
    path = model.forget_log_[-1].path
    if path == "downdate":
        scale = np.abs(fresh.cluster_centers_).max()
        assert np.abs(model.cluster_centers_ - fresh.cluster_centers_).max() \
            <= DOWNDATE_RTOL * scale
    else:
        assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert model.device_ids_ == fresh.device_ids_
    for a, b in zip(model.center_labels_, fresh.center_labels_):
        assert np.array_equal(a, b)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        assert np.array_equal(a, b) or not device_labels
    assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
    assert results_close(model._unlearning_.result, fresh._unlearning_.result)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("trial", range(3))
def test_interleaved_forget_sequences_equal_a_retrain(weighted, trial):
    rng = np.random.default_rng(900 + trial)
    n_dev = 24
    Xs = _overlapping(rng, n_dev)
    ids = [int(z) for z in rng.choice(10_000, size=n_dev, replace=False)]
    data = dict(zip(ids, Xs))
    make = _make(weighted)
    model = make().fit(Xs, device_ids=ids)
    for step in range(8):
        remaining = model.device_ids_
        z = int(rng.choice(remaining))
        if step % 3 == 2 and len(data[z]) > 6:   # rows of a device: its step, one aggregation
            rows = rng.choice(len(data[z]), size=2, replace=False)
            model.forget(rows={z: rows})
            data[z] = np.delete(data[z], rows, axis=0)
            # its new summary enters the trace, or the step runs in full
            assert model.forget_log_[-1].path in ("downdate", "replay")
        else:
            model.forget(devices=[z])
            del data[z]
            rec = model.forget_log_[-1]
            if rec.path == "downdate":
                assert 0 <= rec.rechecked <= sum(len(c) for c in model.local_centers_)
            else:
                assert rec.rechecked is None
        _assert_equals_fresh(model, data, make)
        assert model.verify().ok
    assert any(r.path == "downdate" for r in model.forget_log_)


def test_some_downdate_moves_labels_and_matches_the_retrain():
    """Across overlapping federations, downdates that change remaining centers' labels
    happen, and those labels are the fresh fit's (a certificate that kept a stale
    label would fail here)."""
    moved = 0
    for trial in range(6):
        rng = np.random.default_rng(70 + trial)
        Xs = _overlapping(rng, 30)
        ids = list(range(100, 130))
        data = dict(zip(ids, Xs))
        make = _make(False)
        model = make().fit(Xs, device_ids=ids)
        for _ in range(4):
            trace = model._unlearning_.trace
            held = {trace.seed, *trace.picked.tolist()} if trace is not None else set(ids)
            free = [z for z in model.device_ids_ if z not in held]
            if not free:
                break
            before = dict(zip(model.device_ids_, model.center_labels_))
            z = int(rng.choice(free))
            model.forget(devices=[z])
            del data[z]
            if model.forget_log_[-1].path != "downdate":
                continue
            moved += sum(not np.array_equal(before[y], lab)
                         for y, lab in zip(model.device_ids_, model.center_labels_))
            _assert_equals_fresh(model, data, make)
    assert moved > 0


def test_certificate_rechecks_only_a_few_centers_when_clusters_are_apart():
    rng = np.random.default_rng(5)
    means = rng.normal(size=(4, 3)) * 30
    Xs = [means[rng.choice(4, 2, replace=False)[rng.integers(2, size=40)]]
          + rng.normal(size=(40, 3)) for _ in range(40)]
    model = _make(True)().fit(Xs)
    trace = model._unlearning_.trace
    free = [z for z in range(40) if z not in {trace.seed, *trace.picked.tolist()}]
    model.forget(devices=[free[0]])
    rec = model.forget_log_[-1]
    assert rec.path == "downdate"
    assert rec.rechecked < 0.1 * sum(len(c) for c in model.local_centers_)
    doc = json.loads(json.dumps(rec.to_json()))
    assert ForgetRecord.from_json(doc).rechecked == rec.rechecked


def test_every_certified_label_is_the_nearest_center_with_room_to_spare():
    """The invariant the certificate rests on, checked directly: after downdates, every
    remaining center's label is its nearest final center, and each center it did not
    recheck has a distance gap to the other centers larger than the rounding slack."""
    rng = np.random.default_rng(31)
    Xs = _overlapping(rng, 40)
    model = _make(False)().fit(Xs)
    for _ in range(5):
        t = model._unlearning_.trace
        free = [z for z in model.device_ids_ if z not in {t.seed, *t.picked.tolist()}]
        model.forget(devices=[int(rng.choice(free))])
        if model.forget_log_[-1].path != "downdate":
            continue
        t = model._unlearning_.trace
        C = np.concatenate(model.local_centers_)
        labels = np.concatenate(model.center_labels_)
        final = model.cluster_centers_
        assert np.array_equal(labels, assign(C, final)[0])
        D = np.sqrt(((C[:, None, :] - final[None]) ** 2).sum(axis=2))
        own = D[np.arange(len(C)), labels]
        D[np.arange(len(C)), labels] = np.inf
        assert (D.min(axis=1) - own > 0).all()


def test_forced_refresh_and_forced_doubt_still_equal_a_retrain(monkeypatch):
    """Each fallback of the label step: every center in doubt (a huge slack) renews the
    reference (all rows assigned again); doubt without a renewal assigns the doubtful
    ones; a leaving picked device runs the full step."""
    rng = np.random.default_rng(12)
    Xs = _overlapping(rng, 20)
    ids = list(range(20))
    make = _make(False)
    for slack, share, expect_all in ((1e6, 0.125, True), (1e6, 2.0, True),
                                     (0.0, 2.0, False)):
        monkeypatch.setattr(dd, "CERTIFY_SLACK", slack)
        monkeypatch.setattr(dd, "REFRESH_SHARE", share)
        data = dict(zip(ids, Xs))
        model = make().fit(Xs, device_ids=ids)
        t = model._unlearning_.trace
        free = [z for z in ids if z not in {t.seed, *t.picked.tolist()}]
        model.forget(devices=[free[0]])
        del data[free[0]]
        rec = model.forget_log_[-1]
        assert rec.path == "downdate"
        n_rows = sum(len(c) for c in model.local_centers_)
        assert (rec.rechecked == n_rows) if expect_all else (rec.rechecked < n_rows)
        _assert_equals_fresh(model, data, make)
        # a device holding a picked center: the full step, bit for bit
        t = model._unlearning_.trace
        held = next(z for z in model.device_ids_ if z == t.seed or z in set(t.picked.tolist()))
        model.forget(devices=[held])
        del data[held]
        assert model.forget_log_[-1].path == "replay"
        _assert_equals_fresh(model, data, make)


def test_the_trace_keeps_nothing_of_a_forgotten_device_and_is_not_pickled():
    import pickle

    rng = np.random.default_rng(8)
    Xs = _overlapping(rng, 16)
    ids = list(range(16))
    data = dict(zip(ids, Xs))
    make = _make(True)
    model = make().fit(Xs, device_ids=ids)
    t = model._unlearning_.trace
    z = next(z for z in ids if z not in {t.seed, *t.picked.tolist()})
    gone_centers = model.local_centers_[ids.index(z)].copy()
    gone_margins = t.margin_sorted[t.rank[t.owner == z]].copy()
    model.forget(devices=[z])
    del data[z]
    t = model._unlearning_.trace
    assert model.forget_log_[-1].path == "downdate"
    rows = t.owner == z
    assert not (t.C[rows] != 0).any() and not (t.w[rows] != 0).any()
    assert not any((t.C == c).all(axis=1).any() for c in gone_centers)
    assert not np.isin(gone_margins, t.margin_sorted[~t.alive[t.order]]).any()
    assert (np.diff(t.margin_sorted) >= 0).all()
    # a pickled model holds no trace; it works it out again at its next forget
    copy = pickle.loads(pickle.dumps(model))
    assert copy._unlearning_._trace is None
    y = next(y for y in copy.device_ids_ if y not in {t.seed, *t.picked.tolist()})
    copy.forget(devices=[y])
    del data[y]
    assert copy.forget_log_[-1].path == "downdate"
    # (a pickled model holds no device data: its devices' row labels are None)
    _assert_equals_fresh(copy, data, make, device_labels=False)
