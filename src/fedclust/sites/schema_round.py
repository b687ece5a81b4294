"""The schema round: each site sends its column names, the category sets of the declared
categorical columns and its label values (sets, no rows); the server checks that every site
has the federation's columns and broadcasts the sorted union. Under privacy the sites send
no category or label set: the public ``categories`` / ``classes`` of the config take their
place, and each site checks its own values against them.

Client maths :func:`site_columns`, server maths :func:`pool_schema`; the messages
:class:`SiteColumns` (up) and :class:`SchemaBroadcast` (down) carry UTF-8 JSON
as ``uint8`` arrays, so their bytes are counted like any other message. The
round itself is part of :class:`fedclust.sites.deployed.SitePreprocessProtocol`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import INT, Message, reject
from .schema import SiteSchema, label_values, site_categories, union_categories, union_classes
from .files_in import RawTable

#: placeholder rows per site from which a private run's server builds the algorithm's
#: protocol (its shapes; no site sends its row count under privacy)
PRIVATE_SITE_ROWS = 512

__all__ = ["PRIVATE_SITE_ROWS", "SchemaRequest", "SiteColumns", "SchemaBroadcast", "site_columns", "pool_schema",
           "as_table", "text_array", "array_text"]


def text_array(obj: Any) -> np.ndarray:
    """JSON of ``obj`` as a ``uint8`` array (what a message carries)."""
    return np.frombuffer(json.dumps(obj, sort_keys=True).encode("utf-8"), dtype=np.uint8).copy()


def array_text(a: np.ndarray, sender: str = "message") -> Any:
    try:
        return json.loads(bytes(np.asarray(a, np.uint8)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError):
        reject(sender, "the schema text is not UTF-8 JSON")


@dataclass(frozen=True)
class SiteColumns(Message):
    """Site -> server: ``{"site", "columns", "features", "categories", "labels"}`` as JSON.

    ``columns``: every column name of the site's table; ``features``: those that
    count as features by default; ``categories``: per declared categorical column,
    the sorted set of its values; ``labels``: the sorted set of label values (only
    when the protocol needs class labels), ``"values"`` for a numeric target, or
    null. Bytes: the JSON text + 8 (the row count).
    """

    text: np.ndarray    # (b,) uint8
    n_rows: np.ndarray  # () int64
    schema: ClassVar = {"text": (INT, 1), "n_rows": (INT, 0)}
    kind: ClassVar[str] = "site_columns"

    def validate(self, sender: str) -> None:
        if self.text.dtype != np.uint8:
            reject(sender, f"text must be uint8, got {self.text.dtype}")
        d = array_text(self.text, sender)
        if not isinstance(d, dict) or not isinstance(d.get("columns"), list):
            reject(sender, "the site's columns are not a JSON list")
        if int(self.n_rows) < 1:
            reject(sender, "the site has no rows")


@dataclass(frozen=True)
class SchemaBroadcast(Message):
    """Server -> site: the federation's schema and the algorithm's protocol config (JSON)."""

    text: np.ndarray  # (b,) uint8
    schema: ClassVar = {"text": (INT, 1)}
    kind: ClassVar[str] = "schema_broadcast"


@dataclass(frozen=True)
class SchemaRequest:
    """What the config declares (``[data]``): the server checks the sites against it.

    ``features=None``: every column of the first site except label and id columns.
    ``labels``: ``"class"`` (sites send their label sets), ``"value"`` (a numeric
    target: sites send nothing about it) or ``"none"`` (the algorithm takes no labels).
    """

    features: tuple[str, ...] | None
    categorical: tuple[str, ...] = ()
    label: str | None = None
    id_columns: tuple[str, ...] = ()
    labels: str = "none"
    categories: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    classes: tuple[Any, ...] | None = None
    private: bool = False

    def __post_init__(self) -> None:
        if self.categories is not None and not isinstance(self.categories, tuple):
            object.__setattr__(self, "categories", public_categories(self.categories))
        if self.classes is not None:
            object.__setattr__(self, "classes", public_classes(self.classes))

    def to_json(self) -> dict[str, Any]:
        return {"features": None if self.features is None else list(self.features),
                "categorical": list(self.categorical), "label": self.label,
                "id_columns": list(self.id_columns), "labels": self.labels,
                "categories": None if self.categories is None else
                {c: list(v) for c, v in self.categories},
                "classes": None if self.classes is None else list(self.classes),
                "private": self.private}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "SchemaRequest":
        f = d.get("features")
        return cls(None if f is None else tuple(f), tuple(d.get("categorical", ())),
                   d.get("label"), tuple(d.get("id_columns", ())), d.get("labels", "none"),
                   d.get("categories"), d.get("classes"), bool(d.get("private", False)))

    def public(self) -> "SchemaRequest":
        """The request of a private run: the sites send no category or label set; the
        public ``categories`` / ``classes`` replace their unions. One line when missing."""
        missing = [c for c in self.categorical
                   if self.categories is None or c not in dict(self.categories)]
        if missing:
            raise ValidationError(
                f"privacy: [data] categories needs the public values of categorical column "
                f"{missing[0]!r} (categories = {{{missing[0]} = [...]}}): under [privacy] the "
                "sites' category sets are not sent")
        if self.labels == "class" and self.classes is None:
            raise ValidationError(
                "privacy: [data] classes = [...] (the public list of labels) is needed under "
                "[privacy]: the sites' label sets are not sent")
        return dataclasses.replace(self, private=True)


def public_categories(categories: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{column: [values]}`` as the request holds it (values as category text, sorted)."""
    from .schema import category_text, union_categories

    if not isinstance(categories, Mapping):
        raise ValidationError(f"categories must be a table {{column = [values]}}, got "
                              f"{categories!r}")
    sets = {}
    for c, vals in categories.items():
        if isinstance(vals, str) or not isinstance(vals, (list, tuple)) or not vals:
            raise ValidationError(f"categories: column {c!r} needs a non-empty list of values")
        sets[str(c)] = {t for v in vals if (t := category_text(v)) is not None}
    return tuple((c, v) for c, v in union_categories([sets]).items())


