"""Federated self-evolving Gaussian clustering and classification (Ožbot & Škrjanc; eGAUSS+).

``stats`` — exact mergeable statistics (Chan); ``model`` — the evolving cluster
set (online learning, aging, scoring); ``merging`` — its merge tests, merges and
splits; ``local`` / ``server`` — owner and server maths; ``messages`` — what
crosses the wire; ``protocol`` — the round(s); ``evolving`` — :class:`EvolvingGaussians`;
``estimator`` — :class:`FedGaussClustering`, :class:`FedGaussClassifier`; ``hooks`` —
CLI reports, figure, data source, demo.
"""

from ..core.registry import (Algorithm, DataSource, register_algorithm, register_data_source,
                             register_demo, register_predictor, register_protocol)
from .estimator import FedGaussClassifier, FedGaussClustering
from .evolving import EvolvingGaussians
from .hooks import (GaussPredictor, fit_classifier, gauss_blobs, gauss_classifier_report,
                    gauss_export, gauss_report,
                    gauss_result_fields, plot_gauss)
from .classifier_protocol import GaussClassifierProtocol
from .protocol import GaussProtocol, GaussResult
from .private import PrivateGaussClassifierProtocol
from .private_clustering import PrivateGaussProtocol

__all__ = ["EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier", "GaussProtocol",
           "GaussClassifierProtocol", "GaussResult"]

register_protocol(GaussProtocol, GaussResult)
register_protocol(GaussClassifierProtocol, GaussResult)
register_protocol(PrivateGaussClassifierProtocol, GaussResult)
register_protocol(PrivateGaussProtocol, GaussResult)
register_algorithm(Algorithm(
    "gauss", FedGaussClustering, plot=plot_gauss, result_fields=gauss_result_fields,
    report=gauss_report,
    columns=(("accuracy", "accuracy"), ("ari", "ARI"), ("n_clusters", "clusters"),
             ("n_clusters_reference", "reference clusters")),
    baselines=(), export=gauss_export))
register_predictor("gauss", GaussPredictor.load)
#: the classifier on a site federation: ``[data] label = ...``; test accuracy per site and pooled
register_algorithm(Algorithm(
    "gauss-classifier", FedGaussClassifier, fit=fit_classifier, report=gauss_classifier_report,
    result_fields=gauss_result_fields, plot=None,
    columns=(("test_accuracy", "test accuracy"), ("test_accuracy_device_mean", "mean over devices"),
             ("n_clusters", "clusters")),
    baselines=(), export=gauss_export))
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
}, description="evolving Gaussians: 15 blobs in 2-D over 3 owners")
