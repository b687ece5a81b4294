"""Per-device data files for Flower clients (no pickle, no flwr).

``.npz``: ``X``, optional ``y`` and ``device_id``. ``.csv`` / ``.tsv`` /
``.parquet``, and an ``.npz`` with ``feature_names`` (a user's own site file):
a site table, which a protocol run on site data encodes and preprocesses on
the node with the federation's schema. A table handed to a simulated node
travels as an ``.npz`` of its columns. How a table is read and travels is the
site wing's (:mod:`fedclust.sites`), registered with
:func:`fedclust.core.registry.register_table_files`: nothing here imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.atomic import write_npz_atomic
from ..core.exceptions import ValidationError
from ..core.registry import table_files

__all__ = ["save_device_file", "load_device_file"]


def save_device_file(path: str | Path, data: Any, device_id: int | None = None) -> Path:
    """Write one device's data for a ClientApp: ``X`` (n, d) or ``(X, y)``, or a site table;
    and optionally its id."""
    path = Path(path)
    table = table_files().to_arrays(data)
    if table is not None:
        arrays = dict(table)
    elif isinstance(data, tuple):
        X, y = data
        arrays = {"X": np.asarray(X), "y": np.asarray(y)}
    else:
        arrays = {"X": np.asarray(data)}
    if device_id is not None:
        arrays["device_id"] = np.asarray(int(device_id), dtype=np.int64)
    write_npz_atomic(path, arrays)
    return path


def load_device_file(path: str | Path) -> tuple[Any, int | None]:
    """Read ``(data, device_id or None)``; ``data`` is ``X``, or ``(X, y)`` when the file has ``y``,
    or a site table (:class:`~fedclust.core.registry.TableFiles`) for a CSV/Parquet file."""
    tables = table_files()
    if not str(path).lower().endswith(".npz"):
        return tables.read(path), None
    with np.load(path, allow_pickle=False) as data:
        z = int(data["device_id"]) if "device_id" in data.files else None
        table = tables.from_arrays(data)
        if table is not None:
            return table, z
        if "feature_names" in data.files:  # a user's own site file: columns by name
            return tables.read(path), z
        if "X" not in data.files:
            raise ValidationError(f"{path}: no 'X' array (keys: {data.files})")
        X = data["X"]
        out = (X, data["y"]) if "y" in data.files else X
    return out, z
