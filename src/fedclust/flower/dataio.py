"""Per-device data files for Flower clients (no pickle, no flwr).

``.npz``: ``X``, optional ``y`` and ``device_id``. ``.csv`` / ``.tsv`` /
``.parquet``, and an ``.npz`` with ``feature_names`` (a user's own site file):
a site table (:class:`fedclust.sites.RawTable`), which a protocol run on site
data (:class:`fedclust.sites.deployed.SitePreprocessProtocol`) encodes and
preprocesses on the node with the federation's schema. A table handed to a
simulated node travels as an ``.npz`` of its columns (``col/<name>``: numbers,
or text with ``""`` for a missing cell).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.atomic import write_npz_atomic
from ..core.exceptions import ValidationError

__all__ = ["save_device_file", "load_device_file"]


_COL, _SITE = "col/", "__site__"


def save_device_file(path: str | Path, data: Any, device_id: int | None = None) -> Path:
    """Write one device's data for a ClientApp: ``X`` (n, d) or ``(X, y)``, or a site table;
    and optionally its id."""
    from ..sites import RawTable

    path = Path(path)
    if isinstance(data, RawTable):
        arrays = {}
        for c, v in data.columns.items():
            v = np.asarray(v)
            arrays[_COL + c] = v if v.dtype.kind in "biuf" else np.array(
                ["" if x is None else str(x) for x in v.tolist()], dtype=str)
        meta = {"name": data.name, "path": data.path, "features": list(data.features),
                "order": list(data.columns)}
        import json

        arrays[_SITE] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
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
    or a :class:`~fedclust.sites.RawTable` for a CSV/Parquet file."""
    from ..sites import read_table

    if not str(path).lower().endswith(".npz"):
        return read_table(path), None
    with np.load(path, allow_pickle=False) as data:
        z = int(data["device_id"]) if "device_id" in data.files else None
        if _SITE in data.files:
            return _table(data), z
        if "feature_names" in data.files:  # a user's own site file: columns by name
            return read_table(path), z
        if "X" not in data.files:
            raise ValidationError(f"{path}: no 'X' array (keys: {data.files})")
        X = data["X"]
        out = (X, data["y"]) if "y" in data.files else X
    return out, z


def _table(data: Any) -> Any:
    import json

    from ..sites import RawTable

    meta = json.loads(bytes(data[_SITE]).decode("utf-8"))
    cols = {}
    for c in meta["order"]:
        v = data[_COL + c]
        cols[c] = v if v.dtype.kind in "biuf" else np.array(
            [x if x != "" else None for x in v.tolist()], dtype=object)
    return RawTable(meta["name"], meta["path"], cols, list(meta["features"]))
