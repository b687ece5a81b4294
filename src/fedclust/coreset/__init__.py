"""Distributed PCA and distributed coreset k-means over any communication graph
(Balcan, Ehrlich & Liang, NIPS 2013; Liang, Balcan, Kanchanapally & Woodruff, NIPS 2014).

``local`` — node maths (sums, local SVD, local solution, coreset portion);
``server`` — coordinator maths (global mean, disPCA combine, weighted solve);
``messages`` — what crosses the wire; ``protocol`` — the star rounds;
``graph`` — topologies and flooding with per-edge accounting;
``estimator`` — :class:`DistributedPCA` and :class:`DistributedKMeans`;
``data`` — a synthetic stand-in for Daily and Sports Activities.
"""

from typing import Any

from ..core.registry import (Algorithm, DataSource, Federation, register_algorithm,
                             register_data_source, register_demo, register_protocol)
from ..clustering import clustering_report, plot_clustering
from .data import low_rank_source as _low_rank_source
from .data import make_low_rank_mixture
from .estimator import DistributedKMeans, DistributedPCA
from .graph import check_graph, flood, make_graph, run_on_graph
from .protocol import CoresetProtocol, CoresetResult

__all__ = ["DistributedPCA", "DistributedKMeans", "CoresetProtocol", "CoresetResult",
           "make_graph", "check_graph", "flood", "run_on_graph", "make_low_rank_mixture"]


def _fit(model: DistributedKMeans, fed: Federation, transport: Any) -> None:
    """Star: the configured transport. A general graph floods in process, or on
    Flower the server relays each message to one neighbour."""
    if model.graph is None or model.graph == "star":
        model.fit(fed.devices, transport=transport, device_ids=fed.device_ids)
        return
    from ..core.exceptions import ValidationError
    from ..sim.transport import InProcessTransport

    if getattr(transport, "dropout", 0) or getattr(transport, "late", 0):
        raise ValidationError("[simulation] dropout/late apply to the star only, not to graphs")
    if type(transport) is InProcessTransport:
        model.fit(fed.devices)
        return
    if not getattr(transport, "runs_graphs", False):
        raise ValidationError(
            f"graph={model.graph!r} needs a transport that relays between neighbours; "
            f"{type(transport).__name__} runs only graph='star'")
    model.fit(fed.devices, transport=transport)


register_protocol(CoresetProtocol, CoresetResult)
register_algorithm(Algorithm("coreset", DistributedKMeans, required=("n_clusters",), fit=_fit,
                             report=clustering_report, plot=plot_clustering))
register_data_source(DataSource("low-rank-mixture", _low_rank_source))
#: ``fedclust demo coreset``: disPCA to 10 dimensions + distributed coreset, 10 nodes.
register_demo("coreset", {
    "title": "disPCA (t=10) + distributed coreset k-means on a low-rank mixture "
             "(3000 x 200, k=8, 10 nodes, weighted partition)",
    "seed": 0,
    "data": {"source": "low-rank-mixture", "n_points": 3000, "n_features": 200,
             "n_clusters": 8, "signal_dim": 10},
    "partition": {"kind": "weighted", "n_devices": 10},
    "algorithm": {"name": "coreset", "n_clusters": 8, "coreset_size": 500, "n_components": 10},
    "baselines": {"centralized": True, "distributed_lloyd": True},
}, description="distributed PCA + coreset k-means: 3000 x 200, 10 nodes")
