"""Front doors: :class:`EvolvingGaussians` (one owner, online),
:class:`FedGaussClustering` and :class:`FedGaussClassifier` (federated).

The default rule (one setting for every data set; see docs/gauss.md):

* scale from the data: per-feature variances of all data, pooled exactly across
  owners (Chan), each floored at ``var_floor`` x the median variance (never the
  mean variance, which one huge raw feature dominates);
* a new cluster starts at x with Sigma_0 = r diag(var), r = volume_fraction^(2/D):
  its volume is a fixed fraction of the global volume in every dimension (the
  authors' ``diag(var / N_r)`` with a per-data-set N_r is available as ``n_r``);
* a sample joins its best cluster when d_M^2 <= chi^2_D quantile ``gate_quantile``
  (the gate scales with D; the authors' d_M <= N_sigma is available as ``n_sigma``);
* a cluster's covariance is (S + n0 Sigma_0) / (n + n0 - 1), n0 = 2 (D + 1);
* merge the best candidate pair while det(Sigma_pq) / (det Sigma_p + det Sigma_q)
  < kappa_m (=1.5, the paper's value) and the merged volume is at most
  ``max_volume`` of the global volume; on the server, clusters holding less than
  ``min_weight`` of the data are folded into their most likely neighbour;
* clustering (``adaptive_prior=True``): once clusters mature, Sigma_0 shrinks to the
  lower-quartile volume of the mature clusters when that is smaller (clusters much
  smaller than the global-volume fraction are not swallowed by young neighbours);
* clustering (``merge_test="both"``): a pair also merges when its pooled Gaussian loses
  at most ``overlap_tol`` (0) nats per sample of classification likelihood (no cap);
* classifier: Fisher-score feature selection first (``kappa_f=0.01``: per-class counts,
  means and variances pooled exactly in an extra round; features scoring below 1 % of
  the best are dropped before learning);
* predict by the Gaussian likelihood (measured better than gamma; both offered); the
  classifier scores with covariances shrunk toward half the model's pooled
  within-cluster variance (``pooled_shrinkage=0.5``) rather than toward Sigma_0.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import check_array, check_device_ids, check_devices, check_scale
from ..sim.transport import InProcessTransport
from .local import from_message, learn_local
from .model import ClusterSet, Settings, one_thread
from .protocol import (SETTING_NAMES, GaussClassifierProtocol, GaussProtocol, GaussResult,
                       check_settings, predict_labels, result_message)
from .scoring import class_log_scores, proba
from .stats import moments

__all__ = ["EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier"]

_PARAMS_DOC = """
    covariance : {"full", "diag"}, default="full"
        Full scatter matrices, or their diagonals (O(D) per cluster; high D).
    gate_quantile : float, default=0.99 (0.999 for the classifier)
        A sample joins its best cluster when d_M^2 <= chi^2_D.ppf(gate_quantile).
    n_sigma : float or None
        The authors' gate d_M <= N_sigma (overrides ``gate_quantile``; paper: sqrt(D)).
    volume_fraction : float, default=0.003 (0.05 for the classifier)
        A new cluster's volume as a fraction of the global Gaussian's volume.
    n_r : float or None
        The authors' rule Sigma_0 = diag(var / N_r) (overrides ``volume_fraction``).
    prior_weight : float or None
        n0 in Sigma = (S + n0 Sigma_0) / (n + n0 - 1); default 2 (D + 1).
    kappa_m : float, default=1.5
        Merge while V_pq / (V_p + V_q) < kappa_m (paper's kappa_m).
    volume : {"det", "sqrt_det", "det_root"}, default="det"
        V = det(Sigma), sqrt(det(Sigma)) or det(Sigma)^(1/D) (the authors' variants).
    max_volume : float, default=0.1
        Size cap: a merge may not make sqrt(det Sigma) exceed this fraction of
        the global volume.
    max_clusters : int, default=200
        Past it the oldest cluster is removed (never a class's last one).
    min_weight : float, default=0.005
        Server: clusters with less than this fraction of all samples are folded
        into their most likely neighbour (exact statistics).
    var_floor : float, default=1e-6
        Per-feature variance floor as a fraction of the median feature variance.
    predict_rule : {"likelihood", "gamma"}, default="likelihood"
        Gaussian likelihood d_M^2 + log det Sigma (+ log n), or the paper's gamma.
    merge_test : {"both", "volume"}, default="both"
        "both": a pair also merges when one Gaussian explains it about as well as
        two (classification likelihood per sample, see ``overlap_tol``); "volume":
        the paper's volume criterion only.
    overlap_tol : float, default=0.0
        Nats per sample of classification likelihood a merge may lose.
    adaptive_prior : bool, default=True (False for the classifier)
        Shrink Sigma_0 to the lower-quartile volume of the mature clusters (n >= D + 1,
        small-sample-corrected log det) when that is smaller than the volume rule;
        re-evaluated online as the stream grows and on the server from the received and
        the final clusters (deterministic, order-independent). An owner (and ``fit``)
        holds all its rows, so it streams them twice: a pilot pass measures the factor,
        the second pass starts from it (without it the first clusters, born under the
        volume rule, which is wide in high D, swallow neighbouring blobs for good).
    max_dip : float, default=0.75
        With ``merge_test="both"``, the volume criterion merges a pair only when the
        two-Gaussian mixture density has no valley deeper than this (in log density)
        on the segment between the means (0.75: two equal Gaussians about 3.5 sigma
        apart; ``inf``: no gate). The likelihood test is not gated. A core and its halo pass; young
        clusters of two neighbouring blobs (which the volume rule joins in D >= 5) do not.
    pooled_shrinkage : float, default=0.0 (0.5 for the classifier)
        w > 0: at prediction, a cluster's covariance is (S_i + n0 T) / (n_i + n0 - 1)
        with T = w x the model's pooled within-cluster variance (diagonal) instead of
        Sigma_0 (see :meth:`ClusterSet.scoring_precisions`); learning is unchanged.
"""


class _Params:
    """Hyper-parameter plumbing shared by the three front doors."""

    def _settings(self) -> Settings:
        return check_settings(**{k: getattr(self, k) for k in SETTING_NAMES})

    @staticmethod
    def _init(obj: Any, local: dict[str, Any]) -> None:
        for k, v in local.items():
            if k not in ("self", "__class__"):
                setattr(obj, k, v)


def _cluster_attrs(cs: ClusterSet) -> dict[str, np.ndarray]:
    C = cs.C
    if cs.C == 0:
        D = cs.D
        return {"means": np.zeros((0, D)), "covs": np.zeros((0, D, D) if cs.full else (0, D)),
                "scat": np.zeros((0, D, D) if cs.full else (0, D))}
    return {"means": cs.mu[:C].copy(), "covs": cs.covariance(np.arange(C)),
            "scat": cs.S[:C].copy()}


class EvolvingGaussians(_Params):
    __doc__ = """Self-evolving Gaussian clustering of one owner's stream (eGAUSS+ style).

    No preset number of clusters: ``learn_one`` / ``partial_fit`` absorb a sample
    into its best cluster (Mahalanobis gate) with exact rank-one updates of the
    mean and scatter, or start a new cluster; overlapping clusters merge by the
    volume criterion with a size cap; past ``max_clusters`` the oldest is removed.
    ``partial_fit(X)`` first pools X's per-feature statistics (so the scale rule
    sees the batch), then streams its rows.

    Parameters
    ----------""" + _PARAMS_DOC + """
    Attributes (valid before the first sample: zero clusters)
    ----------
    n_clusters_ : int
    means_ : ndarray (c, D)
    covariances_ : ndarray (c, D, D) or (c, D) for ``covariance="diag"``
        The covariances the model uses, (S + n0 Sigma_0) / (n + n0 - 1).
    scatters_ : ndarray, like covariances_
        Exact scatter matrices sum (x - mu)(x - mu)^T.
    counts_ : ndarray (c,)
    ages_ : ndarray (c,)
        Samples seen since each cluster was last activated.
    n_samples_seen_ : int

    Notes
    -----
    Per sample O(c D^2) (rank-one Sherman-Morrison updates of each cluster's
    precision; a Cholesky refresh every max(32, D) updates). Ožbot & Škrjanc,
    "Federated learning with self-evolving Gaussian clusters"; Škrjanc, eGAUSS+,
    IEEE TFS 28(9), 2020.
    """

    def __init__(self, *, covariance: str = "full", gate_quantile: float = 0.99,
                 n_sigma: float | None = None, volume_fraction: float = 0.003,
                 n_r: float | None = None, prior_weight: float | None = None,
                 kappa_m: float = 1.5, volume: str = "det", max_volume: float = 0.1,
                 max_clusters: int = 200, min_weight: float = 0.005, var_floor: float = 1e-6,
                 predict_rule: str = "likelihood", merge_test: str = "both",
                 overlap_tol: float = 0.0, adaptive_prior: bool = True,
                 max_dip: float = 0.75, pooled_shrinkage: float = 0.0):
        self._init(self, locals())

    def _model(self, D: int | None) -> ClusterSet | None:
        cs = getattr(self, "_cs", None)
        if cs is None and D is not None:
            cs = self._cs = ClusterSet(D, self._settings())
        return cs

    def _check_X(self, X: Any, name: str = "X") -> np.ndarray:
        X = check_array(X, name).astype(np.float64, copy=False)
        check_scale([X], name)
        cs = getattr(self, "_cs", None)
        if cs is not None and X.shape[1] != cs.D:
            raise ValidationError(f"{name} has {X.shape[1]} features but the model has {cs.D}")
        return X

    def learn_one(self, x: Any) -> "EvolvingGaussians":
        """Learn one sample (a length-D vector)."""
        x = np.asarray(x)
        if x.ndim != 1:
            raise ValidationError(f"x must be 1-D (one sample), got shape {x.shape}")
        return self.partial_fit(x[None, :])

    def partial_fit(self, X: Any, y: None = None) -> "EvolvingGaussians":
        """Learn the rows of X in order (one pass)."""
        X = self._check_X(X)
        cs = self._model(X.shape[1])
        if X.shape[0]:
            with one_thread():
                cs.update_global(*moments(X))
                cs.learn(X)
        return self

    def fit(self, X: Any, y: None = None) -> "EvolvingGaussians":
        """Forget everything, learn X as one owner does (one pass, or a pilot pass and
        one with ``adaptive_prior``), then :meth:`compact` (as the server does)."""
        self._cs = None
        X = self._check_X(X)
        if X.shape[0]:
            with one_thread():
                self._cs = learn_local(X, None, self._settings(), 0)
        else:
            self._model(X.shape[1])
        return self.compact()

    def compact(self) -> "EvolvingGaussians":
        """The server's clean-up on this model: merge every passing pair (not only pairs
        active for one sample), fold clusters holding < ``min_weight`` of the samples into
        their most likely neighbour (exact statistics, no sample lost), prune past
        ``max_clusters``. ``partial_fit`` / ``learn_one`` never call it, so a cluster that
        is just emerging in a stream is not folded away; call it when a summary is wanted.
        O(c^2 D^2 + merges c D^3)."""
        cs = getattr(self, "_cs", None)
        if cs is not None and cs.C > 1:
            with one_thread():
                cs.adapt_prior()
                cs.merge_all()
                cs.absorb_fragments()
                cs.prune()
                cs.adapt_prior()
        return self

    def _fitted(self) -> ClusterSet:
        cs = getattr(self, "_cs", None)
        if cs is None or cs.C == 0:
            raise NotFittedError("EvolvingGaussians has no cluster yet; learn some samples first")
        return cs

    def predict(self, X: Any) -> np.ndarray:
        """Index of the best cluster of every row."""
        cs = self._fitted()
        return predict_labels(cs, self._check_X(X), cs.s.predict_rule)

    def predict_proba(self, X: Any) -> np.ndarray:
        """(N, c) cluster memberships (posterior; rows sum to 1)."""
        cs = self._fitted()
        return proba(cs.log_scores(self._check_X(X), cs.s.predict_rule))

    def fit_predict(self, X: Any, y: None = None) -> np.ndarray:
        return self.fit(X).predict(X)

    @property
    def n_clusters_(self) -> int:
        cs = getattr(self, "_cs", None)
        return 0 if cs is None else cs.C

    def _attr(self, key: str) -> np.ndarray:
        cs = getattr(self, "_cs", None)
        if cs is None:
            return np.zeros((0, 0)) if key != "covs" else np.zeros((0, 0, 0))
        return _cluster_attrs(cs)[key]

    means_ = property(lambda self: self._attr("means"))
    covariances_ = property(lambda self: self._attr("covs"))
    scatters_ = property(lambda self: self._attr("scat"))
    counts_ = property(lambda self: np.zeros(0) if getattr(self, "_cs", None) is None
                       else self._cs.n[:self._cs.C].copy())
    ages_ = property(lambda self: np.zeros(0, np.int64) if getattr(self, "_cs", None) is None
                     else (self._cs.t - self._cs.last[:self._cs.C]).astype(np.int64))
    n_samples_seen_ = property(lambda self: 0 if getattr(self, "_cs", None) is None
                               else int(self._cs.t))


class _FedBase(_Params):
    _protocol_cls: type = GaussProtocol

    def _store(self, out: Any, device_ids: Sequence[int], n_classes: int) -> None:
        res: GaussResult = out.result
        settings = self._settings()
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
        attrs = _cluster_attrs(self._cs)
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
        X = check_array(X, "X").astype(np.float64, copy=False)
        if X.shape[1] != self.n_features_in_:
            raise ValidationError(f"X has {X.shape[1]} features but the model was fitted "
                                  f"with {self.n_features_in_}")
        return X if self.features_.all() else X[:, self.features_]


class FedGaussClustering(_FedBase):
    __doc__ = """Federated self-evolving Gaussian clustering (one round, no preset k).

    Each owner learns its rows in one pass (:class:`EvolvingGaussians` rules),
    sends its clusters with n > ``kappa_n`` (mean, packed scatter, count, age)
    and its per-feature (count, mean, m2); the server pools everything exactly,
    merges overlapping clusters, folds fragments, removes the oldest past
    ``max_clusters`` and broadcasts the global model, which each owner uses to
    label its rows.

    Parameters
    ----------""" + _PARAMS_DOC + """
    kappa_n : float, default=1
        Owners send clusters with n > kappa_n (each owner sends at least one).
    n_rounds : int, default=1
        Rounds; round r streams the r-th chunk of every owner's rows.
    random_state : int, Generator or None
        Recorded as ``seed_`` (the method itself is deterministic).
    progress : bool
        Progress bar over owners.

    Attributes
    ----------
    n_clusters_, means_ (K, D), covariances_, scatters_, counts_ (K,), ages_ (K,)
    cluster_centers_ : alias of ``means_``
    device_labels_ : list of ndarray (n_z,) or None
    communication_ : dict (bytes up/down per owner and in total)
    run_log_, seed_

    Notes
    -----
    Bytes up per owner (float64): 8 [c (D + D(D+1)/2 + 2) + 2D + 1] with c
    clusters sent (8 [c (2D + 2) + 2D + 1] for ``covariance="diag"``); the
    same layout comes back with the K global clusters.
    """

    def __init__(self, *, covariance: str = "full", gate_quantile: float = 0.99,
                 n_sigma: float | None = None, volume_fraction: float = 0.003,
                 n_r: float | None = None, prior_weight: float | None = None,
                 kappa_m: float = 1.5, volume: str = "det", max_volume: float = 0.1,
                 max_clusters: int = 200, min_weight: float = 0.005, var_floor: float = 1e-6,
                 predict_rule: str = "likelihood", merge_test: str = "both",
                 overlap_tol: float = 0.0, adaptive_prior: bool = True,
                 max_dip: float = 0.75, pooled_shrinkage: float = 0.0,
                 kappa_n: float = 1, n_rounds: int = 1,
                 random_state: RandomState = None, progress: bool = False):
        self._init(self, locals())

    def _protocol(self, n_features: int) -> GaussProtocol:
        return GaussProtocol(kappa_n=self.kappa_n, n_rounds=self.n_rounds, n_features=n_features,
                             **{k: getattr(self, k) for k in SETTING_NAMES})

    def fit(self, owners: Sequence[Any], y: None = None, *,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "FedGaussClustering":
        """Fit on ``owners``: a sequence of (n_z, D) arrays."""
        ids = check_device_ids(device_ids, len(list(owners)) if not isinstance(owners, np.ndarray) else 1)
        devices = check_devices(owners, ids=ids)
        devices = [X.astype(np.float64, copy=False) for X in devices]
        protocol = self._protocol(devices[0].shape[1])
        self._settings()
        transport = transport or InProcessTransport(progress=self.progress)
        self.seed_ = root_seed(self.random_state)
        out = transport.run(protocol, dict(zip(ids, devices)), self.seed_)
        with one_thread():
            self._store(out, ids, 0)
        self._protocol_ = protocol
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Index of the most likely global cluster of every row."""
        cs = self._check_fitted()
        return predict_labels(cs, self._check_X(X), cs.s.predict_rule)

    def predict_proba(self, X: Any) -> np.ndarray:
        cs = self._check_fitted()
        return proba(cs.log_scores(self._check_X(X), cs.s.predict_rule))

    def fit_predict(self, owners: Sequence[Any], y: None = None, **kw: Any) -> list:
        return self.fit(owners, **kw).device_labels_

    @property
    def labels_(self) -> np.ndarray:
        self._check_fitted()
        return np.concatenate([lab for lab in self.device_labels_ if lab is not None])


class FedGaussClassifier(_FedBase):
    __doc__ = """Federated evolving Gaussian classifier (one cluster set per class, merged per class).

    Like :class:`FedGaussClustering`, but every cluster carries a class, a
    sample only joins clusters of its class, clusters never merge across
    classes, and every class an owner holds survives. ``predict_proba`` is the
    posterior of a Gaussian mixture per class (``predict_rule="likelihood"``)
    or the normalised best gamma per class (``"gamma"``). Labels may be any
    sortable values (strings too); ``classes_`` is their sorted union over owners.

    Parameters
    ----------""" + _PARAMS_DOC + """
    merge_test : default="volume" for the classifier
        (the likelihood test measured 0.5 point worse on average over 14 sets).
    kappa_f : float, default=0.01
        Fisher-score feature selection (the paper's kappa_F): a first round pools
        every owner's per-class counts, means and variances exactly (M (2D + 1) + 2D + 1
        numbers per owner); features whose Fisher score (between- over within-class
        scatter) is below ``kappa_f`` x the best score are dropped before learning.
        0 turns the selection (and its round) off.
    kappa_n, n_rounds, random_state, progress : as in :class:`FedGaussClustering`

    Attributes
    ----------
    classes_ : ndarray (M,)
    n_clusters_, means_, covariances_, scatters_, counts_, ages_
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
                 overlap_tol: float = 0.0, adaptive_prior: bool = False,
                 max_dip: float = 0.75, pooled_shrinkage: float = 0.5,
                 kappa_f: float = 0.01, kappa_n: float = 1,
                 n_rounds: int = 1,
                 random_state: RandomState = None, progress: bool = False):
        self._init(self, locals())

    def fit(self, owners_X: Sequence[Any], owners_y: Sequence[Any], *,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "FedGaussClassifier":
        """Fit on per-owner arrays ``owners_X[z]`` (n_z, D) and labels ``owners_y[z]`` (n_z,)."""
        if isinstance(owners_X, np.ndarray):
            raise ValidationError("owners_X must be a sequence of per-owner 2-D arrays, got one "
                                  f"array of shape {owners_X.shape}; wrap it as [X]")
        owners_X = list(owners_X)
        owners_y = list(owners_y) if not isinstance(owners_y, np.ndarray) or owners_y.dtype == object \
            else None
        if owners_y is None:
            raise ValidationError("owners_y must be a sequence of per-owner label arrays; wrap "
                                  "one array as [y]")
        if len(owners_y) != len(owners_X):
            raise ValidationError(f"owners_X has {len(owners_X)} owners but owners_y has "
                                  f"{len(owners_y)}")
        ids = check_device_ids(device_ids, len(owners_X))
        devices = check_devices(owners_X, ids=ids)
        ys = []
        for z, X, y in zip(ids, devices, owners_y):
            y = np.asarray(y)
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
        try:
            classes = np.unique(np.concatenate(ys))
        except TypeError as exc:
            raise ValidationError(f"labels of the owners cannot be compared ({exc})") from None
        self.classes_ = classes
        protocol = GaussClassifierProtocol(
            classes=classes.tolist(), kappa_f=self.kappa_f, kappa_n=self.kappa_n,
            n_rounds=self.n_rounds,
            n_features=devices[0].shape[1], **{k: getattr(self, k) for k in SETTING_NAMES})
        transport = transport or InProcessTransport(progress=self.progress)
        self.seed_ = root_seed(self.random_state)
        data = {z: (X.astype(np.float64, copy=False), y) for z, X, y in zip(ids, devices, ys)}
        out = transport.run(protocol, data, self.seed_)
        with one_thread():
            self._store(out, ids, len(classes))
        self.cluster_classes_ = classes[self._result.classes]
        self.clusters_per_class_ = {c.item() if isinstance(c, np.generic) else c:
                                    int((self._result.classes == i).sum())
                                    for i, c in enumerate(classes)}
        self.fisher_scores_ = self._result.fisher.copy()
        self._protocol_ = protocol
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """(N, M) class log scores."""
        cs = self._check_fitted()
        return class_log_scores(cs, self._check_X(X), cs.s.predict_rule)

    def predict_proba(self, X: Any) -> np.ndarray:
        """(N, M) class probabilities in the order of ``classes_`` (rows sum to 1)."""
        return proba(self.decision_function(X))

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[np.argmax(self.decision_function(X), axis=1)]

    def score(self, X: Any, y: Any) -> float:
        """Accuracy on (X, y)."""
        y = np.asarray(y)
        pred = self.predict(X)
        if y.shape != pred.shape:
            raise ValidationError(f"y has shape {y.shape} but X has {pred.shape[0]} rows")
        return float(np.mean(pred == y))
