"""Reading site files: CSV / TSV / Parquet (pandas, pyarrow) and ``.npz`` (numpy, no pickle)."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError

__all__ = ["RawTable", "read_table", "expand_paths", "file_stem", "frame_columns", "NA_VALUES",
           "table_to_arrays", "table_from_arrays"]

#: cells read as missing in CSV files (pandas' defaults plus "?", common in UCI files)
NA_VALUES = ("", "?", "NA", "N/A", "NaN", "nan", "null", "NULL", "None")
_CSV = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz")
_PARQUET = (".parquet", ".pq")
_NPZ = (".npz",)


@dataclass
class RawTable:
    """One site's file as read: column name -> 1-D array (numbers or objects), in file order.

    ``features`` are the columns that count as features by default (every
    column of a table; the ``X`` columns of an ``.npz``).
    """

    name: str
    path: str
    columns: dict[str, np.ndarray]
    features: list[str]

    @property
    def n_rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def as_arrays(self, where: str) -> Any:
        """``X`` or ``(X, y)`` for a protocol that takes numbers, not a table (see
        :meth:`fedclust.core.protocol.Protocol.node_data`): an ``.npz`` with
        ``feature_names`` gives its arrays; a CSV/Parquet file needs the site schema."""
        if not self.path.lower().endswith(".npz"):
            raise ValidationError(f"{where}: a CSV/Parquet node file needs the site schema: "
                                  "deploy a config with [data] source = \"files\"")
        cols = []
        for c in self.features:
            v = np.asarray(self.columns[c])
            if v.dtype.kind not in "biuf":
                raise ValidationError(f"{self.path}: column {c!r} is not numeric; this protocol "
                                      "takes numbers (deploy a config with [data] source = "
                                      "\"files\")")
            cols.append(v.astype(np.float64))
        X = np.column_stack(cols) if cols else np.zeros((self.n_rows, 0))
        return (X, np.asarray(self.columns["y"])) if "y" in self.columns else X



# ------------------------------------------------------------------ reading

def _has_magic(p: str) -> bool:
    return any(ch in p for ch in "*?[")


def expand_paths(paths: str | os.PathLike | Sequence[str | os.PathLike],
                 base_dir: str | os.PathLike | None = None) -> list[Path]:
    """Files named by ``paths`` (globs allowed, sorted per pattern), relative to ``base_dir``.

    ``$FEDCLUST_DATA`` (or any environment variable) and ``~`` are expanded.
    A glob matching nothing, a missing file, or a file listed twice is an error.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in paths:
        text = os.path.expanduser(os.path.expandvars(str(p)))
        if "$" in text:
            import re

            unset = re.findall(r"\$\{?(\w+)", text)
            hint = (" (the folder holding the datasets)"
                    if "FEDCLUST_DATA" in unset else "")
            raise ValidationError(f"path {str(p)!r}: the environment variable "
                                  f"{unset[0] if unset else '$'} is not set{hint}")
        if base_dir is not None and not os.path.isabs(text):
            text = os.path.join(str(base_dir), text)
        if _has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise ValidationError(f"glob {str(p)!r} matches no file (looked for {text})")
            out.extend(Path(f) for f in found)
        else:
            if not os.path.isfile(text):
                raise ValidationError(f"site file {text} does not exist")
            out.append(Path(text))
    if not out:
        raise ValidationError("paths is empty: give at least one site file or glob")
    seen: set[Path] = set()
    for f in out:
        r = f.resolve()
        if r in seen:
            raise ValidationError(f"site file {f} is listed twice")
        seen.add(r)
    return out


def file_stem(path: Path) -> str:
    name = path.name
    for ext in (*_CSV, *_PARQUET, *_NPZ):
        if name.lower().endswith(ext):
            return name[: -len(ext)]
    return path.stem


def _pandas(path: Path):
    try:
        import pandas as pd
    except ImportError:
        raise ValidationError(f"{path}: reading CSV/Parquet needs pandas; "
                              "pip install 'fedclust[io]'") from None
    return pd


def frame_columns(df: Any) -> dict[str, np.ndarray]:
    out = {}
    for c in df.columns:
        s = df[c]
        kind = s.dtype.kind if isinstance(s.dtype, np.dtype) else "O"  # nullable/categorical
        if kind in "biuf":
            out[str(c)] = s.to_numpy(dtype=np.float64 if kind == "f" else s.dtype)
        elif kind == "b":
            out[str(c)] = s.to_numpy().astype(np.int64)
        else:  # strings, mixed, pandas nullable types: objects with None for missing
            vals = s.astype(object).where(s.notna(), None).to_numpy(dtype=object)
            out[str(c)] = vals
    return out


#: the delimiters a CSV file may use (Excel writes ";" where "," is the decimal mark)
DELIMITERS = ",;\t|"


