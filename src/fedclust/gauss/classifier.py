"""The federated Gaussian classifier (:class:`FedGaussClassifier`): every owner learns
class-labelled Gaussian clusters of its rows in one pass, the server merges them; the
paper's volume merge test, Fisher-score feature selection and likelihood prediction
(the default rule is in :mod:`fedclust.gauss.estimator`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sklearn.base import BaseEstimator, ClassifierMixin

from ..core.estimators import split_federation
from ..core.exceptions import ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import (check_device_ids, check_devices, check_flags, check_labels,
                               check_query)
from ..sim.transport import InProcessTransport, fit_transport
from ..unlearning.forget import run_recorded
from .classifier_protocol import GaussClassifierProtocol
from .evolving import PARAMS_DOC
from .fed_base import FedGaussBase, check_privacy, privacy_record
from .model import MERGE_TOL, one_thread
from .protocol import SETTING_NAMES
from .scoring import class_log_scores, proba

__all__ = ["FedGaussClassifier"]


class FedGaussClassifier(FedGaussBase, ClassifierMixin, BaseEstimator):
    __doc__ = """Federated evolving Gaussian classifier (one cluster set per class, merged per class).

    Like :class:`FedGaussClustering`, but every cluster carries a class, a
    sample only joins clusters of its class, clusters never merge across
    classes, and every class an owner holds survives. ``predict_proba`` is the
    posterior of a Gaussian mixture per class (``predict_rule="likelihood"``)
    or the normalised best gamma per class (``"gamma"``). Labels may be any
    sortable values (strings too); ``classes_`` is the public ``classes`` or their sorted
    union over owners.

    Parameters
    ----------""" + PARAMS_DOC + """
    merge_test : default="volume" for the classifier
        (clusters never cross classes, so the count of clusters per class matters less
        than the boundaries; the paper's rule keeps Table 1).
    kappa_f : float, default=0.01
        Fisher-score feature selection (the paper's kappa_F): a first round pools
        every owner's per-class counts, means and variances exactly (M (2D + 1) + 2D + 1
        numbers per owner); features whose Fisher score (between- over within-class
        scatter) is below ``kappa_f`` x the best score are dropped before learning.
        0 turns the selection (and its round) off.
    kappa_n, random_state, progress : as in :class:`FedGaussClustering`
    n_rounds : int, default=1
        Rounds; round r streams the r-th chunk of every owner's rows.
    server : {"flat", "tree"}, default="flat"
        The server's merge: every owner's clusters at once, or along a fixed binary
        trie over the owners' ids (:mod:`fedclust.gauss.tree_merge`; a forget
        recomputes only the departed owner's path, exactly).
    privacy : DifferentialPrivacy or None
        Central (ε, δ)-DP (needs ``data_bound``): one round of per-class count,
        sum and second moments of the clipped rows, noised on the server, one
        Gaussian per class with a PSD repair (:mod:`fedclust.gauss.private`);
        the evolving per-class clusters and the Fisher selection are not used.
        ``privacy_`` records the budget and the release. Needs ``classes``.
    classes : array-like of labels, optional
        The public list of labels (``classes_``, sorted). Required under
        ``privacy``; without it ``classes_`` is the sorted union of the owners'
        labels. An owner's label outside it is refused.
    secure_aggregation : bool or SecureAggregation, default=False
        Run the rounds whose replies the server only adds up as secure sums
        (:mod:`fedclust.core.secure_sum`; the same as fitting on
        ``InProcessTransport(secure_aggregation=...)``). With ``privacy`` that is the
        whole fit: the owners' per-class counts, sums and second moments; the server
        learns only their sum (to ``2**-20`` fixed-point precision per owner) and noises
        it. Without ``privacy`` only the feature-selection round (``kappa_f > 0``) is
        summed: the server merges each owner's evolving clusters, which a sum cannot
        carry, so they still reach it one by one; with ``kappa_f=0`` no round is left to
        sum and ``fit`` says so. Each secure round costs 3 extra exchanges.

    Attributes
    ----------
    classes_ : ndarray (M,)
    n_clusters_, means_, covariances_, scatters_, counts_, ages_
        As in :class:`EvolvingGaussians`.
    cluster_classes_ : ndarray (K,) of labels in ``classes_``
    clusters_per_class_ : dict label -> int
    features_ : ndarray (D,) of bool
        The features the model uses (Fisher-score selection).
    fisher_scores_ : ndarray (D,)
        Fisher score of every feature from the pooled per-class statistics
        (empty when ``kappa_f=0``).
    communication_, run_log_, seed_

    Notes
    -----
    Bytes up per owner (full covariance, D' kept features of D):
    8 [c (D' + D'(D'+1)/2 + 2 + M) + (2D' + 1)(M + 1)], plus 8 (2D + 1)(M + 1)
    in the selection round when ``kappa_f > 0``; down: the global model in the same
    layout plus the D-long feature mask (and the mask once before learning).
    """

    def __init__(self, *, covariance: str = "full", gate_quantile: float = 0.999,
                 n_sigma: float | None = None, volume_fraction: float = 0.05,
                 n_r: float | None = None, prior_weight: float | None = None,
                 kappa_m: float = 1.5, volume: str = "det", max_volume: float = 0.1,
                 max_clusters: int = 200, min_weight: float = 0.005, var_floor: float = 1e-6,
                 predict_rule: str = "likelihood", merge_test: str = "volume",
                 pooled_shrinkage: float = 0.5, merge_tol: float = MERGE_TOL,
                 kappa_f: float = 0.01, kappa_n: float = 1,
                 n_rounds: int = 1, server: str = "flat", privacy: Any = None,
                 classes: Any = None,
                 random_state: RandomState = None, progress: bool = False,
                 secure_aggregation: Any = False):
        self.covariance = covariance
        self.gate_quantile = gate_quantile
        self.n_sigma = n_sigma
        self.volume_fraction = volume_fraction
        self.n_r = n_r
        self.prior_weight = prior_weight
        self.kappa_m = kappa_m
        self.volume = volume
        self.max_volume = max_volume
        self.max_clusters = max_clusters
        self.min_weight = min_weight
        self.var_floor = var_floor
        self.predict_rule = predict_rule
        self.merge_test = merge_test
        self.pooled_shrinkage = pooled_shrinkage
        self.merge_tol = merge_tol
        self.kappa_f = kappa_f
        self.kappa_n = kappa_n
        self.n_rounds = n_rounds
        self.server = server
        self.privacy = privacy
        self.classes = classes
        self.random_state = random_state
        self.progress = progress
        self.secure_aggregation = secure_aggregation

    def fit(self, X: Any, y: Any, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "FedGaussClassifier":
        """Fit on per-owner arrays ``X[z]`` (n_z, D) and labels ``y[z]`` (n_z,); or on
        one array X (n, D) and y (n,) with ``groups`` (n,) naming every row's owner
        (without ``groups``: one owner). See :meth:`fedclust.KFed.fit`."""
        check_flags(self, "progress")
        fed = split_federation(X, y, groups=groups, device_ids=device_ids)
        owners_X, owners_y, device_ids = list(fed.devices), fed.labels, fed.device_ids
        if owners_y is None:
            raise ValidationError("FedGaussClassifier requires y to be passed, but the target y "
                                  "is None")
        owners_y = list(owners_y) if not isinstance(owners_y, np.ndarray) or owners_y.dtype == object \
            else None
        if owners_y is None:
            raise ValidationError("y must be one label array per owner when X is a sequence "
                                  "of owners")
        if len(owners_y) != len(owners_X):
            raise ValidationError(f"X has {len(owners_X)} owners but y has {len(owners_y)} "
                                  "label arrays")
        ids = check_device_ids(device_ids, len(owners_X))
        devices = check_devices(owners_X, ids=ids)
        ys = []
        for z, X, y in zip(ids, devices, owners_y):
            y = np.asarray(y)
            if y.dtype.kind == "O" and all(isinstance(v, str) for v in y.ravel()):
                y = y.astype(str)  # pandas' object column of strings
            if y.ndim != 1 or y.shape[0] != X.shape[0]:
                raise ValidationError(f"owner {z}: y has shape {y.shape} but X has {X.shape[0]} rows")
            if y.dtype.kind == "f" and not np.isfinite(y).all():
                raise ValidationError(f"owner {z}: y contains a non-finite label "
                                      f"{y[~np.isfinite(y)][0]}")
            if y.dtype.kind not in "biufUS":
                raise ValidationError(f"owner {z}: labels of dtype {y.dtype} are not supported "
                                      "(use numbers or strings)")
            ys.append(y)
        text = [y.dtype.kind in "US" for y in ys]
        if any(text) and not all(text):
            z = ids[text.index(not text[0])]
            raise ValidationError(f"owner {z}: labels mix strings and numbers across owners "
                                  f"(owner {ids[0]} has dtype {ys[0].dtype}, owner {z} has "
                                  f"{ys[ids.index(z)].dtype})")
        classes = self._public_classes(ids, ys)
        self.classes_ = classes
        kw = dict(classes=classes.tolist(), kappa_f=self.kappa_f, kappa_n=self.kappa_n,
                  n_rounds=self.n_rounds, n_features=devices[0].shape[1],
                  **{k: getattr(self, k) for k in SETTING_NAMES})
        if self.privacy is None:
            protocol = GaussClassifierProtocol(server=self.server, **kw)
        elif self.server != "flat":
            raise ValidationError(f"server={self.server!r} is not available with privacy: the "
                                  "private classifier's server sums the owners' releases")
        else:
            from .private import PrivateGaussClassifierProtocol

            protocol = PrivateGaussClassifierProtocol(privacy=check_privacy(self.privacy), **kw)
        transport = fit_transport(transport, self.secure_aggregation, self.progress)
        self.seed_ = root_seed(self.random_state)
        data = {z: (X.astype(np.float64, copy=False), y) for z, X, y in zip(ids, devices, ys)}
        out = run_recorded(self, transport, protocol, data, self.seed_)
        with one_thread():
            self._store(out, ids, len(classes))
        self._store_classes()
        self._protocol_ = protocol
        self.privacy_ = privacy_record(protocol, out, ids)
        return self

    def _forget_protocol(self, u: Any, kept: Any, new_data: dict) -> Any:
        """After a forget the label set is the union of the remaining owners' labels (as a
        fresh fit finds it); if a class goes, every owner computes again."""
        counts = np.zeros(len(self.classes_), np.int64)
        for r in kept.rounds:
            for z, msg in r.replies.items():
                if z not in new_data and getattr(msg, "class_count", None) is not None:
                    counts += np.asarray(msg.class_count, np.int64)
        for X, y in new_data.values():
            counts += np.bincount(np.searchsorted(self.classes_, y), minlength=len(counts))
        if (counts > 0).all():
            return u.protocol
        classes = self.classes_[counts > 0]
        return type(u.protocol).from_config(
            {**u.protocol.config(), "classes": [c.item() if isinstance(c, np.generic) else c
                                                for c in classes]})

    def _protocol_changed(self, protocol: Any) -> None:
        super()._protocol_changed(protocol)
        self.classes_ = np.asarray(protocol.classes) if len(protocol.classes) else self.classes_

    def _store_classes(self) -> None:
        classes = self.classes_
        self.cluster_classes_ = classes[self._result.classes]
        self.clusters_per_class_ = {c.item() if isinstance(c, np.generic) else c:
                                    int((self._result.classes == i).sum())
                                    for i, c in enumerate(classes)}
        self.fisher_scores_ = self._result.fisher.copy()

    def _public_classes(self, ids: Sequence[int], ys: Sequence[np.ndarray]) -> np.ndarray:
        """``classes_``: the public ``classes`` (required under privacy: the union of the
        owners' labels would be released without noise), else the owners' sorted union."""
        private = self.privacy is not None and check_privacy(self.privacy).private
        if self.classes is None:
            if private:
                raise ValidationError(
                    "privacy: FedGaussClassifier needs classes= (the public list of labels); "
                    "the union of the owners' labels would be released without noise")
            try:
                return np.unique(np.concatenate(ys))
            except TypeError as exc:
                raise ValidationError(f"labels of the owners cannot be compared ({exc})") from None
        classes = np.asarray(self.classes)
        if classes.ndim != 1 or classes.size == 0 or classes.dtype.kind not in "biuUS":
            raise ValidationError(f"classes must be a non-empty list of integer or string "
                                  f"labels, got {self.classes!r}")
        classes = np.unique(classes)
        for z, y in zip(ids, ys):
            if (y.dtype.kind in "US") != (classes.dtype.kind in "US"):
                raise ValidationError(f"owner {z}: labels of dtype {y.dtype} but classes= has "
                                      f"dtype {classes.dtype}")
            unknown = ~np.isin(y, classes)
            if unknown.any():
                what = "" if private else f" ({y[unknown][0]!r})"
                raise ValidationError(f"owner {z} holds a label outside classes={classes.tolist()}"
                                      f"{what}")
        return classes

    def _class_scores(self, X: Any) -> np.ndarray:
        cs = self._check_fitted()
        return class_log_scores(cs, self._check_X(X), cs.s.predict_rule)

    def decision_function(self, X: Any) -> np.ndarray:
        """Class log scores (N, M); for two classes (scikit-learn's convention) the
        score of ``classes_[1]`` minus that of ``classes_[0]`` (N,)."""
        scores = self._class_scores(X)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict_proba(self, X: Any) -> np.ndarray:
        """(N, M) class probabilities in the order of ``classes_`` (rows sum to 1)."""
        return proba(self._class_scores(X))

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Mean accuracy of :meth:`predict` on X (n, D) against y (n,) (scikit-learn's
        ``ClassifierMixin.score``)."""
        X = check_query(X, self, min_rows=1, dtype=np.float64)
        return super().score(X, check_labels(y, X.shape[0]), sample_weight)

    def predict(self, X: Any) -> np.ndarray:
        """The most likely class of every row (N,)."""
        scores = self._class_scores(X)
        return self.classes_[np.argmax(scores, axis=1)]
