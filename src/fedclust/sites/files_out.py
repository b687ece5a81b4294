"""A fitted run as files: ``model.npz`` (no pickle) and ``labels/<site>.csv``.

``model.npz`` holds, as plain arrays,

* ``__header__``: UTF-8 JSON — format and version, the algorithm name, the
  predictor kind and its ``meta``, the site schema (feature columns,
  categories, label column and classes), the preprocessing settings, the
  training sites' names and the task;
* ``model/<name>``: the fitted model's arrays (each family's export hook,
  :class:`fedclust.core.registry.Exported`);
* ``pre/<name>``: the pooled preprocessing statistics;
* ``forget/<round>/<device>/<field>``: the device summaries the server keeps to
  forget a site (:mod:`fedclust.unlearning.saved`; described in the header's
  ``"unlearning"`` entry).

:func:`load_model` returns a :class:`SavedModel` whose ``predict`` applies the
same encoding, the same preprocessing and the same model, with no refit. A
file named like a training site is predicted as that site was in training
(clustered models: the site's own cluster model).
"""

from __future__ import annotations

import csv
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.atomic import atomic_open, write_npz_atomic
from ..core.exceptions import ValidationError
from ..core.registry import Exported, get_predictor
from ..core.validation import overflow_limit

__all__ = ["SavedModel", "save_model", "load_model", "write_site_labels", "write_labels_csv"]

_FORMAT = "fedclust-model"
_VERSION = 1


