"""k-FED's saved model: each training site's points get k-FED's own induced labels.

k-FED labels a point by its device's local cluster and the global cluster that
local center joined (Dennis, Li & Smith 2021, Alg. 2); the saved model keeps
every site's local centers and their global labels, so ``fedclust predict`` on
a training site's file gives the labels k-FED found (``device_labels_``, scored
in ``result.json``). A new site's rows go to the nearest global center.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..core.kmeans import assign
from ..core.registry import Exported

__all__ = ["KFedPredictor", "kfed_export"]


def kfed_export(model: Any, fed: Any) -> Exported:
    """Global centers + per site (device order) its local centers and their global labels;
    with the default server (devices labelled by the nearest final center) the centers alone."""
    from ..core.registry import export_centers
    from .server import WEIGHTED_SERVERS

    if getattr(model, "server", None) in WEIGHTED_SERVERS or getattr(model, "refine_rounds", 0):
        return export_centers(model, fed)
    centers = np.asarray(model.cluster_centers_, np.float64)
    d = centers.shape[1]
    local, labels, site = [], [], []
    for z, (lc, cl) in enumerate(zip(model.local_centers_, model.center_labels_)):
        if lc is None or cl is None:  # absent from the run: a new site for the model
            continue
        local.append(np.asarray(lc, np.float64).reshape(-1, d))
        labels.append(np.asarray(cl, np.int64))
        site.append(np.full(len(labels[-1]), z, np.int64))
    cat = (lambda xs, shape: np.concatenate(xs) if xs else np.zeros(shape))
    return Exported("kfed-induced", {
        "centers": centers, "local_centers": cat(local, (0, d)),
        "local_labels": cat(labels, (0,)).astype(np.int64),
        "local_site": cat(site, (0,)).astype(np.int64)})


class KFedPredictor:
    """Nearest local center of the row's site -> its global label; a new site: nearest center."""

    task = "clustering"

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self.centers = np.asarray(arrays["centers"], np.float64)
        self.local_centers = np.asarray(arrays["local_centers"], np.float64)
        self.local_labels = np.asarray(arrays["local_labels"], np.int64)
        self.local_site = np.asarray(arrays["local_site"], np.int64)

    @classmethod
    def load(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "KFedPredictor":
        return cls(arrays)

    def predict(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        mine = np.flatnonzero(self.local_site == site) if site is not None else []
        if len(mine) == 0:
            return assign(X, self.centers)[0].astype(np.int64)
        return self.local_labels[mine][assign(X, self.local_centers[mine])[0]]
