"""What a forget request names, checked before anything is computed: the devices (ids or
site names), each device's row indices (integers within its rows), and the remaining rows."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..core.exceptions import ValidationError

__all__ = ["device_list", "row_requests", "row_indices", "drop_rows"]


def device_list(devices: Any) -> list[Any]:
    """``devices=`` as a list: one id or site name, or a sequence of them."""
    if isinstance(devices, (str, int, np.integer)):
        return [devices]
    if devices is None or not isinstance(devices, Iterable):
        raise ValidationError(f"forget: devices= must be a device id, a site name or a sequence "
                              f"of them; got {type(devices).__name__}")
    return list(devices)


def row_requests(rows: Any) -> Mapping[Any, Any]:
    """``rows=`` as a mapping device -> row indices (None: no rows)."""
    if rows is None:
        return {}
    if not isinstance(rows, Mapping):
        raise ValidationError("forget: rows= must map each device to its row indices, e.g. "
                              f"{{4: [12, 250]}}; got {type(rows).__name__}")
    return rows


def row_indices(rows: Any, device: int) -> np.ndarray:
    """A device's row indices, sorted and unique (int64); a flat list of integers only: a
    float, a bool, a string or a nested list is refused by name rather than rounded, read
    as 0/1 or flattened."""
    try:
        arr = np.asarray(rows)
    except (TypeError, ValueError):
        arr = np.asarray(rows, dtype=object)
    if arr.ndim > 1:   # a nested list is not read as its flattened entries
        raise ValidationError(f"forget: device {device}'s row indices must be a flat list of "
                              f"integers; got an array of shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        example = arr.reshape(-1)[0]
        example = example.item() if isinstance(example, np.generic) else example
        raise ValidationError(f"forget: device {device}'s row indices must be integers; got "
                              f"{example!r}")
    return np.unique(arr.astype(np.int64).reshape(-1))


def drop_rows(data: Any, rows: np.ndarray, device: int) -> Any:
    """A device's data (X, or a tuple of arrays with one row each) without ``rows``."""
    X = data[0] if isinstance(data, tuple) else data
    n = len(X)
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        bad = rows[(rows < 0) | (rows >= n)][0]
        raise ValidationError(f"forget: device {device} has {n} rows; row index {bad} is out of "
                              "range")
    keep = np.ones(n, bool)
    keep[rows] = False
    if isinstance(data, tuple):
        return tuple(np.asarray(a)[keep] for a in data)
    return np.asarray(X)[keep]
