"""Plain-numpy models for federated learning: a flat parameter vector, loss, gradient, SGD.

Every model keeps all its weights in one float64 vector ``theta`` (p,) and
views into it (``W``, ``b``, ...), so ``get_params`` / ``set_params`` are a
copy and FedAvg / IFCA / the robust aggregators work on plain vectors. The
losses are means over the batch (plus ``l2/2 * ||weights||²`` when ``l2 > 0``;
biases are not penalised) and ``gradient`` is the exact gradient of that mean,
checked against finite differences in ``tests/fl``.

Models:

* :class:`LinearRegression` — squared loss ``0.5 * mean((Xw + b - y)²)``;
* :class:`LogisticRegression` — binary, y in {0, 1}, mean log-loss;
* :class:`SoftmaxRegression` — multinomial, y in {0..C-1}, mean cross entropy;
* :class:`MLP` — one ReLU hidden layer, softmax output: the 784-200-10 network
  of McMahan et al. (2017) and of the k-FED paper's Table 2.

Cost of one SGD step on a batch of B rows: O(B p) (BLAS ``gemm``); one epoch of
250 MNIST images through the 784-200-10 MLP is a few milliseconds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.exceptions import ValidationError
from ..core.validation import check_float, check_int

__all__ = ["Model", "LinearRegression", "LogisticRegression", "SoftmaxRegression", "MLP",
           "make_model", "build_model", "MODEL_KINDS"]

MODEL_KINDS = ("mlp", "softmax", "logistic", "linear")


class Model:
    """Base class: a flat parameter vector with named views (see the module docstring)."""

    kind: str = "model"
    #: True for classifiers (integer labels in ``range(n_classes)``)
    classifier: bool = True

    def __init__(self, shapes: dict[str, tuple[int, ...]], *, l2: float = 0.0):
        self.l2 = check_float(l2, "l2", min_value=0.0)
        self._shapes = dict(shapes)
        self.n_params = int(sum(int(np.prod(s)) for s in shapes.values()))
        self.theta = np.zeros(self.n_params)
        self._bind()

    def _bind(self) -> None:
        """Make the named weight views (``self.W`` ...) into ``self.theta``."""
        pos = 0
        for name, shape in self._shapes.items():
            size = int(np.prod(shape))
            setattr(self, name, self.theta[pos:pos + size].reshape(shape))
            pos += size

    # -- parameters -------------------------------------------------------
    def get_params(self) -> np.ndarray:
        """A float64 copy of the flat parameter vector (p,)."""
        return self.theta.copy()

    def set_params(self, theta: Any) -> None:
        """Copy ``theta`` (p,) into the model (refuses a wrong size or non-finite values)."""
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.n_params,):
            raise ValidationError(
                f"{self.kind} model has {self.n_params} parameters, got an array of shape "
                f"{theta.shape}")
        if not np.isfinite(theta).all():
            raise ValidationError(f"{self.kind} parameters contain NaN or inf")
        self.theta[:] = theta

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Starting parameters (p,) drawn from ``rng`` (zeros for the convex models)."""
        return np.zeros(self.n_params)

    def _penalised(self) -> list[str]:
        return ["W"]

    def _l2_loss(self) -> float:
        if not self.l2:
            return 0.0
        return 0.5 * self.l2 * sum(float(np.vdot(getattr(self, n), getattr(self, n)))
                                   for n in self._penalised())

    # -- subclass maths ---------------------------------------------------
    def _loss_grad(self, X: np.ndarray, y: np.ndarray, grad: np.ndarray | None) -> float:
        """Mean data loss; when ``grad`` (p,) is given, write the gradient of the mean into it."""
        raise NotImplementedError

    def _grad_views(self, grad: np.ndarray) -> dict[str, np.ndarray]:
        out, pos = {}, 0
        for name, shape in self._shapes.items():
            size = int(np.prod(shape))
            out[name] = grad[pos:pos + size].reshape(shape)
            pos += size
        return out

    # -- public maths -----------------------------------------------------
    def loss(self, X: np.ndarray, y: np.ndarray) -> float:
        """Mean loss over the rows of X (plus the L2 penalty)."""
        return self._loss_grad(X, y, None) + self._l2_loss()

    def gradient(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Gradient (p,) of :meth:`loss` at the current parameters."""
        g = np.zeros(self.n_params)
        self._loss_grad(X, y, g)
        if self.l2:
            views = self._grad_views(g)
            for name in self._penalised():
                views[name] += self.l2 * getattr(self, name)
        return g

    def decision_function(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class labels (classifiers) or real predictions (regression) of the rows of X."""
        s = self.decision_function(X)
        return s.argmax(axis=1) if s.ndim == 2 else s

    def score(self, X: np.ndarray, y: np.ndarray) -> float:
        """Accuracy (classifiers) or minus the mean squared error (regression)."""
        pred = self.predict(X)
        if self.classifier:
            return float(np.mean(pred == y))
        return -float(np.mean((pred - y) ** 2))

    def local_sgd(self, X: np.ndarray, y: np.ndarray, *, epochs: int = 1, batch_size: int = 32,
                  lr: float = 0.05, rng: np.random.Generator) -> None:
        """Mini-batch SGD in place: each epoch visits a fresh permutation of the rows (from ``rng``).

        Batches of ``batch_size`` rows (the last one may be smaller); every
        step is ``theta -= lr * gradient(batch)``. O(epochs * n * p).
        """
        n = X.shape[0]
        g = np.zeros(self.n_params)
        for _ in range(epochs):
            order = rng.permutation(n)
            for s in range(0, n, batch_size):
                idx = order[s:s + batch_size]
                g[:] = 0.0
                self._loss_grad(X[idx], y[idx], g)
                if self.l2:
                    views = self._grad_views(g)
                    for name in self._penalised():
                        views[name] += self.l2 * getattr(self, name)
                self.theta -= lr * g

    # -- checks -----------------------------------------------------------
    def check_data(self, X: Any, y: Any, owner: str = "device") -> tuple[np.ndarray, np.ndarray]:
        """Validate (X, y) for this model; errors name ``owner`` and the offending value."""
        X = np.asarray(X)
        y = np.asarray(y)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValidationError(
                f"{owner}: X has shape {X.shape} but the {self.kind} model expects "
                f"{self.n_features} features")
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValidationError(
                f"{owner}: X has {X.shape[0]} rows but y has shape {y.shape}")
        if self.classifier:
            bad = (y < 0) | (y >= self.n_classes) | (y != np.round(y))
            if bad.any():
                raise ValidationError(
                    f"{owner}: label {y[bad][0].item()!r} is outside the model's classes "
                    f"0..{self.n_classes - 1}")
        return X, y

    def clone(self) -> "Model":
        """A new model of the same kind and sizes, with a copy of the parameters."""
        m = build_model(self.kind, self.n_features, getattr(self, "n_classes", 1),
                        n_hidden=getattr(self, "n_hidden", 0), l2=self.l2)
        m.set_params(self.theta)
        return m


class LinearRegression(Model):
    """Least squares ``y ≈ X w + b``; loss ``0.5 * mean((Xw + b - y)²)``. p = d + 1."""

    kind = "linear"
    classifier = False

    def __init__(self, n_features: int, *, l2: float = 0.0):
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.n_classes = 1
        super().__init__({"W": (self.n_features,), "b": (1,)}, l2=l2)

    def decision_function(self, X):
        return X @ self.W + self.b[0]

    def _loss_grad(self, X, y, grad):
        r = X @ self.W + (self.b[0] - y)
        if grad is not None:
            n = X.shape[0]
            grad[:-1] += X.T @ r / n
            grad[-1] += r.sum() / n
        return 0.5 * float(r @ r) / X.shape[0]


class LogisticRegression(Model):
    """Binary logistic regression, y in {0, 1}; mean log-loss. p = d + 1."""

    kind = "logistic"

    def __init__(self, n_features: int, *, l2: float = 0.0):
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.n_classes = 2
        super().__init__({"W": (self.n_features,), "b": (1,)}, l2=l2)

    def decision_function(self, X):
        return X @ self.W + self.b[0]

    def predict(self, X):
        return (self.decision_function(X) > 0).astype(np.int64)

    def predict_proba(self, X):
        """P(y = 1) of every row."""
        return 0.5 * (1.0 + np.tanh(0.5 * self.decision_function(X)))

    def _loss_grad(self, X, y, grad):
        s = X @ self.W + self.b[0]
        # log(1 + e^s) - y s, stably
        loss = float(np.mean(np.logaddexp(0.0, s) - y * s))
        if grad is not None:
            r = (0.5 * (1.0 + np.tanh(0.5 * s)) - y) / X.shape[0]
            grad[:-1] += X.T @ r
            grad[-1] += r.sum()
        return loss


def _softmax_xent(S: np.ndarray, y: np.ndarray, want_grad: bool) -> tuple[float, np.ndarray | None]:
    """Mean cross entropy of scores S (B, C) against integer labels; dL/dS (B, C) when asked."""
    S = S - S.max(axis=1, keepdims=True)
    E = np.exp(S)
    Z = E.sum(axis=1)
    rows = np.arange(S.shape[0])
    yi = y.astype(np.int64, copy=False)
    loss = float(np.mean(np.log(Z) - S[rows, yi]))
    if not want_grad:
        return loss, None
    E /= Z[:, None]
    E[rows, yi] -= 1.0
    E /= S.shape[0]
    return loss, E


class SoftmaxRegression(Model):
    """Multinomial logistic regression, y in {0..C-1}; mean cross entropy. p = (d + 1) C."""

    kind = "softmax"

    def __init__(self, n_features: int, n_classes: int, *, l2: float = 0.0):
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.n_classes = check_int(n_classes, "n_classes", min_value=2)
        super().__init__({"W": (self.n_features, self.n_classes), "b": (self.n_classes,)}, l2=l2)

    def decision_function(self, X):
        return X @ self.W + self.b

    def _loss_grad(self, X, y, grad):
        loss, D = _softmax_xent(X @ self.W + self.b, y, grad is not None)
        if grad is not None:
            v = self._grad_views(grad)
            v["W"] += X.T @ D
            v["b"] += D.sum(axis=0)
        return loss


class MLP(Model):
    """One hidden ReLU layer and a softmax output (McMahan et al. 2017's 784-200-10 network).

    p = (d + 1) h + (h + 1) C. Weights start Glorot-uniform from the run's
    server stream (:meth:`init_params`); biases at zero.
    """

    kind = "mlp"

    def __init__(self, n_features: int, n_hidden: int = 200, n_classes: int = 10, *,
                 l2: float = 0.0):
        self.n_features = check_int(n_features, "n_features", min_value=1)
        self.n_hidden = check_int(n_hidden, "n_hidden", min_value=1)
        self.n_classes = check_int(n_classes, "n_classes", min_value=2)
        d, h, c = self.n_features, self.n_hidden, self.n_classes
        super().__init__({"W1": (d, h), "b1": (h,), "W2": (h, c), "b2": (c,)}, l2=l2)

    def _penalised(self) -> list[str]:
        return ["W1", "W2"]

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        theta = np.zeros(self.n_params)
        d, h, c = self.n_features, self.n_hidden, self.n_classes
        a1, a2 = np.sqrt(6.0 / (d + h)), np.sqrt(6.0 / (h + c))
        theta[:d * h] = rng.uniform(-a1, a1, d * h)
        off = d * h + h
        theta[off:off + h * c] = rng.uniform(-a2, a2, h * c)
        return theta

    def hidden(self, X: np.ndarray) -> np.ndarray:
        """The hidden layer's activations (n, h): a learned feature map."""
        H = X @ self.W1
        H += self.b1
        return np.maximum(H, 0.0, out=H)

    def decision_function(self, X):
        return self.hidden(X) @ self.W2 + self.b2

    def _loss_grad(self, X, y, grad):
        H = self.hidden(X)
        loss, D = _softmax_xent(H @ self.W2 + self.b2, y, grad is not None)
        if grad is not None:
            v = self._grad_views(grad)
            v["W2"] += H.T @ D
            v["b2"] += D.sum(axis=0)
            DH = D @ self.W2.T
            DH *= H > 0
            v["W1"] += X.T @ DH
            v["b1"] += DH.sum(axis=0)
        return loss


def build_model(kind: str, n_features: int, n_classes: int = 10, *, n_hidden: int = 200,
                l2: float = 0.0) -> Model:
    """A model from its kind and sizes (what a protocol's ``config()`` carries)."""
    if kind == "mlp":
        return MLP(n_features, n_hidden, n_classes, l2=l2)
    if kind == "softmax":
        return SoftmaxRegression(n_features, n_classes, l2=l2)
    if kind == "logistic":
        return LogisticRegression(n_features, l2=l2)
    if kind == "linear":
        return LinearRegression(n_features, l2=l2)
    raise ValidationError(f"model={kind!r} is not supported; choose one of {list(MODEL_KINDS)}")


def make_model(kind: str | Model | None, X: Any, y: Any, *, n_hidden: int = 200,
               l2: float = 0.0) -> Model:
    """The model for data (X, y): ``None`` or ``"mlp"`` is the paper's MLP (d-200-C).

    ``X`` (n, d) and ``y`` (n,) may be pooled over devices (only the sizes are
    read: d from X, C = max(y) + 1 for classifiers). A :class:`Model` instance
    is checked against the data and returned as a fresh clone.
    """
    X = np.asarray(X)
    y = np.asarray(y)
    if X.ndim != 2:
        raise ValidationError(f"X must be 2-D, got shape {X.shape}")
    d = X.shape[1]
    if isinstance(kind, Model):
        kind.check_data(X, y, "data")
        return kind.clone()
    kind = "mlp" if kind is None else kind
    if kind not in MODEL_KINDS:
        raise ValidationError(f"model={kind!r} is not supported; choose one of {list(MODEL_KINDS)}")
    n_classes = 1
    if kind != "linear":
        if y.size == 0:
            raise ValidationError("y is empty: cannot size the model's output")
        if (y != np.round(y)).any() or (y < 0).any():
            bad = y[(y != np.round(y)) | (y < 0)][0].item()
            raise ValidationError(f"label {bad!r} is not a class index 0, 1, 2, ...")
        n_classes = max(int(y.max()) + 1, 2)
    if kind == "logistic" and n_classes > 2:
        raise ValidationError(f"model='logistic' is binary but the labels go up to {int(y.max())} "
                              f"({n_classes} classes); use model='softmax' (multinomial logistic "
                              "regression) or the default MLP")
    return build_model(kind, d, n_classes, n_hidden=n_hidden, l2=l2)
