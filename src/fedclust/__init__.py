"""fedclust: federated clustering with one-shot, communication-cheap, robust methods.

Importing the package imports every family's wing, which registers its
protocols, algorithms and demos (:mod:`fedclust.core.registry`).
"""

from . import datasets as _datasets  # noqa: F401  (registers the built-in data sources)
from .core.exceptions import (ConfigError, FedClustError, IncompatibleMessageError, NotFittedError,
                              ValidationError)
from .kfed import KFed
from .lloyd import DistributedLloyd

__version__ = "0.1.0"

__all__ = [
    "KFed",
    "DistributedLloyd",
    "FedClustError",
    "ValidationError",
    "IncompatibleMessageError",
    "ConfigError",
    "NotFittedError",
    "__version__",
]
