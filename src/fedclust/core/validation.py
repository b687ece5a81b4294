"""Input checks shared by every public entry point.

Public functions validate and then call private ``_impl`` code that assumes
clean input. Messages follow scikit-learn's style: they name the parameter (or
device index) and the offending value, and say what would be accepted.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import scipy.sparse as sp

from .exceptions import ValidationError

__all__ = [
    "check_int",
    "check_float",
    "check_choice",
    "check_array",
    "check_devices",
    "check_n_local_clusters",
    "check_device_ids",
    "check_n_features",
    "check_scale",
    "check_query",
    "check_labels",
    "overflow_limit",
    "check_flags",
]

#: squared distances are sums of up to ~1e8 squares: keep this factor of headroom
_HEADROOM = 1e4


def check_flags(estimator: Any, *names: str) -> None:
    """Refuse an estimator's yes/no setting that is not a bool (``weighted="no"`` would
    otherwise read as True), naming the estimator, the setting and the value."""
    for name in names:
        value = getattr(estimator, name)
        if not isinstance(value, (bool, np.bool_)):
            raise ValidationError(f"{type(estimator).__name__}: {name}={value!r} must be True "
                                  "or False")


def check_int(value: Any, name: str, *, min_value: int | None = None,
              max_value: int | None = None) -> int:
    """Return ``value`` as an int, or raise naming ``name`` and the value."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValidationError(f"{name}={value!r} must be an integer")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValidationError(f"{name}={value} must be >= {min_value}")
    if max_value is not None and value > max_value:
        raise ValidationError(f"{name}={value} must be <= {max_value}")
    return value


def check_float(value: Any, name: str, *, min_value: float | None = None,
                max_value: float | None = None, min_inclusive: bool = True) -> float:
    """Return ``value`` as a finite float within bounds, or raise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValidationError(f"{name}={value!r} must be a real number")
    value = float(value)
    if not np.isfinite(value):
        raise ValidationError(f"{name}={value} must be finite")
    if min_value is not None:
        if value < min_value or (not min_inclusive and value == min_value):
            op = ">=" if min_inclusive else ">"
            raise ValidationError(f"{name}={value} must be {op} {min_value}")
    if max_value is not None and value > max_value:
        raise ValidationError(f"{name}={value} must be <= {max_value}")
    return value


def check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise listing them."""
    if value not in choices:
        raise ValidationError(
            f"{name}={value!r} is not supported; choose one of {sorted(choices)}")
    return value


def check_array(X: Any, name: str = "X", *, dtype: Any = None,
                ndim: int = 2) -> np.ndarray:
    """Return ``X`` as a finite numeric array of ``ndim`` dimensions.

    Floats keep their precision (float32 stays float32); integers and bools
    become float64. Strings, objects and complex numbers are refused.
    """
    if sp.issparse(X):
        raise ValidationError(f"{name} is a scipy sparse matrix; sparse data is not supported "
                              f"(pass {name}.toarray())")
    try:
        arr = np.asarray(X)
    except Exception as exc:  # ragged nested lists and the like
        raise ValidationError(f"{name} could not be read as an array: {exc}") from None
    if arr.dtype.kind == "c":
        raise ValidationError(f"{name} has dtype {arr.dtype}: Complex data not supported; "
                              "expected real numbers (int or float)")
    if arr.dtype.kind not in "biuf":
        raise ValidationError(
            f"{name} has dtype {arr.dtype} ({_kind_name(arr.dtype)}); "
            "expected real numbers (int or float)")
    if arr.ndim != ndim:
        hint = (" (Reshape your data: X.reshape(-1, 1) for a single feature)"
                if arr.ndim == 1 and ndim == 2 else "")
        raise ValidationError(
            f"{name} must be {ndim}-D, got an array of shape {arr.shape}{hint}")
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    elif arr.dtype.kind != "f":
        arr = arr.astype(np.float64)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValidationError(
            f"{name} contains a non-finite value {arr[tuple(bad)]} at index "
            f"{tuple(int(i) for i in bad)}; remove or impute NaN/inf first")
    return arr


def _kind_name(dtype: np.dtype) -> str:
    return {"U": "strings", "S": "bytes", "O": "Python objects",
            "c": "complex numbers", "M": "datetimes", "m": "timedeltas"}.get(
                dtype.kind, dtype.kind)


