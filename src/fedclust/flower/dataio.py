"""Per-device data files for Flower clients (no pickle, no flwr).

``.npz``: ``X``, optional ``y`` and ``device_id``. ``.csv`` / ``.tsv`` /
``.parquet``: a site table (:class:`fedclust.sites.RawTable`), which a protocol
run on site data (:class:`fedclust.site_protocol.SiteTransformProtocol`)
encodes and preprocesses on the node with the federation's schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.exceptions import ValidationError

__all__ = ["save_device_file", "load_device_file"]


def save_device_file(path: str | Path, data: Any, device_id: int | None = None) -> Path:
    """Write one device's data for a ClientApp: ``X`` (n, d) or ``(X, y)``, and optionally its id."""
    path = Path(path)
    if isinstance(data, tuple):
        X, y = data
        arrays = {"X": np.asarray(X), "y": np.asarray(y)}
    else:
        arrays = {"X": np.asarray(data)}
    if device_id is not None:
        arrays["device_id"] = np.asarray(int(device_id), dtype=np.int64)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load_device_file(path: str | Path) -> tuple[Any, int | None]:
    """Read ``(data, device_id or None)``; ``data`` is ``X``, or ``(X, y)`` when the file has ``y``,
    or a :class:`~fedclust.sites.RawTable` for a CSV/Parquet file."""
    if not str(path).lower().endswith(".npz"):
        from ..sites import read_table

        return read_table(path), None
    with np.load(path, allow_pickle=False) as data:
        if "X" not in data.files:
            raise ValidationError(f"{path}: no 'X' array (keys: {data.files})")
        X = data["X"]
        out = (X, data["y"]) if "y" in data.files else X
        z = int(data["device_id"]) if "device_id" in data.files else None
    return out, z
