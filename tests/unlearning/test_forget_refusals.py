"""A forget leaves a model only where a fresh ``fit`` on the remaining data would run: where
that fit refuses (too few local centers in all, a device whose centers would be its raw
points), the forget refuses with the fit's reason and the model is unchanged."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fedclust import KFed
from fedclust.core.exceptions import ValidationError


def _federation(rng, sizes, d=3, k=4):
    means = rng.normal(size=(k, d)) * 8
    return [means[rng.integers(k, size=n)] + rng.normal(size=(n, d)) for n in sizes]


def _fit_refusal(make, Xs, ids):
    with pytest.raises(ValidationError) as info:
        make().fit(Xs, device_ids=ids)
    return str(info.value)


def _snapshot(model):
    return (model.cluster_centers_.copy(), list(model.device_ids_), len(model.forget_log_),
            model._unlearning_.store.digest())


def _unchanged(model, snap):
    centers, ids, n_log, digest = snap
    return (np.array_equal(model.cluster_centers_, centers) and model.device_ids_ == ids
            and len(model.forget_log_) == n_log and model._unlearning_.store.digest() == digest)


@pytest.mark.parametrize("server", ["weighted-kmeans++", "farthest-lloyd1", "kmeans++"])
def test_forgetting_below_k_local_centers_is_refused_as_a_fresh_fit_is(server):
    rng = np.random.default_rng(3)
    Xs = _federation(rng, [40, 30, 35, 50])
    make = lambda: KFed(5, 2, server=server, random_state=1)   # noqa: E731
    model = make().fit(Xs, device_ids=[10, 11, 12, 13])
    model.forget(devices=[12])   # 3 devices x 2 = 6 >= 5: a fresh fit runs, so does this
    fresh = make().fit([Xs[0], Xs[1], Xs[3]], device_ids=[10, 11, 13])
    assert np.allclose(model.cluster_centers_, fresh.cluster_centers_, rtol=0, atol=1e-12)
    snap = _snapshot(model)
    why = _fit_refusal(make, [Xs[0], Xs[3]], [10, 13])   # 2 x 2 = 4 < 5
    with pytest.raises(ValidationError) as info:
        model.forget(devices=[11])
    assert why in str(info.value) and "need sum k_z >= k" in why
    assert _unchanged(model, snap)
    model.forget(rows={11: [0, 1]})   # the model still forgets what a fresh fit allows
    fresh = make().fit([Xs[0], Xs[1][2:], Xs[3]], device_ids=[10, 11, 13])
    assert np.allclose(model.cluster_centers_, fresh.cluster_centers_, rtol=0, atol=1e-12)


def test_a_row_deletion_that_leaves_raw_points_is_refused_as_a_fresh_fit_is():
    rng = np.random.default_rng(4)
    Xs = _federation(rng, [30, 5, 40])
    make = lambda: KFed(3, 3, random_state=2)   # noqa: E731
    model = make().fit(Xs, device_ids=[0, 1, 2])
    snap = _snapshot(model)
    why = _fit_refusal(make, [Xs[0], Xs[1][2:], Xs[2]], [0, 1, 2])   # 3 points, k_z = 3
    assert "raw points" in why and "device 1" in why
    with pytest.raises(ValidationError) as info:
        model.forget(rows={1: [0, 1]})
    assert why in str(info.value)
    assert _unchanged(model, snap)
    with_raw = KFed(3, 3, random_state=2, allow_raw_points=True).fit(Xs, device_ids=[0, 1, 2])
    with_raw.forget(rows={1: [0, 1]})   # allowed raw points: as a fresh fit with them
    fresh = KFed(3, 3, random_state=2, allow_raw_points=True).fit(
        [Xs[0], Xs[1][2:], Xs[2]], device_ids=[0, 1, 2])
    assert np.array_equal(with_raw.cluster_centers_, fresh.cluster_centers_)


def test_auto_local_clusters_read_the_sizes_from_the_kept_counts_when_no_data_is_held():
    """n_local_clusters="auto": how many centers a device may send follows its size; a model
    that holds no device data (here a copy made in memory) takes the sizes from the counts
    it kept, and refuses exactly where a fresh fit does."""
    rng = np.random.default_rng(5)
    sizes = [60, 12, 14, 100]
    Xs = _federation(rng, sizes)
    k = 6
    make = lambda: KFed(k, "auto", random_state=3)   # noqa: E731
    model = pickle.loads(pickle.dumps(make().fit(Xs, device_ids=[0, 1, 2, 3])))
    assert model._unlearning_.data == {}
    snap = _snapshot(model)
    why = _fit_refusal(make, [Xs[1], Xs[2]], [1, 2])
    with pytest.raises(ValidationError) as info:
        model.forget(devices=[0, 3])
    assert why in str(info.value)
    assert _unchanged(model, snap)
    model.forget(devices=[0])
    fresh = make().fit([Xs[1], Xs[2], Xs[3]], device_ids=[1, 2, 3])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


@pytest.mark.parametrize("request_, message", [
    (dict(rows={0: [1.5]}), "device 0's row indices must be integers; got 1.5"),
    (dict(rows={0: np.array([np.nan])}), "device 0's row indices must be integers; got nan"),
    (dict(rows={0: ["3"]}), "device 0's row indices must be integers; got '3'"),
    (dict(rows={0: [True]}), "device 0's row indices must be integers; got True"),
    (dict(rows={0: [2, "x"]}), "device 0's row indices must be integers"),
    (dict(rows={0: [[1, 2], [3, 4]]}),
     "device 0's row indices must be a flat list of integers; got an array of shape (2, 2)"),
    (dict(rows={0: [[1, 2], [3]]}), "device 0's row indices must be integers; got [1, 2]"),
    (dict(rows=[1, 2]), "rows= must map each device to its row indices"),
    (dict(devices=None), "devices= must be a device id, a site name or a sequence"),
    (dict(devices=2.0), "devices= must be a device id, a site name or a sequence"),
    (dict(rows={0: [30]}), "device 0 has 30 rows; row index 30 is out of range"),
])
def test_a_malformed_forget_request_is_refused_by_name_and_changes_nothing(request_, message):
    rng = np.random.default_rng(6)
    Xs = _federation(rng, [30, 30, 30])
    model = KFed(3, 2, random_state=0).fit(Xs)
    snap = _snapshot(model)
    with pytest.raises(ValidationError) as info:
        model.forget(**request_)
    assert message in str(info.value)
    assert _unchanged(model, snap)
    model.forget(rows={0: np.array([3, 1], dtype=np.uint8)})   # any integer dtype, any order
    assert model.forget_log_[-1].rows == {0: [1, 3]}
    fresh = KFed(3, 2, random_state=0).fit([np.delete(Xs[0], [1, 3], axis=0), Xs[1], Xs[2]])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_the_devices_auto_ranges_at_once_are_auto_range_device_by_device():
    from fedclust.kfed.fit_checks import auto_ranges
    from fedclust.kfed.local_auto import auto_range

    sizes = list(range(1, 400)) + [10**6]
    for k in (1, 2, 7, 50):
        lo, hi = auto_ranges(sizes, k)
        assert [(int(a), int(b)) for a, b in zip(lo, hi)] == [auto_range(n, k) for n in sizes]