def check_devices(devices: Any, *, min_points: int = 1, name: str = "devices",
                  ids: Sequence[int] | None = None) -> list[np.ndarray]:
    """Validate a federation: a non-empty sequence of 2-D arrays with one d.

    Devices keep their own float dtype when all are float32, else float64.
    Errors name a device by its id in ``ids`` (default: its position).
    """
    if isinstance(devices, np.ndarray) and devices.dtype.kind != "O":
        raise ValidationError(
            f"{name} must be a sequence of per-device 2-D arrays, got a single "
            f"array of shape {devices.shape}; wrap it as [X] for one device")
    try:
        devices = list(devices)
    except TypeError:
        raise ValidationError(
            f"{name} must be a sequence of 2-D arrays, got {type(devices).__name__}") from None
    if not devices:
        raise ValidationError(f"{name} is empty: give at least one device")
    out: list[np.ndarray] = []
    d0 = None
    if ids is not None and len(ids) != len(devices):
        raise ValidationError(f"device_ids has {len(ids)} entries for {len(devices)} devices")
    one_shape = _one_shape(devices)   # read once: 10^5 small devices take milliseconds
    finite, ranges = _finite_float_devices(devices, shape=one_shape)
    # large float devices: one dot product certifies most (finite, below the overflow limit);
    # the others' per-feature min and max test finiteness (NaN and inf reach them) and are the
    # scale check's input, so each such device is read twice, not three times
    bounded: list[int] = []
    for pos, X in enumerate(() if finite.all() else devices):
        if (type(X) is np.ndarray and X.ndim == 2 and X.size > _SMALL_DEVICE
                and X.dtype.kind == "f" and X.shape[0] > 0 and not finite[pos]):
            if _certified_bounded(X):
                finite[pos] = True
                bounded.append(pos)
                continue
            lo, hi = _feature_range(X)
            if np.isfinite(lo).all() and np.isfinite(hi).all():
                finite[pos] = True
                ranges[pos] = (lo, hi)
    finite_list = finite.tolist()   # python bools: one lookup per device
    shape = one_shape if finite.all() else None
    if shape is not None and len(shape) == 2 and shape[0] >= min_points and shape[1] > 0:
        out = list(devices)   # finite float arrays of one valid shape: nothing to convert
        finite_list = []
    for pos, X in enumerate(devices if finite_list else ()):
        if finite_list[pos] and d0 is not None:   # a checked float array: only its shape
            shape = X.shape
            if shape[0] >= min_points and shape[1] == d0:
                out.append(X)
                continue
        z = pos if ids is None else ids[pos]
        arr = X if finite_list[pos] else check_array(X, f"device {z}")
        if arr.shape[0] < min_points:
            raise ValidationError(
                f"device {z} has {arr.shape[0]} points; every device needs at "
                f"least {min_points}")
        if arr.shape[1] == 0:
            raise ValidationError(f"device {z} has 0 feature(s) (shape={arr.shape}) while a "
                                  "minimum of 1 is required (every device needs d >= 1)")
        if d0 is None:
            d0, first = arr.shape[1], z
        elif arr.shape[1] != d0:
            raise ValidationError(
                f"device {z} has {arr.shape[1]} features but device {first} has {d0}; "
                "all devices must share the same feature dimension")
        out.append(arr)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    dtypes = set(map(_DTYPE, out))
    if dtypes != {f32} and dtypes != {f64}:
        out = [a.astype(np.float64, copy=False) for a in out]
    check_scale(out, name, ids, ranges=ranges, bounded=bounded)
    return out


