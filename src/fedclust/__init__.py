"""fedclust: federated clustering with one-shot, communication-cheap, robust methods."""

from .estimators import KFed
from .exceptions import (ConfigError, FedClustError, IncompatibleMessageError, NotFittedError,
                         ValidationError)

__version__ = "0.1.0"

__all__ = [
    "KFed",
    "FedClustError",
    "ValidationError",
    "IncompatibleMessageError",
    "ConfigError",
    "NotFittedError",
    "__version__",
]