class SavedModel:
    """A model read from ``model.npz``: ``predict(X | DataFrame | file)``, no refit.

    Attributes
    ----------
    algorithm : str
    task : {"clustering", "classification", "regression"}
    columns : list of str
        The encoded feature columns the model takes.
    classes : tuple or None
        Label classes (classification), in the order of the class indices.
    sites : list of str
        Names of the training sites.
    """

    def __init__(self, header: dict[str, Any], exported: Exported, preprocessor: Any,
                 path: str = "model"):
        from . import SiteSchema

        self.header = header
        self.path = path
        self.algorithm = header["algorithm"]
        self.schema = None if header.get("schema") is None else SiteSchema.from_json(
            header["schema"])
        self.columns = list(header["columns"])
        self.sites = list(header.get("sites", []))
        self.exported = exported
        self.preprocessor = preprocessor
        self.predictor = get_predictor(exported)
        self.task = self.predictor.task
        self.classes = self.schema.classes if self.schema is not None else None

    # -- inputs -----------------------------------------------------------------------
    def _encode(self, X: Any, where: str) -> np.ndarray:
        from . import RawTable, encode_table, frame_columns, label_indices

        if hasattr(X, "columns") and hasattr(X, "iloc"):  # a pandas DataFrame
            cols = frame_columns(X)
            X = RawTable(where, where, cols, list(cols))
        if isinstance(X, RawTable):
            if self.schema is None:
                raise ValidationError(f"{self.path}: the model was not trained on site files; "
                                      "pass an array of its columns")
            label = self.schema.label
            if (label is not None and label in X.columns and self.task == "classification"
                    and self.classes is not None):
                from . import label_values

                label_indices(label_values(X, label), self.classes, X.path, label)
            return encode_table(X, self.schema)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != len(self.columns):
            raise ValidationError(f"{where}: X has shape {X.shape}; the model takes "
                                  f"{len(self.columns)} columns {self.columns[:8]}")
        return X

    def transform(self, X: Any, *, where: str = "X") -> np.ndarray:
        """Encoded and preprocessed rows (what the model itself sees)."""
        return self._model_input(X, where)

    def _model_input(self, X: Any, where: str, columns: Sequence[str] | None = None
                     ) -> np.ndarray:
        """:meth:`transform`, its refusals naming ``columns`` (default the model's)."""
        E = self._encode(X, where)
        Z = E if self.preprocessor is None else self.preprocessor.transform(E, where=where)
        return self._finite(Z, where, columns)

    def _finite(self, Z: np.ndarray, where: str, columns: Sequence[str] | None = None
                ) -> np.ndarray:
        """``Z`` when every value is finite; else the first missing or non-finite value is
        refused by row and column (``columns``, default the model's encoded ones): the
        preprocessing imputes only where it was trained to, and a NaN row would otherwise
        get an arbitrary cluster."""
        names = self.columns if columns is None else list(columns)
        bad = ~np.isfinite(Z)
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise ValidationError(
                f"{where}: row {i}, column {_column(names, j)!r} is {Z[i, j]}; the model takes "
                "finite numbers only (impute or drop the row, or train with the "
                "preprocessing's impute setting)")
        huge = overflow_limit(np.finfo(np.float64))
        if Z.size and np.abs(Z).max() > huge:   # every squared distance would be inf
            i, j = (int(v) for v in np.argwhere(np.abs(Z) > huge)[0])
            raise ValidationError(
                f"{where}: row {i}, column {_column(names, j)!r} is {Z[i, j]:.3g}; squared "
                f"distances overflow float64 beyond about {huge:.1e}: bring the rows to the "
                "units of the training data")
        return Z

    def predict(self, X: Any, *, site: str | None = None) -> np.ndarray:
        """Cluster, class label or value of every row.

        ``X``: a pandas DataFrame with the training columns (raw, as in the
        site files), or an (n, d) array of the encoded columns (:attr:`columns`).
        ``site``: the name of a training site to predict as that site.
        """
        where = site or "X"
        Z = self.transform(X, where=where)
        pos = self.sites.index(site) if site in self.sites else None
        out = self.predictor.predict(Z, site=pos)
        if self.task == "classification" and self.classes is not None:
            return np.asarray(self.classes, dtype=object if _mixed(self.classes) else None)[out]
        return out

    def predict_file(self, path: str | os.PathLike) -> tuple[np.ndarray, Any]:
        """Predictions for a site file (CSV/Parquet/npz) and the table read."""
        from . import file_stem, read_table

        table = read_table(Path(path))
        if table.n_rows == 0:
            raise ValidationError(f"{path}: the file has no rows")
        if self.schema is None:  # trained on arrays: the file's feature columns, in order
            X = np.column_stack([np.asarray(table.columns[c], dtype=np.float64)
                                 if np.asarray(table.columns[c]).dtype.kind in "biuf" else
                                 _not_numeric(path, c) for c in table.features])
            Z = self._model_input(X, str(path), table.features)
        else:
            Z = self.transform(table, where=str(path))
        name = file_stem(Path(path))
        pos = self.sites.index(name) if name in self.sites else None
        out = self.predictor.predict(Z, site=pos)
        if self.task == "classification" and self.classes is not None:
            out = np.asarray(self.classes, dtype=object if _mixed(self.classes) else None)[out]
        return out, table


def _column(names: Sequence[str], j: int) -> str:
    return names[j] if j < len(names) else f"#{j}"


def _not_numeric(path: Any, column: str) -> np.ndarray:
    raise ValidationError(f"{path}: column {column!r} is not numeric; the model takes numbers")


def _mixed(values: Sequence[Any]) -> bool:
    return len({type(v) for v in values}) > 1


def save_model(path: str | os.PathLike, exported: Exported, *, algorithm: str,
               preprocessor: Any = None, schema: Any = None, columns: Sequence[str] | None = None,
               sites: Sequence[str] = (),
               unlearning: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None) -> Path:
    """Write ``model.npz`` (see the module docstring); returns the path.

    ``unlearning``: the kept device summaries (:func:`fedclust.unlearning.saved.saved_section`),
    saved as ``forget/...`` arrays and the header's ``"unlearning"`` entry.
    """
    path = Path(path)
    for name, a in exported.arrays.items():
        if np.asarray(a).dtype.kind == "O":
            raise ValidationError(f"model array {name!r} holds Python objects; export arrays "
                                  "of numbers or strings")
    if columns is None:
        columns = schema.columns if schema is not None else (
            preprocessor.feature_names_in_ if preprocessor is not None else [])
    header = {"format": _FORMAT, "version": _VERSION, "algorithm": algorithm,
              "kind": exported.kind, "meta": exported.meta,
              "schema": None if schema is None else schema.to_json(),
              "columns": list(columns), "sites": list(sites),
              "preprocess": None if preprocessor is None else preprocessor.to_json(),
              "task": get_predictor(exported).task}
    if unlearning is not None:
        header["unlearning"] = unlearning[1]
    arrays = {"__header__": np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)}
    arrays.update({f"model/{k}": np.asarray(v) for k, v in exported.arrays.items()})
    if preprocessor is not None:
        arrays.update({f"pre/{k}": v for k, v in preprocessor.to_arrays().items()})
    if unlearning is not None:
        arrays.update(unlearning[0])
    write_npz_atomic(path, arrays)   # a killed run leaves the previous model or none
    return path