def _feature_range(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature (min, max) of a 2-D array: blocks of m rows read as one long row (a
    reduction down short rows is slow), then the m partial results; exact, as min and max."""
    n, d = X.shape
    m = max(1, 1024 // max(d, 1))
    q = n - n % m
    if m == 1 or q == 0 or not X.flags.c_contiguous:
        return X.min(axis=0), X.max(axis=0)
    W = X[:q].reshape(-1, m * d)
    lo = W.min(axis=0).reshape(m, d).min(axis=0)
    hi = W.max(axis=0).reshape(m, d).max(axis=0)
    if q < n:
        np.minimum(lo, X[q:].min(axis=0), out=lo)
        np.maximum(hi, X[q:].max(axis=0), out=hi)
    return lo, hi


def _certified_bounded(X: np.ndarray) -> bool:
    """Whether one BLAS dot product certifies that every value of the float32 or float64
    array ``X`` is finite and at most :func:`check_scale`'s overflow limit for ``X``'s dtype
    (``sqrt(max) / 1e4``; float64 data's limit is the larger when devices are mixed).

    The sum of squares S is finite only when every value is (NaN and inf reach it), and
    bounds each square. Its computed value, in any order and with or without fused
    multiply-adds, is at least ``(1 - N u / (1 - N u)) S - N eta`` for N values, unit
    roundoff u and underflow error eta per operation: with ``N eps <= 1/4`` that is more
    than ``0.85 S - N eta``, so a computed sum at most a quarter of the squared limit
    leaves every value below the limit. False (the caller reads the exact per-feature
    range) for anything it cannot certify: a non-contiguous array, too many values for
    the bound, or a sum above the quarter.
    """
    if X.dtype not in _CERTIFIED_DTYPES or not X.flags.c_contiguous:
        return False
    fi = np.finfo(X.dtype)
    if X.size * float(fi.eps) > 0.25:
        return False
    flat = X.reshape(-1)
    limit = overflow_limit(fi)
    with np.errstate(over="ignore", invalid="ignore"):   # inf and NaN: not certified
        return bool(float(flat @ flat) <= 0.25 * limit * limit)   # NaN compares False


_CERTIFIED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_scale(arrays: Sequence[np.ndarray], name: str = "devices",
                ids: Sequence[int] | None = None, *,
                ranges: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
                bounded: Sequence[int] = ()) -> None:
    """Refuse, in one line, data whose squared distances overflow or underflow its float type.

    Every family computes squared distances, scatter matrices or squared
    residuals: with values beyond about ``sqrt(max) / 1e4`` (1.3e150 in float64)
    they overflow to inf (an eigensolver then fails to converge, k-means++
    draws NaN probabilities); with every feature spanning less than about
    ``sqrt(tiny) * 1e4`` (1.5e-150) they underflow to 0 and distinct points
    look identical. Both are a units problem the user can fix by multiplying
    the data by one constant, which every clustering here is equivariant to.
    ``arrays``: finite 2-D float arrays with one number of columns (checked
    already); errors name the device (by ``ids``, default its position).
    O(total size), in chunks of devices. ``ranges``: position -> (per-feature min, max) of
    devices whose ranges the caller has already computed (not read again). ``bounded``:
    positions of non-empty devices (no range given) that :func:`_certified_bounded`
    certified: they cannot hold the largest value of data that overflows, so their ranges
    are read only for the underflow test, one at a time until some feature's span reaches
    the limit (usually the first one), all of them when none does; the errors are the ones
    their full ranges give.
    """
    known = ranges or {}
    later = [arrays[pos] for pos in sorted(bounded)]
    # positions already accounted for: no set built for 10^5 small devices' ranges alone
    skip = known.keys() | set(bounded) if later else known
    if skip and len(skip) == len(arrays):   # every device's range at hand or certified
        unread: list[np.ndarray] = []
    else:
        ids = None if ids is None else [z for z, a in zip(ids, arrays) if a.size]
        pairs = [(pos, a) for pos, a in enumerate(arrays) if a.size]
        arrays = [a for _, a in pairs]
        unread = [a for pos, a in pairs if pos not in skip]
    if not len(arrays):
        return
    fi = np.finfo(np.result_type(*set(map(_DTYPE, arrays))))
    huge = overflow_limit(fi)
    tiny = float(np.sqrt(fi.tiny)) * _HEADROOM
    lo = np.full(arrays[0].shape[1], np.inf)
    hi = np.full(arrays[0].shape[1], -np.inf)
    # one range may stand for many devices (a stacked chunk's): each read once
    shared = list(known.values())
    for lo_known, hi_known in dict(zip(map(id, shared), shared)).values():
        np.minimum(lo, lo_known, out=lo)
        np.maximum(hi, hi_known, out=hi)
    for s in range(0, len(unread), _SMALL_DEVICE):
        part = unread[s:s + _SMALL_DEVICE]
        # small devices stacked (one reduction per chunk); large ones read in place
        small = [a for a in part if a.size <= _SMALL_DEVICE]
        blocks = [a for a in part if a.size > _SMALL_DEVICE]
        if small:
            blocks.append(np.concatenate(small))
        for a in blocks:
            np.minimum(lo, a.min(axis=0), out=lo)
            np.maximum(hi, a.max(axis=0), out=hi)
    top = float(max(hi.max(), -lo.min()))
    if top > huge:
        where = next(pos for pos, a in enumerate(arrays) if np.abs(a).max() > huge)
        raise ValidationError(
            f"{name}: values reach {top:.3g} (device {where if ids is None else ids[where]}); "
            f"squared distances overflow {fi.dtype} beyond about {huge:.1e}: divide the data "
            "by one constant (e.g. its largest absolute value) before fitting")
    span = float((hi - lo).max())
    for a in later if not span >= tiny else ():   # a span at the limit clears the rest
        lo_a, hi_a = _feature_range(a)
        np.minimum(lo, lo_a, out=lo)
        np.maximum(hi, hi_a, out=hi)
        span = float((hi - lo).max())
        if span >= tiny:
            break
    if 0.0 < span < tiny:
        raise ValidationError(
            f"{name}: the widest feature spans only {span:.3g}; squared distances underflow "
            f"{fi.dtype} below about {tiny:.1e}: multiply the data by one constant (e.g. "
            "1 / its largest range) before fitting")


def overflow_limit(fi: np.finfo) -> float:
    """Largest absolute value whose squared distances keep :data:`_HEADROOM` below overflow."""
    return float(np.sqrt(fi.max)) / _HEADROOM


def check_query(X: Any, estimator: Any, n_features: int | None = None, *,
                name: str = "X", min_rows: int = 0, dtype: Any = None) -> np.ndarray:
    """Validate rows given to a fitted model (predict, transform, score).

    :func:`check_array`, at least ``min_rows`` rows (a mean over no rows is NaN),
    the fitted width (:func:`check_n_features`), and no value beyond the overflow
    limit of :func:`check_scale` for the array's float type (``dtype``: the type the
    model computes in; default X's own, float32 or float64, other floats become float64
    as in :func:`check_devices`). The fit refuses such data; predicting on it turns
    every squared distance into inf and labels every row 0.
    """
    X = check_n_features(check_array(X, name, dtype=dtype), estimator, n_features, name)
    if X.dtype not in _CERTIFIED_DTYPES:   # float16 distances overflow at 256: as the fit does
        X = X.astype(np.float64)
    if X.shape[0] < min_rows:
        raise ValidationError(f"{name} has {X.shape[0]} rows; {type(estimator).__name__} "
                              f"needs at least {min_rows} to score")
    if X.size:
        top = float(np.abs(X).max())
        huge = overflow_limit(np.finfo(X.dtype))
        if top > huge:
            raise ValidationError(
                f"{name}: values reach {top:.3g}; squared distances overflow {X.dtype} beyond "
                f"about {huge:.1e} (fit refuses such data too): bring {name} to the units of "
                "the training data")
    return X


def check_labels(y: Any, n_rows: int, owner: str | None = None) -> np.ndarray:
    """``y`` as a 1-D array of ``n_rows`` finite numbers or strings; errors start with
    ``owner`` (a device) when given."""
    at = "" if owner is None else f"{owner}: "
    y = np.asarray(y)
    if y.dtype.kind == "O" and y.size and all(isinstance(v, str) for v in y.ravel()):
        y = y.astype(str)  # pandas' column of strings
    if y.dtype.kind not in "biufUS":
        raise ValidationError(f"{at}y has dtype {y.dtype}; expected numbers or strings")
    if y.ndim != 1 or y.shape[0] != n_rows:
        raise ValidationError(f"{at}X has {n_rows} rows but y has shape {y.shape}")
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        bad = y[~np.isfinite(y)][0]
        raise ValidationError(f"{at}y contains a non-finite value {bad} at index "
                              f"{int(np.flatnonzero(~np.isfinite(y))[0])}")
    return y


#: devices with more values than this are checked one by one (stacking them only copies data)
_SMALL_DEVICE = 4096


def check_device_ids(device_ids: Any, n: int) -> list[int]:
    """``device_ids`` as ``n`` distinct non-negative ints (default ``0..n-1``)."""
    if device_ids is None:
        return list(range(n))
    ids = [check_int(z, f"device_ids[{i}]", min_value=0) for i, z in enumerate(device_ids)]
    if len(ids) != n or len(set(ids)) != n:
        raise ValidationError(f"device_ids must be {n} distinct non-negative ints, got {ids[:10]}")
    return ids


def _finite_float_devices(devices: list[Any], chunk: int = 4096, *,
                          shape: tuple[int, ...] | None | str = "unknown"
                          ) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Which devices are already finite 2-D float arrays, tested in stacked chunks, and the
    per-feature (min, max) of each finite chunk (position -> the chunk's shared pair).

    Cross-device federations have 10^5 small devices: one reduction per chunk
    of same-shaped devices instead of one per device. A device's per-feature min
    and max are finite exactly when all its values are (NaN and inf reach them),
    and they are the scale check's input, so each device is read once. Anything
    else (lists, integers, NaN, other shapes) is left to :func:`check_array` for its error.
    """
    ok = np.zeros(len(devices), dtype=bool)
    ranges: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    groups: dict[tuple, list[int]] = {}
    ndarray = np.ndarray
    if shape == "unknown":   # ``shape``: :func:`_one_shape` of the devices, if at hand
        shape = _one_shape(devices)
    if shape is not None and len(shape) == 2 and shape[0] * shape[1] <= _SMALL_DEVICE:
        dtypes = set(map(_DTYPE, devices))
        if len(dtypes) == 1:   # one shape, one dtype (many small devices): one group
            (dt,) = dtypes
            if dt.kind == "f":
                groups[(shape, dt)] = list(range(len(devices)))
            devices_to_group: Any = ()
        else:
            devices_to_group = devices
    else:
        devices_to_group = devices
    for pos, X in enumerate(devices_to_group):
        if type(X) is ndarray and X.ndim == 2 and X.size <= _SMALL_DEVICE:
            dt = X.dtype
            if dt.kind == "f":
                groups.setdefault((X.shape, dt), []).append(pos)
    for (shape, _), members in groups.items():
        if shape[0] * shape[1] == 0:   # nothing to test, nothing to range
            ok[members] = True
            continue
        # chunks of about a core's cache: the copy is still there for the reductions
        step = max(1, min(chunk, _CHECK_CHUNK_VALUES // (shape[0] * shape[1])))
        every = len(members) == len(devices)   # the one group of all devices: read by slices
        for s in range(0, len(members), step):
            part = members[s:s + step]
            flat = np.concatenate(devices[s:s + step] if every else
                                  [devices[p] for p in part]).reshape(len(part), -1)
            # per-feature range: min over the devices' rows, then over each device's points
            # (long rows reduce faster than (n, d) blocks; min and max are exact either way).
            # NaN and inf reach the min or the max: finite ones clear the whole chunk
            lo, hi = flat.min(axis=0), flat.max(axis=0)
            if np.isfinite(lo).all() and np.isfinite(hi).all():
                if every:
                    ok[s:s + step] = True
                else:
                    ok[part] = True
                part_good = part
            else:
                good = np.isfinite(flat).all(axis=1)
                ok[part] = good
                if not good.any():
                    continue
                flat = flat[good]
                part_good = np.asarray(part)[good].tolist()
                lo, hi = flat.min(axis=0), flat.max(axis=0)
            pair = (lo.reshape(shape).min(axis=0), hi.reshape(shape).max(axis=0))
            ranges.update(dict.fromkeys(part_good, pair))
    return ok, ranges


#: values per stacked chunk of small devices tested for finite values (1 MiB of float64)
_CHECK_CHUNK_VALUES = 1 << 17

_SHAPE = attrgetter("shape")
_DTYPE = attrgetter("dtype")


def _one_shape(devices: list[Any]) -> tuple[int, ...] | None:
    """The shape every device has when all are numpy arrays of one shape, else None
    (read at C speed: a cross-device federation has 10^5 small devices)."""
    if not devices or set(map(type, devices)) != {np.ndarray}:
        return None
    shapes = set(map(_SHAPE, devices))
    return next(iter(shapes)) if len(shapes) == 1 else None


def check_n_local_clusters(n_local_clusters: Any, n_devices: int) -> list[int]:
    """Expand an int or a per-device sequence into one k_z per device."""
    if isinstance(n_local_clusters, numbers.Integral) and not isinstance(n_local_clusters, bool):
        k = check_int(n_local_clusters, "n_local_clusters", min_value=1)
        return [k] * n_devices
    try:
        values = list(n_local_clusters)
    except TypeError:
        raise ValidationError(
            f"n_local_clusters={n_local_clusters!r} must be an int or one int per device") from None
    if len(values) != n_devices:
        raise ValidationError(
            f"n_local_clusters has {len(values)} values but there are {n_devices} devices")
    return [check_int(v, f"n_local_clusters[{z}]", min_value=1) for z, v in enumerate(values)]


def check_n_features(X: np.ndarray, estimator: Any, n_features: int | None = None,
                     name: str = "X") -> np.ndarray:
    """Refuse a 2-D ``X`` whose width differs from the fitted ``n_features_in_`` (scikit-learn's
    wording)."""
    n = estimator.n_features_in_ if n_features is None else n_features
    if X.shape[1] != n:
        raise ValidationError(f"{name} has {X.shape[1]} features, but {type(estimator).__name__} "
                              f"is expecting {n} features as input")
    return X
