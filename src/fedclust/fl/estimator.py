"""Front doors: :class:`FedAvg`, :class:`IFCA`, :class:`ClusteredFedAvg` (scikit-learn style).

``fit(devices_X, devices_y)`` validates the federation, builds one protocol
(:mod:`fedclust.fl.protocol`, :mod:`.ifca`, :mod:`.clustered`) and runs it once
through ``transport.run`` (the in-process simulator by default, or Flower).
Labels are class indices 0..C-1 (C = the largest label + 1) for the classifiers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sklearn.base import BaseEstimator
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils import ClassifierTags, RegressorTags

from ..core.checkpoint import privacy_summary
from ..core.estimators import split_federation
from ..core.exceptions import NotFittedError, ValidationError
from ..core.protocol import Transport
from ..core.random import RandomState, root_seed
from ..core.validation import check_array, check_devices, check_int, check_n_features
from ..privacy import DifferentialPrivacy
from ..privacy.distributed import min_noise_devices
from ..sim.transport import fit_transport
from ..unlearning.forget import ForgetMixin, run_recorded
from .models import Model, build_model, make_model
from .clustered import ROUTINGS, ClusteredFedAvgProtocol
from .ifca import IFCAProtocol
from .protocol import FedAvgProtocol, FLProtocol, FLResult, feature_map

__all__ = ["FedAvg", "IFCA", "ClusteredFedAvg"]


def _check_federation(devices_X: Any, devices_y: Any, ids: Sequence[int] | None, name: str = ""
                      ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    Xs = check_devices(devices_X, ids=ids, name=f"{name}devices_X")
    Xs = [X.astype(np.float64, copy=False) for X in Xs]
    try:
        ys = list(devices_y)
    except TypeError:
        raise ValidationError(f"{name}devices_y must be one label array per device") from None
    if len(ys) != len(Xs):
        raise ValidationError(f"{name}devices_y has {len(ys)} arrays for {len(Xs)} devices")
    out = []
    for pos, (X, y) in enumerate(zip(Xs, ys)):
        z = pos if ids is None else ids[pos]
        y = np.asarray(y)
        if y.dtype.kind not in "biuf":
            raise ValidationError(f"device {z}: y has dtype {y.dtype}; expected numbers")
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValidationError(
                f"device {z}: X has {X.shape[0]} rows but y has shape {y.shape}")
        if y.dtype.kind == "f" and not np.isfinite(y).all():
            raise ValidationError(f"device {z}: y contains NaN or inf")
        out.append(y)
    return Xs, out


class _FLEstimator(ForgetMixin, BaseEstimator):
    """Shared fit / predict / history code; subclasses name the protocol.

    A classifier for every model but ``"linear"`` (a regressor): the tags and
    :meth:`score` follow ``model``.
    """

    _protocol_cls: type[FLProtocol] = FedAvgProtocol

    def __init__(self, model: str | None = None, *, rounds: int = 30, local_epochs: int = 1,
                 batch_size: int = 32, lr: float = 0.05, clients_per_round: int | None = None,
                 aggregator: str = "mean", beta: float = 0.1, weighted: bool = True,
                 local_mode: str = "sgd", n_hidden: int = 200, l2: float = 0.0,
                 random_state: RandomState = None, progress: bool = False):
        self.model = model
        self.rounds = rounds
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.lr = lr
        self.clients_per_round = clients_per_round
        self.aggregator = aggregator
        self.beta = beta
        self.weighted = weighted
        self.local_mode = local_mode
        self.n_hidden = n_hidden
        self.l2 = l2
        self.random_state = random_state
        self.progress = progress

    def _selection_config(self) -> dict[str, Any]:
        """``selection`` and ``n_candidates`` (0: the protocol's default) for the protocol."""
        d = 0 if self.n_candidates is None else check_int(self.n_candidates, "n_candidates",
                                                          min_value=1)
        return {"selection": self.selection, "n_candidates": d}

    def _extra_config(self, n_devices: int) -> dict[str, Any]:
        return {}

    def _build(self, Xs, ys, ids, eval_every: int) -> FLProtocol:
        if isinstance(self.model, Model):
            template = self.model
            kind = template.kind
        else:
            template = make_model(self.model, Xs[0][:1], self._label_range(ys),
                                  n_hidden=self.n_hidden, l2=self.l2)
            kind = template.kind
        for z, X, y in zip(ids, Xs, ys):
            template.check_data(X, y, f"device {z}")
        m = self.clients_per_round
        if m is not None:
            m = check_int(m, "clients_per_round", min_value=1)
            if m > len(Xs):
                raise ValidationError(
                    f"clients_per_round={m} is larger than the federation ({len(Xs)} devices)")
        privacy = self._privacy()
        # under privacy, m of N devices a round is a secret Poisson sample at rate m / N,
        # which the accountant amplifies (see docs/privacy.md)
        sampling = m / len(Xs) if privacy is not None and m is not None else 1.0
        return self._protocol_cls(
            model=kind, n_features=template.n_features,
            n_classes=int(getattr(template, "n_classes", 1)),
            n_hidden=int(getattr(template, "n_hidden", self.n_hidden)),
            l2=template.l2, rounds=self.rounds, local_mode=self.local_mode,
            local_epochs=self.local_epochs, batch_size=self.batch_size, lr=self.lr,
            aggregator=self.aggregator, beta=self.beta, weighted=self.weighted,
            clients_per_round=m or 0, snapshot_every=eval_every,
            privacy=privacy, sampling=sampling, **self._extra_config(len(Xs)))

    def _label_range(self, ys) -> np.ndarray:
        """The labels the model's class count is read from: the devices' labels, or the
        public ``classes`` (0..C-1; required under privacy for a multi-class model, whose
        class count would otherwise be the largest label seen)."""
        classes = getattr(self, "classes", None)
        y = np.concatenate(ys)
        if self.model == "linear":
            return y
        if classes is None:
            privacy = self._privacy()
            if privacy is not None and privacy.private and self.model != "logistic":
                raise ValidationError(
                    f"privacy: {type(self).__name__} needs classes= (the public labels "
                    "0..C-1, or C): the class count would be read from the labels seen")
            return y
        C = classes if isinstance(classes, (int, np.integer)) else len(classes)
        if isinstance(classes, bool) or C < 1 or (
                not isinstance(classes, (int, np.integer))
                and list(np.asarray(classes).tolist()) != list(range(C))):
            raise ValidationError(f"classes={classes!r} must be C or the labels 0..C-1")
        if len(y) and (y.min() < 0 or y.max() >= C):
            raise ValidationError(f"a device holds a label outside classes 0..{C - 1}")
        return np.array([C - 1])

    def _privacy(self):
        privacy = getattr(self, "privacy", None)
        if privacy is not None and not isinstance(privacy, DifferentialPrivacy):
            raise ValidationError(f"privacy={privacy!r} must be a "
                                  "fedclust.privacy.DifferentialPrivacy or None")
        return privacy

    def _is_classifier(self) -> bool:
        if isinstance(self.model, Model):
            return bool(self.model.classifier)
        return self.model != "linear"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        if self._is_classifier():
            tags.estimator_type = "classifier"
            tags.classifier_tags = ClassifierTags()
        else:
            tags.estimator_type = "regressor"
            tags.regressor_tags = RegressorTags()
        return tags

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy of :meth:`predict` (classifiers) or its R² (``model="linear"``)."""
        metric = accuracy_score if self._is_classifier() else r2_score
        return float(metric(y, self.predict(X), sample_weight=sample_weight))

    def fit(self, X: Any, y: Any, *, groups: Any = None,
            device_ids: Sequence[int] | None = None, test_X: Sequence[Any] | None = None,
            test_y: Sequence[Any] | None = None, transport: Transport | None = None):
        """Train over the devices' (X_z, y_z).

        ``X``/``y``: one array per device; or all rows with ``groups`` (n,), each
        row's device id; or one array pair alone, a federation of one device
        (see :meth:`fedclust.KFed.fit`). ``test_X``/``test_y`` (one per device, in
        device order) fill ``history_``'s test accuracy (averaged over devices, each
        with the model serving it).
        """
        fed = split_federation(X, y, groups=groups, device_ids=device_ids)
        devices_X, devices_y, device_ids = fed.devices, fed.labels, fed.device_ids
        if devices_y is None:
            raise ValidationError(f"{type(self).__name__} requires y to be passed, but the "
                                  "target y is None")
        if test_X is not None and not isinstance(test_X, (list, tuple)) \
                and len(devices_X) == 1 and groups is None:
            test_X, test_y = [test_X], [test_y]
        if device_ids is not None:
            device_ids = [check_int(z, f"device_ids[{i}]", min_value=0)
                          for i, z in enumerate(device_ids)]
            if len(set(device_ids)) != len(device_ids):
                raise ValidationError(f"device_ids must be distinct, got {device_ids[:10]}")
        Xs, ys = _check_federation(devices_X, devices_y, device_ids)
        ids = list(range(len(Xs))) if device_ids is None else list(device_ids)
        tests = None
        if test_X is not None:
            tX, ty = _check_federation(test_X, test_y, ids, name="test_")
            if len(tX) != len(Xs):
                raise ValidationError(f"test_X has {len(tX)} devices, the federation {len(Xs)}")
            tests = (tX, ty)
        transport = fit_transport(transport, getattr(self, "secure_aggregation", False),
                                  self.progress)
        protocol = self._build(Xs, ys, ids, eval_every=1 if tests else 0)
        if getattr(transport, "secure_aggregation", False) \
                and "secure_sum" in getattr(self._protocol_cls, "_EXTRA_KEYS", ()):
            # the transport sums securely: send the updates in their summable form (under
            # privacy each device clips its update and adds its share of the noise)
            extra = ({} if protocol.privacy is None else
                     {"noise_devices": min_noise_devices(len(Xs))})  # every device is in the sum
            protocol = self._protocol_cls.from_config({**protocol.config(), "secure_sum": True,
                                                       **extra})
        if tests:
            for z, X, y in zip(ids, *tests):
                protocol.new_model().check_data(X, y, f"test device {z}")
        self.seed_ = root_seed(self.random_state)
        out = run_recorded(self, transport, protocol, dict(zip(ids, zip(Xs, ys))), self.seed_)
        self._protocol_ = protocol
        self._store(out, ids, tests)
        self.privacy_ = None if protocol.plan is None else privacy_summary(protocol.plan, out.log)
        return self

    # -- results ----------------------------------------------------------------
    def _forget_protocol(self, u, kept, new_data):
        """The protocol a fit on the remaining devices builds (the model's classes and sizes
        follow their labels); the fitted one when nothing changes."""
        data = {**u.data, **new_data}
        remaining = set(kept.device_ids)
        ids = [z for z in self.device_ids_ if z in remaining]
        if not ids or any(z not in data for z in ids):
            return u.protocol
        proto = self._build([data[z][0] for z in ids], [data[z][1] for z in ids], ids,
                            eval_every=getattr(u.protocol, "snapshot_every", 0))
        return u.protocol if proto.config() == u.protocol.config() else proto

    def _apply_forget(self, out, device_ids) -> None:
        """The model after :meth:`forget` (``fedclust.unlearning``): as ``fit`` stores it."""
        self._store(out, device_ids, None)

    def _store(self, out, ids, tests) -> None:
        res: FLResult = out.result
        self._result = res
        self.device_ids_ = list(ids)
        self.models_ = res.models
        self.model_ = self._model(res.models[0])
        self._scratch = self._model(res.models[0])
        self._loaded = None
        self.n_features_in_ = self.model_.n_features
        if self.model_.classifier:
            self.classes_ = np.arange(self.model_.n_classes)
        if self._protocol_.plan is None:
            self.device_clusters_ = self._device_clusters(res, ids)
        else:   # a device's cluster choice is not released: each routes on its own data
            self.device_clusters_ = [-1] * len(ids)
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels") for z in ids]
        self.run_log_ = out.log
        comm = out.meter.summary()
        comm.update(fl_rounds=len(res.round_loss), setup_bytes_up=res.setup_bytes[0],
                    setup_bytes_down=res.setup_bytes[1],
                    models_per_download=self._models_per_download())
        self.communication_ = comm
        self.history_ = []
        for r in range(len(res.round_loss)):
            self.history_.append({
                "round": r + 1,
                "train_loss": (float(res.round_loss[r]) if np.isfinite(res.round_loss[r])
                               else None),
                "bytes_up": int(res.round_bytes_up[r]), "bytes_down": int(res.round_bytes_down[r]),
                "devices": int(res.round_devices[r])})
        if tests:
            for r, models in sorted(res.snapshots.items()):
                accs = self._device_scores(models.astype(np.float64), *tests)
                self.history_[r - 1]["test_accuracy"] = float(np.mean(accs))
            self.device_test_accuracy_ = self._device_scores(res.models, *tests)
        self._loaded = None

    def _models_per_download(self) -> int:
        return 1

    def _device_clusters(self, res: FLResult, ids) -> list[int]:
        out = []
        for z in ids:
            lab = res.center_labels.get(z)
            out.append(-1 if lab is None else int(lab[int(np.argmax(res.local_counts[z]))]))
        return out

    def _model(self, params: np.ndarray) -> Model:
        p = self._protocol_
        m = build_model(p.model, p.n_features, max(p.n_classes, 2), n_hidden=p.n_hidden, l2=p.l2)
        m.set_params(params)
        return m

    def _device_scores(self, models: np.ndarray, tX, ty) -> np.ndarray:
        self._loaded = None
        return np.array([float(np.mean(self._predict_device(pos, X, models) == y))
                         for pos, (X, y) in enumerate(zip(tX, ty))])

    def _check_fitted(self) -> None:
        if not hasattr(self, "models_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _check_X(self, X: Any) -> np.ndarray:
        return check_n_features(check_array(X, "X").astype(np.float64, copy=False), self)

    def predict(self, X: Any) -> np.ndarray:
        """Predictions of the global model (FedAvg) or of each point's routed cluster model."""
        self._check_fitted()
        self._loaded = None
        try:
            return self._route(self._check_X(X), self.models_)
        finally:
            self._loaded = None  # the cache lives for one call: predict leaves no state

    def predict_device(self, i: int, X: Any) -> np.ndarray:
        """Predictions of the model that serves device ``i`` (its id) on X."""
        self._check_fitted()
        if i not in self.device_ids_:
            raise ValidationError(f"device {i} is not in the federation {self.device_ids_[:10]}")
        self._loaded = None
        try:
            return self._predict_device(self.device_ids_.index(i), self._check_X(X), self.models_)
        finally:
            self._loaded = None

    def _predict_device(self, pos: int, X: np.ndarray, models: np.ndarray) -> np.ndarray:
        c = self.device_clusters_[pos]
        if c < 0:
            return self._route(X, models)
        return self._predict_with(models[c], X, (models, c))

    def _scratch_model(self) -> Model:
        """The model whose parameters predictions load; rebuilt when it came back read-only
        (an estimator loaded by joblib with ``mmap_mode``)."""
        if not self._scratch.theta.flags.writeable:
            self._scratch = self._model(self.models_[0])
            self._loaded = None
        return self._scratch

    def _predict_with(self, params: np.ndarray, X: np.ndarray, key: Any = None) -> np.ndarray:
        # ``key`` = (models array, row): skip reloading p parameters for every device
        m = self._scratch_model()
        if key is None or self._loaded is None or self._loaded[0] is not key[0] \
                or self._loaded[1] != key[1]:
            m.set_params(params)
            self._loaded = key
        return m.predict(X)

    def _route(self, X: np.ndarray, models: np.ndarray) -> np.ndarray:
        return self._predict_with(models[0], X)


class FedAvg(_FLEstimator):
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
        The public class labels 0..C-1 (or C): the model's class count. Required
        under ``privacy`` for a multi-class model; otherwise read from the labels.
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


class IFCA(_FLEstimator):
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


class ClusteredFedAvg(_FLEstimator):
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
        tX, ty = _check_federation(test_X, test_y, self.device_ids_, name="test_")
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
