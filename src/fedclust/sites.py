"""Site files in, a federation out: one file = one site (device), named by its file stem.

:func:`load_sites` reads CSV (``.csv``, ``.csv.gz``, ``.tsv``), Parquet
(``.parquet``, ``.pq``) and ``.npz`` files (``allow_pickle=False``; ``X`` with
optional ``feature_names`` and any 1-D arrays of the same length, such as
``y``), or one table split into sites by a column (:func:`load_table_sites`).
CSV and Parquet need pandas (and pyarrow for Parquet): ``pip install
'fedclust[io]'``; ``.npz`` needs nothing more than numpy.

What crosses sites here is what a federated schema round would carry: each
site's column names and, for categorical columns, the set of categories it
holds. The server's union of those sets (:func:`union_categories`) fixes the
one-hot columns, so every site encodes its rows identically without sending
one. The same :class:`SiteSchema` encodes a new site's file at prediction time
(:func:`encode_table`), so a saved model applies the training encoding.

Missing values (empty cells, ``NA``, ``?``, NaN) stay NaN in the numeric
columns; a missing categorical value is NaN in all of its indicator columns, so
mean imputation fills it with the pooled category frequencies. Federated
imputation and scaling are :class:`fedclust.preprocess.FederatedPreprocessor`.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .core.exceptions import ValidationError

__all__ = ["SiteFederation", "SiteSchema", "RawTable", "load_sites", "load_table_sites",
           "read_table", "encode_table", "union_categories", "expand_paths", "NA_VALUES"]

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


@dataclass(frozen=True)
class SiteSchema:
    """How raw site tables become feature matrices (JSON-ready: saved with a model).

    ``features`` are the raw feature columns in order; ``categories[c]`` the
    sorted union of the sites' categories of a categorical column ``c``, each
    expanded to one indicator column ``"c=value"``; ``label`` the label column
    (or None); ``classes`` the sorted union of label values (or None).
    """

    features: tuple[str, ...]
    categories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    label: str | None = None
    classes: tuple[Any, ...] | None = None
    id_columns: tuple[str, ...] = ()

    @property
    def columns(self) -> list[str]:
        """Names of the encoded feature columns (the model's inputs)."""
        out: list[str] = []
        for c in self.features:
            if c in self.categories:
                out.extend(f"{c}={v}" for v in self.categories[c])
            else:
                out.append(c)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"features": list(self.features),
                "categories": {k: list(v) for k, v in self.categories.items()},
                "label": self.label,
                "classes": None if self.classes is None else list(self.classes),
                "id_columns": list(self.id_columns)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SiteSchema":
        return cls(tuple(d["features"]), {k: tuple(v) for k, v in d["categories"].items()},
                   d.get("label"), None if d.get("classes") is None else tuple(d["classes"]),
                   tuple(d.get("id_columns", ())))


@dataclass
class SiteFederation:
    """Sites read by :func:`load_sites`.

    Attributes
    ----------
    devices : list of ndarray (n_z, d) float64
        Encoded features of every site, rows in file order (NaN where missing).
    labels : list of ndarray (n_z,) or None
        The label column of every site (numbers or strings), when ``label`` was given.
    names : list of str
        Site names (file stems, or the values of ``site_column``).
    columns : list of str
        The d encoded column names (``"sex=1"`` for a one-hot column).
    paths : list of str
        Where each site came from.
    ids : list of dict
        Per site, the ``id_columns`` as read (for output files).
    schema : SiteSchema
    """

    devices: list[np.ndarray]
    labels: list[np.ndarray] | None
    names: list[str]
    columns: list[str]
    paths: list[str]
    ids: list[dict[str, np.ndarray]]
    schema: SiteSchema

    @property
    def n_sites(self) -> int:
        return len(self.devices)

    @property
    def classes(self) -> tuple[Any, ...] | None:
        return self.schema.classes


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
            hint = (" (the folder holding the datasets, e.g. the project's ../shared/data)"
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


def _stem(path: Path) -> str:
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


def _frame_columns(df: Any) -> dict[str, np.ndarray]:
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
        sep = "\t" if ".tsv" in low else ","
        try:
            df = pd.read_csv(path, sep=sep, na_values=list(na_values), keep_default_na=True,
                             skipinitialspace=True)
        except pd.errors.EmptyDataError:
            raise ValidationError(f"{path}: the file is empty (no header, no rows)") from None
        except Exception as exc:
            raise ValidationError(f"{path} could not be read as CSV: {exc}") from None
    else:
        raise ValidationError(f"{path}: unknown file type; use .csv, .tsv, .parquet or .npz")
    dup = [c for c in df.columns if list(df.columns).count(c) > 1]
    if dup or any(str(c).startswith("Unnamed:") and df[c].isna().all() for c in df.columns):
        df = df.loc[:, [c for c in df.columns if not (str(c).startswith("Unnamed:")
                                                       and df[c].isna().all())]]
    cols = _frame_columns(df)
    return RawTable(_stem(path), str(path), cols, list(cols))


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
    return RawTable(_stem(path), str(path), cols, names)


# ----------------------------------------------------------------- encoding

def _category_text(v: Any) -> str | None:
    """A category as text, the same from CSV (``"1"``), Parquet (1) and npz (1.0)."""
    if v is None:
        return None
    if isinstance(v, (float, np.floating)):
        if np.isnan(v):
            return None
        if float(v).is_integer():
            return str(int(v))
        return repr(float(v))
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    s = str(v).strip()
    return s if s else None


def site_categories(table: RawTable, categorical: Sequence[str]) -> dict[str, set[str]]:
    """What a site sends in the schema round: the set of categories of each categorical column."""
    out = {}
    for c in categorical:
        out[c] = {t for v in table.columns[c] if (t := _category_text(v)) is not None}
    return out


def union_categories(sets: Sequence[dict[str, set[str]]]) -> dict[str, tuple[str, ...]]:
    """The server step of the schema round: the sorted union of every site's category sets."""
    keys: list[str] = []
    for s in sets:
        keys.extend(k for k in s if k not in keys)

    def order(t: str):
        try:
            return (0, float(t), t)
        except ValueError:
            return (1, 0.0, t)

    return {k: tuple(sorted(set().union(*(s.get(k, set()) for s in sets)), key=order))
            for k in keys}


def _numeric(table: RawTable, c: str) -> np.ndarray:
    v = table.columns[c]
    if v.dtype.kind in "biuf":
        return v.astype(np.float64)
    out = np.empty(len(v), dtype=np.float64)
    for i, x in enumerate(v):
        if x is None or (isinstance(x, float) and np.isnan(x)):
            out[i] = np.nan
            continue
        if isinstance(x, (bool, np.bool_)):
            out[i] = float(x)
            continue
        try:
            out[i] = float(x)
        except (TypeError, ValueError):
            raise ValidationError(
                f"{table.path}: row {i}, column {c!r}: value {x!r} is not a number "
                "(list the column in categorical=, or fix the value)") from None
    return out


def encode_table(table: RawTable, schema: SiteSchema) -> np.ndarray:
    """The (n, d) float64 feature matrix of one site under ``schema`` (NaN where missing).

    A category the schema does not know (a new site at prediction time) is an
    error naming the file, row and column.
    """
    missing = [c for c in schema.features if c not in table.columns]
    if missing:
        raise ValidationError(f"{table.path}: column {missing[0]!r} is missing "
                              f"(the federation's features: {list(schema.features)})")
    n = table.n_rows
    blocks = []
    for c in schema.features:
        if c in schema.categories:
            cats = schema.categories[c]
            index = {t: j for j, t in enumerate(cats)}
            B = np.zeros((n, len(cats)))
            for i, v in enumerate(table.columns[c]):
                t = _category_text(v)
                if t is None:
                    B[i] = np.nan
                elif t in index:
                    B[i, index[t]] = 1.0
                else:
                    raise ValidationError(
                        f"{table.path}: row {i}, column {c!r}: category {t!r} is not one of "
                        f"the federation's {list(cats)}")
            blocks.append(B)
        else:
            blocks.append(_numeric(table, c)[:, None])
    if not blocks:
        return np.zeros((n, 0))
    X = np.hstack(blocks)
    bad = np.isinf(X)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValidationError(f"{table.path}: row {i}, column {schema.columns[j]!r}: value is "
                              "infinite")
    return X


def label_values(table: RawTable, label: str) -> np.ndarray:
    """The label column as int64 (integral numbers) or str; a missing label is an error."""
    if label not in table.columns:
        raise ValidationError(f"{table.path}: label column {label!r} is missing "
                              f"(columns: {list(table.columns)[:20]})")
    v = table.columns[label]
    if v.dtype.kind in "biu":
        return v.astype(np.int64)
    if v.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise ValidationError(f"{table.path}: row {bad[0]}, column {label!r}: the label "
                                  "is missing")
        return v.astype(np.int64) if np.all(v == np.round(v)) else v
    texts = []
    for i, x in enumerate(v):
        t = _category_text(x)
        if t is None:
            raise ValidationError(f"{table.path}: row {i}, column {label!r}: the label is missing")
        texts.append(t)
    arr = np.array(texts)
    try:  # numbers written as text in one file stay numbers
        as_int = arr.astype(np.int64)
        return as_int
    except ValueError:
        return arr.astype(str)


def _union_classes(labels: Sequence[np.ndarray], paths: Sequence[str]) -> tuple[Any, ...]:
    kinds = {("U" if y.dtype.kind in "US" else "n") for y in labels}
    if len(kinds) > 1:
        labels = [y.astype(str) for y in labels]
    vals = np.unique(np.concatenate(labels))
    return tuple(v.item() if isinstance(v, np.generic) else v for v in vals)


# ------------------------------------------------------------------ front doors

def _build(tables: list[RawTable], label: str | None, features: Sequence[str] | None,
           categorical: Sequence[str] | None, id_columns: Sequence[str] | None
           ) -> SiteFederation:
    categorical = list(categorical or [])
    id_columns = list(id_columns or [])
    for t in tables:
        if t.n_rows == 0:
            raise ValidationError(f"{t.path}: the file has no rows")
    names = [t.name for t in tables]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValidationError(f"two site files share the name {sorted(dup)[0]!r}; "
                              "site names are file stems and must be distinct")
    skip = set(id_columns) | ({label} if label else set())
    if features is None:
        feats = [c for c in tables[0].features if c not in skip]
        feats += [c for c in categorical if c not in feats]
    else:
        feats = list(features)
        if isinstance(features, str):
            raise ValidationError(f"features={features!r} must be a list of column names")
        for c in categorical:
            if c not in feats:
                raise ValidationError(f"categorical column {c!r} is not in features={feats}")
    if label is not None and label in feats:
        raise ValidationError(f"label {label!r} is also listed as a feature")
    if not feats:
        raise ValidationError(f"{tables[0].path}: no feature columns left "
                              f"(label={label!r}, id_columns={id_columns})")
    for t in tables:
        for c in [*feats, *id_columns]:
            if c not in t.columns:
                others = [u.name for u in tables if c in u.columns]
                raise ValidationError(
                    f"{t.path}: column {c!r} is missing"
                    + (f" (present at {', '.join(others[:3])})" if others else ""))
        extra = [c for c in t.features if c not in feats and c not in skip]
        if features is None and extra:
            raise ValidationError(f"{t.path}: column {extra[0]!r} is not at site "
                                  f"{tables[0].name!r}; list the shared columns in features=")
    # schema round: category sets up, their union down; then the label classes likewise
    cats = union_categories([site_categories(t, categorical) for t in tables])
    for c, v in cats.items():
        if not v:
            raise ValidationError(f"categorical column {c!r} has no value at any site")
    labels = [label_values(t, label) for t in tables] if label is not None else None
    classes = None
    if labels is not None and not any(y.dtype.kind == "f" for y in labels):  # not regression
        classes = _union_classes(labels, [t.path for t in tables])
    if labels is not None and any(y.dtype.kind in "US" for y in labels):
        labels = [y.astype(str) for y in labels]
    schema = SiteSchema(tuple(feats), cats, label, classes, tuple(id_columns))
    devices = [encode_table(t, schema) for t in tables]
    ids = [{c: t.columns[c] for c in id_columns} for t in tables]
    return SiteFederation(devices, labels, names, schema.columns, [t.path for t in tables], ids,
                          schema)


def load_sites(paths: str | os.PathLike | Sequence[str | os.PathLike], label: str | None = None,
               features: Sequence[str] | None = None, categorical: Sequence[str] | None = None,
               id_columns: Sequence[str] | None = None, *,
               base_dir: str | os.PathLike | None = None,
               na_values: Sequence[str] = NA_VALUES) -> SiteFederation:
    """Read a federation of site files: one file = one site, named by its file stem.

    Parameters
    ----------
    paths : path, glob or list of them
        ``.csv`` / ``.tsv`` / ``.parquet`` / ``.npz`` by extension; globs are
        sorted; relative paths are taken from ``base_dir`` (default: the current
        folder); environment variables such as ``$FEDCLUST_DATA`` are expanded.
    label : str, optional
        Label column (an ``.npz`` array such as ``"y"`` or ``"y_binary"``);
        numbers or strings.
    features : list of str, optional
        Feature columns in order. Default: every column of the first site (the
        ``X`` columns of an ``.npz``) except ``label`` and ``id_columns``.
    categorical : list of str, optional
        Columns one-hot encoded over the union of the sites' categories.
    id_columns : list of str, optional
        Row identifiers: not features, copied into output files.
    na_values : sequence of str
        CSV cells read as missing.

    Returns
    -------
    SiteFederation
        ``.devices`` (n_z, d) float64 with NaN where missing, ``.labels``,
        ``.names``, ``.columns``, ``.schema``.

    Raises
    ------
    ValidationError
        One line naming the file, row and column: a glob matching nothing, a
        file with no rows, a column missing at one site, a non-numeric value
        in a numeric feature column, a missing label.
    """
    files = expand_paths(paths, base_dir)
    tables = [read_table(f, na_values=na_values) for f in files]
    return _build(tables, label, features, categorical, id_columns)


def load_table_sites(path: str | os.PathLike, site_column: str, label: str | None = None,
                     features: Sequence[str] | None = None,
                     categorical: Sequence[str] | None = None,
                     id_columns: Sequence[str] | None = None, *,
                     base_dir: str | os.PathLike | None = None,
                     na_values: Sequence[str] = NA_VALUES) -> SiteFederation:
    """One table split into sites by ``site_column`` (sites in order of first appearance).

    Other parameters as in :func:`load_sites`; ``site_column`` is not a feature.
    """
    files = expand_paths(path, base_dir)
    if len(files) != 1:
        raise ValidationError(f"path={str(path)!r} must name one table, matched {len(files)}")
    table = read_table(files[0], na_values=na_values)
    if table.n_rows == 0:
        raise ValidationError(f"{table.path}: the file has no rows")
    if site_column not in table.columns:
        raise ValidationError(f"{table.path}: site_column {site_column!r} is not a column "
                              f"(columns: {list(table.columns)[:20]})")
    keys = [_category_text(v) for v in table.columns[site_column]]
    if None in keys:
        raise ValidationError(f"{table.path}: row {keys.index(None)}, column {site_column!r}: "
                              "the site is missing")
    order = list(dict.fromkeys(keys))
    key_arr = np.array(keys, dtype=object)
    tables = []
    for s in order:
        rows = np.flatnonzero(key_arr == s)
        cols = {c: v[rows] for c, v in table.columns.items() if c != site_column}
        tables.append(RawTable(str(s), f"{table.path}[{site_column}={s}]", cols,
                               [c for c in table.features if c != site_column]))
    return _build(tables, label, features, categorical, id_columns)


# ------------------------------------------------------- as a configured data source

@dataclass
class SiteInfo:
    """What the experiment runner keeps about site data (``Federation.extra["sites"]``).

    ``rows[z]`` is every row of site z in file order (encoded, NaN where missing);
    ``train[z]`` / ``test[z]`` index into it; ``targets[z]`` the label of every row
    (class index, or value for regression), or None.
    """

    federation: SiteFederation
    rows: list[np.ndarray]
    train: list[np.ndarray]
    test: list[np.ndarray] | None
    targets: list[np.ndarray] | None

    @property
    def names(self) -> list[str]:
        return self.federation.names

    @property
    def schema(self) -> SiteSchema:
        return self.federation.schema


def label_indices(y: np.ndarray, classes: Sequence[Any], where: str) -> np.ndarray:
    """Class index of every label; an unknown value is an error naming its row."""
    index = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(y), np.int64)
    for i, v in enumerate(y.tolist()):
        j = index.get(v)
        if j is None and isinstance(v, str):
            j = index.get(int(v)) if v.lstrip("-").isdigit() else None
        if j is None:
            j = index.get(str(v))
        if j is None:
            raise ValidationError(f"{where}: row {i}: label {v!r} is not one of the classes "
                                  f"the model knows {list(classes)}")
        out[i] = j
    return out


def to_federation(sf: SiteFederation, seed: int, test_fraction: float | None = None,
                  description: str | None = None) -> Any:
    """A :class:`~fedclust.core.registry.Federation` of the sites' training rows.

    Labels become class indices (0..C-1 over the union of the sites' classes;
    regression targets stay values). ``test_fraction`` holds out that share of
    every site's rows (at least one row stays for training), drawn from ``seed``.
    """
    from .core.registry import Federation
    from .core.validation import check_float

    targets = None
    if sf.labels is not None:
        targets = ([label_indices(y, sf.classes, p) for y, p in zip(sf.labels, sf.paths)]
                   if sf.classes is not None else [np.asarray(y, np.float64) for y in sf.labels])
    train, test = [], None
    if test_fraction:
        check_float(test_fraction, "test_fraction", min_value=0.0, max_value=1.0,
                    min_inclusive=False)
        if test_fraction >= 1.0:
            raise ValidationError(f"test_fraction={test_fraction} must be < 1")
        test = []
        for z, X in enumerate(sf.devices):
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7E57, z]))
            n = len(X)
            n_test = min(int(round(test_fraction * n)), n - 1)
            perm = rng.permutation(n)
            test.append(np.sort(perm[:n_test]))
            train.append(np.sort(perm[n_test:]))
    else:
        train = [np.arange(len(X)) for X in sf.devices]
    info = SiteInfo(sf, sf.devices, train, test, targets)
    n = sum(len(X) for X in sf.devices)
    desc = description or (f"{sf.n_sites} sites ({', '.join(sf.names[:4])}"
                           f"{', ...' if sf.n_sites > 4 else ''}; {n} rows, "
                           f"{len(sf.columns)} columns)")
    return Federation(
        devices=[X[i] for X, i in zip(sf.devices, train)],
        labels=None if targets is None else [y[i] for y, i in zip(targets, train)],
        description=desc,
        test_devices=None if test is None else [X[i] for X, i in zip(sf.devices, test)],
        test_labels=None if (test is None or targets is None) else
        [y[i] for y, i in zip(targets, test)],
        extra={"sites": info})


def files_source(seed: int, *, paths: Any, label: str | None = None,
                 features: Sequence[str] | None = None, categorical: Sequence[str] | None = None,
                 id_columns: Sequence[str] | None = None, test_fraction: float | None = None,
                 base_dir: str | None = None) -> Any:
    """``[data] source = "files"``: one file per site (see :func:`load_sites`)."""
    sf = load_sites(paths, label, features, categorical, id_columns, base_dir=base_dir)
    return to_federation(sf, seed, test_fraction)


def table_source(seed: int, *, path: str, site_column: str, label: str | None = None,
                 features: Sequence[str] | None = None, categorical: Sequence[str] | None = None,
                 id_columns: Sequence[str] | None = None, test_fraction: float | None = None,
                 base_dir: str | None = None) -> Any:
    """``[data] source = "table"``: one table split into sites by ``site_column``."""
    sf = load_table_sites(path, site_column, label, features, categorical, id_columns,
                          base_dir=base_dir)
    return to_federation(sf, seed, test_fraction)


def _register() -> None:
    from .core.registry import DataSource, register_data_source

    register_data_source(DataSource("files", files_source, federated=True))
    register_data_source(DataSource("table", table_source, federated=True))


_register()
