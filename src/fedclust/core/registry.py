"""One registry: what each family declares so the shared machinery can serve it.

The CLI, the TOML configs, ``fedclust demo``, the experiment reports and the
Flower apps never name a family. Each family registers, in its own wing's
``__init__.py`` (imported by ``import fedclust``):

* its **protocols** and their result types (:func:`register_protocol`) — what a
  Flower client rebuilds from a name and a config, and what a Flower server
  writes back;
* its **algorithms** (:func:`register_algorithm`): the ``[algorithm] name`` of a
  config, the front-door estimator (whose keyword parameters *are* the allowed
  TOML keys), and hooks that fit it on a :class:`Federation` and report it;
* optionally **data sources** (:func:`register_data_source`), **baselines**
  (:func:`register_baseline`) and **demos** (:func:`register_demo`).

The site wing (:mod:`fedclust.sites`) registers how a node reads a site's own
file and how a site table travels in a node's ``.npz`` (:func:`register_table_files`),
so the Flower apps read site files without importing it.

Nothing here imports a wing; wings import this module.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .exceptions import ValidationError
from .protocol import Protocol

__all__ = [
    "Federation", "Algorithm", "DataSource", "Baseline",
    "register_protocol", "register_algorithm", "register_data_source", "register_baseline",
    "register_demo", "protocol_from_config", "accepts_privacy", "all_actions", "get_algorithm", "get_data_source",
    "estimator_params", "PROTOCOLS", "RESULT_TYPES", "ALGORITHMS", "DATA_SOURCES", "BASELINES",
    "DEMOS", "DEMO_DESCRIPTIONS", "Exported", "PREDICTORS",
    "register_predictor", "get_predictor", "export_centers", "CentersPredictor",
    "TableFiles", "register_table_files", "table_files",
]


@dataclass
class Federation:
    """A federation as the experiment runner hands it to a family.

    ``labels`` are per-device ground truth (cluster labels for clustering, the
    targets ``y`` for supervised families). ``test_devices`` / ``test_labels``
    hold per-device held-out data where a family evaluates on it; ``extra``
    carries source-specific truth (true regression weights, Byzantine ids, a
    communication graph, ...), JSON-ready or arrays. ``device_ids``: the devices' ids
    (None: 0..Z-1 by position); a site federation names its sites by
    :func:`fedclust.core.random.named_device_id`, so their random streams do not
    depend on which other sites are listed.
    """

    devices: list[np.ndarray]
    labels: list[np.ndarray] | None
    description: str
    test_devices: list[np.ndarray] | None = None
    test_labels: list[np.ndarray] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    device_ids: list[int] | None = None


def _default_fit(model: Any, fed: Federation, transport: Any) -> None:
    model.fit(fed.devices, transport=transport, device_ids=fed.device_ids)


def _centers_fields(model: Any) -> dict[str, Any]:
    return {"cluster_centers": np.asarray(model.cluster_centers_).tolist()}


@dataclass(frozen=True)
class Exported:
    """A fitted model as saved in ``model.npz``: a registered predictor ``kind``, its
    arrays (no object arrays: no pickle) and a JSON-ready ``meta``.

    ``meta["site_models"]``, where present, says which of the model's parts serves
    each training site (in the federation's device order); a predictor uses it when
    asked to predict for a known site.
    """

    kind: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)


#: predictor kind -> ``load(arrays, meta)`` returning an object with
#: ``task`` ("clustering" | "classification" | "regression") and ``predict(X, site=None)``
#: over preprocessed rows (``site``: position of a training site, or None for a new one)
PREDICTORS: dict[str, Callable[[Mapping[str, np.ndarray], Mapping[str, Any]], Any]] = {}


def register_predictor(kind: str, load: Callable[[Mapping[str, np.ndarray], Mapping[str, Any]],
                                                 Any]) -> None:
    _taken("predictor", kind, PREDICTORS, load)
    PREDICTORS[kind] = load


def get_predictor(exported: Exported) -> Any:
    try:
        load = PREDICTORS[exported.kind]
    except KeyError:
        raise ValidationError(f"unknown model kind {exported.kind!r}; registered: "
                              f"{sorted(PREDICTORS)}") from None
    return load(exported.arrays, exported.meta)


class CentersPredictor:
    """Nearest center of every row: the saved form of a center-based clustering."""

    task = "clustering"

    def __init__(self, centers: np.ndarray):
        self.centers = np.asarray(centers, dtype=np.float64)

    @classmethod
    def load(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "CentersPredictor":
        return cls(arrays["centers"])

    def predict(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        from .kmeans import assign

        X = np.asarray(X, dtype=np.float64)
        return assign(X, self.centers)[0].astype(np.int64)


def export_centers(model: Any, fed: Federation) -> Exported | None:
    """The default export: the final ``cluster_centers_`` (nearest-center assignment);
    None (no saved model) for an estimator without them."""
    centers = getattr(model, "cluster_centers_", None)
    if centers is None:
        return None
    return Exported("centers", {"centers": np.asarray(centers, np.float64)})


@dataclass(frozen=True)
class Algorithm:
    """An ``[algorithm] name = ...`` entry.

    Parameters
    ----------
    name : str
        The config name (``"kfed"``, ``"coreset"``, ``"fedavg"``, ...).
    estimator : type
        Front door; its keyword parameters (except ``random_state``) are the
        keys an ``[algorithm]`` table may set, so there is no second list.
    required : tuple of str
        Keys a config must give.
    fit : callable(model, federation, transport)
        Fits the estimator; default ``model.fit(fed.devices, transport=transport)``.
    report : callable(model, federation, cfg) -> dict, or None
        The ``metrics`` of ``result.json``; None: none. A clustering that ends in
        centers registers :func:`fedclust.clustering.clustering_report`.
    result_fields : callable(model) -> dict
        Extra top-level ``result.json`` fields; default the cluster centers.
    plot : callable(model, federation, result, path) -> Path or None, or None
        The figure; ``None`` for no figure. A clustering that ends in centers
        registers :func:`fedclust.clustering.plot_clustering`.
    columns : tuple of (metric key, column title)
        What the printed table shows for the algorithm and its baselines.
    baselines : tuple of str
        Registered baselines that make sense for it (a config's
        ``[baselines]`` table may turn on only these).
    rounds_note : callable(model, communication) -> str or None
        One line under the printed table that explains the ``rounds`` column
        (transport rounds) when they differ from the rounds a user set; default
        none.
    export : callable(model, federation) -> Exported, or None
        The fitted model as ``model.npz`` saves it and ``fedclust predict`` applies
        it (:func:`register_predictor`); default :func:`export_centers`.
    label_kind : {"class", "value"} or callable(params) -> str
        How labels read from site files reach it: class indices 0..C-1 (default)
        or numbers (regression targets); a callable decides from the
        ``[algorithm]`` parameters (a model that regresses takes numbers).
    """

    name: str
    estimator: type
    required: tuple[str, ...] = ()
    fit: Callable[[Any, Federation, Any], None] = _default_fit
    report: Callable[[Any, Federation, Mapping[str, Any]], dict[str, Any]] | None = None
    result_fields: Callable[[Any], dict[str, Any]] = _centers_fields
    plot: Callable[[Any, Federation, dict, Path], Path | None] | None = None
    columns: tuple[tuple[str, str], ...] = (("accuracy", "accuracy"), ("ari", "ARI"),
                                            ("cost_ratio_vs_centralized", "cost / centralized"))
    baselines: tuple[str, ...] = ("centralized", "distributed_lloyd")
    rounds_note: Callable[[Any, dict], str | None] | None = None
    export: Callable[[Any, Federation], Exported | None] | None = export_centers
    label_kind: str | Callable[[Mapping[str, Any]], str] = "class"


@dataclass(frozen=True)
class DataSource:
    """A ``[data] source = ...`` entry.

    ``build(seed, **keys) -> Federation`` when ``federated`` (the source makes
    the devices itself; a config must not have ``[partition]``), else
    ``build(seed, **keys) -> (X, y)`` pooled data that ``[partition]`` splits.
    The allowed keys are ``build``'s keyword parameters.
    """

    name: str
    build: Callable[..., Any]
    federated: bool = False


@dataclass(frozen=True)
class Baseline:
    """A ``[baselines] name = true`` entry: ``run(federation, cfg) -> dict`` (metrics, bytes, time)."""

    name: str
    run: Callable[[Federation, Mapping[str, Any]], dict[str, Any]]


#: protocol name -> protocol class
PROTOCOLS: dict[str, type[Protocol]] = {}
#: protocol name -> result dataclass (what ``Protocol.finish`` returns)
RESULT_TYPES: dict[str, type] = {}
ALGORITHMS: dict[str, Algorithm] = {}
DATA_SOURCES: dict[str, DataSource] = {}
BASELINES: dict[str, Baseline] = {}
#: ``fedclust demo NAME`` -> embedded config (the first registered is the default)
DEMOS: dict[str, dict[str, Any]] = {}
#: ``fedclust demo NAME`` -> one line for ``fedclust demo --help``
DEMO_DESCRIPTIONS: dict[str, str] = {}


def _taken(kind: str, name: str, table: Mapping[str, Any], obj: Any) -> None:
    if name in table and table[name] is not obj and table[name] != obj:
        raise ValidationError(f"{kind} {name!r} is already registered")


def register_protocol(protocol_cls: type[Protocol], result_cls: type) -> None:
    """Make ``protocol_cls`` runnable on every transport (its actions must be identifiers)."""
    for action in protocol_cls.reply_types:
        if not action.isidentifier():
            raise ValidationError(
                f"protocol {protocol_cls.name!r}: action {action!r} must be a Python identifier "
                "(Flower message types are 'query.<action>')")
    _taken("protocol", protocol_cls.name, PROTOCOLS, protocol_cls)
    PROTOCOLS[protocol_cls.name] = protocol_cls
    RESULT_TYPES[protocol_cls.name] = result_cls


def register_algorithm(algorithm: Algorithm) -> None:
    _taken("algorithm", algorithm.name, ALGORITHMS, algorithm)
    ALGORITHMS[algorithm.name] = algorithm


def register_data_source(source: DataSource) -> None:
    _taken("data source", source.name, DATA_SOURCES, source)
    DATA_SOURCES[source.name] = source


def register_baseline(baseline: Baseline) -> None:
    _taken("baseline", baseline.name, BASELINES, baseline)
    BASELINES[baseline.name] = baseline


@dataclass(frozen=True)
class TableFiles:
    """How node data that is a table (a site's own file) is read and travels.

    ``read(path)``: a site file (CSV, Parquet, an ``.npz`` with ``feature_names``)
    as the node's data. ``to_arrays(data)``: the arrays of a table to hand a node
    in its ``.npz`` (None when ``data`` is no table); ``from_arrays(npz)``: that
    table back (None when the ``.npz`` holds none).
    """

    read: Callable[[Any], Any]
    to_arrays: Callable[[Any], "dict[str, np.ndarray] | None"]
    from_arrays: Callable[[Any], Any]


_TABLE_FILES: list[TableFiles] = []


def register_table_files(files: TableFiles) -> None:
    """The site wing's table files (one; registered again, it replaces the first)."""
    _TABLE_FILES[:] = [files]


def table_files() -> TableFiles:
    """The registered :class:`TableFiles` (``import fedclust`` registers the site wing's)."""
    if not _TABLE_FILES:
        raise ValidationError("no reader of site tables is registered (import fedclust.sites)")
    return _TABLE_FILES[0]


def register_demo(name: str, config: Mapping[str, Any], description: str = "") -> None:
    """``fedclust demo NAME`` runs ``config`` (a full experiment config, checked when run).

    ``description`` is the line ``fedclust demo --help`` shows (default: the
    config's ``title``).
    """
    DEMOS[name] = dict(config)
    DEMO_DESCRIPTIONS[name] = description or str(config.get("title", ""))


def protocol_from_config(name: str, config: Mapping[str, Any]) -> Protocol:
    """Rebuild a protocol from its name and :meth:`Protocol.config`."""
    try:
        cls = PROTOCOLS[name]
    except KeyError:
        raise ValidationError(
            f"unknown protocol {name!r}; registered: {sorted(PROTOCOLS)}") from None
    return cls.from_config(dict(config))


def all_actions() -> list[str]:
    """Every client action of every registered protocol (sorted)."""
    return sorted({a for cls in PROTOCOLS.values() for a in cls.reply_types})


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValidationError(
            f"unknown algorithm {name!r}; registered: {sorted(ALGORITHMS)}") from None


def get_data_source(name: str) -> DataSource:
    try:
        return DATA_SOURCES[name]
    except KeyError:
        raise ValidationError(
            f"unknown data source {name!r}; registered: {sorted(DATA_SOURCES)}") from None


#: ``privacy`` is set by a config's own ``[privacy]`` table, not under ``[algorithm]``
_NOT_CONFIGURABLE = {"self", "random_state", "progress", "privacy"}


def keyword_params(func: Callable[..., Any], skip: Sequence[str] = ()) -> list[str]:
    """Names of the keyword-settable parameters of ``func`` (no ``*args``/``**kw``)."""
    sig = inspect.signature(func)
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in _NOT_CONFIGURABLE and p.name not in skip]


def accepts_privacy(algorithm: Algorithm) -> bool:
    """Whether the algorithm's estimator takes ``privacy=`` (a ``[privacy]`` table)."""
    return "privacy" in inspect.signature(algorithm.estimator.__init__).parameters


def estimator_params(algorithm: Algorithm) -> list[str]:
    """The ``[algorithm]`` keys of ``algorithm``: its estimator's ``__init__`` parameters."""
    return keyword_params(algorithm.estimator.__init__)


register_predictor("centers", CentersPredictor.load)
