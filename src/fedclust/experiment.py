"""Run one configured experiment (see :mod:`fedclust.config`) and report it.

Used by ``fedclust run`` / ``fedclust demo``, the Flower deploy path and the
benchmarks: build the federation, fit the registered algorithm on a transport,
run the baselines it asks for on the same federation, report the metrics, and
return a JSON-ready dict. Every family-specific step goes through
:mod:`fedclust.core.registry`; nothing here names a family.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .configured import build_estimator, capture_run, label_kind
from .core.exceptions import ConfigError
from .core.protocol import Protocol
from .core.registry import BASELINES, Federation, get_algorithm, get_data_source, get_predictor
from .sim.transport import InProcessTransport
from .sites.preprocess import PREPROCESS_BUDGET_SHARE

__all__ = ["Federation", "Experiment", "build_federation", "build_estimator", "build_protocol",
           "make_transport", "run_experiment", "preprocess_federation", "TRANSPORTS",
           "label_kind"]

TRANSPORTS = ("inprocess", "flower")


@dataclass
class Experiment:
    """``result`` is what ``result.json`` holds; ``model`` the fitted estimator.

    ``preprocessor`` is the fitted federated preprocessing (or None); ``exported``
    the model as ``model.npz`` saves it and ``predictor`` its loaded form (None
    for an algorithm without an export hook); ``site_predictions`` the saved
    model's output for every row of every site, in file order (site data only).
    """

    result: dict[str, Any]
    model: Any
    federation: Federation
    preprocessor: Any = None
    exported: Any = None
    predictor: Any = None
    site_predictions: list[Any] | None = None


def build_federation(cfg: Mapping[str, Any]) -> Federation:
    """The devices (and true labels) described by ``cfg['data']`` and ``cfg['partition']``."""
    from .sim.partition import apply_partition, partition

    seed = cfg["seed"]
    data = dict(cfg["data"])
    source = get_data_source(data.pop("source"))
    if source.federated:
        if cfg.get("privacy") and source.name in ("files", "table"):
            _check_public_sets(cfg)
        return source.build(seed, **data)
    n_samples = data.pop("n_samples", None)
    if n_samples is not None:
        from .core.validation import check_int

        n_samples = check_int(n_samples, "n_samples", min_value=1)
    X, y = source.build(seed, **data)
    if n_samples is not None and n_samples < len(X):
        keep = np.sort(np.random.default_rng(seed).choice(len(X), size=int(n_samples),
                                                          replace=False))
        X, y = X[keep], y[keep]
    part = dict(cfg["partition"])
    kind = part.pop("kind")
    n_devices = part.pop("n_devices")
    parts = partition(kind, X, y, n_devices, random_state=seed, **part)
    devices, labels = apply_partition(X, y, parts)
    return Federation(devices, labels,
                      f"{source.name} ({len(X)} points, {kind} over {n_devices} devices)")


def _check_public_sets(cfg: Mapping[str, Any]) -> None:
    """Under ``[privacy]``, site data's category sets and (for an estimator that takes
    ``classes``) label set come from ``[data] categories`` / ``classes``: one line if not."""
    import inspect

    from .sites import site_request

    data = cfg["data"]
    estimator = get_algorithm(cfg["algorithm"]["name"]).estimator
    takes_classes = "classes" in inspect.signature(estimator).parameters
    request = site_request({**data, "source": "files"})
    labels = "class" if data.get("label") is not None and takes_classes else "none"
    try:
        replace(request, labels=labels).public()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def make_transport(cfg: Mapping[str, Any], transport: str = "inprocess", *,
                   n_devices: int | None = None, device_ids: Any = None, checkpoint_dir: Any = None,
                   resume: bool = False):
    """The transport named ``transport`` with the faults of ``cfg['simulation']``.

    ``checkpoint_dir`` / ``resume``: the in-process transport writes a checkpoint
    there after every round and resumes from it (:mod:`fedclust.sim.resume`).

    ``byzantine = α`` makes a fraction α of the devices (``device_ids``, default
    0..n_devices-1, drawn from the seed) lie on the wire with ``attack`` / ``attack_scale``
    (:class:`fedclust.sim.byzantine.ByzantineTamper`), on either transport.
    """
    sim = cfg.get("simulation", {})
    secure = sim.get("secure_aggregation", False)
    if secure == "signed":
        from .core.secure_sum import SecureAggregation

        secure = SecureAggregation(signed=True)
    kw = dict(dropout=sim.get("dropout", 0.0), late=sim.get("late", 0.0),
              secure_aggregation=secure or False)
    alpha = sim.get("byzantine", 0.0)
    tamper = None
    if alpha:
        from .sim.byzantine import ByzantineTamper

        tamper = ByzantineTamper(range(n_devices or 0) if device_ids is None else device_ids,
                                 alpha, cfg["seed"],
                                 attack=sim.get("attack", "large-norm"),
                                 scale=sim.get("attack_scale", 100.0))
    elif {"attack", "attack_scale"} & set(sim):
        raise ConfigError("[simulation] attack/attack_scale need byzantine = <fraction> > 0")
    if transport == "inprocess":
        return InProcessTransport(progress=bool(sim.get("progress", False)), tamper=tamper,
                                  checkpoint_dir=checkpoint_dir, resume=resume, **kw)
    if checkpoint_dir is not None:
        raise ConfigError("checkpoints and --resume need the in-process transport (on a "
                          "Flower deployment: fedclust flower run --resume)")
    from .flower.transport import FlowerSimulationTransport  # optional extra

    return FlowerSimulationTransport(tamper=tamper, progress=bool(sim.get("progress", False)),
                                     **kw)


def build_protocol(cfg: Mapping[str, Any], federation: Federation | None = None, *,
                   preprocess_on_nodes: bool = False, count_sites: bool = True
                   ) -> tuple[Protocol, dict[int, Any], int]:
    """The protocol, device data and seed that ``fedclust run`` would run for ``cfg``.

    Goes through the registered estimator and its validation (the estimator's
    ``fit`` hands its protocol to the transport, which is captured here), so a
    deployed run is the in-process run. Device data is ``X`` or ``(X, y)``.

    ``preprocess_on_nodes`` (the deployed app, site files): no site file is read;
    the protocol is :class:`~fedclust.sites.deployed.SitePreprocessProtocol`, whose
    schema round and preprocessing round run on the nodes before the algorithm's
    own rounds; the device data are the site files' paths (counted only, when
    ``count_sites``). Otherwise, on preprocessed site data, the protocol is
    :class:`~fedclust.sites.transform.SiteTransformProtocol` (the pooled transform
    fitted here travels in its config) over the raw rows.
    """
    if preprocess_on_nodes:
        from .sites import site_request

        if cfg["data"].get("source") == "table":
            raise ConfigError("a deployed app takes one file per site: [data] source = \"files\" "
                              "(write each site's rows to its own file)")
        request = site_request(cfg["data"])
        if request is not None:
            from .sites.deployed_app import deployed_protocol

            return deployed_protocol(cfg, request, count_sites)
    fed = federation or build_federation(cfg)
    fed, pre = preprocess_federation(cfg, fed)
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    sites = fed.extra.get("sites") if isinstance(fed.extra, Mapping) else None
    cap = capture_run(algorithm, build_estimator(cfg, pre, getattr(getattr(sites, "schema", None),
                                                                   "classes", None)), fed,
                      bool(cfg.get("simulation", {}).get("secure_aggregation", False)))
    if pre is None:
        return cap.protocol, cap.devices, int(cap.seed)
    # preprocessed data: the nodes get the raw rows and the schema + pooled transform
    # in the protocol, and preprocess themselves
    from .sites.transform import SiteTransformProtocol

    protocol = SiteTransformProtocol.wrap(cap.protocol, pre,
                                          None if sites is None else sites.schema)
    raw = dict(zip(fed.device_ids or range(len(fed.devices)), fed.extra["raw_devices"]))
    devices = {z: (raw[z], d[1]) if isinstance(d, tuple) else raw[z]
               for z, d in cap.devices.items()}
    return protocol, devices, int(cap.seed)


def preprocess_federation(cfg: Mapping[str, Any], fed: Federation, transport: str = "inprocess",
                          *, checkpoint_dir: Any = None, resume: bool = False
                          ) -> tuple[Federation, Any]:
    """Fit ``[preprocess]`` (default for site data) in one counted round; transform every device.

    Runs on the same transport as the algorithm, without the simulated faults of
    ``[simulation]`` (they are the algorithm's experiment); with its secure
    aggregation, as two rounds of secure sums. Returns the
    transformed federation (``extra["site_rows"]``: every site row, transformed)
    and the fitted :class:`~fedclust.sites.preprocess.FederatedPreprocessor`, or
    ``(fed, None)`` when there is nothing to do.
    """
    sites = fed.extra.get("sites")
    if sites is not None and label_kind(cfg) == "value":
        from .sites import as_values

        fed = as_values(fed)
        sites = fed.extra["sites"]
    opts = dict(cfg.get("preprocess") or {})
    if not opts and sites is None:
        return fed, None
    from .sites.preprocess import FederatedPreprocessor, check_no_missing

    progress = bool(cfg.get("simulation", {}).get("progress", False))
    if cfg.get("privacy"):  # the run's budget covers the preprocessing release too
        from .privacy import DifferentialPrivacy

        opts["privacy"] = DifferentialPrivacy.from_config(cfg["privacy"])
        opts.setdefault("budget_share", PREPROCESS_BUDGET_SHARE)
        if "bounds" not in opts:
            raise ConfigError("[preprocess] needs bounds = [[low, high], ...] (a public range "
                              "per column) under [privacy]: the preprocessing round is private "
                              "too")
        if opts["privacy"].unit == "device" and "site_rows" not in opts:
            raise ConfigError("[preprocess] needs site_rows = N (the most rows one site may "
                              "weigh, a public number) under [privacy] unit = \"device\": the "
                              "preprocessing round hides whole sites too")
    pre = FederatedPreprocessor(**opts, progress=progress)
    columns = names = None
    if sites is not None:
        columns, names = sites.federation.columns, sites.names
        if pre.impute == "none":  # name the file row, not the training row
            for X, path in zip(sites.rows, sites.federation.paths):
                check_no_missing(X, path, columns)
    # secure aggregation covers the preprocessing round too (its summed form)
    secure = cfg.get("simulation", {}).get("secure_aggregation", False)
    wire = make_transport({"seed": cfg["seed"],
                           "simulation": {"progress": progress, "secure_aggregation": secure}},
                          transport, n_devices=len(fed.devices), checkpoint_dir=checkpoint_dir,
                          resume=resume)
    # a site dropped or late in [simulation] is absent from the preprocessing round too
    # (as on a deployed run): the pooled statistics are those of the sites that take part
    if sites is not None:
        from .sites.algorithm import present_sites

        keep = present_sites(cfg, fed)
    else:
        keep = list(range(len(fed.devices)))
    pre.fit([fed.devices[z] for z in keep], columns=columns,
            names=None if names is None else [names[z] for z in keep], transport=wire)
    where = names or [f"device {z}" for z in range(len(fed.devices))]
    extra = dict(fed.extra, raw_devices=fed.devices)
    if sites is not None:
        extra["site_rows"] = [pre.transform(X, where=p)
                              for X, p in zip(sites.rows, sites.federation.paths)]
    new = replace(fed, devices=[pre.transform(X, where=w) for X, w in zip(fed.devices, where)],
                  test_devices=None if fed.test_devices is None else
                  [pre.transform(X, where=w) for X, w in zip(fed.test_devices, where)],
                  extra=extra)
    return new, pre


def _site_report(predictor: Any, fed: Federation) -> tuple[list[dict[str, Any]], dict[str, Any],
                                                           list[Any]]:
    """Per site: sizes and the saved model's scores; pooled test figures; every row's output."""
    from . import metrics

    sites = fed.extra["sites"]
    preds = [predictor.predict(X, site=z) for z, X in enumerate(fed.extra["site_rows"])]
    rows, pooled = [], {}
    hits = n_test = 0
    train_hits = n_train = 0
    sq = 0.0
    truth, found = [], []
    for z, name in enumerate(sites.names):
        train = sites.train[z]
        test = sites.test[z] if sites.test is not None else np.zeros(0, np.int64)
        entry: dict[str, Any] = {"site": name, "path": sites.federation.paths[z],
                                 "n_rows": int(len(sites.rows[z])), "n_train": int(len(train)),
                                 "n_test": int(len(test))}
        y = None if sites.targets is None else sites.targets[z]
        p = preds[z]
        if y is not None and predictor.task == "classification":
            entry["train_accuracy"] = float(np.mean(p[train] == y[train]))
            train_hits += int(np.sum(p[train] == y[train]))
            n_train += len(train)
            if len(test):
                entry["test_accuracy"] = float(np.mean(p[test] == y[test]))
                hits += int(np.sum(p[test] == y[test]))
                n_test += len(test)
        elif y is not None and predictor.task == "regression" and len(test):
            entry["test_mse"] = float(np.mean((p[test] - y[test]) ** 2))
            sq += float(np.sum((p[test] - y[test]) ** 2))
            n_test += len(test)
        elif y is not None and predictor.task == "clustering" and len(train) > 1:
            entry["ari"] = metrics.adjusted_rand(y[train], p[train])
            truth.append(y[train])
            found.append(p[train])
        if predictor.task == "clustering":
            entry["cluster_sizes"] = np.bincount(p, minlength=0).tolist()
        rows.append(entry)
    if n_train:
        pooled["train_accuracy_pooled"] = train_hits / n_train
    if n_test and predictor.task == "classification":
        pooled["test_accuracy_pooled"] = hits / n_test
    elif n_test and predictor.task == "regression":
        pooled["test_mse_pooled"] = sq / n_test
    if found:  # the saved model's clusters, as in labels/<site>.csv
        pooled["ari_pooled"] = metrics.adjusted_rand(np.concatenate(truth), np.concatenate(found))
    return rows, pooled, preds


def run_experiment(cfg: Mapping[str, Any], *, transport: str = "inprocess",
                   federation: Federation | None = None, source: str = "config",
                   checkpoint_dir: Any = None, resume: bool = False) -> Experiment:
    """Run ``cfg`` (already checked by :func:`fedclust.config.check_config`).

    ``checkpoint_dir``: the in-process runs (preprocessing, the algorithm) write a
    checkpoint after every round into its ``preprocess/`` and ``fit/`` folders;
    ``resume=True`` continues them after their last complete round.

    An invalid value that the data builder or the estimator finds is reported
    against ``source`` (the file name) and its table: ``myfed.toml: [algorithm]
    n_clusters='two' must be an integer``.
    """
    from .config import config_errors

    if federation is None:
        with config_errors(cfg, "data", source), config_errors(cfg, "partition", source):
            federation = build_federation(cfg)
    fed = federation
    with config_errors(cfg, "preprocess", source):
        fed, pre = preprocess_federation(
            cfg, fed, transport, resume=resume,
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir) / "preprocess")
    seed = cfg["seed"]
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    t0 = time.perf_counter()
    wire = make_transport(cfg, transport, n_devices=len(fed.devices), device_ids=fed.device_ids,
                          resume=resume,
                          checkpoint_dir=None if checkpoint_dir is None else
                          Path(checkpoint_dir) / "fit")
    if pre is not None and transport != "inprocess":
        # the nodes hold raw data and preprocess it themselves (same numbers as in process)
        from .sites.transform import SiteTransformTransport

        wire = SiteTransformTransport(
            wire, dict(zip(fed.device_ids or range(len(fed.devices)), fed.extra["raw_devices"])),
            pre)
    with config_errors(cfg, "algorithm", source):
        sites = fed.extra.get("sites") if isinstance(fed.extra, Mapping) else None
        model = build_estimator(cfg, pre, getattr(getattr(sites, "schema", None), "classes",
                                                  None))
        algorithm.fit(model, fed, wire)
    fit_time = time.perf_counter() - t0
    if sites is not None and hasattr(model.run_log_, "name_sites"):
        # a failed device is named by its site
        model.run_log_.name_sites(dict(zip(fed.device_ids or range(len(fed.devices)),
                                           sites.names)))
    n_points = sum(len(X) for X in fed.devices)
    out: dict[str, Any] = {
        "title": cfg.get("title", ""),
        "federation": fed.description,
        "algorithm": algorithm.name,
        "transport": transport,
        "seed": seed,
        "n_devices": len(fed.devices),
        "n_points": int(n_points),
        "n_features": int(fed.devices[0].shape[1]),
        **algorithm.result_fields(model),
        "metrics": algorithm.report(model, fed, cfg) if algorithm.report is not None else {},
        "communication": _comm(model.communication_, len(fed.devices)),
        "rounds_note": algorithm.rounds_note(model, model.communication_)
        if algorithm.rounds_note else None,
        "run_log": {k: v for k, v in vars(model.run_log_).items()},
        "byzantine": list(getattr(getattr(wire, "tamper", None), "byzantine", [])),
        "time_s": {"fit": fit_time},
        "privacy": _json_privacy(getattr(model, "privacy_", None)),
        "baselines": {},
        "config": dict(cfg),
    }
    for name, on in cfg.get("baselines", {}).items():
        if on:
            out["baselines"][name] = BASELINES[name].run(fed, cfg)
    ref = out["baselines"].get("centralized", {}).get("kmeans_cost")
    if ref and "kmeans_cost" in out["metrics"]:
        out["metrics"]["cost_ratio_vs_centralized"] = out["metrics"]["kmeans_cost"] / ref
        for entry in out["baselines"].values():
            if "kmeans_cost" in entry:
                entry["cost_ratio_vs_centralized"] = entry["kmeans_cost"] / ref
    if pre is not None:
        out["preprocess"] = {"impute": pre.impute, "scale": pre.scale,
                             "privacy": _json_privacy(getattr(pre, "privacy_", None)),
                             "communication": _comm(pre.communication_, len(fed.devices))}
    exported = predictor = preds = None
    if algorithm.export is not None:
        exported = algorithm.export(model, fed)
        predictor = None if exported is None else get_predictor(exported)
    if predictor is not None and "sites" in fed.extra:
        out["sites"], pooled, preds = _site_report(predictor, fed)
        out["metrics"].update(pooled)
        if "test_accuracy_pooled" in pooled:  # the saved model's, as in the sites table
            from .metrics import summarize_test_accuracy

            tested = [e for e in out["sites"] if e["n_test"] and "test_accuracy" in e]
            out["metrics"].update(summarize_test_accuracy([e["test_accuracy"] for e in tested],
                                                  [e["n_test"] for e in tested]))
    return Experiment(out, model, fed, pre, exported, predictor, preds)


def _json_privacy(record: Any) -> Any:
    """``privacy_`` with infinite / NaN numbers as strings (strict JSON)."""
    if isinstance(record, dict):
        return {k: _json_privacy(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [_json_privacy(v) for v in record]
    if isinstance(record, float) and not math.isfinite(record):
        return str(record)
    return record


def _comm(summary: dict[str, Any], n_devices: int) -> dict[str, Any]:
    # Per-device counts are kept for small federations only, so result.json stays small.
    if n_devices > 1000:
        summary = {k: v for k, v in summary.items() if k != "per_device"}
    return summary
