"""Per-device data files for Flower clients (``.npz``: ``X`` and ``device_id``; no pickle, no flwr)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..exceptions import ValidationError

__all__ = ["save_device_file", "load_device_file"]


def save_device_file(path: str | Path, X: np.ndarray, device_id: int | None = None) -> Path:
    """Write one device's data for a ClientApp: ``X`` (n, d) and optionally its id (no pickle)."""
    path = Path(path)
    arrays = {"X": np.asarray(X)}
    if device_id is not None:
        arrays["device_id"] = np.asarray(int(device_id), dtype=np.int64)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load_device_file(path: str | Path) -> tuple[np.ndarray, int | None]:
    """Read ``(X, device_id or None)`` from a file written by :func:`save_device_file`."""
    with np.load(path, allow_pickle=False) as data:
        if "X" not in data.files:
            raise ValidationError(f"{path}: no 'X' array (keys: {data.files})")
        X = data["X"]
        z = int(data["device_id"]) if "device_id" in data.files else None
    return X, z
