"""Exact unlearning: forget a device or some of its rows without a full retrain.

See ``docs/unlearning.md``. :mod:`~fedclust.unlearning.store` is what the
server keeps, :mod:`~fedclust.unlearning.replay` runs the server side again
over it, :mod:`~fedclust.unlearning.forget` is the estimators' ``forget`` /
``verify``.
"""

from .forget import ForgetMixin, ForgetRecord, VerifyReport, digest_result
from .replay import DevicesNeeded, replay
from .store import SummaryStore, digest_message
from . import saved  # noqa: F401  (registers the saved model's forget section)

__all__ = ["DevicesNeeded", "ForgetMixin", "ForgetRecord", "SummaryStore", "VerifyReport",
           "digest_message", "digest_result", "replay"]
