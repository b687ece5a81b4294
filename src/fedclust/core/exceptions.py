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
    "TooFewReplies",
]


class FedClustError(Exception):
    """Base class of every exception raised on purpose by fedclust."""


class ValidationError(FedClustError, ValueError):
    """Bad input: a parameter, a device's data, or a federation."""


class IncompatibleMessageError(ValidationError):
    """A message (from a client or from disk) has the wrong fields, shapes,
    dtypes or non-finite values. The server rejects it and names the sender."""


class TooFewReplies(ValidationError):
    """A run is left with fewer valid replies than its protocol needs (none at all, or
    e.g. fewer local centers than clusters): it stops rather than keep a model that no
    device's reply moved. ``round`` is the round (``None``: before any), ``reasons``
    maps each device that gave no valid reply to why (dropped, late, failed, rejected).

    A protocol raises it with what it needed; the transport adds the round and the
    reasons (:func:`fedclust.core.protocol.explain_too_few`)."""

    def __init__(self, message: str, *, round: int | None = None,
                 reasons: dict[int, str] | None = None):
        super().__init__(message)
        self.round = round
        self.reasons = dict(reasons or {})


class ConfigError(ValidationError):
    """An experiment configuration (TOML) is missing a key or has a bad value."""


class NotFittedError(FedClustError, _SklearnNotFittedError):
    """An estimator was used before ``fit`` (scikit-learn's ``NotFittedError``: a
    ``ValueError`` and an ``AttributeError``)."""
