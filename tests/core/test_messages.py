"""The message codec: bit-exact round trips, no pickle, and every rejection path."""

import numpy as np
import pytest

from fedclust import IncompatibleMessageError, ValidationError
from fedclust.core.messages import MESSAGE_TYPES, load_message, message_nbytes, save_message
from fedclust.kfed.messages import LabelMap, LocalCenters
from fedclust.lloyd.messages import CenterBroadcast, ClusterSums, PointSample

SENDER = "device 17"


def _local(dtype=np.float64, k=4, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return LocalCenters(centers=rng.normal(size=(k, d)).astype(dtype),
                        counts=rng.integers(1, 100, size=k).astype(np.int64))


def _all_messages(dtype):
    rng = np.random.default_rng(1)
    return [
        _local(dtype),
        CenterBroadcast(centers=rng.normal(size=(5, 2)).astype(dtype)),
        ClusterSums(sums=rng.normal(size=(3, 2)).astype(dtype), counts=np.array([0, 4, 9]),
                    cost=np.array(12.5, dtype=dtype)),
        PointSample(points=rng.normal(size=(6, 2)).astype(dtype), n_points=np.array(40)),
        LabelMap(global_labels=np.array([3, 0, 2, 2], dtype=np.int64)),
    ]


def _assert_same(a, b):
    assert type(a) is type(b)
    for name, arr in a.to_arrays().items():
        other = getattr(b, name)
        assert other.dtype == arr.dtype, name
        assert other.shape == arr.shape, name
        assert arr.tobytes() == np.asarray(other).tobytes(), name  # bit-exact


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_arrays_bit_exact(dtype):
    for msg in _all_messages(dtype):
        back = type(msg).from_arrays(msg.to_arrays(), sender=SENDER)
        _assert_same(msg, back)
        # and the wire form keeps the original dimensions (0-d stays 0-d)
        for name, arr in msg.to_arrays().items():
            assert arr.shape == np.shape(getattr(msg, name))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_save_load_bit_exact_and_no_pickle(tmp_path, dtype):
    for i, msg in enumerate(_all_messages(dtype)):
        path = tmp_path / f"m{i}.npz"
        save_message(msg, path)
        back = load_message(path)
        _assert_same(msg, back)
        with np.load(path, allow_pickle=False) as data:  # loads without pickle
            for key in data.files:
                assert data[key].dtype.kind != "O"


def test_message_types_registry():
    for kind, cls in MESSAGE_TYPES.items():
        assert cls.kind == kind


def test_messages_are_frozen():
    msg = _local()
    with pytest.raises(Exception):
        msg.centers = np.zeros((1, 1))


@pytest.mark.parametrize("k,d", [(1, 1), (4, 3), (7, 50)])
def test_nbytes_formula(k, d):
    msg = _local(k=k, d=d)
    assert msg.nbytes == k * (d + 1) * 8
    assert message_nbytes(msg) == k * (d + 1) * 8
    assert message_nbytes(None) == 0
    msg32 = _local(np.float32, k=k, d=d)
    assert msg32.nbytes == k * d * 4 + k * 8


# ------------------------------------------------------------------ rejections

def _reject(cls, arrays, *fragments):
    with pytest.raises(IncompatibleMessageError) as exc:
        cls.from_arrays(arrays, sender=SENDER)
    text = str(exc.value)
    assert SENDER in text
    for f in fragments:
        assert f in text, text
    assert isinstance(exc.value, ValidationError) and isinstance(exc.value, ValueError)


def test_reject_missing_field():
    a = _local().to_arrays()
    del a["counts"]
    _reject(LocalCenters, a, "counts")


def test_reject_extra_field():
    a = _local().to_arrays()
    a["secret"] = np.zeros(3)
    _reject(LocalCenters, a, "secret")


def test_reject_not_a_dict():
    _reject(LocalCenters, [np.zeros((2, 2)), np.ones(2, dtype=np.int64)])


def test_reject_non_array_field():
    a = _local().to_arrays()
    a["centers"] = a["centers"].tolist()
    _reject(LocalCenters, a, "centers")


@pytest.mark.parametrize("bad", [
    np.array([["a", "b"], ["c", "d"]]),
    np.array([[b"a", b"b"]]),
    np.array([[1.0, "x"], [2.0, 3.0]], dtype=object),
    np.array([[1.0, 2.0], [3.0, 4.0]], dtype=object),
    np.array([[1, 2], [3, 4]], dtype=np.int64),
    np.array([[1 + 1j, 2], [3, 4]]),
    np.array([[True, False]]),
])
def test_reject_wrong_dtype_kind_centers(bad):
    a = {"centers": bad, "counts": np.ones(len(bad), dtype=np.int64)}
    _reject(LocalCenters, a, "centers")


@pytest.mark.parametrize("bad", [np.array([1.0, 2.0]), np.array(["1", "2"]),
                                 np.array([1, 2], dtype=object), np.array([True, True])])
def test_reject_wrong_dtype_kind_counts(bad):
    a = {"centers": np.zeros((2, 3)), "counts": bad}
    _reject(LocalCenters, a, "counts")


@pytest.mark.parametrize("centers,counts", [
    (np.zeros(3), np.ones(1, dtype=np.int64)),
    (np.zeros((1, 2, 3)), np.ones(1, dtype=np.int64)),
    (np.zeros((2, 3)), np.ones((2, 1), dtype=np.int64)),
    (np.zeros((2, 3)), np.array(2, dtype=np.int64)),
])
def test_reject_wrong_ndim(centers, counts):
    _reject(LocalCenters, {"centers": centers, "counts": counts})


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_reject_non_finite(value, dtype):
    a = _local(dtype).to_arrays()
    a["centers"] = a["centers"].copy()
    a["centers"][1, 2] = value
    _reject(LocalCenters, a, "centers")
    b = CenterBroadcast(centers=np.ones((2, 2))).to_arrays()
    b["centers"][0, 0] = value
    _reject(CenterBroadcast, b, "centers")
    c = {"sums": np.zeros((1, 2)), "counts": np.ones(1, dtype=np.int64),
         "cost": np.array(value)}
    _reject(ClusterSums, c, "cost")


def test_reject_counts_shape_mismatch():
    _reject(LocalCenters, {"centers": np.zeros((3, 2)), "counts": np.ones(2, dtype=np.int64)},
            "counts")
    _reject(ClusterSums, {"sums": np.zeros((3, 2)), "counts": np.ones(4, dtype=np.int64),
                          "cost": np.array(0.0)}, "counts")


@pytest.mark.parametrize("bad", [0, -1])
def test_reject_counts_below_one(bad):
    counts = np.array([3, bad, 2], dtype=np.int64)
    _reject(LocalCenters, {"centers": np.zeros((3, 2)), "counts": counts}, "counts")


def test_reject_empty_centers():
    _reject(LocalCenters, {"centers": np.zeros((0, 3)), "counts": np.zeros(0, dtype=np.int64)})
    _reject(LocalCenters, {"centers": np.zeros((2, 0)), "counts": np.ones(2, dtype=np.int64)})


def test_reject_other_message_invariants():
    _reject(ClusterSums, {"sums": np.zeros((1, 2)), "counts": np.array([-1]),
                          "cost": np.array(0.0)}, "counts")
    _reject(ClusterSums, {"sums": np.zeros((1, 2)), "counts": np.array([1]),
                          "cost": np.array(-1.0)}, "cost")
    _reject(PointSample, {"points": np.zeros((5, 2)), "n_points": np.array(3)}, "n_points")
    _reject(LabelMap, {"global_labels": np.array([0.0, 1.0])}, "global_labels")


def test_load_rejects_file_without_kind(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, centers=np.zeros((2, 2)), counts=np.ones(2, dtype=np.int64))
    with pytest.raises(IncompatibleMessageError, match="plain.npz"):
        load_message(path)


def test_load_rejects_unknown_kind(tmp_path):
    path = tmp_path / "odd.npz"
    np.savez(path, centers=np.zeros((2, 2)),
             __kind__=np.frombuffer(b"nonsense", dtype=np.uint8))
    with pytest.raises(IncompatibleMessageError, match="nonsense"):
        load_message(path)


def test_load_rejects_tampered_file(tmp_path):
    path = tmp_path / "bad.npz"
    msg = _local()
    arrays = msg.to_arrays()
    arrays["centers"] = arrays["centers"].copy()
    arrays["centers"][0, 0] = np.nan
    np.savez(path, __kind__=np.frombuffer(b"local_centers", dtype=np.uint8), **arrays)
    with pytest.raises(IncompatibleMessageError, match="bad.npz"):
        load_message(path)


def test_load_rejects_pickled_object_array_as_incompatible(tmp_path):
    # A file carrying an object array (which would need pickle) is a malformed message,
    # and must be refused as one, naming the file -- not leak a bare ValueError.
    path = tmp_path / "evil.npz"
    np.savez(path, __kind__=np.frombuffer(b"local_centers", dtype=np.uint8),
             centers=np.array([[1.0, 2.0]], dtype=object), counts=np.array([1]))
    with pytest.raises(IncompatibleMessageError, match="evil.npz"):
        load_message(path)
