"""check_devices' certified path for large devices (one dot product instead of the per-feature
min and max) against the exact path it replaces: the same arrays and, on bad data, the same
error word for word, naming the same device."""

import numpy as np
import pytest

from fedclust.core import validation
from fedclust.core.exceptions import ValidationError
from fedclust.core.validation import _SMALL_DEVICE, _certified_bounded, check_devices

F64, F32 = np.finfo(np.float64), np.finfo(np.float32)


def _limits(dtype):
    fi = np.finfo(dtype)
    return float(np.sqrt(fi.max)) / 1e4, float(np.sqrt(fi.tiny)) * 1e4


def _outcome(devs, ids=None, *, certified=True, monkeypatch=None):
    """(arrays, None) or (None, message) of check_devices, with or without the certificate."""
    if not certified:
        monkeypatch.setattr(validation, "_certified_bounded", lambda X: False)
    try:
        out = check_devices([d.copy() for d in devs], ids=ids)
        return out, None
    except ValidationError as exc:
        return None, str(exc)
    finally:
        monkeypatch.undo()


def _same_as_exact(devs, monkeypatch, ids=None):
    fast, fast_err = _outcome(devs, ids, monkeypatch=monkeypatch)
    exact, exact_err = _outcome(devs, ids, certified=False, monkeypatch=monkeypatch)
    assert fast_err == exact_err
    if exact is not None:
        assert [a.dtype for a in fast] == [a.dtype for a in exact]
        for a, b in zip(fast, exact):
            np.testing.assert_array_equal(a, b)
    return exact_err


# values per device around the stacking size (at or below it: stacked, not certified)
SIZES = [(_SMALL_DEVICE // 4, 4), (_SMALL_DEVICE // 4 + 1, 4), (3 * _SMALL_DEVICE // 7 + 1, 7)]


@pytest.mark.parametrize("shape", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, "mixed"])
def test_random_federations_pass_as_on_the_exact_path(shape, dtype, monkeypatch):
    rng = np.random.default_rng(shape[0])
    devs = [rng.normal(size=shape) * 10.0 ** rng.integers(-5, 5) for _ in range(7)]
    devs = [d.astype(np.float32 if dtype == np.float32 or (dtype == "mixed" and i % 2) else
                     np.float64) for i, d in enumerate(devs)]
    assert _same_as_exact(devs, monkeypatch) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [1 - 1e-6, 1 + 1e-6, 2.0])
