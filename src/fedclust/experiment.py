"""Run one configured experiment (see :mod:`fedclust.config`) and report it.

Used by ``fedclust run`` / ``fedclust demo`` and by the benchmarks: build the
federation, run the algorithm on a transport, run the baselines on the same
federation, compute the metrics, return a JSON-ready dict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import metrics
from .baselines import DistributedLloyd, centralized_kmeans
from .estimators import KFed
from .sim.transport import InProcessTransport

__all__ = ["Federation", "Experiment", "build_federation", "run_experiment", "TRANSPORTS"]

TRANSPORTS = ("inprocess", "flower")


@dataclass
class Federation:
    devices: list[np.ndarray]
    labels: list[np.ndarray] | None
    description: str


@dataclass
class Experiment:
    """``result`` is what ``result.json`` holds; ``model`` the fitted estimator."""

    result: dict[str, Any]
    model: Any
    federation: Federation


def build_federation(cfg: dict[str, Any]) -> Federation:
    """The devices (and true labels) described by ``cfg['data']`` and ``cfg['partition']``."""
    from .datasets import load_benchmark, load_mnist, load_npz, make_federated_gaussians
    from .sim.partition import apply_partition, partition

    seed = cfg["seed"]
    data = dict(cfg["data"])
    source = data.pop("source")
    if source == "gaussians":
        fd = make_federated_gaussians(**data, random_state=seed)
        return Federation(fd.devices, fd.labels,
                          f"Gaussian mixture ({fd.n_devices} devices, d={fd.n_features})")
    n_samples = data.pop("n_samples", None)
    if source == "mnist":
        X, y = load_mnist(data.pop("path", None), **data)
    elif source == "npz":
        X, y = load_npz(data["path"])
    else:
        X, y = load_benchmark(data["name"], data.get("data_dir"))
    if n_samples is not None and n_samples < len(X):
        keep = np.sort(np.random.default_rng(seed).choice(len(X), size=int(n_samples),
                                                          replace=False))
        X, y = X[keep], y[keep]
    part = dict(cfg["partition"])
    kind = part.pop("kind")
    n_devices = part.pop("n_devices")
    parts = partition(kind, X, y, n_devices, random_state=seed, **part)
    devices, labels = apply_partition(X, y, parts)
    return Federation(devices, labels, f"{source} ({len(X)} points, {kind} over {n_devices} devices)")


def _transport(cfg: dict[str, Any], transport: str):
    sim = cfg["simulation"]
    kw = dict(dropout=sim.get("dropout", 0.0), late=sim.get("late", 0.0))
    if transport == "inprocess":
        return InProcessTransport(progress=bool(sim.get("progress", False)), **kw)
    from .flower.transport import FlowerSimulationTransport  # optional extra

    return FlowerSimulationTransport(**kw)


def _make_estimator(algo: dict[str, Any], seed: int):
    params = dict(algo)
    name = params.pop("name")
    if name == "kfed":
        return KFed(**params, random_state=seed)
    return DistributedLloyd(**params, random_state=seed)


def run_experiment(cfg: dict[str, Any], *, transport: str = "inprocess",
                   federation: Federation | None = None) -> Experiment:
    """Run ``cfg`` (already checked by :func:`fedclust.config.check_config`)."""
    fed = federation or build_federation(cfg)
    seed = cfg["seed"]
    algo = cfg["algorithm"]
    model = _make_estimator(algo, seed)
    t0 = time.perf_counter()
    model.fit(fed.devices, transport=_transport(cfg, transport))
    fit_time = time.perf_counter() - t0
    X_all = np.concatenate(fed.devices)
    y_all = None if fed.labels is None else np.concatenate(fed.labels)
    centers = model.cluster_centers_
    out: dict[str, Any] = {
        "title": cfg.get("title", ""),
        "federation": fed.description,
        "algorithm": algo["name"],
        "transport": transport,
        "seed": seed,
        "n_devices": len(fed.devices),
        "n_points": int(len(X_all)),
        "n_features": int(X_all.shape[1]),
        "cluster_centers": centers.tolist(),
        "metrics": _scores(X_all, y_all, fed, model, centers),
        "communication": _comm(model.communication_, len(fed.devices)),
        "run_log": {k: v for k, v in vars(model.run_log_).items()},
        "time_s": {"fit": fit_time},
        "baselines": {},
        "config": cfg,
    }
    base = cfg["baselines"]
    if base.get("centralized", False):
        t0 = time.perf_counter()
        km = centralized_kmeans(fed.devices, algo["n_clusters"], random_state=seed)
        t = time.perf_counter() - t0
        ref_cost = metrics.kmeans_cost(X_all, km.cluster_centers_)
        out["baselines"]["centralized"] = {
            "kmeans_cost": ref_cost, "time_s": t,
            **({"accuracy": metrics.matched_accuracy(y_all, km.labels_)} if y_all is not None else {}),
        }
        out["metrics"]["cost_ratio_vs_centralized"] = out["metrics"]["kmeans_cost"] / ref_cost
    if base.get("distributed_lloyd", False) and algo["name"] != "distributed-lloyd":
        t0 = time.perf_counter()
        dl = DistributedLloyd(algo["n_clusters"], random_state=seed).fit(fed.devices)
        t = time.perf_counter() - t0
        entry = {"kmeans_cost": metrics.kmeans_cost(X_all, dl.cluster_centers_), "time_s": t,
                 "rounds": dl.communication_["rounds"],
                 "bytes_up": dl.communication_["bytes_up"],
                 "bytes_down": dl.communication_["bytes_down"]}
        if y_all is not None:
            entry["accuracy"] = metrics.matched_accuracy(y_all, np.concatenate(dl.device_labels_))
        out["baselines"]["distributed_lloyd"] = entry
    return Experiment(out, model, fed)


def _scores(X_all, y_all, fed, model, centers) -> dict[str, float]:
    scores = {"kmeans_cost": metrics.kmeans_cost(X_all, centers)}
    if fed.labels is None:
        return scores
    got = [(lab, y) for lab, y in zip(model.device_labels_, fed.labels) if lab is not None]
    pred = np.concatenate([g[0] for g in got])
    true = np.concatenate([g[1] for g in got])
    scores.update(accuracy=metrics.matched_accuracy(true, pred),
                  ari=metrics.adjusted_rand(true, pred),
                  nmi=metrics.normalized_mutual_info(true, pred),
                  labelled_fraction=len(pred) / len(X_all))
    return scores


def _comm(summary: dict[str, Any], n_devices: int) -> dict[str, Any]:
    # Per-device counts are kept for small federations only, so result.json stays small.
    if n_devices > 1000:
        summary = {k: v for k, v in summary.items() if k != "per_device"}
    return summary
