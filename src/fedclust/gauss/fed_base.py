"""What the federated Gaussian estimators share: the fitted attributes stored from a run's
result (and again after a forget), the privacy record, the input checks of a fitted model.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.checkpoint import privacy_summary
from ..core.exceptions import NotFittedError, ValidationError
from ..core.validation import check_query
from ..unlearning.forget import ForgetMixin
from .evolving import cluster_attrs, estimator_settings
from .local import from_message
from .model import ClusterSet, one_thread
from .protocol import GaussProtocol, GaussResult, result_message

__all__ = ["FedGaussBase", "check_privacy", "privacy_record"]


def check_privacy(privacy: Any) -> Any:
    from ..privacy import DifferentialPrivacy

    if not isinstance(privacy, DifferentialPrivacy):
        raise ValidationError(f"privacy={privacy!r} must be a "
                              "fedclust.privacy.DifferentialPrivacy or None")
    return privacy


def privacy_record(protocol: Any, out: Any, ids: Sequence[int]) -> dict | None:
    """``privacy_``: the plan's summary with the run's true ε (a release lost to a crash
    and redone on resume counts); None: not private. The rows each owner clipped are
    counted on the owner and stay there (its ``n_clipped`` output)."""
    plan = getattr(protocol, "plan", None)
    return None if plan is None else privacy_summary(plan, out.log)


class FedGaussBase(ForgetMixin):
    """What :class:`~fedclust.gauss.estimator.FedGaussClustering` and
    :class:`~fedclust.gauss.classifier.FedGaussClassifier` share: the fitted model's
    attributes from a run's result, forgetting, the fitted check."""

    _protocol_cls: type = GaussProtocol

    def _apply_forget(self, out: Any, device_ids: Sequence[int]) -> None:
        """The model after :meth:`forget` (``fedclust.unlearning``): as ``fit`` stores it."""
        with one_thread():
            self._store(out, device_ids, len(getattr(self, "classes_", ())))
        self._store_classes()

    def _store_classes(self) -> None:
        """Per-class attributes of the classifier (nothing for clustering)."""

    def _store(self, out: Any, device_ids: Sequence[int], n_classes: int) -> None:
        res: GaussResult = out.result
        settings = estimator_settings(self)
        self._cs = from_message(result_message(res, settings), settings, 0)
        if n_classes:
            cs = ClusterSet(self._cs.D, settings, n_classes)
            cs.set_global(*self._cs.g)
            cs.add(res.means, res.scatters, res.counts.astype(float), res.classes,
                   -res.ages.astype(np.int64))
            self._cs = cs
        self._result = res
        self.n_features_in_ = int(res.features.size or res.means.shape[1])
        self.features_ = (res.features.astype(bool) if res.features.size
                          else np.ones(res.means.shape[1], bool))
        self.n_clusters_ = int(res.means.shape[0])
        attrs = cluster_attrs(self._cs)
        self.means_ = attrs["means"]
        self.covariances_ = attrs["covs"]
        self.scatters_ = attrs["scat"]
        self.counts_ = res.counts.copy()
        self.ages_ = res.ages.copy()
        self.cluster_centers_ = self.means_
        self.device_ids_ = list(device_ids)
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels") for z in device_ids]
        self.local_counts_ = [res.local_counts.get(z) for z in device_ids]
        self.communication_ = out.meter.summary()
        self.run_log_ = res.log
        self.em_trace_ = list(res.em_trace)
        self.removed_by_owner_ = {z: int(res.removed_by_owner.get(z, 0)) for z in device_ids}
        self.removed_samples_ = sum(self.removed_by_owner_.values()) + int(res.removed_by_server)
        self.global_count_ = int(res.global_count)
        self.global_mean_ = res.global_mean.copy()
        self.global_var_ = res.global_m2 / max(res.global_count, 1)

    def _check_fitted(self) -> ClusterSet:
        if not hasattr(self, "_cs"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        return self._cs

    def _check_X(self, X: Any) -> np.ndarray:
        """Validated X over the features the model uses (the selected ones)."""
        self._check_fitted()
        X = check_query(X, self, dtype=np.float64)
        return X if self.features_.all() else X[:, self.features_]
