"""The exceptions fedclust raises.

Every error a user can cause is a :class:`ValidationError`, which subclasses
:class:`ValueError` so that ``except ValueError`` keeps working. Messages name
the offending parameter or device and its value, and say what to do.
"""

from __future__ import annotations

from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

__all__ = [
    "FedClustError",
    "ValidationError",
    "IncompatibleMessageError",
    "ConfigError",
    "NotFittedError",
]


class FedClustError(Exception):
    """Base class of every exception raised on purpose by fedclust."""


class ValidationError(FedClustError, ValueError):
    """Bad input: a parameter, a device's data, or a federation."""


class IncompatibleMessageError(ValidationError):
    """A message (from a client or from disk) has the wrong fields, shapes,
    dtypes or non-finite values. The server rejects it and names the sender."""


class ConfigError(ValidationError):
    """An experiment configuration (TOML) is missing a key or has a bad value."""


class NotFittedError(FedClustError, _SklearnNotFittedError):
    """An estimator was used before ``fit`` (scikit-learn's ``NotFittedError``: a
    ``ValueError`` and an ``AttributeError``)."""