def load_model(path: str | os.PathLike) -> SavedModel:
    """Read ``model.npz`` written by ``fedclust run`` (``allow_pickle=False``)."""
    from .preprocess import FederatedPreprocessor

    path = Path(path)
    if not path.is_file():
        raise ValidationError(f"model file {path} does not exist")
    def not_a_model(why: str) -> ValidationError:
        return ValidationError(f"not a fedclust model file: {path} ({why})")

    # numpy's own messages would advise allow_pickle, which a model file never needs
    if not zipfile.is_zipfile(path):
        raise not_a_model("not an .npz archive; `fedclust run` writes OUT/model.npz")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError:  # an object array: fedclust writes none and never unpickles
        raise not_a_model("it holds object arrays, which fedclust never writes") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise not_a_model(f"the archive cannot be read: {exc}") from None
    raw = arrays.pop("__header__", None)
    try:
        header = json.loads(bytes(raw).decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict) or header.get("format") != _FORMAT:
        raise not_a_model(f"an .npz archive without fedclust's header; it holds "
                          f"{sorted(arrays)[:10]}")
    if header.get("version") != _VERSION:
        raise ValidationError(f"{path}: model format version {header.get('version')} is not "
                              f"supported (this fedclust reads {_VERSION})")
    model = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
    pre = {k[len("pre/"):]: v for k, v in arrays.items() if k.startswith("pre/")}
    preprocessor = (FederatedPreprocessor.from_saved(pre, header["preprocess"])
                    if header.get("preprocess") else None)
    return SavedModel(header, Exported(header["kind"], model, header.get("meta", {})),
                      preprocessor, str(path))


def write_labels_csv(path: str | os.PathLike, values: np.ndarray, column: str, *,
                     ids: dict[str, np.ndarray] | None = None,
                     split: np.ndarray | None = None) -> Path:
    """One line per input row, in input order: ``row``, the id columns, ``column`` (, ``split``)."""
    path = Path(path)
    ids = ids or {}
    with atomic_open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row", *ids, column, *(["split"] if split is not None else [])])
        for i, v in enumerate(np.asarray(values).tolist()):
            w.writerow([i, *(ids[c][i] for c in ids), v,
                        *([split[i]] if split is not None else [])])
    return path


def write_site_labels(out_dir: str | os.PathLike, exp: Any) -> list[Path]:
    """``out_dir/labels/<site>.csv`` for every site of a site-data experiment."""
    sites = exp.federation.extra["sites"]
    folder = Path(out_dir) / "labels"
    folder.mkdir(parents=True, exist_ok=True)
    column = "cluster" if exp.predictor.task == "clustering" else "prediction"
    classes = sites.schema.classes
    written = []
    for z, name in enumerate(sites.names):
        values = exp.site_predictions[z]
        if exp.predictor.task == "classification" and classes is not None:
            values = np.asarray(classes, dtype=object)[values]
        split = None
        if sites.test is not None:
            split = np.full(len(sites.rows[z]), "train", dtype=object)
            split[sites.test[z]] = "test"
        written.append(write_labels_csv(folder / f"{name}.csv", values, column,
                                        ids=sites.federation.ids[z], split=split))
    return written
