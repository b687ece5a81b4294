"""fedclust: federated clustering with one-shot, communication-cheap, robust methods.

Importing the package imports every family's wing, which registers its
protocols, algorithms, data sources and demos (:mod:`fedclust.core.registry`).
"""

import importlib as _importlib

from . import datasets as _datasets  # noqa: F401  (registers the built-in data sources)
from .core.exceptions import (ConfigError, FedClustError, IncompatibleMessageError, NotFittedError,
                              ValidationError)
from . import kfed, lloyd, coreset, gauss, fl, robust  # noqa: E402,F401  (the wings register)
from .sites import deployed, preprocess, transform  # noqa: E402,F401  (the site protocols register)
from .kfed import KFed
from .lloyd import DistributedLloyd

__version__ = "0.1.0"

# Front doors of the later wings, resolved on first use.
_LAZY = {
    "DistributedPCA": "coreset", "DistributedKMeans": "coreset",
    "EvolvingGaussians": "gauss", "FedGaussClustering": "gauss", "FedGaussClassifier": "gauss",
    "RobustClusteredRegression": "robust", "RobustClusteredClassification": "robust",
    "FedAvg": "fl", "IFCA": "fl", "ClusteredFedAvg": "fl",
    "load_model": "sites.files_out",
}

__all__ = [
    "KFed",
    "DistributedLloyd",
    *_LAZY,
    "FedClustError",
    "ValidationError",
    "IncompatibleMessageError",
    "ConfigError",
    "NotFittedError",
    "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(_importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
