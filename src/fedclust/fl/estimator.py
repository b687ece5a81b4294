"""Front doors: :class:`FedAvg`, :class:`IFCA`, :class:`ClusteredFedAvg` (scikit-learn style).

Each names its protocol (:mod:`fedclust.fl.fedavg`, :mod:`.ifca`, :mod:`.clustered`);
fitting, prediction and the history are :class:`fedclust.fl.base.FLEstimator`'s.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..core.exceptions import ValidationError
from ..core.random import RandomState
from ..core.validation import check_int
from ..privacy import DifferentialPrivacy
from .base import FLEstimator, check_federation
from .clustered import ROUTINGS, ClusteredFedAvgProtocol
from .fedavg import FedAvgProtocol
from .ifca import IFCAProtocol
from .protocol import feature_map

__all__ = ["FedAvg", "IFCA", "ClusteredFedAvg"]


class FedAvg(FLEstimator):
    """Federated averaging (McMahan et al., AISTATS 2017): one global model.

    Parameters
    ----------
    model : {None, "mlp", "softmax", "logistic", "linear"} or Model
        ``None``: the paper's MLP (d-``n_hidden``-C, ReLU), sizes from the data.
    rounds, local_epochs, batch_size, lr : FL rounds and the device's SGD.
    clients_per_round : int or None
        m devices per round (None: all). Under ``privacy``: every device takes part
        in a round independently with probability m / N (Poisson sampling, drawn
        from the privacy-noise stream so the sample stays secret), and the
        accountant amplifies the guarantee by that subsampling.
    aggregator : {"mean", "trimmed-mean", "median"}; beta : float
        Coordinate-wise combination of the updates (:func:`fedclust.fl.server.aggregate_updates`).
    weighted : bool
        Weight updates by sample count (FedAvg; the mean only).
    local_mode : {"sgd", "gd"}
        Local SGD epochs, or one full-batch gradient step.
    selection : {"random", "pow-d", "kfed-pow-d"}
        Client selection: uniform; power-of-choice (Cho et al. 2020: ``n_candidates``
        d candidates ∝ data size, keep the m with the highest loss); the same
        keeping at most one device per k-FED cluster (k-FED paper, Figure 4).
    n_candidates : int or None
        d (None: 2 m).
    n_clusters, n_local_clusters : int
        k and k' of the k-FED round of ``selection="kfed-pow-d"``.
    kfed_server : {"kmeans++", "farthest-lloyd1"}
        That round's server step, as in :class:`ClusteredFedAvg` (k-means++ restarts
        on the local centers; or the k-FED paper's farthest-first + one Lloyd step).
    privacy : DifferentialPrivacy or None
        DP-FedAvg, device level (``unit="device"``, ``clip_norm`` bounds each
        update's L2 norm), central DP: the server clips, sums, adds Gaussian
        noise, one release per round (:class:`fedclust.fl.protocol.FLProtocol`);
        needs ``aggregator="mean"`` and ``selection="random"``; updates are
        unweighted. See ``docs/privacy.md``.
    classes : int or list, optional
        The public class labels 0..C-1 (or C): the model's class count; or the list
        of string labels (then ``classes_``, sorted). Required under ``privacy`` for a
        multi-class model and for string labels; otherwise read from the labels.
    secure_aggregation : bool or SecureAggregation, default=False
        Sum every training round's updates by secure aggregation
        (:mod:`fedclust.core.secure_sum`): the server learns only their weighted
        total, to ``2**-20`` fixed-point precision per device. Needs
        ``aggregator="mean"``. With ``privacy`` each device clips its own update
        and adds its share ``σ/√n_min`` of the noise (``n_min = m − ⌊m/3⌋`` of
        the ``m`` devices of a round; :mod:`fedclust.privacy.distributed`), so the
        server sees only the noisy sum. Each secure round costs 3 extra exchanges.

    Attributes
    ----------
    models_ : ndarray (1, p)
    model_ : Model
    history_ : list of dict
        Per round: ``train_loss`` (weighted mean local loss of the received
        model; None in a round that released none: no reply, or DP-FedAvg),
        ``bytes_up``, ``bytes_down``, ``devices``, ``test_accuracy``
        (when test sets were given to ``fit``).
    communication_ : dict
        Meter totals, ``fl_rounds``, setup bytes (k-FED / size probe).
    device_test_accuracy_ : ndarray (Z,) (with test sets)

    Notes
    -----
    Per round each selected device downloads ``8 p`` bytes and uploads
    ``8 p + 24``; pow-d candidates add ``8 p`` down and 16 up. Device work
    O(local_epochs n_z p) per round.
    """

    _protocol_cls = FedAvgProtocol

    def _predict_device(self, pos, X, models):
        return self._predict_with(models[0], X, (models, 0))  # one global model serves all

    def __init__(self, model: str | None = None, *, rounds: int = 30, local_epochs: int = 1,
                 batch_size: int = 32, lr: float = 0.05, clients_per_round: int | None = None,
                 aggregator: str = "mean", beta: float = 0.1, weighted: bool = True,
                 local_mode: str = "sgd", selection: str = "random",
                 n_candidates: int | None = None, n_clusters: int = 10,
                 n_local_clusters: int = 1, kfed_server: str = "kmeans++",
                 n_hidden: int = 200, l2: float = 0.0, privacy: DifferentialPrivacy | None = None,
                 classes: Any = None, random_state: RandomState = None, progress: bool = False,
                 secure_aggregation: Any = False):
        super().__init__(model, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size,
                         lr=lr, clients_per_round=clients_per_round, aggregator=aggregator,
                         beta=beta, weighted=weighted, local_mode=local_mode, n_hidden=n_hidden,
                         l2=l2, random_state=random_state, progress=progress)
        self.selection = selection
        self.n_candidates = n_candidates
        self.n_clusters = n_clusters
        self.n_local_clusters = n_local_clusters
        self.kfed_server = kfed_server
        self.privacy = privacy
        self.classes = classes
        self.secure_aggregation = secure_aggregation

    def _extra_config(self, n_devices):
        return {**self._selection_config(),
                "n_clusters": check_int(self.n_clusters, "n_clusters", min_value=1),
                "n_local_clusters": check_int(self.n_local_clusters, "n_local_clusters",
                                              min_value=1),
                "kfed_server": self.kfed_server}


class IFCA(FLEstimator):
    """Iterative Federated Clustering Algorithm (Ghosh et al., NeurIPS 2020).

    k models start from independent random draws; every round each selected
    device downloads all k (``8 k p`` bytes), keeps the one with the lowest
    loss on its data, trains it and sends it back with its index; the server
    averages per cluster (a cluster nobody chose keeps its model). Other
    parameters as :class:`FedAvg` (selection is random).

    ``selection="pow-d"`` (with ``clients_per_round`` m and ``n_candidates`` d):
    power-of-choice, the d candidates (∝ size) report the loss of their best
    model and the m highest train; ``"random"`` otherwise.

    ``n_init`` random starts (Ghosh et al.'s restarts) run the first
    ``restart_rounds`` rounds side by side (``n_init`` times IFCA's bytes in those
    rounds); the start with the lowest training loss then goes on alone.

    ``privacy``: DP-FedAvg per model as in :class:`FedAvg` (one release per
    round covers all k models: a device adds its clipped update to the model it
    chose); needs ``n_init=1`` (restarts are chosen by unreleased losses) and, for
    a multi-class model, ``classes`` (as in :class:`FedAvg`).

    Attributes
    ----------
    device_clusters_ : list of int
        The model each device chose when it last trained (-1: never selected, or
        under ``privacy``, where a choice is not released and each device routes
        its own points).
    models_ : ndarray (k, p)
    restart_losses_ : ndarray (n_init,) (empty when n_init = 1)
        Each start's mean training loss in the last restart round.
    best_start_ : int
        The start kept.
    """

    _protocol_cls = IFCAProtocol

    def __init__(self, n_clusters: int = 2, model: str | None = None, *, rounds: int = 30,
                 local_epochs: int = 1, batch_size: int = 32, lr: float = 0.05,
                 clients_per_round: int | None = None, aggregator: str = "mean",
                 beta: float = 0.1, weighted: bool = True, local_mode: str = "sgd",
                 n_init: int = 1, restart_rounds: int = 3, selection: str = "random",
                 n_candidates: int | None = None, n_hidden: int = 200,
                 l2: float = 0.0, privacy: DifferentialPrivacy | None = None,
                 classes: Any = None, random_state: RandomState = None, progress: bool = False):
        super().__init__(model, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size,
                         lr=lr, clients_per_round=clients_per_round, aggregator=aggregator,
                         beta=beta, weighted=weighted, local_mode=local_mode, n_hidden=n_hidden,
                         l2=l2, random_state=random_state, progress=progress)
        self.n_clusters = n_clusters
        self.n_init = n_init
        self.restart_rounds = restart_rounds
        self.selection = selection
        self.n_candidates = n_candidates
        self.privacy = privacy
        self.classes = classes

    def _extra_config(self, n_devices):
        return {"n_clusters": check_int(self.n_clusters, "n_clusters", min_value=1),
                "n_init": check_int(self.n_init, "n_init", min_value=1),
                "restart_rounds": check_int(self.restart_rounds, "restart_rounds", min_value=1),
                **self._selection_config()}

    def _store(self, out, ids, tests):
        loss = out.result.restart_loss
        self.restart_losses_ = loss
        self.best_start_ = int(np.argmin(loss)) if len(loss) else 0
        super()._store(out, ids, tests)

    def _models_per_download(self) -> int:
        return int(self.n_clusters)

    def _route(self, X, models):
        """Per point, the model with the highest confidence (largest top score margin)."""
        if len(models) == 1 or not self.model_.classifier:
            return self._predict_with(models[0], X)
        m = self._scratch_model()
        self._loaded = None
        best_conf = np.full(len(X), -np.inf)
        pred = np.zeros(len(X), dtype=np.int64)
        for theta in models:
            m.set_params(theta)
            S = m.decision_function(X)
            if S.ndim == 1:
                S = np.stack([-S, S], axis=1)
            S = S - S.max(axis=1, keepdims=True)
            P = np.exp(S)
            P /= P.sum(axis=1, keepdims=True)
            conf = P.max(axis=1)
            better = conf > best_conf
            best_conf[better] = conf[better]
            pred[better] = P.argmax(axis=1)[better]
        return pred


class ClusteredFedAvg(FLEstimator):
    """k-FED + FedAvg (Dennis, Li & Smith, ICML 2021, §4.2.2, Table 2).

    One k-FED round clusters the devices' data (``n_local_clusters`` k' per
    device, ``n_clusters`` k in all; on the raw inputs, a shared random
    projection, or the hidden layer after one global FedAvg round:
    ``feature_map``), then FedAvg trains one model per cluster: with k' = 1 a
    device belongs to one cluster and downloads only its model; with k' > 1 it
    trains the model of each of its local clusters on those points.

    ``kfed_server`` is how the server clusters the k' Z local centers:
    ``"kmeans++"`` (default: 10 k-means++ starts, Lloyd to convergence, lowest
    inertia) or ``"farthest-lloyd1"`` (the k-FED paper's farthest-first start and
    one Lloyd step). Both are one-shot (same bytes); on rotated MNIST with k' = 2
    the paper's start lets one outlying local center claim a cluster and merges
    90° with 270° (docs/fl.md), k-means++ does not.

    ``routing`` (k' > 1) decides which of a device's cluster models serves each
    of its points at prediction: ``"centers"`` (nearest local k-FED center, the
    paper), ``"confidence"`` (the device's model with the lowest predictive
    entropy) or ``"gate"`` (a logistic-regression gate each device fits on its own
    training points, labelled by which of its final models has the lowest loss
    on them; costs one final download of the device's m models, ``8 m p``
    bytes, and no upload), or ``"soft-gate"`` (the same gate; the prediction
    mixes the models' class probabilities with the gate's probabilities;
    the default: best on rotated MNIST, k' = 2, docs/fl.md). Training always
    routes by k-FED's local clusters.
    ``history_`` curves use ``"centers"`` with either gate (the gate exists
    only for the final models).

    ``privacy`` is refused: the k-FED round has no device-level DP yet.

    Attributes
    ----------
    device_clusters_ : list of int
        The cluster of each device (of its largest local cluster when k' > 1).
    cluster_centers_ : ndarray (k, d')
        k-FED's centers (in the feature space).
    device_labels_ : list of ndarray or None
        k-FED's cluster of every training point of each device.
    device_gates_ : list of dict or None
        ``routing="gate"`` / ``"soft-gate"`` (k' > 1): each device's gate (``coef``, ``intercept``,
        ``clusters``; :func:`fedclust.fl.client.gate_route`).

    Notes
    -----
    Setup: ``k' (d' + 1) 8`` bytes up and ``8 k'`` down per device (k-FED);
    then per round and selected device ``8 p + 8 + 16 m_c`` down per cluster
    it trains and ``8 p + 24`` up: one model, not IFCA's k.
    """

    _protocol_cls = ClusteredFedAvgProtocol

    def __init__(self, n_clusters: int = 2, n_local_clusters: int = 1,
                 model: str | None = None, *, rounds: int = 30, local_epochs: int = 1,
                 batch_size: int = 32, lr: float = 0.05, clients_per_round: int | None = None,
                 aggregator: str = "mean", beta: float = 0.1, weighted: bool = True,
                 local_mode: str = "sgd", feature_map: str = "raw", feature_dim: int = 50,
                 kfed_server: str = "kmeans++", routing: str = "soft-gate", n_hidden: int = 200,
                 l2: float = 0.0, privacy: DifferentialPrivacy | None = None,
                 random_state: RandomState = None, progress: bool = False):
        super().__init__(model, rounds=rounds, local_epochs=local_epochs, batch_size=batch_size,
                         lr=lr, clients_per_round=clients_per_round, aggregator=aggregator,
                         beta=beta, weighted=weighted, local_mode=local_mode, n_hidden=n_hidden,
                         l2=l2, random_state=random_state, progress=progress)
        self.n_clusters = n_clusters
        self.n_local_clusters = n_local_clusters
        self.feature_map = feature_map
        self.feature_dim = feature_dim
        self.kfed_server = kfed_server
        self.routing = routing
        self.privacy = privacy

    def _extra_config(self, n_devices):
        k = check_int(self.n_clusters, "n_clusters", min_value=1)
        kl = check_int(self.n_local_clusters, "n_local_clusters", min_value=1)
        if kl * n_devices < k:
            raise ValidationError(f"n_local_clusters={kl} x {n_devices} devices < n_clusters={k}")
        return {"n_clusters": k, "n_local_clusters": kl, "feature_map": self.feature_map,
                "feature_dim": check_int(self.feature_dim, "feature_dim", min_value=1),
                "kfed_server": self.kfed_server, "routing": self.routing}

    def _build(self, Xs, ys, ids, eval_every):
        proto = super()._build(Xs, ys, ids, eval_every)
        for z, X in zip(ids, Xs):
            if X.shape[0] <= proto.n_local_clusters:
                raise ValidationError(
                    f"device {z} has {X.shape[0]} samples but n_local_clusters="
                    f"{proto.n_local_clusters}; k-FED needs more points than local clusters")
        return proto

    def _store(self, out, ids, tests):
        self.cluster_centers_ = out.result.centers
        self.device_gates_ = []
        for z in ids:
            o = out.device_outputs.get(z, {})
            self.device_gates_.append({k: o[f"gate_{k}"] for k in ("coef", "intercept", "clusters")}
                                      if "gate_coef" in o else None)
        self._routing = self.routing
        super()._store(out, ids, tests)

    def score_devices(self, test_X: Sequence[Any], test_y: Sequence[Any], *,
                      routing: str | None = None) -> np.ndarray:
        """Accuracy of each device's serving models on its own test set (Z,), with the
        given prediction ``routing`` (default: the fitted one; ``"gate"`` and
        ``"soft-gate"`` need a fit with either, so that the devices have gates)."""
        from ..core.validation import check_choice

        self._check_fitted()
        routing = self._protocol_.routing if routing is None else check_choice(routing, "routing",
                                                                              ROUTINGS)
        if routing in ("gate", "soft-gate") and self._protocol_.n_local_clusters > 1 \
                and all(g is None for g in self.device_gates_):
            raise ValidationError(f"routing={routing!r} needs a fit with routing='gate' or "
                                  "'soft-gate'")
        tX, ty = check_federation(test_X, test_y, self.device_ids_, name="test_")
        ty = self._encode(ty, self.device_ids_, name="test ")
        saved, self._routing = self._routing, routing
        try:
            return self._device_scores(self.models_, tX, ty)
        finally:
            self._routing = saved

    def _features(self, X: np.ndarray) -> np.ndarray:
        p = self._protocol_
        model = None
        if p.feature_map == "hidden":
            model = self._model(self._result.feature_params)
        return feature_map(p.feature_map, X, seed=self.seed_, dim=p.feature_dim, model=model)

    def _route(self, X, models):
        """Each point to its nearest k-FED center, then that cluster's model."""
        from ..kfed.server import assign_to_centers

        labels = assign_to_centers(self._features(X), self.cluster_centers_)
        return self._predict_by_label(X, labels, models)

    def _predict_by_label(self, X, labels, models):
        pred = np.zeros(len(X), dtype=np.int64 if self.model_.classifier else np.float64)
        for c in np.unique(labels):
            sel = labels == c
            pred[sel] = self._predict_with(models[c], X[sel], (models, c))
        return pred

    def _predict_device(self, pos, X, models):
        p = self._protocol_
        z = self.device_ids_[pos]
        local = self._result.local_centers.get(z)
        if p.n_local_clusters == 1 or local is None:
            return super()._predict_device(pos, X, models)
        from ..kfed.server import assign_to_centers
        from .client import gate_route

        gate = self.device_gates_[pos]
        if self._routing in ("gate", "soft-gate") and gate is not None and models is self.models_:
            if self._routing == "soft-gate" and len(gate["clusters"]) > 1 \
                    and self.model_.classifier:
                return self._mixture(X, models, gate)
            return self._predict_by_label(X, gate_route(gate, X), models)
        mine = np.unique(self._result.center_labels[z])
        if self._routing == "confidence" and len(mine) > 1 and self.model_.classifier:
            return self._most_confident(X, models, mine)
        # the device's own local clusters decide which of its clusters' models serves a point
        near = assign_to_centers(self._features(X), local)
        labels = self._result.center_labels[z][near]
        return self._predict_by_label(X, labels, models)

    def _mixture(self, X, models, gate):
        """argmax_y sum_c g_c(x) p_c(y | x): the gate's probabilities mix the models'."""
        G = X @ gate["coef"].T + gate["intercept"]
        G = np.exp(G - G.max(axis=1, keepdims=True))
        G /= G.sum(axis=1, keepdims=True)
        m = self._scratch_model()
        self._loaded = None
        mix = 0.0
        for j, c in enumerate(gate["clusters"]):
            m.set_params(models[int(c)])
            S = m.decision_function(X)
            if S.ndim == 1:
                S = np.stack([np.zeros_like(S), S], axis=1)
            P = np.exp(S - S.max(axis=1, keepdims=True))
            mix = mix + G[:, j:j + 1] * (P / P.sum(axis=1, keepdims=True))
        return np.asarray(mix.argmax(axis=1), dtype=np.int64)

    def _most_confident(self, X, models, clusters):
        """Per point, the prediction of the model (among ``clusters``) with the lowest entropy."""
        m = self._scratch_model()
        self._loaded = None
        best = np.full(len(X), np.inf)
        pred = np.zeros(len(X), dtype=np.int64)
        for c in clusters:
            m.set_params(models[c])
            S = m.decision_function(X)
            if S.ndim == 1:
                S = np.stack([np.zeros_like(S), S], axis=1)
            logp = S - S.max(axis=1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
            ent = -(np.exp(logp) * logp).sum(axis=1)
            better = ent < best
            best[better] = ent[better]
            pred[better] = logp.argmax(axis=1)[better]
        return pred
