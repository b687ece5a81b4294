"""What every center-based front door shares (k-FED, distributed k-means, ...).

scikit-learn's pattern: ``fit`` sets ``cluster_centers_``, ``n_features_in_``
and ``device_labels_``; these methods read them.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .exceptions import NotFittedError, ValidationError
from .kmeans import assign
from .validation import check_array

__all__ = ["CenterEstimatorMixin"]


class CenterEstimatorMixin:
    """``labels_``, ``predict`` (nearest final center) and ``fit_predict`` for a fitted model."""

    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; "
                                 "call fit(devices) first")

    @property
    def labels_(self) -> np.ndarray:
        """Labels of all participating devices' points, concatenated in device order."""
        self._check_fitted()
        return np.concatenate([lab for lab in self.device_labels_ if lab is not None])

    def predict(self, X: Any) -> np.ndarray:
        """Nearest final center of every row of X (n, d)."""
        self._check_fitted()
        X = check_array(X, "X")
        if X.shape[1] != self.n_features_in_:
            raise ValidationError(
                f"X has {X.shape[1]} features but the model was fitted with {self.n_features_in_}")
        return assign(X, self.cluster_centers_.astype(X.dtype, copy=False))[0]

    def fit_predict(self, devices: Sequence[Any], y: None = None, **fit_kw: Any) -> list:
        """Fit and return ``device_labels_``."""
        return self.fit(devices, **fit_kw).device_labels_
