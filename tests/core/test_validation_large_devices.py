"""check_devices on devices above the stacking size: min/max stand in for the finiteness pass."""

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.validation import _SMALL_DEVICE, check_devices


def _large(seed, rows=None):
    rows = rows or _SMALL_DEVICE // 4 + 10
    return np.random.default_rng(seed).normal(size=(rows, 5))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_in_a_large_device_is_named(bad):
    devs = [_large(0), _large(1), _large(2)]
    devs[1][7, 3] = bad
    with pytest.raises(ValidationError, match=r"device 11 contains a non-finite value .* index \(7, 3\)"):
        check_devices(devs, ids=[10, 11, 12])


def test_large_and_small_devices_pass_unchanged():
    devs = [_large(0), np.ones((3, 5)), _large(1).astype(np.float32)]
    out = check_devices(devs)
    assert [a.dtype for a in out] == [np.float64] * 3
    assert out[0] is devs[0]
    np.testing.assert_array_equal(out[2], devs[2].astype(np.float64))


def test_the_scale_check_still_sees_large_devices():
    devs = [_large(0), _large(1) * 1e160, np.ones((3, 5))]
    with pytest.raises(ValidationError, match=r"values reach .*\(device 21\)"):
        check_devices(devs, ids=[20, 21, 22])
    tiny = [_large(0) * 1e-160, _large(1) * 1e-160]
    with pytest.raises(ValidationError, match="widest feature spans only"):
        check_devices(tiny)


def _many_small(n_devices=5000, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(6, 4)) for _ in range(n_devices)]   # more than one stacked chunk


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_among_many_small_devices_is_named(bad):
    devs = _many_small()
    devs[4321][2, 1] = bad
    with pytest.raises(ValidationError, match=r"device 4321 contains a non-finite value .* index \(2, 1\)"):
        check_devices(devs)


def test_the_scale_check_sees_every_chunk_of_small_devices():
    # a chunk's shared range must still reach the check: one device beyond the overflow
    # limit in the last chunk, or every feature too narrow in all of them
    devs = _many_small()
    devs[4999] = devs[4999] * 1e160
    with pytest.raises(ValidationError, match=r"values reach .*\(device 4999\)"):
        check_devices(devs)
    tiny = [d * 1e-160 for d in _many_small()]
    with pytest.raises(ValidationError, match="widest feature spans only"):
        check_devices(tiny)
    # the same values spread over float32 and float64 devices give the same range
    ok = _many_small()
    mixed = [d.astype(np.float32) if i % 2 else d for i, d in enumerate(ok)]
    out = check_devices(mixed)
    assert all(a.dtype == np.float64 for a in out)


def test_empty_small_devices_reach_the_points_check():
    devs = _many_small(10) + [np.empty((0, 4))]
    with pytest.raises(ValidationError, match="device 10 has 0 points"):
        check_devices(devs)
