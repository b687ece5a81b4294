"""Stage 1 client maths: a machine's least-squares ERM, sent once.

The ERM is ``[w, b]`` minimising ``0.5 * mean((X w + b - y)²) + l2/2 ||w||²``
(the loss of :class:`fedclust.fl.models.LinearRegression`, so stage 3 starts
from the same objective). Without ``l2`` it needs a full-rank design: a
machine with fewer samples than parameters is refused with a message that
says so, rather than silently regularised (the paper's statistical model
assumes n >= d on every machine). O(n p²) by a thin SVD (``numpy.linalg.lstsq``)
or a Cholesky solve when ``l2 > 0``.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import minimize

from ..core.exceptions import ValidationError
from ..fl.models import LogisticRegression

__all__ = ["local_erm", "local_logistic_erm"]


def local_erm(X: np.ndarray, y: np.ndarray, *, l2: float = 0.0, fit_intercept: bool = True,
              owner: str = "machine") -> np.ndarray:
    """Least-squares ERM ``[w (d), b]`` (d + 1,) of one machine's (X, y) (validated arrays).

    ``fit_intercept=False`` fixes ``b = 0``. Raises :class:`ValidationError`
    naming ``owner`` when the problem is underdetermined and ``l2 == 0``.
    """
    n, d = X.shape
    p = d + int(fit_intercept)
    if l2 == 0.0 and n < p:
        raise ValidationError(
            f"{owner} has n={n} samples but the least-squares ERM needs at least {p} "
            f"(d={d} features{' + intercept' if fit_intercept else ''}); give it more data, "
            "drop it, or pass l2 > 0 to regularise")
    if fit_intercept:
        xm, ym = X.mean(axis=0), float(y.mean())
        Xc, yc = X - xm, y - ym
    else:
        xm, ym, Xc, yc = np.zeros(d), 0.0, X, y
    if l2 > 0.0:
        G = Xc.T @ Xc / n
        G.flat[::d + 1] += l2
        w = cho_solve(cho_factor(G), Xc.T @ yc / n)
    else:
        w, _, rank, _ = np.linalg.lstsq(Xc, yc, rcond=None)
        if rank < d:
            raise ValidationError(
                f"{owner}: its {n} samples span only {rank} of the d={d} feature directions, "
                "so the least-squares ERM is not unique; pass l2 > 0 to regularise")
    b = ym - float(xm @ w)
    return np.concatenate([w, [b]]) if fit_intercept else np.concatenate([w, [0.0]])


def local_logistic_erm(X: np.ndarray, y: np.ndarray, *, l2: float = 0.0,
                       fit_intercept: bool = True, owner: str = "machine",
                       tol: float = 1e-10, max_iter: int = 500) -> np.ndarray:
    """Logistic ERM ``[w (d), b]`` (d + 1,) of one machine's (X, y in {0, 1}).

    Minimises :class:`fedclust.fl.models.LogisticRegression`'s loss (mean
    log-loss + ``l2/2 ||w||²``) with its own loss and gradient, by scipy's
    L-BFGS (no second training loop: the objective is the FL model's, the
    optimiser scipy's). Without ``l2`` the minimiser does not exist when the
    machine's data are linearly separable (or hold one class only): that is
    refused with a :class:`ValidationError` naming ``owner``. O(n p) per
    L-BFGS iteration.
    """
    n, d = X.shape
    model = LogisticRegression(d, l2=l2)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        if not fit_intercept:
            theta = np.r_[theta, 0.0]
        model.set_params(theta)
        g = model.gradient(X, y)
        return model.loss(X, y), (g if fit_intercept else g[:-1])

    p = d + int(fit_intercept)
    res = minimize(fun, np.zeros(p), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "gtol": tol, "ftol": 0.0})
    theta = res.x if fit_intercept else np.r_[res.x, 0.0]
    if l2 == 0.0:
        one_class = np.unique(y).size < 2
        pred = X @ theta[:-1] + theta[-1]
        separable = bool(np.all((pred > 0) == (y > 0.5)))
        if one_class or separable:
            raise ValidationError(
                f"{owner}: its labels are {'all one class' if one_class else 'linearly separable'},"
                " so the logistic ERM does not exist (the weights grow without bound); pass "
                "l2 > 0 to regularise")
    if not np.isfinite(theta).all():
        raise ValidationError(f"{owner}: the logistic ERM diverged; pass l2 > 0")
    return theta