def public_classes(classes: Any) -> tuple[Any, ...]:
    """The public label list, sorted and without repeats."""
    if isinstance(classes, str) or not isinstance(classes, (list, tuple)) or not classes:
        raise ValidationError(f"classes must be a non-empty list of labels, got {classes!r}")
    vals = np.unique(np.asarray(classes))
    if vals.dtype.kind not in "biuUS":
        raise ValidationError(f"classes must be integers or strings, got {classes!r}")
    return tuple(v.item() for v in vals)


def as_table(data: Any, where: str) -> RawTable:
    """A site's data as a table: a :class:`RawTable` as is; an array ``X`` (or ``(X, y)``)
    with columns ``x0..x{d-1}`` (and ``y``)."""
    if isinstance(data, RawTable):
        return data
    X, y = data if isinstance(data, tuple) else (data, None)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValidationError(f"{where}: data of shape {X.shape}; expected a 2-D array")
    names = [f"x{j}" for j in range(X.shape[1])]
    cols = {c: X[:, j] for j, c in enumerate(names)}
    if y is not None:
        cols["y"] = np.asarray(y)
    return RawTable(where, where, cols, names)


def site_columns(table: RawTable, request: SchemaRequest, impute: str = "mean") -> SiteColumns:
    """Client maths of the schema round (names and sets only; no row leaves the site).

    The site also checks its own rows against the request (a value that is not a
    number in a numeric feature column, a missing label, a missing value with
    ``impute="none"``, no rows) and sends the first problem as one line
    (``"error"``), which stops the run with that line, naming file, row and column.
    """
    out: dict[str, Any] = {"site": table.name, "columns": list(table.columns),
                           "features": list(table.features), "categories": {},
                           "labels": None}
    try:
        _check_rows(table, request, impute)
        cats = site_categories(table, [c for c in request.categorical if c in table.columns])
        if request.private:   # the public sets replace the site's: check them here, send none
            _check_public(table, request, cats)
        else:
            out["categories"] = {c: sorted(v) for c, v in cats.items()}
        if request.labels == "class" and request.label in table.columns and not request.private:
            y = label_values(table, request.label)
            out["labels"] = "values" if y.dtype.kind == "f" else sorted(set(y.tolist()), key=str)
        elif request.labels == "value" and request.label in table.columns:
            label_values(table, request.label)  # a missing target is the site's error
    except ValidationError as exc:
        out["error"] = str(exc)
    # under privacy a site's row count stays on the site (the server builds shapes from
    # PRIVATE_SITE_ROWS placeholder rows)
    rows = 1 if request.private else max(table.n_rows, 1)
    return SiteColumns(text=text_array(out), n_rows=np.asarray(rows, np.int64))


