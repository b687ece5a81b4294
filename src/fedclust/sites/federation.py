"""Site federations: :func:`load_sites`, :func:`load_table_sites`, and the ``files`` /
``table`` data sources of the experiment configs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.random import named_device_ids
from .schema_round import public_categories, public_classes
from .schema import (SiteSchema, category_text, encode_table, label_indices, label_values,
                     site_categories, union_categories, union_classes)
from .files_in import NA_VALUES, RawTable, expand_paths, read_table

__all__ = ["SiteFederation", "SiteInfo", "load_sites", "load_table_sites", "to_federation",
           "files_source", "table_source", "as_values", "site_request", "site_paths"]


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



# ------------------------------------------------------------------ front doors

def _build(tables: list[RawTable], label: str | None, features: Sequence[str] | None,
           categorical: Sequence[str] | None, id_columns: Sequence[str] | None,
           categories: Any = None, classes: Any = None) -> SiteFederation:
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
                    + (f" (present at {', '.join(others[:3])})" if others else "")
                    + f"; its header was read as {list(t.columns)[:20]}")
        extra = [c for c in t.features if c not in feats and c not in skip]
        if features is None and extra:
            raise ValidationError(f"{t.path}: column {extra[0]!r} is not at site "
                                  f"{tables[0].name!r}; list the shared columns in features=")
    # schema round: category sets up, their union down; then the label classes likewise
    cats = union_categories([site_categories(t, categorical) for t in tables])
    for c, v in cats.items():
        if not v:
            raise ValidationError(f"categorical column {c!r} has no value at any site")
    if categories is not None:   # public sets (a private run): they replace the unions
        public = dict(public_categories(categories))
        for c, own in cats.items():
            if c not in public:
                raise ValidationError(f"categories: categorical column {c!r} has no public "
                                      "values")
            if not set(own) <= set(public[c]):
                raise ValidationError(f"column {c!r} holds a category outside categories=")
        cats = {c: public[c] for c in cats}
    labels = [label_values(t, label) for t in tables] if label is not None else None
    union = None
    if labels is not None and not any(y.dtype.kind == "f" for y in labels):  # not regression
        union = union_classes(labels, [t.path for t in tables])
        if classes is not None:
            public_set = public_classes(classes)
            if not {str(v) for v in union} <= {str(v) for v in public_set}:
                raise ValidationError("a site holds a label outside classes=")
            union = public_set
    classes = union
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
               na_values: Sequence[str] = NA_VALUES, categories: Any = None,
               classes: Any = None) -> SiteFederation:
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
    categories : dict column -> list, optional
        Public category values per categorical column: they replace the union
        of the sites' categories (a site value outside them is an error).
    classes : list, optional
        Public label values: they replace the union of the sites' labels.

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
    return _build(tables, label, features, categorical, id_columns, categories, classes)


def load_table_sites(path: str | os.PathLike, site_column: str, label: str | None = None,
                     features: Sequence[str] | None = None,
                     categorical: Sequence[str] | None = None,
                     id_columns: Sequence[str] | None = None, *,
                     base_dir: str | os.PathLike | None = None,
                     na_values: Sequence[str] = NA_VALUES, categories: Any = None,
                     classes: Any = None) -> SiteFederation:
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
    keys = [category_text(v) for v in table.columns[site_column]]
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
    return _build(tables, label, features, categorical, id_columns, categories, classes)


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


def to_federation(sf: SiteFederation, seed: int, test_fraction: float | None = None,
                  description: str | None = None, site_ids: str = "position") -> Any:
    """A :class:`~fedclust.core.registry.Federation` of the sites' training rows.

    Labels become class indices (0..C-1 over the union of the sites' classes;
    regression targets stay values). ``test_fraction`` holds out that share of
    every site's rows (at least one row stays for training), drawn from ``seed``.

    ``site_ids``: ``"position"`` numbers the sites 0..Z-1 in the order listed;
    ``"name"`` gives each site the id :func:`fedclust.core.random.named_device_id` of
    its name, so its random streams (and its test rows) are the same in every run that
    lists it, whichever other sites are listed: a run without a site then equals the
    run with that site forgotten (``fedclust forget``).
    """
    from ..core.registry import Federation
    from ..core.validation import check_choice, check_float

    site_ids = check_choice(site_ids, "site_ids", ("position", "name"))
    ids = named_device_ids(sf.names) if site_ids == "name" else None

    targets = None
    if sf.labels is not None:
        targets = ([label_indices(y, sf.classes, p, sf.schema.label) for y, p in zip(sf.labels, sf.paths)]
                   if sf.classes is not None else [np.asarray(y, np.float64) for y in sf.labels])
    train, test = [], None
    if test_fraction:
        check_float(test_fraction, "test_fraction", min_value=0.0, max_value=1.0,
                    min_inclusive=False)
        if test_fraction >= 1.0:
            raise ValidationError(f"test_fraction={test_fraction} must be < 1")
        test = []
        for z, X in enumerate(sf.devices):
            key = z if ids is None else ids[z]
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7E57, key]))
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
        extra={"sites": info}, device_ids=ids)


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def as_values(fed: Any) -> Any:
    """The same site federation with the labels as numbers (regression targets), not classes.

    Integer labels are read as classes by default; an algorithm that fits values
    (``Algorithm.label_kind == "value"``) gets them back as floats.
    """
    from dataclasses import replace

    info: SiteInfo | None = fed.extra.get("sites")
    if info is None or info.targets is None or info.schema.classes is None:
        return fed
    sf = info.federation
    for y, path in zip(sf.labels, sf.paths):
        if y.dtype.kind in "US":
            i = next(i for i, v in enumerate(y.tolist()) if not _is_number(v))
            raise ValidationError(f"{path}: row {i}, column {sf.schema.label!r}: label {y[i]!r} "
                                  "is not a number; this algorithm fits numbers to the label "
                                  "(a regression), not classes")
    values = [np.asarray(y, np.float64) for y in sf.labels]
    sf = replace(sf, schema=replace(sf.schema, classes=None))
    info = SiteInfo(sf, info.rows, info.train, info.test, values)
    return replace(fed, labels=[y[i] for y, i in zip(values, info.train)],
                   test_labels=None if info.test is None else
                   [y[i] for y, i in zip(values, info.test)],
                   extra=dict(fed.extra, sites=info))


def files_source(seed: int, *, paths: Any, label: str | None = None,
                 features: Sequence[str] | None = None, categorical: Sequence[str] | None = None,
                 id_columns: Sequence[str] | None = None, test_fraction: float | None = None,
                 base_dir: str | None = None, categories: Any = None, classes: Any = None,
                 site_ids: str = "position") -> Any:
    """``[data] source = "files"``: one file per site (see :func:`load_sites`); public
    ``categories`` / ``classes`` replace the sites' unions; ``site_ids`` as in
    :func:`to_federation`."""
    sf = load_sites(paths, label, features, categorical, id_columns, base_dir=base_dir,
                    categories=categories, classes=classes)
    return to_federation(sf, seed, test_fraction, site_ids=site_ids)


def table_source(seed: int, *, path: str, site_column: str, label: str | None = None,
                 features: Sequence[str] | None = None, categorical: Sequence[str] | None = None,
                 id_columns: Sequence[str] | None = None, test_fraction: float | None = None,
                 base_dir: str | None = None, categories: Any = None, classes: Any = None,
                 site_ids: str = "position") -> Any:
    """``[data] source = "table"``: one table split into sites by ``site_column``;
    ``site_ids`` as in :func:`to_federation`."""
    sf = load_table_sites(path, site_column, label, features, categorical, id_columns,
                          base_dir=base_dir, categories=categories, classes=classes)
    return to_federation(sf, seed, test_fraction, site_ids=site_ids)



def site_request(data: Mapping[str, Any]) -> Any:
    """The :class:`~fedclust.sites.schema_round.SchemaRequest` of a ``[data]`` table of site
    files (``source = "files"``), or None for any other source. Reads no file."""
    from .schema_round import SchemaRequest

    if data.get("source") != "files":
        return None
    feats = data.get("features")
    if isinstance(feats, str):
        raise ValidationError(f"features={feats!r} must be a list of column names")
    cats = tuple(data.get("categorical") or ())
    if feats is not None:
        for c in cats:
            if c not in feats:
                raise ValidationError(f"categorical column {c!r} is not in features={list(feats)}")
    label = data.get("label")
    if label is not None and feats is not None and label in feats:
        raise ValidationError(f"label {label!r} is also listed as a feature")
    return SchemaRequest(None if feats is None else tuple(feats), cats, label,
                         tuple(data.get("id_columns") or ()),
                         categories=data.get("categories"), classes=data.get("classes"))


def site_paths(data: Mapping[str, Any]) -> list[str]:
    """The site files of a ``[data]`` table (names only; nothing is read)."""
    return [str(p) for p in expand_paths(data["paths"], data.get("base_dir"))]


def _register() -> None:
    from ..core.registry import DataSource, register_data_source

    register_data_source(DataSource("files", files_source, federated=True))
    register_data_source(DataSource("table", table_source, federated=True))


_register()
