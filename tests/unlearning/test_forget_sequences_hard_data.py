"""Random forget sequences on data the other property tests do not draw: integer-valued
rows (many ties between distances), repeated rows, float32 devices, one feature, tiny
devices, n_local_clusters="auto" and every k-FED server. After every forget the model
equals a fresh fit on what remains (bit for bit; within 1e-12 after the paper server's
downdate), or, where that fit refuses the remaining federation, the forget refuses too."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.exceptions import FedClustError


def _federation(rng):
    d = int(rng.choice([1, 2, 3, 7]))
    k = int(rng.integers(2, 6))
    means = rng.normal(size=(k, d)) * rng.choice([1.0, 4.0, 10.0])
    integer, f32 = rng.random() < 0.5, rng.random() < 0.25
    devices = []
    for _ in range(int(rng.integers(4, 16))):
        n = int(rng.integers(3, 40))
        own = rng.choice(k, size=min(k, int(rng.integers(1, 4))), replace=False)
        X = means[own[rng.integers(len(own), size=n)]] + rng.normal(size=(n, d))
        X = np.round(X) if integer else X
        if rng.random() < 0.15:
            X[: n // 2] = X[0]   # repeated rows
        devices.append(X.astype(np.float32 if f32 else np.float64))
    return devices, k


def _same_as_fresh(model, make, devices, ids):
    fresh = make().fit(devices, device_ids=ids)
    A, B = model.cluster_centers_, fresh.cluster_centers_
    if model.forget_log_[-1].path == "downdate":
        assert A.shape == B.shape and np.abs(A - B).max() <= 1e-12 * max(np.abs(B).max(), 1e-300)
    else:
        assert np.array_equal(A, B)
    assert list(model.device_ids_) == list(fresh.device_ids_)
    for a, b in zip(model.device_labels_, fresh.device_labels_):
        assert np.array_equal(a, b)
    assert model._unlearning_.result.log.warnings == fresh._unlearning_.result.log.warnings


def _sequence(seed):
    rng = np.random.default_rng(seed)
    devices, k = _federation(rng)
    k_local = [1, 2, 3, "auto"][int(rng.integers(4))]
    server = ["weighted-kmeans++", "farthest-lloyd1", "kmeans++"][int(rng.integers(3))]
    make = lambda: KFed(k, k_local, server=server, random_state=seed)   # noqa: E731
    ids = [int(z) for z in rng.choice(10_000, size=len(devices), replace=False)]
    try:
        model = make().fit(devices, device_ids=ids)
    except FedClustError:
        return 0
    steps = 0
    for _ in range(int(rng.integers(2, 6))):
        if len(ids) <= 2:
            break
        if rng.random() < 0.5:
            gone = [int(z) for z in rng.choice(ids, size=int(rng.integers(1, 3)), replace=False)]
            new_ids = [z for z in ids if z not in gone]
            new_devices = [X for z, X in zip(ids, devices) if z not in gone]
            request = dict(devices=gone)
        else:
            i = int(rng.integers(len(ids)))
            if len(devices[i]) < 3:
                continue
            rows = rng.choice(len(devices[i]), size=int(rng.integers(1, len(devices[i]) // 2 + 1)),
                              replace=False)
            new_ids, new_devices = ids, list(devices)
            new_devices[i] = np.delete(devices[i], rows, axis=0)
            request = dict(rows={ids[i]: rows})
        try:
            make().fit(new_devices, device_ids=new_ids)
        except FedClustError as exc:   # a fresh fit refuses: so does the forget, and no change
            before = model.cluster_centers_.copy()
            with pytest.raises(FedClustError) as info:
                model.forget(**request)
            assert str(exc) in str(info.value) or type(info.value) is type(exc)
            assert np.array_equal(model.cluster_centers_, before)
            continue
        model.forget(**request)
        ids, devices = new_ids, new_devices
        _same_as_fresh(model, make, devices, ids)
        steps += 1
    return steps


@pytest.mark.parametrize("seed", range(6))
def test_forget_sequences_on_tied_and_small_data_equal_a_fresh_fit(seed):
    _sequence(seed)


@pytest.mark.slow
def test_forget_sequences_on_tied_and_small_data_many_seeds():
    assert sum(_sequence(seed) for seed in range(100, 180)) > 80   # most sequences forget
