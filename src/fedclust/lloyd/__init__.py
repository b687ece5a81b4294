"""The k-means baselines: naive distributed Lloyd (a protocol, many rounds) and
centralized k-means on the pooled data (scikit-learn)."""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from ..core.registry import (Algorithm, Baseline, Federation, register_algorithm,
                             register_baseline, register_protocol)
from ..clustering import clustering_report, plot_clustering
from .estimator import DistributedLloyd, centralized_kmeans
from .protocol import DistributedLloydProtocol, DistributedLloydResult
from ..kfed.protocol import KFedResult
from .refine import RefinedKFedProtocol

__all__ = ["DistributedLloyd", "DistributedLloydProtocol", "DistributedLloydResult",
           "RefinedKFedProtocol",
           "centralized_kmeans"]


def _k(cfg: Mapping[str, Any]) -> int:
    return int(cfg["algorithm"]["n_clusters"])


def _centralized(fed: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    from .. import metrics

    X_all = np.concatenate(fed.devices)
    t0 = time.perf_counter()
    km = centralized_kmeans(fed.devices, _k(cfg), random_state=cfg["seed"])
    entry: dict[str, Any] = {"kmeans_cost": metrics.kmeans_cost(X_all, km.cluster_centers_),
                             "time_s": time.perf_counter() - t0}
    if fed.labels is not None:
        entry["accuracy"] = metrics.matched_accuracy(np.concatenate(fed.labels), km.labels_)
    return entry


def _distributed_lloyd(fed: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    from .. import metrics

    X_all = np.concatenate(fed.devices)
    t0 = time.perf_counter()
    dl = DistributedLloyd(_k(cfg), random_state=cfg["seed"]).fit(fed.devices)
    entry: dict[str, Any] = {
        "kmeans_cost": metrics.kmeans_cost(X_all, dl.cluster_centers_),
        "time_s": time.perf_counter() - t0, "rounds": dl.communication_["rounds"],
        "bytes_up": dl.communication_["bytes_up"], "bytes_down": dl.communication_["bytes_down"]}
    if fed.labels is not None:
        entry["accuracy"] = metrics.matched_accuracy(np.concatenate(fed.labels),
                                                     np.concatenate(dl.device_labels_))
    return entry


register_protocol(DistributedLloydProtocol, DistributedLloydResult)
register_protocol(RefinedKFedProtocol, KFedResult)  # k-FED's round, then Lloyd rounds
register_algorithm(Algorithm("distributed-lloyd", DistributedLloyd, required=("n_clusters",),
                             report=clustering_report, plot=plot_clustering,
                             baselines=("centralized",)))
register_baseline(Baseline("centralized", _centralized))
register_baseline(Baseline("distributed_lloyd", _distributed_lloyd))
