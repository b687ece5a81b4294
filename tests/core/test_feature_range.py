"""The per-feature range behind check_devices' finiteness and scale checks: exact, NaN-aware."""

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.validation import _feature_range, _finite_float_devices, check_devices


@pytest.mark.parametrize("shape", [(1, 3), (7, 3), (1000, 100), (1001, 100), (513, 2),
                                   (5, 2000), (300, 1)])
def test_feature_range_equals_numpy_min_and_max(shape):
    X = np.random.default_rng(sum(shape)).standard_cauchy(size=shape)
    lo, hi = _feature_range(X)
    np.testing.assert_array_equal(lo, X.min(axis=0))
    np.testing.assert_array_equal(hi, X.max(axis=0))
    # a column view (not C-contiguous) too
    Xv = np.asfortranarray(X)
    np.testing.assert_array_equal(_feature_range(Xv)[0], X.min(axis=0))


@pytest.mark.parametrize("row", [0, 511, 1000])   # in the wide blocks and in the remainder
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_feature_range_sees_every_non_finite_value(row, bad):
    X = np.random.default_rng(1).normal(size=(1001, 10))
    X[row, 4] = bad
    lo, hi = _feature_range(X)
    assert not (np.isfinite(lo[4]) and np.isfinite(hi[4]))
    assert np.isfinite(np.delete(lo, 4)).all() and np.isfinite(np.delete(hi, 4)).all()


def test_small_devices_ranges_and_finiteness_match_a_loop():
    rng = np.random.default_rng(2)
    devs = [rng.normal(size=(20, 4)) * (z + 1) for z in range(300)]
    devs[17][3, 2] = np.nan
    devs[250][0, 0] = -np.inf
    ok, ranges = _finite_float_devices(devs, chunk=64)
    assert ok.tolist() == [z not in (17, 250) for z in range(300)]
    for lo_hi in {id(r): r for r in ranges.values()}.values():
        members = [z for z, r in ranges.items() if r is lo_hi]
        stacked = np.concatenate([devs[z] for z in members])
        np.testing.assert_array_equal(lo_hi[0], stacked.min(axis=0))
        np.testing.assert_array_equal(lo_hi[1], stacked.max(axis=0))
    assert sorted(ranges) == [z for z in range(300) if z not in (17, 250)]
    with pytest.raises(ValidationError, match=r"device 17 contains a non-finite value nan at index \(3, 2\)"):
        check_devices(devs)