def _delimiter(path: Path, default: str) -> str:
    """The file's delimiter among :data:`DELIMITERS`, from its first lines (``csv.Sniffer``);
    ``default`` when the sample does not tell (one column, an unreadable file)."""
    import csv
    import gzip
    import itertools

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", newline="", errors="replace") as fh:
            sample = "".join(itertools.islice(fh, 20))
        return csv.Sniffer().sniff(sample, delimiters=DELIMITERS).delimiter
    except (csv.Error, OSError, EOFError):
        return default


def read_table(path: str | os.PathLike, *, na_values: Sequence[str] = NA_VALUES) -> RawTable:
    """Read one site file (format by extension) into a :class:`RawTable`."""
    path = Path(path)
    low = path.name.lower()
    if low.endswith(_NPZ):
        return _read_npz(path)
    if low.endswith(_PARQUET):
        pd = _pandas(path)
        try:
            df = pd.read_parquet(path)
        except ImportError as exc:
            raise ValidationError(f"{path}: reading Parquet needs pyarrow ({exc}); "
                                  "pip install 'fedclust[io]'") from None
        except Exception as exc:  # corrupt file, not parquet
            raise ValidationError(f"{path} could not be read as Parquet: {exc}") from None
    elif low.endswith(_CSV):
        pd = _pandas(path)
        sep = _delimiter(path, "\t" if ".tsv" in low else ",")
        try:
            df = pd.read_csv(path, sep=sep, na_values=list(na_values), keep_default_na=True,
                             skipinitialspace=True)
        except pd.errors.EmptyDataError:
            raise ValidationError(f"{path}: the file is empty (no header, no rows)") from None
        except Exception as exc:
            raise ValidationError(f"{path} could not be read as CSV: {exc}") from None
    else:
        raise ValidationError(f"{path}: unknown file type; use .csv, .tsv, .parquet or .npz")
    cols = frame_columns(df)
    # a column without a header (pandas' "Unnamed: 0", e.g. a written index) is no feature
    # unless asked for by name
    return RawTable(file_stem(path), str(path), cols,
                    [c for c in cols if not c.startswith("Unnamed: ")])


def _read_npz(path: Path) -> RawTable:
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise ValidationError(f"{path} could not be read as an .npz archive: {exc}") from None
    with archive:
        if "X" not in archive.files:
            raise ValidationError(f"{path}: no array 'X' (it holds {sorted(archive.files)})")
        try:
            X = archive["X"]
        except ValueError as exc:  # object arrays would need pickle
            raise ValidationError(f"{path}: 'X' cannot be read without pickle ({exc})") from None
        if X.ndim != 2:
            raise ValidationError(f"{path}: 'X' must be 2-D, got shape {X.shape}")
        names = [f"x{j}" for j in range(X.shape[1])]
        if "feature_names" in archive.files:
            fn = archive["feature_names"]
            if fn.ndim == 1 and len(fn) == X.shape[1]:
                names = [str(v) for v in fn]
        cols: dict[str, np.ndarray] = {}
        for j, c in enumerate(names):
            cols[c] = X[:, j] if X.dtype.kind in "biuf" else X[:, j].astype(object)
        for key in archive.files:
            if key in ("X", "feature_names") or key in cols:
                continue
            try:
                a = archive[key]
            except ValueError:
                continue
            if a.ndim == 1 and len(a) == X.shape[0]:
                cols[key] = a if a.dtype.kind in "biuf" else a.astype(str).astype(object)
    return RawTable(file_stem(path), str(path), cols, names)


# ------------------------------------------------------------------ a table in a node's .npz

_COL, _SITE = "col/", "__site__"


def table_to_arrays(data: Any) -> dict[str, np.ndarray] | None:
    """A site table as the arrays of a node's ``.npz`` (``col/<name>``: numbers, or text
    with ``""`` for a missing cell; the table's names as JSON); None for other data."""
    if not isinstance(data, RawTable):
        return None
    import json

    arrays = {}
    for c, v in data.columns.items():
        v = np.asarray(v)
        arrays[_COL + c] = v if v.dtype.kind in "biuf" else np.array(
            ["" if x is None else str(x) for x in v.tolist()], dtype=str)
    meta = {"name": data.name, "path": data.path, "features": list(data.features),
            "order": list(data.columns)}
    arrays[_SITE] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return arrays


def table_from_arrays(data: Any) -> RawTable | None:
    """The table :func:`table_to_arrays` wrote into an opened ``.npz``; None if it holds none."""
    if _SITE not in data.files:
        return None
    import json

    meta = json.loads(bytes(data[_SITE]).decode("utf-8"))
    cols = {}
    for c in meta["order"]:
        v = data[_COL + c]
        cols[c] = v if v.dtype.kind in "biuf" else np.array(
            [x if x != "" else None for x in v.tolist()], dtype=object)
    return RawTable(meta["name"], meta["path"], cols, list(meta["features"]))


def _register() -> None:
    from ..core.registry import TableFiles, register_table_files

    register_table_files(TableFiles(read=read_table, to_arrays=table_to_arrays,
                                    from_arrays=table_from_arrays))


_register()
