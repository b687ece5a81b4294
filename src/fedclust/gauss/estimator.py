"""Front doors of the federated Gaussians: :class:`FedGaussClustering` here,
:class:`FedGaussClassifier` in :mod:`.classifier` (both importable from here);
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

from sklearn.base import BaseEstimator, ClusterMixin

from ..core.estimators import DeviceLabelsMixin, split_federation
from ..core.exceptions import ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import check_device_ids, check_devices, check_flags
from ..sim.transport import InProcessTransport
from ..unlearning.forget import run_recorded
from .classifier import FedGaussClassifier
from .evolving import PARAMS_DOC, ClusterScoring, EvolvingGaussians, estimator_settings
from .fed_base import FedGaussBase, check_privacy, privacy_record
from .model import MERGE_TOL, one_thread
from .protocol import SETTING_NAMES, GaussProtocol

__all__ = ["EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier"]

#: refinement rounds of a private FedGaussClustering fit by default (each is a release)
PRIVATE_ROUNDS = 3


class FedGaussClustering(ClusterScoring, FedGaussBase, DeviceLabelsMixin, ClusterMixin, BaseEstimator):
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

        return PrivateGaussProtocol(privacy=check_privacy(self.privacy), **kw)

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "FedGaussClustering":
        """Fit on the owners' (n_z, D) arrays; ``X``, ``groups``, ``device_ids`` and
        ``transport`` as in :meth:`fedclust.KFed.fit`."""
        check_flags(self, "progress")
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
        self.privacy_ = privacy_record(protocol, out, ids)
        return self

    _scored = FedGaussBase._check_fitted
