"""The site schema: feature columns, categories (one-hot over the union of the sites' sets),
label classes; encoding a site's table into the model's inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from .files_in import RawTable

__all__ = ["SiteSchema", "encode_table", "site_categories", "union_categories", "label_values",
           "label_indices", "category_text"]


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



# ----------------------------------------------------------------- encoding

def category_text(v: Any) -> str | None:
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
        out[c] = {t for v in table.columns[c] if (t := category_text(v)) is not None}
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
                # no value in the text: it may travel to the server
                f"{table.path}: row {i}, column {c!r}: the value is not a number "
                "(list the column in categorical=, or fix the value)") from None
    return out


def encode_table(table: RawTable, schema: SiteSchema, unknown: str = "error") -> np.ndarray:
    """The (n, d) float64 feature matrix of one site under ``schema`` (NaN where missing).

    A category the schema does not know (a new site at prediction time) is an
    error naming the file, row and column; with ``unknown="missing"`` (a late
    site, which missed the schema round) it is a missing value instead.
    """
    missing = [c for c in schema.features if c not in table.columns]
    if missing:
        raise ValidationError(f"{table.path}: column {missing[0]!r} is missing "
                              f"(the federation's features: {list(schema.features)}; its "
                              f"header was read as {list(table.columns)[:20]})")
    n = table.n_rows
    blocks = []
    for c in schema.features:
        if c in schema.categories:
            cats = schema.categories[c]
            index = {t: j for j, t in enumerate(cats)}
            B = np.zeros((n, len(cats)))
            for i, v in enumerate(table.columns[c]):
                t = category_text(v)
                if t is None:
                    B[i] = np.nan
                elif t in index:
                    B[i, index[t]] = 1.0
                elif unknown == "missing":
                    B[i] = np.nan
                else:
                    raise ValidationError(
                        f"{table.path}: row {i}, column {c!r}: the category is not one of "
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
        t = category_text(x)
        if t is None:
            raise ValidationError(f"{table.path}: row {i}, column {label!r}: the label is missing")
        texts.append(t)
    arr = np.array(texts)
    try:  # numbers written as text in one file stay numbers
        as_int = arr.astype(np.int64)
        return as_int
    except ValueError:
        return arr.astype(str)


def union_classes(labels: Sequence[np.ndarray], paths: Sequence[str]) -> tuple[Any, ...]:
    kinds = {("U" if y.dtype.kind in "US" else "n") for y in labels}
    if len(kinds) > 1:
        labels = [y.astype(str) for y in labels]
    vals = np.unique(np.concatenate(labels))
    return tuple(v.item() if isinstance(v, np.generic) else v for v in vals)



def label_indices(y: np.ndarray, classes: Sequence[Any], where: str,
                  column: str | None = None) -> np.ndarray:
    """Class index of every label; an unknown value is an error naming its row (and column)."""
    index = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(y), np.int64)
    for i, v in enumerate(y.tolist()):
        j = index.get(v)
        if j is None and isinstance(v, str):
            j = index.get(int(v)) if v.lstrip("-").isdigit() else None
        if j is None:
            j = index.get(str(v))
        if j is None:
            col = "" if column is None else f", column {column!r}"
            raise ValidationError(f"{where}: row {i}{col}: the label is not one of the "
                                  f"classes the model knows {list(classes)}")
        out[i] = j
    return out


