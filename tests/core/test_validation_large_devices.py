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
