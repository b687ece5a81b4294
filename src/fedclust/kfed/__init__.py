"""k-FED: one-shot federated k-means (Dennis, Li & Smith, ICML 2021).

``local`` / ``batched`` — the device step (Awasthi–Sheffet spectral k-means);
``server`` — aggregation of device centers; ``messages`` — what crosses the
wire; ``protocol`` — the round; ``refine`` — the round then distributed Lloyd
rounds from its centers; ``estimator`` — the :class:`KFed` front door.
"""

from ..core.registry import (Algorithm, register_algorithm, register_demo, register_predictor,
                             register_protocol)
from ..clustering import clustering_report, plot_clustering
from .estimator import KFed
from . import keyed  # noqa: F401  (registers the keyed server's step)
from .export import KFedPredictor, kfed_export
from .protocol import KFedProtocol, KFedResult

__all__ = ["KFed", "KFedProtocol", "KFedResult"]

register_protocol(KFedProtocol, KFedResult)
register_predictor("kfed-induced", KFedPredictor.load)
register_algorithm(Algorithm("kfed", KFed, required=("n_clusters",), report=clustering_report,
                             plot=plot_clustering, export=kfed_export))
#: ``fedclust demo`` / ``fedclust demo kfed``: a reduced Table-1 federation of k-FED.
register_demo("kfed", {
    "title": "k-FED on a Table-1 Gaussian mixture (d=100, k=16, k'=4, m0=5, c=100)",
    "seed": 0,
    "data": {"source": "gaussians", "n_features": 100, "n_clusters": 16, "n_local_clusters": 4,
             "m0": 5, "separation": 100.0, "n_per_component": 500},
    "algorithm": {"name": "kfed", "n_clusters": 16, "n_local_clusters": 4,
                  "server": "farthest-lloyd1"},
    "simulation": {"dropout": 0.0, "late": 0.0},
    "baselines": {"centralized": True, "distributed_lloyd": True},
}, description="k-FED: 16 Gaussians in d=100 over 20 devices")