@pytest.mark.parametrize("where", [0, 17, 39])
def test_one_device_at_the_overflow_limit_among_many(dtype, factor, where, monkeypatch):
    huge, _ = _limits(dtype)
    rng = np.random.default_rng(where)
    devs = [rng.normal(size=(_SMALL_DEVICE // 5 + 3, 5)).astype(dtype) for _ in range(40)]
    devs[where][11, 2] = dtype(huge * factor)
    err = _same_as_exact(devs, monkeypatch, ids=list(range(100, 140)))
    if dtype(huge * factor) > huge:
        assert err is not None and f"(device {100 + where})" in err and "overflow" in err
    else:
        assert err is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_values_near_the_limit_on_every_device(dtype, monkeypatch):
    # sums of squares near the certificate's quarter: some devices certified, some read
    huge, _ = _limits(dtype)
    rng = np.random.default_rng(1)
    n = _SMALL_DEVICE // 4 + 1
    devs = [(rng.uniform(-1, 1, size=(n, 4)) * huge * s / np.sqrt(n)).astype(dtype)
            for s in (0.3, 0.6, 0.9, 1.0, 1.5)]
    assert _same_as_exact(devs, monkeypatch) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [0.5, 0.999, 1.001, 2.0])
@pytest.mark.parametrize("wide", [None, 0, 8])
def test_spans_around_the_underflow_limit(dtype, factor, wide, monkeypatch):
    # every device's spread just below or above the limit; ``wide``: one device spread
    # widely (the certificate holds from it on), at the front or at the back
    _, tiny = _limits(dtype)
    rng = np.random.default_rng(2)
    devs = [(rng.uniform(0, 1, size=(_SMALL_DEVICE // 6 + 5, 6)) * tiny * factor).astype(dtype)
            for _ in range(9)]
    for d in devs:
        d[0], d[1] = 0, dtype(tiny * factor)   # the span is the scaled limit exactly
    if wide is not None:
        devs[wide] = rng.normal(size=devs[wide].shape).astype(dtype)
    err = _same_as_exact(devs, monkeypatch)
    if wide is None and dtype(tiny * factor) < tiny:
        assert err is not None and "widest feature spans only" in err
    else:
        assert err is None


def test_identical_points_everywhere_pass_as_before(monkeypatch):
    devs = [np.full((_SMALL_DEVICE, 3), 2.5) for _ in range(4)]
    assert _same_as_exact(devs, monkeypatch) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_device_among_many_is_named(dtype, bad, monkeypatch):
    rng = np.random.default_rng(3)
    devs = [rng.normal(size=(_SMALL_DEVICE // 5 + 1, 5)).astype(dtype) for _ in range(30)]
    devs[22][400, 4] = bad
    devs[25] = devs[25] * dtype(1e200 if dtype == np.float64 else 1e30)   # later: not named
    err = _same_as_exact(devs, monkeypatch, ids=[7 * i for i in range(30)])
    assert err is not None and "device 154 contains a non-finite value" in err


def test_mixed_with_small_and_empty_devices(monkeypatch):
    rng = np.random.default_rng(4)
    big = [rng.normal(size=(_SMALL_DEVICE, 2)) for _ in range(3)]
    small = [rng.normal(size=(5, 2)) for _ in range(3)]
    assert _same_as_exact(big + small, monkeypatch) is None
    over = big + [small[0] * 1e160] + small[1:]
    err = _same_as_exact(over, monkeypatch, ids=[5, 6, 7, 8, 9, 10])
    assert "(device 8)" in err
    err = _same_as_exact(big + [np.empty((0, 2))], monkeypatch)
    assert "device 3 has 0 points" in err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_certificate_is_sound(dtype):
    # whenever it certifies, every value is finite and within the limit, at every scale
    huge, _ = _limits(dtype)
    rng = np.random.default_rng(5)
    certified = 0
    for trial in range(400):
        n = int(rng.integers(1, 3000))
        X = rng.standard_normal((n, 3)) * rng.uniform(0, 2) * huge / np.sqrt(3 * n)
        X[rng.integers(n), rng.integers(3)] = rng.choice([1, -1]) * huge * rng.uniform(0, 1.5)
        X = X.astype(dtype)
        if _certified_bounded(X):
            certified += 1
            assert np.isfinite(X).all() and np.abs(X).max() <= huge
    assert certified > 20   # the test reaches the certified side


def test_what_the_certificate_leaves_to_the_exact_path():
    X = np.random.default_rng(6).normal(size=(2000, 5))
    assert _certified_bounded(X) and _certified_bounded(X.astype(np.float32))
    for bad in (np.nan, np.inf, -np.inf):
        Y = X.copy()
        Y[3, 1] = bad
        assert not _certified_bounded(Y)
    assert not _certified_bounded(X.T)                       # not C-contiguous
    assert not _certified_bounded(X.astype(np.float16))      # not float32 / float64
    assert not _certified_bounded(np.ones((3_000_000, 1), dtype=np.float32))   # N eps > 1/4


@pytest.mark.parametrize("scale, needle", [(1e160, "overflow"), (1e-160, "underflow"),
                                           (np.nan, "non-finite")])
def test_kfed_fit_refuses_as_on_the_exact_path(scale, needle, monkeypatch):
    from fedclust.kfed import KFed

    rng = np.random.default_rng(7)
    devs = [rng.normal(size=(_SMALL_DEVICE // 4 + 50, 4)) + 5 * (i % 2) for i in range(12)]
    if np.isnan(scale):
        devs[9][3, 3] = scale
    elif scale > 1:
        devs[9] = devs[9] * scale
    else:
        devs = [d * scale for d in devs]

    def refusal():
        with pytest.raises(ValidationError, match=needle) as err:
            KFed(2, 2, random_state=0).fit(devs)
        return str(err.value)

    fast = refusal()
    monkeypatch.setattr(validation, "_certified_bounded", lambda X: False)
    assert fast == refusal()
    if not scale < 1:
        assert "device 9" in fast
    monkeypatch.undo()
    ok = [rng.normal(size=d.shape) for d in devs]
    fitted = KFed(2, 2, random_state=0).fit(ok)
    monkeypatch.setattr(validation, "_certified_bounded", lambda X: False)
    exact = KFed(2, 2, random_state=0).fit(ok)
    np.testing.assert_array_equal(fitted.cluster_centers_, exact.cluster_centers_)
