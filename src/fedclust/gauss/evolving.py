"""The one-owner front door :class:`EvolvingGaussians`, and what the Gaussian front doors
share: their parameters' documentation (:data:`PARAMS_DOC`), their validated
settings (:func:`estimator_settings`) and the cluster attributes (:func:`cluster_attrs`).
The default rules are described in :mod:`fedclust.gauss.estimator`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sklearn.base import BaseEstimator, ClusterMixin

from ..core.exceptions import NotFittedError, ValidationError
from ..core.validation import check_array, check_n_features, check_scale
from .consolidate import consolidate, snapshot
from .local import learn_local
from .model import MERGE_TOL, ClusterSet, Settings, one_thread
from .protocol import SETTING_NAMES, check_settings, predict_labels
from .scoring import log_density, proba
from .stats import moments

__all__ = ["EvolvingGaussians", "PARAMS_DOC", "estimator_settings", "cluster_attrs"]

PARAMS_DOC = """
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
        ``merge_test="volume"``: merge while V_pq / (V_p + V_q) < kappa_m (paper's kappa_m).
    volume : {"det", "sqrt_det", "det_root"}, default="det"
        V = det(Sigma), sqrt(det(Sigma)) or det(Sigma)^(1/D) (the authors' variants).
    max_volume : float, default=0.1
        ``merge_test="volume"``: a merge may not make sqrt(det Sigma) exceed this
        fraction of the global volume (size cap).
    max_clusters : int, default=200
        Past it the BIC merges run (``"bic"``); clusters still past it are removed,
        oldest first (never a class's last one), and counted in ``removed_samples_``.
    min_weight : float, default=0.005
        ``merge_test="volume"``, server: clusters with less than this fraction of all
        samples are folded into their most likely neighbour (exact statistics).
    var_floor : float, default=1e-6
        Per-feature variance floor as a fraction of the median feature variance.
    predict_rule : {"likelihood", "gamma"}, default="likelihood"
        Gaussian likelihood d_M^2 + log det Sigma (+ log n), or the paper's gamma.
    merge_test : {"bic", "volume"}, default="bic" ("volume" for the classifier)
        "bic": two clusters merge when one Gaussian describes their samples at most
        ``merge_tol`` nats per sample worse than two, by the Bayesian information
        criterion on their exact pooled statistics (full or diagonal covariance,
        whichever it prefers); merges run after an owner's pass, at ``max_clusters`` and
        on the server, never between two samples of a stream. "volume": the paper's
        volume criterion, online for the clusters active for a sample and on the server.
    merge_tol : float, default=0.01
        ``merge_test="bic"``: merge while (BIC of one Gaussian - BIC of two) / (2 n_pq)
        < merge_tol, an effect size in nats per sample that does not depend on n. With
        0 (plain BIC) two adjacent pieces of one large Gaussian, whose hard-assigned
        likelihoods tie up to ~0.003 nats per sample, stay apart once n is large (the
        gain grows like n, the penalty like log n); two equal Gaussians 4 sigma apart
        differ by 0.11 nats per sample.
    pooled_shrinkage : float, default=0.0 (0.5 for the classifier)
        w > 0: at prediction, a cluster's covariance is (S_i + n0 T) / (n_i + n0 - 1)
        with T = w x the model's pooled within-cluster variance (diagonal) instead of
        Sigma_0 (see :meth:`ClusterSet.scoring_precisions`); learning is unchanged.
"""


def estimator_settings(est: Any) -> Settings:
    """The validated model settings of an estimator's parameters (done in ``fit``)."""
    return check_settings(**{k: getattr(est, k) for k in SETTING_NAMES})

def cluster_attrs(cs: ClusterSet) -> dict[str, np.ndarray]:
    C = cs.C
    if cs.C == 0:
        D = cs.D
        return {"means": np.zeros((0, D)), "covs": np.zeros((0, D, D) if cs.full else (0, D)),
                "scat": np.zeros((0, D, D) if cs.full else (0, D))}
    return {"means": cs.mu[:C].copy(), "covs": cs.covariance(np.arange(C)),
            "scat": cs.S[:C].copy()}

class ClusterScoring:
    """Prediction and scikit-learn's mixture scoring from a fitted cluster set
    (``_scored()``: the model's :class:`~fedclust.gauss.model.ClusterSet`; ``_check_X``)."""

    def predict(self, X: Any) -> np.ndarray:
        """Index of the most likely cluster of every row."""
        cs = self._scored()
        return predict_labels(cs, self._check_X(X), cs.s.predict_rule)

    def predict_proba(self, X: Any) -> np.ndarray:
        """(N, c) cluster memberships (posterior; rows sum to 1)."""
        cs = self._scored()
        return proba(cs.log_scores(self._check_X(X), cs.s.predict_rule))

    def score_samples(self, X: Any) -> np.ndarray:
        """(N,) log density of every row under the model as a Gaussian mixture (weights
        ``counts_ / counts_.sum()``, ``means_``, ``covariances_``; with ``pooled_shrinkage``
        > 0 the shrunk scoring covariances), as scikit-learn's
        ``GaussianMixture.score_samples``."""
        cs = self._scored()
        return log_density(cs, self._check_X(X))

    def score(self, X: Any, y: None = None) -> float:
        """Average log-likelihood per row of X (:meth:`score_samples`' mean), as
        scikit-learn's ``GaussianMixture.score``: larger is better, so ``GridSearchCV``
        needs no scorer."""
        scores = self.score_samples(X)
        if not scores.size:   # the mean of no rows is NaN
            raise ValidationError(f"X has 0 rows; {type(self).__name__} needs at least 1 to "
                                  "score")
        return float(np.mean(scores))


class EvolvingGaussians(ClusterScoring, ClusterMixin, BaseEstimator):
    __doc__ = """Self-evolving Gaussian clustering of one owner's stream (eGAUSS+ style).

    No preset number of clusters: ``learn_one`` / ``partial_fit`` absorb a sample
    into its best cluster (Mahalanobis gate) with exact rank-one updates of the
    mean and scatter, or start a new cluster; clusters merge when one Gaussian
    describes their samples at most ``merge_tol`` nats per sample worse than two, by
    BIC (``merge_test="bic"``: when the count passes ``max_clusters``,
    and in :meth:`fit` / :meth:`compact`) or by the paper's volume criterion
    (``"volume"``: online); clusters still past ``max_clusters`` are removed, oldest
    first, and counted in ``removed_samples_``. :meth:`fit` also splits, after the pass,
    a cluster whose own rows the BIC test keeps apart as two (``partial_fit`` keeps no
    rows, so it does not). ``partial_fit(X)`` first pools X's
    per-feature statistics (so the scale rule sees the batch; the first batch also
    sets the new-cluster neighbourhood scale), then streams its rows.

    Parameters
    ----------""" + PARAMS_DOC + """
    Attributes
    ----------
    n_clusters_ : int
    means_ : ndarray (c, D)
    covariances_ : ndarray (c, D, D) or (c, D) for ``covariance="diag"``
        The covariances the model uses, (S + n0 Sigma_0) / (n + n0 - 1).
    scatters_ : ndarray, like ``covariances_``
        Exact scatter matrices sum (x - mu)(x - mu)^T.
    counts_ : ndarray (c,)
    ages_ : ndarray (c,)
        Samples seen since each cluster was last activated.
    n_samples_seen_ : int
    labels_ : ndarray (N,)
        Set by :meth:`fit` (and ``fit_predict``): the cluster of every row of
        its X under the final model (``partial_fit`` leaves it alone).
    removed_samples_ : int
        Samples of the clusters removed past ``max_clusters``:
        ``counts_.sum() + removed_samples_ == n_samples_seen_`` always.

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
                 predict_rule: str = "likelihood", merge_test: str = "bic",
                 pooled_shrinkage: float = 0.0, merge_tol: float = MERGE_TOL):
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

    def _model(self, D: int | None) -> ClusterSet | None:
        cs = getattr(self, "_cs", None)
        if cs is None and D is not None:
            cs = self._cs = ClusterSet(D, estimator_settings(self))
            self.n_features_in_ = D
        return cs

    def _check_X(self, X: Any, name: str = "X") -> np.ndarray:
        X = check_array(X, name).astype(np.float64, copy=False)
        check_scale([X], name)
        cs = getattr(self, "_cs", None)
        if cs is not None:
            check_n_features(X, self, cs.D, name)
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
                if cs.t == 0:
                    cs.set_birth_scale(X)
                cs.learn(X)
        return self

    def fit(self, X: Any, y: None = None) -> "EvolvingGaussians":
        """Forget everything, learn X as one owner does (one pass, then the owner's
        merges), then :meth:`compact` (as the server does)."""
        self._cs = None
        X = self._check_X(X)
        if X.shape[0] == 0:
            raise ValidationError("X has 0 rows: nothing to fit (partial_fit accepts an empty "
                                  "batch)")
        if X.shape[1] == 0:
            raise ValidationError(f"X has 0 feature(s) (shape={X.shape}) while a minimum of 1 "
                                  "is required.")
        with one_thread():
            self._cs = learn_local(X, None, estimator_settings(self), 0)
        self.n_features_in_ = X.shape[1]
        self.compact()
        self.labels_ = predict_labels(self._cs, X, self._cs.s.predict_rule)
        return self

    def compact(self) -> "EvolvingGaussians":
        """The server's clean-up on this model: merge the best passing pair while there is
        one (every pair for ``"bic"``), fold fragments (``"volume"``), prune past
        ``max_clusters``; no sample is lost except by the pruning (``removed_samples_``).
        ``partial_fit`` / ``learn_one`` call it only at ``max_clusters``; call it when a
        summary is wanted. O(c^2 D^3)."""
        cs = getattr(self, "_cs", None)
        if cs is not None and cs.C > 1:
            with one_thread():
                pieces = snapshot(cs)
                cs.merge_all()
                consolidate(cs, pieces)
                cs.absorb_fragments()
                cs.prune()
        return self

    def _fitted(self) -> ClusterSet:
        cs = getattr(self, "_cs", None)
        if cs is None or cs.C == 0:
            raise NotFittedError("EvolvingGaussians has no cluster yet; learn some samples first")
        return cs

    _scored = _fitted

    @property
    def n_clusters_(self) -> int:
        cs = getattr(self, "_cs", None)
        return 0 if cs is None else cs.C

    def _attr(self, key: str) -> np.ndarray:
        cs = getattr(self, "_cs", None)
        if cs is None:
            return np.zeros((0, 0)) if key != "covs" else np.zeros((0, 0, 0))
        return cluster_attrs(cs)[key]

    means_ = property(lambda self: self._attr("means"))
    covariances_ = property(lambda self: self._attr("covs"))
    scatters_ = property(lambda self: self._attr("scat"))
    counts_ = property(lambda self: np.zeros(0) if getattr(self, "_cs", None) is None
                       else self._cs.n[:self._cs.C].copy())
    ages_ = property(lambda self: np.zeros(0, np.int64) if getattr(self, "_cs", None) is None
                     else (self._cs.t - self._cs.last[:self._cs.C]).astype(np.int64))
    n_samples_seen_ = property(lambda self: 0 if getattr(self, "_cs", None) is None
                               else int(self._cs.t))
    removed_samples_ = property(lambda self: 0 if getattr(self, "_cs", None) is None
                                else int(round(self._cs.removed)))
