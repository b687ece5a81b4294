"""The report and the figure of a clustering that ends in centers (k-FED, Lloyd, coresets).

What such a family registers as ``report=`` and ``plot=``
(:class:`fedclust.core.registry.Algorithm`): the k-means cost of the final
centers on every point and, where the federation has labels, accuracy, ARI and
NMI; the devices' points coloured by label with the centers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from . import metrics
from .core.registry import Federation

__all__ = ["clustering_report", "plot_clustering"]


def clustering_report(model: Any, fed: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """k-means cost of the final centers on all points; accuracy/ARI/NMI when labels exist."""
    X_all = np.concatenate(fed.devices)
    scores: dict[str, Any] = {"kmeans_cost": metrics.kmeans_cost(X_all, model.cluster_centers_)}
    if fed.labels is None:
        return scores
    got = [(lab, y) for lab, y in zip(model.device_labels_, fed.labels) if lab is not None]
    if not got:
        return scores
    pred = np.concatenate([g[0] for g in got])
    true = np.concatenate([g[1] for g in got])
    scores.update(accuracy=metrics.matched_accuracy(true, pred),
                  ari=metrics.adjusted_rand(true, pred),
                  nmi=metrics.normalized_mutual_info(true, pred),
                  labelled_fraction=len(pred) / len(X_all))
    return scores


def plot_clustering(model: Any, fed: Federation, result: dict[str, Any], path: Path) -> Path | None:
    """The default figure: devices' points coloured by label, final centers."""
    from .plotting import have_matplotlib, plot_federated_clustering

    if not have_matplotlib():
        return None
    return plot_federated_clustering(fed.devices, model.device_labels_, model.cluster_centers_,
                                     result, path)
