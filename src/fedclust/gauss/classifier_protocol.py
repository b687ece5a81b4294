"""The evolving Gaussians' supervised protocol: device data ``(X, y)``.

``classes`` travel in the config, so a label seen only at predict time is
impossible and a label missing on some owners is fine. With ``kappa_f > 0`` a
first round sends per-class statistics for the Fisher-score feature selection
(as plain per-class sums under secure aggregation).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import Message
from ..core.validation import check_float
from .messages import GaussClassSums
from .protocol import STATS, GaussProtocol, GaussResult, onehot, result_message

__all__ = ["GaussClassifierProtocol", "encode_labels"]


class GaussClassifierProtocol(GaussProtocol):
    """Supervised variant: device data is ``(X, y)`` with y among ``classes``."""

    name = "gauss-classifier"
    supervised = True
    not_summable_reason = ("the server merges each owner's evolving clusters, which a sum cannot "
                           "carry; with kappa_f > 0 the feature-selection round is summed, and "
                           "FedGaussClassifier(privacy=...) sends per-class sums only")

    def __init__(self, *, classes: Sequence[Any], kappa_f: float = 0.0,
                 summed_stats: bool = False, **kw: Any):
        super().__init__(**kw)
        self.kappa_f = check_float(kappa_f, "kappa_f", min_value=0.0, max_value=1.0)
        self.selects = self.kappa_f > 0
        # the feature-selection round as plain per-class sums (secure aggregation)
        self.summed_stats = bool(summed_stats) and self.selects
        if self.summed_stats:
            self.summed_actions = frozenset({STATS})
            self.reply_types = {**type(self).reply_types, STATS: GaussClassSums}
        if self.em_rounds:
            raise ValidationError(f"em_rounds={self.em_rounds}: the federated EM rounds are for "
                                  "clustering; the classifier has none")
        classes = list(classes)
        if not classes:
            raise ValidationError("classes is empty: a classifier needs at least one class")
        self.classes = classes
        self._classes_arr = np.asarray(classes)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg["kappa_f"] = self.kappa_f
        if self.summed_stats:
            cfg["summed_stats"] = True
        cfg["classes"] = [c.item() if isinstance(c, np.generic) else c for c in self.classes]
        return cfg

    def secure_form(self) -> "GaussClassifierProtocol":
        """Under secure aggregation: the feature-selection round as per-class sums (the
        server gets their sum; the cluster rounds are sent as before)."""
        if not self.selects or self.summed_stats:
            return self
        return type(self).from_config({**self.config(), "summed_stats": True})

    def final_message(self, result: GaussResult, device_id: int) -> Message | None:
        msg = result_message(result, self.settings)
        M = self.n_classes
        return dataclasses.replace(msg, classes=onehot(result.classes, M))

    def _device_data(self, data: Any, device_id: int) -> tuple[np.ndarray, np.ndarray | None]:
        if not (isinstance(data, tuple) and len(data) == 2):
            raise ValidationError(f"device {device_id}: supervised data must be a tuple (X, y)")
        X, y = data
        Xd, _ = super()._device_data(X, device_id)
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != Xd.shape[0]:
            raise ValidationError(f"device {device_id}: y has shape {y.shape} but X has "
                                  f"{Xd.shape[0]} rows")
        return Xd, encode_labels(y, self._classes_arr, f"device {device_id}")


def encode_labels(y: np.ndarray, classes: np.ndarray, owner: str) -> np.ndarray:
    """Class indices of y in the sorted ``classes``; an unknown label is named."""
    try:
        idx = np.searchsorted(classes, y)
    except TypeError:
        raise ValidationError(f"{owner}: labels of type {y.dtype} cannot be compared with the "
                              f"classes {classes.tolist()[:10]}") from None
    idx = np.clip(idx, 0, len(classes) - 1)
    bad = classes[idx] != y
    if np.any(bad):
        # the row, never the value: this message can reach the server
        raise ValidationError(f"{owner}: the label of row {int(np.argmax(bad))} is not one of "
                              f"the {len(classes)} classes")
    return idx.astype(np.int64)
