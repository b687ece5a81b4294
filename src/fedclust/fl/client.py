"""Client maths of federated learning: one device's local update, IFCA's model choice.

Pure functions over a device's own arrays; the protocols (:mod:`.protocol`)
and other wings (the Byzantine-robust gradient rounds of :mod:`fedclust.robust`)
call them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.exceptions import ValidationError
from ..core.validation import check_choice, check_float, check_int
from .models import Model

__all__ = ["local_update", "choose_cluster", "point_losses", "fit_gate", "gate_route",
           "LOCAL_MODES"]

LOCAL_MODES = ("sgd", "gd")


def local_update(model: Model, params: Any, X: np.ndarray, y: np.ndarray, *, mode: str = "sgd",
                 epochs: int = 1, batch_size: int = 32, lr: float = 0.05,
                 rng: np.random.Generator | None = None,
                 loss_before: float | None = None) -> tuple[np.ndarray, int, float]:
    """Train ``params`` on one device's (X, y) and return the new parameters.

    Parameters
    ----------
    model : Model
        Scratch model of the right kind and sizes (its parameters are overwritten).
    params : ndarray (p,)
        The parameters received from the server.
    X, y : ndarray (n, d), (n,)
        The device's data (validated by the caller; n >= 1).
    mode : {"sgd", "gd"}
        ``"sgd"``: ``epochs`` epochs of mini-batch SGD (FedAvg's local step,
        McMahan et al. 2017). ``"gd"``: one full-batch gradient step
        ``params - lr * grad`` (the robust wing's distributed gradient descent,
        Yin et al. 2018: the server sees ``(params - new) / lr``, the gradient).
    epochs, batch_size, lr : int, int, float
    rng : Generator
        The device's stream for the round (batch order); needed for ``"sgd"``.
    loss_before : float, optional
        The loss of ``params`` on (X, y) when the caller already has it (IFCA's
        choice computes it), saving one pass over the data.

    Returns
    -------
    new_params : ndarray (p,)
    n_samples : int
    loss_before : float
        Local loss of ``params`` before training (IFCA, power-of-choice, history).

    Notes
    -----
    Cost O(epochs * n * p) for SGD, O(n p) for GD. The device sends
    ``8 p + 24`` bytes (:class:`~fedclust.fl.messages.ModelUpdate`).
    """
    check_choice(mode, "mode", LOCAL_MODES)
    epochs = check_int(epochs, "local_epochs", min_value=1)
    batch_size = check_int(batch_size, "batch_size", min_value=1)
    lr = check_float(lr, "lr", min_value=0.0, min_inclusive=False)
    n = X.shape[0]
    if n == 0:
        raise ValidationError("device has no samples")
    model.set_params(params)
    if loss_before is None:
        loss_before = model.loss(X, y)
    if mode == "gd":
        new = model.get_params() - lr * model.gradient(X, y)
    else:
        if rng is None:
            raise ValidationError("mode='sgd' needs the device's rng")
        model.local_sgd(X, y, epochs=epochs, batch_size=batch_size, lr=lr, rng=rng)
        new = model.get_params()
    if not np.isfinite(new).all():
        raise ValidationError(
            f"local training diverged (non-finite parameters; loss before {loss_before:.4g}); "
            f"lower lr={lr}")
    return new, int(n), float(loss_before)


def choose_cluster(model: Model, params_k: np.ndarray, X: np.ndarray,
                   y: np.ndarray) -> tuple[int, np.ndarray]:
    """IFCA's cluster estimate: the model of ``params_k`` (k, p) with the lowest loss on (X, y).

    Returns the index (ties: the lowest) and the k losses. O(k n p).
    """
    losses = np.empty(params_k.shape[0])
    for j, theta in enumerate(params_k):
        model.set_params(theta)
        losses[j] = model.loss(X, y)
    return int(np.argmin(losses)), losses


def point_losses(model: Model, params_k: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-point loss (m, n) of each of the m models in ``params_k`` (m, p) on (X, y)
    (cross-entropy for classifiers, half squared error for regression; no penalty). O(m n p)."""
    out = np.empty((params_k.shape[0], X.shape[0]))
    yi = np.asarray(y)
    for j, theta in enumerate(params_k):
        model.set_params(theta)
        S = model.decision_function(X)
        if not model.classifier:
            out[j] = 0.5 * (S - yi) ** 2
        elif S.ndim == 1:  # binary logistic: log(1 + exp(-s (2y - 1)))
            out[j] = np.logaddexp(0.0, -S * (2.0 * yi - 1.0))
        else:
            M = S.max(axis=1, keepdims=True)
            lse = M[:, 0] + np.log(np.exp(S - M).sum(axis=1))
            out[j] = lse - S[np.arange(len(yi)), yi.astype(np.int64)]
    return out


def fit_gate(model: Model, params_k: np.ndarray, clusters: np.ndarray, X: np.ndarray,
             y: np.ndarray) -> dict[str, np.ndarray]:
    """A device's gate over its m cluster models, learned from its own labelled points.

    Each training point is labelled by the model with the lowest loss on it
    (:func:`point_losses`); a multinomial logistic regression (scikit-learn,
    lbfgs, C = 1) learns to predict that choice from x alone, so unlabelled
    points can be routed at prediction time (:func:`gate_route`). Local only: no
    bytes. Returns ``coef`` (c, d), ``intercept`` (c,) and ``clusters`` (c,): point x
    goes to ``clusters[argmax(coef @ x + intercept)]``. O(m n p) + the fit.
    """
    from sklearn.linear_model import LogisticRegression

    clusters = np.asarray(clusters, dtype=np.int64)
    choice = point_losses(model, params_k, X, y).argmin(axis=0)
    present = np.unique(choice)
    d = X.shape[1]
    if len(present) == 1:
        return {"coef": np.zeros((1, d)), "intercept": np.zeros(1),
                "clusters": clusters[present]}
    lr = LogisticRegression(C=1.0, max_iter=500).fit(X, choice)
    coef, icpt = lr.coef_, lr.intercept_
    if len(present) == 2:  # binary: class 1 iff w x + b > 0, i.e. argmax over [0; w]
        coef = np.vstack([np.zeros((1, d)), coef])
        icpt = np.concatenate([[0.0], icpt])
    return {"coef": np.asarray(coef, dtype=np.float64), "intercept": np.asarray(icpt, dtype=np.float64),
            "clusters": clusters[lr.classes_]}


def gate_route(gate: dict[str, np.ndarray], X: np.ndarray) -> np.ndarray:
    """The cluster :func:`fit_gate`'s gate sends each row of X to. O(n c d)."""
    if len(gate["clusters"]) == 1:
        return np.full(len(X), int(gate["clusters"][0]), dtype=np.int64)
    S = X @ gate["coef"].T + gate["intercept"]
    return np.asarray(gate["clusters"], dtype=np.int64)[S.argmax(axis=1)]
