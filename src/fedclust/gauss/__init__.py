"""Federated self-evolving Gaussian clustering and classification (Ožbot & Škrjanc; eGAUSS+).

``stats`` — exact mergeable statistics (Chan); ``model`` — the evolving cluster
set (online learning, merging, aging, scoring); ``local`` / ``server`` — owner
and server maths; ``messages`` — what crosses the wire; ``protocol`` — the
round(s); ``estimator`` — :class:`EvolvingGaussians`, :class:`FedGaussClustering`,
:class:`FedGaussClassifier`; ``hooks`` — CLI reports, figure, data source, demo.
"""

from ..core.registry import (Algorithm, DataSource, register_algorithm, register_data_source,
                             register_demo, register_protocol)
from .estimator import EvolvingGaussians, FedGaussClassifier, FedGaussClustering
from .hooks import gauss_blobs, gauss_report, gauss_result_fields, plot_gauss
from .protocol import GaussClassifierProtocol, GaussProtocol, GaussResult
from .private import PrivateGaussClassifierProtocol

__all__ = ["EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier", "GaussProtocol",
           "GaussClassifierProtocol", "GaussResult"]

register_protocol(GaussProtocol, GaussResult)
register_protocol(GaussClassifierProtocol, GaussResult)
register_protocol(PrivateGaussClassifierProtocol, GaussResult)
register_algorithm(Algorithm(
    "gauss", FedGaussClustering, plot=plot_gauss, result_fields=gauss_result_fields,
    report=gauss_report,
    columns=(("accuracy", "accuracy"), ("ari", "ARI"), ("n_clusters", "clusters"),
             ("n_clusters_reference", "reference clusters")),
    baselines=()))
register_data_source(DataSource("gauss-blobs", gauss_blobs))
#: ``fedclust demo gauss``: 15 Gaussian blobs in 2-D over 3 owners, one round, defaults.
register_demo("gauss", {
    "title": "Federated evolving Gaussians: 15 blobs in 2-D, 3 owners, one round, defaults",
    "seed": 0,
    "data": {"source": "gauss-blobs", "n_clusters": 15, "n_per_cluster": 200},
    "partition": {"kind": "iid", "n_devices": 3},
    "algorithm": {"name": "gauss"},
    "simulation": {"dropout": 0.0, "late": 0.0},
    "baselines": {},
})
