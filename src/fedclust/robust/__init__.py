"""Byzantine-robust clustering and robust clustered federated learning (Ghosh, Hong, Yin & Ramchandran).

``fedclust.core.robust`` — robust means (geometric median, coordinate-wise
median and trimmed mean), re-exported here; ``clustering`` — trimmed k-means,
k-geomedians (and plain Lloyd with the same API); ``edge_cutting`` —
threshold-graph clustering; ``filtering`` — iterative filtering (a robust
mean in many dimensions); ``init`` — robust initialisation; ``local`` /
``server`` / ``messages`` / ``protocol`` / ``estimator`` — the three-stage
pipeline :class:`RobustClusteredRegression`; ``data`` — mixtures of linear
regressions with Byzantine machines; ``metrics`` — estimation error and
misclustering. Byzantine devices on the wire: :mod:`fedclust.sim.byzantine`.
"""

from ..core.registry import (Algorithm, DataSource, register_algorithm, register_data_source,
                             register_demo, register_predictor, register_protocol)
from ..core.robust import (aggregate, coordinate_mean, coordinate_median, geometric_median,
                           trimmed_mean)
from .clustering import KGeomedians, KMeansLloyd, TrimmedKMeans
from .data import (MixtureRegression, make_mixture_logistic, make_mixture_regression,
                   mixture_logistic_source, mixture_regression_source)
from .edge_cutting import EdgeCutting
from .filtering import iterative_filtering
from .estimator import (RobustClusteredClassification, RobustClusteredRegression,
                        RobustPredictor, fit_robust, plot_round_loss, robust_export,
                        robust_report, robust_result_fields, robust_rounds_note)
from .metrics import estimation_error, misclustering_rate
from .protocol import RobustRegressionProtocol, RobustRegressionResult

__all__ = ["geometric_median", "trimmed_mean", "coordinate_median", "coordinate_mean", "aggregate",
           "iterative_filtering",
           "TrimmedKMeans", "KGeomedians", "KMeansLloyd", "EdgeCutting",
           "RobustClusteredRegression", "RobustClusteredClassification",
           "RobustRegressionProtocol", "RobustRegressionResult",
           "MixtureRegression", "make_mixture_regression", "make_mixture_logistic",
           "estimation_error", "misclustering_rate"]

register_protocol(RobustRegressionProtocol, RobustRegressionResult)
register_algorithm(Algorithm(
    "robust-regression", RobustClusteredRegression, required=("n_clusters",), fit=fit_robust,
    report=robust_report, result_fields=robust_result_fields, plot=plot_round_loss,
    rounds_note=robust_rounds_note,
    columns=(("estimation_error", "max_j |w_j - w*_j|"), ("misclustering", "misclustered"),
             ("test_mse", "test MSE")), baselines=(), export=robust_export, label_kind="value"))
register_data_source(DataSource("mixture-regression", mixture_regression_source, federated=True))
register_algorithm(Algorithm(
    "robust-classification", RobustClusteredClassification, required=("n_clusters",),
    fit=fit_robust, report=robust_report, result_fields=robust_result_fields,
    plot=plot_round_loss, rounds_note=robust_rounds_note,
    columns=(("estimation_error", "max_j |w_j - w*_j|"), ("misclustering", "misclustered"),
             ("test_accuracy", "test acc."), ("test_accuracy_device_mean", "mean over devices")),
    baselines=(), export=robust_export))
register_predictor("robust-linear", RobustPredictor.load)
register_data_source(DataSource("mixture-logistic", mixture_logistic_source, federated=True))

#: ``fedclust demo robust``: the three-stage pipeline on 100 machines, 20% Byzantine.
register_demo("robust", {
    "title": "Robust clustered regression: 4 linear regressions, 100 machines, 20% Byzantine",
    "seed": 0,
    "data": {"source": "mixture-regression", "n_machines": 100, "n_samples": 50,
             "n_features": 10, "n_clusters": 4, "alpha": 0.2, "noise": 0.5, "n_test": 50},
    "algorithm": {"name": "robust-regression", "n_clusters": 4, "clustering": "trimmed-kmeans",
                  "aggregator": "trimmed-mean", "beta": 0.2, "rounds": 20, "lr": 0.1},
    "simulation": {"dropout": 0.0, "late": 0.0},
}, description="robust clustered regression: 100 machines, 20% Byzantine")
register_demo("robust-classification", {
    "title": "Robust clustered logistic regression: 3 models, 120 machines, 15% Byzantine",
    "seed": 0,
    "data": {"source": "mixture-logistic", "n_machines": 120, "n_samples": 200,
             "n_features": 5, "n_clusters": 3, "alpha": 0.15, "coef_scale": 2.0,
             "byzantine_scale": 10.0, "n_test": 100},
    "algorithm": {"name": "robust-classification", "n_clusters": 3,
                  "clustering": "trimmed-kmeans", "aggregator": "trimmed-mean", "beta": 0.25,
                  "l2": 0.001, "rounds": 40, "lr": 1.0},
    "simulation": {"dropout": 0.0, "late": 0.0},
}, description="robust clustered logistic regression: 120 machines, 15% liars")
