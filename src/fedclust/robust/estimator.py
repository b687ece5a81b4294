"""The :class:`RobustClusteredRegression` and :class:`RobustClusteredClassification` front doors
(and their registry hooks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from sklearn.base import BaseEstimator

from ..core.estimators import split_federation
from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import (check_array, check_device_ids, check_flags, check_int, check_query,
                               check_scale)
from ..sim.transport import InProcessTransport
from .metrics import estimation_error, misclustering_rate
from .protocol import RobustRegressionProtocol, RobustRegressionResult
from ..privacy import refuse_privacy

__all__ = ["RobustClusteredRegression", "RobustClusteredClassification", "fit_robust",
           "robust_report", "robust_result_fields", "plot_round_loss"]


def _check_machines(Xs: Any, ys: Any, ids: Sequence[int]) -> tuple[list, list]:
    if Xs is None or ys is None or len(Xs) != len(ys):
        raise ValidationError(
            f"expected one y per machine: got {None if Xs is None else len(Xs)} X arrays and "
            f"{None if ys is None else len(ys)} y arrays")
    if len(Xs) == 0:
        raise ValidationError("no machines given")
    out_X, out_y, d = [], [], None
    for z, X, y in zip(ids, Xs, ys):
        X = check_array(X, f"machine {z}: X")
        y = check_array(y, f"machine {z}: y", ndim=1)
        if X.shape[0] == 0:
            raise ValidationError(f"machine {z} is empty (X has 0 rows)")
        if X.shape[1] == 0:
            raise ValidationError(f"machine {z} has 0 feature(s) (shape={X.shape}) while a "
                                  "minimum of 1 is required (every machine needs d >= 1)")
        if y.shape[0] != X.shape[0]:
            raise ValidationError(
                f"machine {z}: X has {X.shape[0]} rows but y has shape {y.shape}")
        X = X.astype(np.float64)   # the machines' own copies
        y = y.astype(np.float64)
        if d is None:
            d = X.shape[1]
        elif X.shape[1] != d:
            raise ValidationError(
                f"machine {z} has d={X.shape[1]} features but machine {ids[0]} has d={d}")
        out_X.append(X)
        out_y.append(y)
    check_scale(out_X, "machines' X", list(ids))
    check_scale([y[:, None] for y in out_y], "machines' y", list(ids))
    return out_X, out_y


class RobustClusteredRegression(BaseEstimator):
    """Byzantine-robust clustered linear regression: the three-stage modular algorithm.

    Stage 1: each machine's least-squares ERM, sent once. Stage 2: robust
    clustering of the ERMs. Stage 3: per cluster, Byzantine-robust distributed
    gradient descent (or FedAvg with local steps) combined by a robust rule,
    started at the cluster's stage-2 centre.

    Parameters
    ----------
    n_clusters : int, default=2
    clustering : {"trimmed-kmeans", "kgeomedians", "edge-cutting", "kmeans"}
        Stage 2 (``"kmeans"``: the non-robust reference).
    optimizer : {"gd", "fedavg"}, default="gd"
        Stage 3: one gradient step per round, or ``local_steps`` full-batch
        steps on each machine per round (FedAvg).
    aggregator : {"trimmed-mean", "median", "mean", "filter"}, default="trimmed-mean"
        How the machines' gradients (gd) or models (fedavg) are combined
        (``"filter"``: iterative filtering, :mod:`fedclust.robust.filtering`).
    beta : float, default=0.1
        Trimmed fraction per side (should exceed the Byzantine fraction of a
        cluster), ``0 <= beta < 0.5``.
    rounds : int, default=20
        Stage-3 rounds (0: the stage-2 centres are the models).
    lr : float, default=0.1
        Step size of the machines' gradient steps.
    local_steps : int, default=5
        FedAvg's local full-batch steps per round.
    l2 : float, default=0
        Ridge penalty of the ERM and the loss; 0 refuses machines with fewer
        samples than parameters (set it to regularise them instead).
    fit_intercept : bool, default=True
    radius : float, default=3.0
        Trimmed k-means radius, in median distances to the geometric median.
    init : {"k-means++", "pairwise"}, default="k-means++"
        Robust initialisation of the stage-2 clustering.
    max_iter : int, default=100
        Stage-2 iterations.
    drop_outliers : bool, default=True
        Machines trimmed in stage 2 (trimmed k-means, edge cutting) get
        cluster -1 and take no part in stage 3.
    adaptive_beta : bool, default=True
        Stage 3 with the trimmed mean: each round and cluster, the trim
        fraction is ``max(beta, s / m_j)`` where s of the m_j replies lie
        farther than ``radius`` median distances from their geometric median
        (:func:`fedclust.robust.server.adaptive_beta`): liars can gather in
        one cluster beyond the global ``beta``. It is also at least the share
        of the cluster's members that stage 2 found in a group beyond the k
        best-supported ones (:func:`fedclust.robust.server.share_beta`).
    privacy : None
        Refused with a one-line error: no differentially private version yet
        (see ``docs/privacy.md``).
    random_state : int, Generator or None

    Attributes
    ----------
    coef_ : ndarray (c, d)
        One model per cluster found (c = n_clusters unless edge cutting found fewer).
    intercept_ : ndarray (c,)
    device_clusters_ : ndarray (m,)
        Cluster of every machine; -1: judged Byzantine / outlier; -2: sent no ERM.
    erms_ : ndarray (m, d + 1)
        The stage-1 ERMs as received (zeros where none).
    stage_log_ : dict
        ``erms``, ``clustering_history`` (T + 1, m') labels per stage-2 iteration,
        ``clustering_iterations``, ``initial_coef`` (c, d + 1), ``round_loss``
        (rounds, c): median local loss of each cluster's members per round,
        ``round_beta`` (rounds, c): the trim fraction used.
    communication_ : dict
        Rounds and bytes (see :class:`fedclust.sim.meter.CommunicationMeter`).
    run_log_ : RunLog
        ``run_log_.distrusted``: machines trimmed in stage 2, and machines whose
        stage-3 update was flagged as outlying (``adaptive_beta``) in more than
        half of their rounds, with the reason.
    seed_ : int

    Notes
    -----
    Bytes per machine: ``8 (d + 1) + 8`` up once; stage 3: ``8 (d + 1) + 24``
    up per iteration, down ``8 (d + 1) + 8`` in the first iteration (its
    cluster's model and index, one round per cluster) and ``8 c (d + 1)`` (all c
    models, ``+ 16 a`` when a machines missed the first iteration) in each later
    one; ``8 (d + 1) + 8`` down at the end. Transport rounds: ``1 + rounds``
    (the local ERMs, then one per stage-3 iteration). Server work: stage 2
    O(T m k d) plus the geometric medians; stage 3 O(rounds · m d log m).

    Ghosh, Hong, Yin & Ramchandran, "Robust federated learning in a
    heterogeneous environment", 2019; Yin, Chen, Ramchandran & Bartlett, ICML 2018.
    """

    _loss = "squared"

    def __init__(self, n_clusters: int = 2, *, clustering: str = "trimmed-kmeans",
                 optimizer: str = "gd", aggregator: str = "trimmed-mean", beta: float = 0.1,
                 rounds: int = 20, lr: float = 0.1, local_steps: int = 5, l2: float = 0.0,
                 fit_intercept: bool = True, radius: float = 3.0, init: str = "k-means++",
                 max_iter: int = 100, drop_outliers: bool = True, adaptive_beta: bool = True,
                 privacy: Any = None, random_state: RandomState = None, progress: bool = False):
        self.n_clusters = n_clusters
        self.privacy = privacy
        self.clustering = clustering
        self.optimizer = optimizer
        self.aggregator = aggregator
        self.beta = beta
        self.rounds = rounds
        self.lr = lr
        self.local_steps = local_steps
        self.l2 = l2
        self.fit_intercept = fit_intercept
        self.radius = radius
        self.init = init
        self.max_iter = max_iter
        self.drop_outliers = drop_outliers
        self.adaptive_beta = adaptive_beta
        self.random_state = random_state
        self.progress = progress

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    def fit(self, X: Any, y: Any, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "RobustClusteredRegression":
        """Fit on per-machine arrays ``X[i]`` (n_i, d) and ``y[i]`` (n_i,); or on one
        array X (n, d) and y (n,) with ``groups`` (n,) naming every row's machine
        (without ``groups``: one machine). See :meth:`fedclust.KFed.fit`."""
        refuse_privacy(self.privacy, type(self).__name__,
                       "each machine's local model is released without noise and the robust "
                       "aggregators (trimmed mean, median) have no DP calibration")
        check_flags(self, "fit_intercept", "drop_outliers", "adaptive_beta", "progress")
        if X is None or y is None:
            raise ValidationError(f"{type(self).__name__} requires y to be passed, but the "
                                  f"target y is None" if y is None else "X is None")
        fed = split_federation(X, y, groups=groups, device_ids=device_ids)
        try:   # generators too
            Xs, ys, device_ids = list(fed.devices), list(fed.labels), fed.device_ids
        except TypeError:
            raise ValidationError(f"X and y must be one array per machine, got "
                                  f"{type(fed.devices).__name__} and {type(fed.labels).__name__}"
                                  ) from None
        m = len(Xs)
        device_ids = check_device_ids(device_ids, m)
        Xs, ys = _check_machines(Xs, ys, device_ids)
        k = check_int(self.n_clusters, "n_clusters", min_value=1)
        if k > m:
            raise ValidationError(f"n_clusters={k} is larger than the number of machines ({m})")
        d = Xs[0].shape[1]
        protocol = RobustRegressionProtocol(
            n_clusters=k, n_features=d, clustering=self.clustering, optimizer=self.optimizer,
            aggregator=self.aggregator, beta=self.beta, rounds=self.rounds, lr=self.lr,
            local_steps=self.local_steps, l2=self.l2, fit_intercept=self.fit_intercept,
            radius=self.radius, init=self.init, max_iter=self.max_iter,
            drop_outliers=self.drop_outliers, adaptive_beta=self.adaptive_beta, loss=self._loss)
        if protocol.l2 == 0.0 and self._loss == "squared":
            p = d + int(protocol.fit_intercept)
            for z, X in zip(device_ids, Xs):
                if X.shape[0] < p:
                    raise ValidationError(
                        f"machine {z} has n={X.shape[0]} samples but the least-squares ERM "
                        f"needs at least {p} (d={d} features"
                        f"{' + intercept' if protocol.fit_intercept else ''}); pass l2 > 0 to "
                        "regularise")
        transport = transport or InProcessTransport(progress=self.progress)
        self.seed_ = root_seed(self.random_state)
        out = transport.run(protocol, {z: (X, y) for z, X, y in zip(device_ids, Xs, ys)},
                            self.seed_)
        self._store(out.result, out.meter, device_ids, d)
        self._protocol_ = protocol
        return self

    def _store(self, res: RobustRegressionResult, meter, device_ids, d: int) -> None:
        pos = {int(z): i for i, z in enumerate(res.device_ids)}
        self.device_ids_ = list(device_ids)
        self.coef_ = res.coef[:, :d].copy()
        self.intercept_ = res.coef[:, d].copy()
        take = [pos.get(z) for z in device_ids]
        self.device_clusters_ = np.array([res.clusters[i] if i is not None else -2
                                          for i in take], dtype=np.int64)
        self.erms_ = np.array([res.erms[i] if i is not None else np.zeros(d + 1)
                               for i in take])
        self.n_clusters_ = res.coef.shape[0]
        self.n_features_in_ = d
        self.stage_log_ = {
            "erms": self.erms_, "erm_ids": res.erm_ids.tolist(),
            "clustering_history": res.cluster_history,
            "clustering_iterations": res.clustering_iterations,
            "initial_coef": res.initial_coef, "round_loss": res.round_loss,
            "round_beta": res.round_beta}
        self.communication_ = meter.summary()
        self.run_log_ = res.log
        self._result = res

    def _check_fitted(self) -> None:
        if not hasattr(self, "coef_"):
            raise NotFittedError(
                "this RobustClusteredRegression is not fitted yet; call fit(Xs, ys) first")

    def device_model(self, i: int) -> int:
        """Cluster whose model serves machine at position ``i``: its own, or for a machine
        judged Byzantine the model nearest its ERM."""
        self._check_fitted()
        i = check_int(i, "i", min_value=0, max_value=len(self.device_ids_) - 1)
        c = int(self.device_clusters_[i])
        if c >= 0:
            return c
        models = np.hstack([self.coef_, self.intercept_[:, None]])
        return int(np.argmin(((models - self.erms_[i]) ** 2).sum(axis=1)))

    def predict_device(self, i: int, X: Any) -> np.ndarray:
        """Predictions ``X w_c + b_c`` (n,) for the machine at position ``i`` (its cluster c)."""
        j = self.device_model(i)
        X = check_query(X, self, dtype=np.float64)
        return X @ self.coef_[j] + self.intercept_[j]


# -- registry hooks ---------------------------------------------------------------
def fit_robust(model: Any, fed: Any, transport: Any) -> None:
    model.fit(fed.devices, fed.labels, transport=transport,
              device_ids=getattr(fed, "device_ids", None))


def robust_report(model: Any, fed: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Estimation error and misclustering when the source knows the truth; test MSE (regression,
    mean over machines) or accuracy (classification, pooled over the test rows, and its mean
    over machines) of honest machines when it has test sets."""
    out: dict[str, Any] = {"n_clusters_found": int(model.n_clusters_),
                           "judged_byzantine": int((model.device_clusters_ == -1).sum())}
    truth = fed.extra.get("coef")
    if truth is not None:
        truth = np.asarray(truth)
        est = np.hstack([model.coef_, model.intercept_[:, None]])
        full = np.hstack([truth, np.asarray(fed.extra.get("intercept", np.zeros(len(truth))))[
            :, None]])
        out["estimation_error"] = estimation_error(est, full)
    clusters = fed.extra.get("clusters")
    if clusters is not None:
        clusters = np.asarray(clusters)
        out["misclustering"] = misclustering_rate(model.device_clusters_, clusters)
        byz = clusters < 0
        if byz.any():
            out["byzantine_flagged"] = float(np.mean(model.device_clusters_[byz] == -1))
    if fed.test_devices:
        honest = [i for i in range(len(fed.test_devices))
                  if clusters is None or clusters[i] >= 0]
        if isinstance(model, RobustClusteredClassification):
            from ..metrics import summarize_test_accuracy

            acc = [float(np.mean(model.predict_device(i, fed.test_devices[i])
                                 == fed.test_labels[i])) for i in honest]
            out.update(summarize_test_accuracy(acc, [len(fed.test_labels[i]) for i in honest]))
        else:
            mse = [float(np.mean((model.predict_device(i, fed.test_devices[i])
                                  - fed.test_labels[i]) ** 2)) for i in honest]
            out["test_mse"] = float(np.mean(mse))
    return out


def robust_rounds_note(model: Any, communication: Mapping[str, Any]) -> str | None:
    """``1 local-ERM round + 20 stage-3 rounds = 21 transport rounds``."""
    total, rounds = int(communication.get("rounds", 0)), int(model.rounds)
    if total != 1 + rounds:
        return None
    return f"1 local-ERM round + {rounds} stage-3 rounds = {total} transport rounds"


def robust_result_fields(model: Any) -> dict[str, Any]:
    return {"coef": model.coef_.tolist(), "intercept": model.intercept_.tolist(),
            "device_clusters": model.device_clusters_.tolist(),
            "round_loss": model.stage_log_["round_loss"].tolist()}


def plot_round_loss(model: Any, fed: Any, result: dict[str, Any], path: Path) -> Path | None:
    """Stage-3 median local loss per round, one line per cluster."""
    from ..plotting import have_matplotlib, save_figure, wrap_title

    loss = model.stage_log_["round_loss"]
    if not have_matplotlib() or loss.size == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for j in range(loss.shape[1]):
        ax.semilogy(np.arange(1, loss.shape[0] + 1), loss[:, j], marker=".", label=f"cluster {j}")
    ax.set_xlabel("stage-3 round")
    ax.set_ylabel("median local loss")
    ax.legend(fontsize=7)
    ax.set_title(wrap_title(result.get("title") or result.get("algorithm", ""), 5.0, 9),
                 fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return Path(path)


class RobustClusteredClassification(RobustClusteredRegression):
    """Byzantine-robust clustered binary logistic regression: the three-stage pipeline with the
    logistic loss (labels in {0, 1}).

    Same parameters, attributes and protocol as :class:`RobustClusteredRegression`
    (``loss="logistic"``): stage 1 each machine's logistic ERM
    (:func:`fedclust.robust.local.local_logistic_erm`: L-BFGS on
    :class:`fedclust.fl.models.LogisticRegression`'s loss and gradient), stage 2
    the same robust clustering of the ERMs, stage 3 the same robust gradient
    (or FedAvg) rounds through :func:`fedclust.fl.client.local_update` with the
    logistic model. ``l2`` defaults to 1e-3 here: without it a machine whose
    labels are linearly separable has no ERM (refused, by name). Predictions:
    :meth:`predict_device` (labels), :meth:`predict_proba_device`,
    :meth:`decision_function_device`.
    """

    _loss = "logistic"

    def __init__(self, n_clusters: int = 2, *, clustering: str = "trimmed-kmeans",
                 optimizer: str = "gd", aggregator: str = "trimmed-mean", beta: float = 0.1,
                 rounds: int = 20, lr: float = 1.0, local_steps: int = 5, l2: float = 1e-3,
                 fit_intercept: bool = True, radius: float = 3.0, init: str = "k-means++",
                 max_iter: int = 100, drop_outliers: bool = True, adaptive_beta: bool = True,
                 privacy: Any = None, random_state: RandomState = None, progress: bool = False):
        super().__init__(n_clusters, clustering=clustering, optimizer=optimizer,
                         aggregator=aggregator, beta=beta, rounds=rounds, lr=lr,
                         local_steps=local_steps, l2=l2, fit_intercept=fit_intercept,
                         radius=radius, init=init, max_iter=max_iter,
                         drop_outliers=drop_outliers, adaptive_beta=adaptive_beta,
                         privacy=privacy, random_state=random_state, progress=progress)

    def decision_function_device(self, i: int, X: Any) -> np.ndarray:
        """Scores ``X w_c + b_c`` (n,) for the machine at position ``i``."""
        return super().predict_device(i, X)

    def predict_proba_device(self, i: int, X: Any) -> np.ndarray:
        """P(y = 1) (n,) under the model serving machine ``i``."""
        return 0.5 * (1.0 + np.tanh(0.5 * self.decision_function_device(i, X)))

    def predict_device(self, i: int, X: Any) -> np.ndarray:
        """Labels in {0, 1} (n,) for the machine at position ``i``."""
        return (self.decision_function_device(i, X) > 0).astype(np.int64)


# -- saved model (model.npz) ----------------------------------------------------------------
class RobustPredictor:
    """Saved clustered linear / logistic models; a training site uses its own cluster's model,
    a new site the most confident model per row (classification) or the largest cluster's."""

    def __init__(self, coef: np.ndarray, intercept: np.ndarray, site_models: np.ndarray,
                 task: str):
        self.coef, self.intercept = np.asarray(coef, float), np.asarray(intercept, float)
        self.site_models = np.asarray(site_models, np.int64)
        self.task = task

    @classmethod
    def load(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "RobustPredictor":
        return cls(arrays["coef"], arrays["intercept"], arrays["site_models"], meta["task"])

    def predict(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        X = np.asarray(X, float)
        if site is not None and site < len(self.site_models):
            j = int(self.site_models[site])
            S = X @ self.coef[j] + self.intercept[j]
        elif self.task == "classification":
            scores = X @ self.coef.T + self.intercept        # (n, k)
            S = scores[np.arange(len(X)), np.abs(scores).argmax(axis=1)]
        else:
            j = int(np.bincount(self.site_models, minlength=len(self.coef)).argmax())
            S = X @ self.coef[j] + self.intercept[j]
        return (S > 0).astype(np.int64) if self.task == "classification" else S


def robust_export(model: Any, fed: Any) -> Any:
    from ..core.registry import Exported

    sites = [model.device_model(i) for i in range(len(model.device_ids_))]
    task = "classification" if isinstance(model, RobustClusteredClassification) else "regression"
    return Exported("robust-linear", {"coef": model.coef_, "intercept": model.intercept_,
                                      "site_models": np.asarray(sites, np.int64)},
                    {"task": task})
