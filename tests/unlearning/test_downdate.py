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


def test_a_row_deletion_runs_the_full_step_and_the_record_keeps_its_path():
    rng = np.random.default_rng(7)
    Xs = _federation(rng, 8)
    ids = list(range(10, 18))
    model = _paper().fit(Xs, device_ids=ids)
    unpicked = [z for z in ids if z not in set(model._unlearning_.trace.picked.tolist())]
    model.forget(devices=[unpicked[0]])
    assert model.forget_log_[-1].path == "downdate"
    assert not model._unlearning_.exact
    model.forget(rows={unpicked[1]: [0, 3]})
    assert model.forget_log_[-1].path == "replay" and model._unlearning_.exact
    doc = json.loads(json.dumps(model.forget_log_[0].to_json()))
    assert doc["path"] == "downdate" and ForgetRecord.from_json(doc).path == "downdate"
    remaining = [Xs[i] if z != unpicked[1] else np.delete(Xs[i], [0, 3], axis=0)
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
