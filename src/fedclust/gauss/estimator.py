"""Front doors: :class:`FedGaussClustering` and :class:`FedGaussClassifier` (federated);
:class:`EvolvingGaussians` (one owner, online) lives in :mod:`.evolving`.

The default rule (one setting for every data set; see docs/gauss.md):

* scale from the data: per-feature variances of all data, pooled exactly across
  owners (Chan), each floored at ``var_floor`` x the median variance;
* birth: a sample joins its best cluster when d_M^2 <= chi^2_D quantile
  ``gate_quantile`` (the authors' d_M <= N_sigma is available as ``n_sigma``),
  otherwise it starts a new cluster with Sigma_0 = r diag(var), r = volume_fraction^(2/D)
  (clustering: no wider than the neighbourhood scale of the owner's rows);
* a cluster's covariance is (S + n0 Sigma_0) / (n + n0 - 1), n0 = 2 (D + 1);
* clustering (``merge_test="bic"``): two clusters merge when one Gaussian describes
  their samples at most ``merge_tol`` = 0.01 nats per sample worse than two, by BIC on
  their exact pooled statistics — whenever the count passes ``max_clusters`` and on the
  server (every pair, best first); after its pass an owner splits a cluster in two when
  the same test keeps the two halves of its own rows apart;
* classifier (``merge_test="volume"``, the paper's rule): merge active pairs online while
  det(Sigma_pq) / (det Sigma_p + det Sigma_q) < kappa_m within a size cap, fold
  clusters holding less than ``min_weight`` on the server; Fisher-score feature
  selection first (``kappa_f=0.01``); scoring covariances shrunk toward half the model's
  pooled within-cluster variance (``pooled_shrinkage=0.5``);
* past ``max_clusters`` the oldest clusters are removed; their samples are counted in
  ``removed_samples_``, so ``counts_.sum() + removed_samples_`` is every sample learnt;
* predict by the Gaussian likelihood (the paper's gamma is ``predict_rule="gamma"``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sklearn.base import BaseEstimator, ClassifierMixin, ClusterMixin

from ..core.checkpoint import privacy_summary
from ..core.estimators import DeviceLabelsMixin, split_federation
from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import check_array, check_device_ids, check_devices, check_n_features
from ..sim.transport import InProcessTransport, fit_transport
from ..unlearning.forget import ForgetMixin, run_recorded
from .evolving import (PARAMS_DOC, ClusterScoring, EvolvingGaussians, cluster_attrs,
                       estimator_settings)
from .local import from_message
from .model import MERGE_TOL, ClusterSet, one_thread
from .classifier_protocol import GaussClassifierProtocol
from .protocol import SETTING_NAMES, GaussProtocol, GaussResult, result_message
from .scoring import class_log_scores, proba

__all__ = ["EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier"]

#: refinement rounds of a private FedGaussClustering fit by default (each is a release)
PRIVATE_ROUNDS = 3


def _check_privacy(privacy: Any) -> Any:
    from ..privacy import DifferentialPrivacy

    if not isinstance(privacy, DifferentialPrivacy):
        raise ValidationError(f"privacy={privacy!r} must be a "
                              "fedclust.privacy.DifferentialPrivacy or None")
    return privacy


def _privacy_record(protocol: Any, out: Any, ids: Sequence[int]) -> dict | None:
    """``privacy_``: the plan's summary with the run's true ε (a release lost to a crash
    and redone on resume counts); None: not private. The rows each owner clipped are
    counted on the owner and stay there (its ``n_clipped`` output)."""
    plan = getattr(protocol, "plan", None)
    return None if plan is None else privacy_summary(plan, out.log)


class _FedBase(ForgetMixin):
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
        X = check_n_features(check_array(X, "X").astype(np.float64, copy=False), self)
        return X if self.features_.all() else X[:, self.features_]


class FedGaussClustering(ClusterScoring, _FedBase, DeviceLabelsMixin, ClusterMixin, BaseEstimator):
    __doc__ = """Federated self-evolving Gaussian clustering (one round, no preset k).

    Each owner learns its rows in one pass (:class:`EvolvingGaussians` rules; BIC
    merges only at ``max_clusters``), splits a cluster whose own rows the BIC test keeps
    apart as two, sends those with n > ``kappa_n`` (mean, packed
    scatter, count, age) and its per-feature (count, mean, m2); the server pools
    everything exactly, merges by BIC (every pair, best first), removes the oldest
    past ``max_clusters`` and broadcasts the global model, which each owner uses to
    label its rows.

    Parameters
    ----------""" + PARAMS_DOC + """
    kappa_n : float, default=0
        Owners send clusters with n > kappa_n (each owner sends at least one); the
        samples of the others count in ``removed_samples_``.
    n_rounds : int or None, default=None
        Rounds; round r streams the r-th chunk of every owner's rows (default 1).
        Under privacy: the refinement rounds after the private start (default 3).
    em_rounds : int, default=0
        Up to this many federated EM rounds after the clustering rounds
        (:mod:`fedclust.gauss.federated_em`): each round the server sends the current
        mixture and candidate edits (merging one of the 8 closest pairs, dropping one of
        the 8 lightest components, splitting one of the 8 heaviest); every owner returns
        the row-level log-likelihood and responsibility entropy of each over its rows and
        the E-step statistics; the server keeps the model with the lowest
        ``em_criterion`` and takes one M-step; it stops early when nothing changes
        (log-likelihood gain below 0.001 nats per row). 0 (the default) runs none.
        Not available with ``privacy`` (the rounds' statistics are not noised or
        accounted). The rounds' trace is ``em_trace_``.
    em_criterion : {"bic", "icl"}, default="bic"
        The EM rounds' model choice: the BIC of the mixture (it counts Gaussians) or the
        integrated completed likelihood (BIC plus twice the entropy of the soft
        assignment: it counts clusters, so overlapping Gaussians that share their rows
        join; on heavily overlapping clusters such as S4 it joins them too).
    combine : {"none", "entropy", "unimodal"}, default="none"
        A last step of the server on its merged model (:mod:`fedclust.gauss.combine`; no
        extra round, no extra bytes). ``"unimodal"``: pairs of clusters whose
        two-component mixture has a single mode (on the ridgeline, Hennig 2010) become one
        cluster, closest pair first; clusters the density separates stay apart.
        ``"entropy"``: components are combined greedily by the largest drop of the
        entropy of the posterior assignments, down to the change point of the entropy
        against the number of clusters (Baudry et al. 2010); it always combines down to
        its change point, so it also joins separated Gaussian clusters. Needs
        ``merge_test="bic"`` and ``server="flat"``; not available with ``privacy``.
    server : {"flat", "tree"}, default="flat"
        The server's merge. ``"flat"``: every owner's clusters at once (one greedy BIC
        merge over all of them, O(K^2 D^2) for K clusters received).
        ``"tree"``: along a fixed binary trie over the owners' ids
        (:mod:`fedclust.gauss.tree_merge`): a leaf of up to 8 owners merges as the
        flat server; a larger node consolidates its two halves' clusters against
        every owner cluster below it (so it can split a join made lower down). A
        forget recomputes only the departed owner's path in the trie (about log2 of
        the owners' count nodes), exactly; the root's step works on every owner
        cluster.
    privacy : DifferentialPrivacy or None
        Central (ε, δ)-DP (needs ``data_bound``; :mod:`fedclust.gauss.private_clustering`):
        owners' evolving clusters have no bounded sensitivity, so the private fit
        releases noisy per-component count, sum and second moments of whitened,
        clipped rows, each row in its most likely component of the broadcast model:
        a private global Gaussian, an over-complete set of candidates drawn from it,
        then ``n_rounds`` refinement rounds, each followed by the PSD repair, the
        pruning of components below the noise and the BIC merge (the number of
        clusters stays data-driven); ``kappa_n`` is not used. ``privacy_`` records
        the budget, the releases and the rows each owner clipped.
    random_state : int, Generator or None
        Recorded as ``seed_`` (the method itself is deterministic).
    progress : bool
        Progress bar over owners.

    Attributes
    ----------
    n_clusters_, means_ (K, D), covariances_, scatters_, counts_ (K,), ages_ (K,)
        As in :class:`EvolvingGaussians`.
    cluster_centers_ : alias of ``means_``
    labels_ : ndarray (n,)
        Every row's cluster (owner order, or the row order of X with ``groups``).
    device_labels_ : list of ndarray (n_z,) or None
    communication_ : dict (bytes up/down per owner and in total)
    removed_samples_ : int
        Samples learnt but in no cluster: clusters an owner did not send (n <= kappa_n)
        or removed past ``max_clusters`` (owner or server);
        ``counts_.sum() + removed_samples_`` = all rows. Per owner: ``removed_by_owner_``;
        the same counts are in ``run_log_.removed`` (owners that removed any) and
        ``run_log_.removed_by_server``.
    em_trace_ : list of dict
        One entry per EM round (``em_rounds > 0``): the round, the components, the kept
        edit (``"none"``, ``[p, q]`` merge, ``[p, -1]`` drop, ``[p, -2]`` split), the
        log-likelihood and the criterion's score of every model offered.
    run_log_, seed_

    Notes
    -----
    Bytes up per owner (float64): 8 [c (D + D(D+1)/2 + 2) + 2D + 1] with c
    clusters sent (8 [c (2D + 2) + 2D + 1] for ``covariance="diag"``); the
    same layout comes back with the K global clusters. Each EM round adds
    8 [2 (e + 1) + K (1 + D + w)] up and 8 [K (1 + D + w) + 2 e] down, e <= 24 edits,
    w = D(D+1)/2 (D for ``"diag"``).
    """

    def __init__(self, *, covariance: str = "full", gate_quantile: float = 0.99,
                 n_sigma: float | None = None, volume_fraction: float = 0.003,
                 n_r: float | None = None, prior_weight: float | None = None,
                 kappa_m: float = 1.5, volume: str = "det", max_volume: float = 0.1,
                 max_clusters: int = 200, min_weight: float = 0.005, var_floor: float = 1e-6,
                 predict_rule: str = "likelihood", merge_test: str = "bic",
                 pooled_shrinkage: float = 0.0, merge_tol: float = MERGE_TOL,
                 kappa_n: float = 0, n_rounds: int | None = None, em_rounds: int = 0,
                 em_criterion: str = "bic", combine: str = "none", server: str = "flat",
                 privacy: Any = None,
                 random_state: RandomState = None, progress: bool = False):
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
        self.kappa_n = kappa_n
        self.n_rounds = n_rounds
        self.em_rounds = em_rounds
        self.em_criterion = em_criterion
        self.combine = combine
        self.server = server
        self.privacy = privacy
        self.random_state = random_state
        self.progress = progress

    def _protocol(self, n_features: int) -> GaussProtocol:
        rounds = self.n_rounds
        if rounds is None:
            rounds = 1 if self.privacy is None else PRIVATE_ROUNDS
        kw = dict(kappa_n=self.kappa_n, n_rounds=rounds, n_features=n_features,
                  **{k: getattr(self, k) for k in SETTING_NAMES})
        if self.privacy is None:
            return GaussProtocol(em_rounds=self.em_rounds, em_criterion=self.em_criterion,
                                 combine=self.combine, server=self.server, **kw)
        if self.server != "flat":
            raise ValidationError(f"server={self.server!r} is not available with privacy: the "
                                  "private fit merges the noisy components at the server once")
        if self.em_rounds:
            raise ValidationError(f"em_rounds={self.em_rounds} is not available with privacy: the "
                                  "EM rounds' log-likelihoods and statistics are not noised or "
                                  "accounted; use em_rounds=0")
        if self.combine != "none":
            raise ValidationError(f"combine={self.combine!r} is not available with privacy: the "
                                  "private fit has its own merges; use combine='none'")
        from .private_clustering import PrivateGaussProtocol

        return PrivateGaussProtocol(privacy=_check_privacy(self.privacy), **kw)

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "FedGaussClustering":
        """Fit on the owners' (n_z, D) arrays; ``X``, ``groups``, ``device_ids`` and
        ``transport`` as in :meth:`fedclust.KFed.fit`."""
        fed = split_federation(X, groups=groups, device_ids=device_ids)
        owners = list(fed.devices)
        ids = check_device_ids(fed.device_ids, len(owners))
        devices = check_devices(owners, ids=ids)
        devices = [X.astype(np.float64, copy=False) for X in devices]
        protocol = self._protocol(devices[0].shape[1])
        estimator_settings(self)
        transport = transport or InProcessTransport(progress=self.progress)
        self.seed_ = root_seed(self.random_state)
        out = run_recorded(self, transport, protocol, dict(zip(ids, devices)), self.seed_)
        with one_thread():
            self._store(out, ids, 0)
        self._protocol_ = protocol
        self._rows = fed.rows
        self.privacy_ = _privacy_record(protocol, out, ids)
        return self

    _scored = _FedBase._check_fitted


class FedGaussClassifier(_FedBase, ClassifierMixin, BaseEstimator):
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

            protocol = PrivateGaussClassifierProtocol(privacy=_check_privacy(self.privacy), **kw)
        transport = fit_transport(transport, self.secure_aggregation, self.progress)
        self.seed_ = root_seed(self.random_state)
        data = {z: (X.astype(np.float64, copy=False), y) for z, X, y in zip(ids, devices, ys)}
        out = run_recorded(self, transport, protocol, data, self.seed_)
        with one_thread():
            self._store(out, ids, len(classes))
        self._store_classes()
        self._protocol_ = protocol
        self.privacy_ = _privacy_record(protocol, out, ids)
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
        private = self.privacy is not None and _check_privacy(self.privacy).private
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

    def predict(self, X: Any) -> np.ndarray:
        """The most likely class of every row (N,)."""
        scores = self._class_scores(X)
        return self.classes_[np.argmax(scores, axis=1)]
