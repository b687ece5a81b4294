"""Clustered federated learning: FedAvg, IFCA, k-FED + FedAvg, cluster-aware client selection.

``models`` — plain-numpy models (flat parameters, loss, gradient, SGD);
``client`` — the device step (:func:`local_update`, IFCA's choice);
``server`` — aggregation (:func:`aggregate_updates`), per-cluster averages,
client selection; ``messages`` / ``protocol`` — the rounds; ``fedavg`` / ``ifca`` /
``clustered`` — FedAvg's, IFCA's and k-FED + FedAvg's protocols; ``base`` — what the
front doors share; ``estimator`` — the :class:`FedAvg`, :class:`IFCA`,
:class:`ClusteredFedAvg` front doors;
``data`` — rotated-digits / MNIST and label-skewed federations.
"""

from ..core.registry import (Algorithm, DataSource, register_algorithm, register_data_source,
                             register_demo, register_predictor, register_protocol)
from .client import choose_cluster, local_update
from .data import label_skew_federation, rotated_federation
from .estimator import IFCA, ClusteredFedAvg, FedAvg
from .models import MLP, LinearRegression, LogisticRegression, Model, SoftmaxRegression, make_model
from .clustered import ClusteredFedAvgProtocol
from .ifca import IFCAProtocol
from .fedavg import FedAvgProtocol
from .protocol import FLProtocol, FLResult
from .report import (FLPredictor, fit_supervised, fl_export, fl_report, fl_result_fields,
                     fl_rounds_note, plot_history)
from .server import aggregate_updates

__all__ = ["FedAvg", "IFCA", "ClusteredFedAvg", "MLP", "SoftmaxRegression", "LogisticRegression",
           "LinearRegression", "Model", "make_model", "local_update", "choose_cluster",
           "aggregate_updates", "FLProtocol", "FedAvgProtocol", "IFCAProtocol",
           "ClusteredFedAvgProtocol", "FLResult", "rotated_federation", "label_skew_federation"]

for _proto in (FedAvgProtocol, IFCAProtocol, ClusteredFedAvgProtocol):
    register_protocol(_proto, FLResult)

def _label_kind(params) -> str:
    """Site labels are class indices, or numbers to fit for a regression model ("linear")."""
    return "value" if params.get("model") == "linear" else "class"


_HOOKS = dict(fit=fit_supervised, label_kind=_label_kind, report=fl_report, result_fields=fl_result_fields,
              plot=plot_history, rounds_note=fl_rounds_note,
              columns=(("test_accuracy", "test accuracy"),
                       ("test_accuracy_device_mean", "mean over devices"),
                       ("train_loss", "train loss")),
              baselines=(), export=fl_export)
register_predictor("fl-models", FLPredictor.load)
register_algorithm(Algorithm("fedavg", FedAvg, **_HOOKS))
register_algorithm(Algorithm("ifca", IFCA, required=("n_clusters",), **_HOOKS))
register_algorithm(Algorithm("clustered-fedavg", ClusteredFedAvg, required=("n_clusters",),
                             **_HOOKS))
register_data_source(DataSource("rotated-images", rotated_federation, federated=True))
register_data_source(DataSource("label-skew-images", label_skew_federation, federated=True))

#: ``fedclust demo fl``: k-FED + FedAvg on 20 devices of rotated 8x8 digits (seconds).
register_demo("fl", {
    "title": "k-FED + FedAvg on rotated digits (4 rotations, 20 devices, k'=1)",
    "seed": 0,
    "data": {"source": "rotated-images", "dataset": "digits", "n_devices": 20,
             "n_local_clusters": 1, "n_train": 60, "n_test": 40},
    "algorithm": {"name": "clustered-fedavg", "n_clusters": 4, "n_local_clusters": 1,
                  "rounds": 15, "lr": 0.1, "n_hidden": 50},
    "simulation": {"dropout": 0.0, "late": 0.0},
}, description="k-FED + FedAvg: rotated 8x8 digits on 20 devices")