def _check_public(table: RawTable, request: SchemaRequest, cats: Mapping[str, set]) -> None:
    """A private run's site: every category and label within the public sets (the line
    names the column, never a value: it travels to the server)."""
    public = dict(request.categories or ())
    for c, v in cats.items():
        if not v <= set(public.get(c, ())):
            raise ValidationError(f"site {table.name!r}: column {c!r} holds a category outside "
                                  "[data] categories (values are not shown under privacy)")
    if request.labels == "class" and request.label in table.columns:
        y = label_values(table, request.label)
        if y.dtype.kind == "f":
            raise ValidationError(f"site {table.name!r}: label column {request.label!r} holds "
                                  "numbers that are not class labels")
        if not set(y.tolist()) <= set(request.classes or ()) and \
                not {str(v) for v in y.tolist()} <= {str(v) for v in request.classes or ()}:
            raise ValidationError(f"site {table.name!r}: label column {request.label!r} holds a "
                                  "label outside [data] classes (values are not shown under "
                                  "privacy)")


def _check_rows(table: RawTable, request: SchemaRequest, impute: str) -> None:
    from .preprocess import check_no_missing
    from .schema import encode_table

    if table.n_rows == 0:
        raise ValidationError(f"{table.path}: the file has no rows")
    skip = set(request.id_columns) | ({request.label} if request.label else set())
    feats = [c for c in (request.features if request.features is not None else
                         [c for c in table.features if c not in skip])
             if c in table.columns]
    cats = site_categories(table, [c for c in request.categorical if c in feats])
    own = SiteSchema(tuple(feats), {c: tuple(sorted(v)) for c, v in cats.items()})
    X = encode_table(table, own)  # numbers parse; the site's own categories
    if impute == "none":
        check_no_missing(X, table.path, own.columns)


def pool_schema(replies: Mapping[int, SiteColumns], request: SchemaRequest
                ) -> tuple[SiteSchema, dict[int, str]]:
    """Server maths: check every site against the request, union categories and labels.

    Sites are taken in device-id order (the first gives the default features).
    Returns the schema and each device's site name. A column missing at a site
    is a one-line error naming the site and the column.
    """
    sites = {z: array_text(replies[z].text, f"device {z}") for z in sorted(replies)}
    names = {z: str(d.get("site", f"device {z}")) for z, d in sites.items()}
    for z, d in sites.items():
        if d.get("error"):
            raise ValidationError(str(d["error"]))

    def who(z: int) -> str:
        return f"site {names[z]!r} (device {z})"

    skip = set(request.id_columns) | ({request.label} if request.label else set())
    first = next(iter(sites))
    if request.features is None:
        feats = [c for c in sites[first]["features"] if c not in skip]
        feats += [c for c in request.categorical if c not in feats]
    else:
        feats = list(request.features)
    if not feats:
        raise ValidationError(f"{who(first)}: no feature columns left (label={request.label!r}, "
                              f"id_columns={list(request.id_columns)})")
    need = list(feats) + ([request.label] if request.labels != "none" else [])
    for z, d in sites.items():
        have = set(d["columns"])
        for c in need:
            if c not in have:
                others = [names[u] for u, e in sites.items() if c in e["columns"]]
                raise ValidationError(f"{who(z)}: column {c!r} is missing"
                                      + (f" (present at {', '.join(others[:3])})"
                                         if others else ""))
        extra = [c for c in d["features"] if c not in feats and c not in skip]
        if request.features is None and extra:
            raise ValidationError(f"{who(z)}: column {extra[0]!r} is not at site "
                                  f"{names[first]!r}; list the shared columns in features=")
    label = request.label if request.labels != "none" else None
    if request.private:   # public sets: nothing about the sites' values shapes the schema
        public = dict(request.categories or ())
        cats = {c: tuple(public[c]) for c in request.categorical}
        classes = request.classes if request.labels == "class" else None
        return SiteSchema(tuple(feats), cats, label, classes, tuple(request.id_columns)), names
    cats = union_categories([{c: set(v) for c, v in d["categories"].items()}
                             for d in sites.values()])
    cats = {c: cats.get(c, ()) for c in request.categorical}
    for c, v in cats.items():
        if not v:
            raise ValidationError(f"categorical column {c!r} has no value at any site")
    classes = None
    if request.labels == "class":
        sets = [d["labels"] for d in sites.values()]
        if not any(s == "values" for s in sets):
            classes = union_classes([np.asarray(s) for s in sets if s], [])
    return SiteSchema(tuple(feats), cats, label, classes, tuple(request.id_columns)), names



