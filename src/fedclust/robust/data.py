"""Mixture of linear regressions over machines, with Byzantine machines (the paper's §6.1).

Honest machine i of cluster j holds ``x ~ N(0, I_d)``, ``y = x·w*_j + b*_j +
noise``, ``noise ~ N(0, noise²)``; ``w*_j`` has i.i.d. ``N(0, coef_scale²)``
entries. Machines are assigned to clusters uniformly at random (every cluster
gets at least one honest machine). A fraction ``alpha`` are Byzantine: their
data follow a regression of their own with ``w ~ N(0, byzantine_scale²)``, so
their ERMs are arbitrary outliers (the paper's construction); attacks on the
wire are :class:`fedclust.sim.byzantine.ByzantineTamper`. (The paper's
constants did not survive in the seed text; these defaults give a clear
separation: ``||w*_i - w*_j|| ~ coef_scale·sqrt(2d)`` against an ERM noise of
``noise·sqrt(d / n)``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.exceptions import ValidationError
from ..core.random import RandomState, device_rng, root_seed, server_rng
from ..core.validation import check_float, check_int
from ..sim.byzantine import choose_byzantine

__all__ = ["MixtureRegression", "make_mixture_regression", "mixture_regression_source",
           "make_mixture_logistic", "mixture_logistic_source"]


@dataclass
class MixtureRegression:
    """``Xs``/``ys``: per-machine arrays; ``coef`` (k, d), ``intercept`` (k,): the truth;
    ``clusters`` (m,): each machine's cluster (-1: Byzantine); ``byzantine``: their ids;
    ``X_test``/``y_test``: per-machine held-out data from the same law."""

    Xs: list[np.ndarray]
    ys: list[np.ndarray]
    coef: np.ndarray
    intercept: np.ndarray
    clusters: np.ndarray
    byzantine: list[int]
    X_test: list[np.ndarray] = field(default_factory=list)
    y_test: list[np.ndarray] = field(default_factory=list)


def _setup(n_machines, n_samples, n_features, n_clusters, alpha, coef_scale, byzantine_scale,
           n_test, random_state) -> tuple:
    """The checks and draws the two mixture generators share: validated sizes and scales,
    the root seed, the Byzantine split and the server stream that draws the truth."""
    m = check_int(n_machines, "n_machines", min_value=1)
    n = check_int(n_samples, "n_samples", min_value=1)
    d = check_int(n_features, "n_features", min_value=1)
    k = check_int(n_clusters, "n_clusters", min_value=1)
    coef_scale = check_float(coef_scale, "coef_scale", min_value=0.0)
    byzantine_scale = check_float(byzantine_scale, "byzantine_scale", min_value=0.0)
    n_test = check_int(n_test, "n_test", min_value=0)
    seed = root_seed(random_state)
    bad, honest = _split_machines(seed, m, k, alpha)
    return m, n, d, k, n_test, coef_scale, byzantine_scale, seed, bad, honest, server_rng(seed, 0)


def _split_machines(seed: int, m: int, k: int, alpha: float) -> tuple[set, list[int]]:
    """The Byzantine machines (from the seed) and the honest ones (at least k of them)."""
    bad = set(choose_byzantine(range(m), alpha, seed))
    honest = [i for i in range(m) if i not in bad]
    if len(honest) < k:
        raise ValidationError(
            f"n_clusters={k} but only {len(honest)} honest machines (n_machines={m}, alpha={alpha})")
    return bad, honest


def _assign_clusters(rng: np.random.Generator, m: int, k: int, honest: list[int]) -> np.ndarray:
    """Cluster of each machine (-1: Byzantine); every cluster gets at least one honest one."""
    clusters = np.full(m, -1, dtype=np.int64)
    lab = np.concatenate([np.arange(k), rng.integers(0, k, len(honest) - k)])
    clusters[honest] = rng.permutation(lab)
    return clusters


def _draw_machines(seed: int, d: int, n: int, n_test: int, clusters: np.ndarray,
                   W: np.ndarray, b: np.ndarray,
                   liar_model: Callable[[np.random.Generator], tuple[np.ndarray, float]],
                   respond: Callable[[np.ndarray, np.random.Generator], np.ndarray]) -> tuple:
    """Each machine's training (and test) points from its own stream: x ~ N(0, I_d), the
    response ``respond(x·w + b, rng)`` under its cluster's model or its own lie."""
    Xs, ys, Xt, yt = [], [], [], []
    for i, c in enumerate(clusters):
        r = device_rng(seed, i, 0)
        w, b0 = (W[c], b[c]) if c >= 0 else liar_model(r)
        for count, xs, ys_ in ((n, Xs, ys), (n_test, Xt, yt)):
            if count:
                X = r.normal(size=(count, d))
                xs.append(X)
                ys_.append(respond(X @ w + b0, r))
    return Xs, ys, Xt, yt


def _federation(mr: MixtureRegression, what: str, n_machines: int, n_features: int,
                alpha: float):
    from ..core.registry import Federation

    return Federation(
        mr.Xs, mr.ys, f"mixture of {what} ({n_machines} machines, d={n_features}, alpha={alpha})",
        test_devices=mr.X_test or None, test_labels=mr.y_test or None,
        extra={"coef": mr.coef, "intercept": mr.intercept, "clusters": mr.clusters.tolist(),
               "byzantine": mr.byzantine})


def make_mixture_regression(n_machines: int = 100, n_samples: int = 50, n_features: int = 10,
                            n_clusters: int = 4, *, alpha: float = 0.1, noise: float = 0.5,
                            coef_scale: float = 1.0, byzantine_scale: float = 10.0,
                            intercept: bool = False, n_test: int = 0,
                            random_state: RandomState = None) -> MixtureRegression:
    """Draw the federation (see the module docstring). O(m n d)."""
    noise = check_float(noise, "noise", min_value=0.0)
    m, n, d, k, n_test, coef_scale, byzantine_scale, seed, bad, honest, rng = _setup(
        n_machines, n_samples, n_features, n_clusters, alpha, coef_scale, byzantine_scale,
        n_test, random_state)
    W = coef_scale * rng.normal(size=(k, d))
    b = coef_scale * rng.normal(size=k) if intercept else np.zeros(k)
    clusters = _assign_clusters(rng, m, k, honest)
    liar = lambda r: (byzantine_scale * r.normal(size=d),
                      byzantine_scale * r.normal() if intercept else 0.0)
    Xs, ys, Xt, yt = _draw_machines(seed, d, n, n_test, clusters, W, b, liar,
                                    lambda z, r: z + noise * r.normal(size=z.shape[0]))
    return MixtureRegression(Xs, ys, W, b, clusters, sorted(bad), Xt, yt)


def mixture_regression_source(seed: int, *, n_machines: int = 100, n_samples: int = 50,
                              n_features: int = 10, n_clusters: int = 4, alpha: float = 0.1,
                              noise: float = 0.5, coef_scale: float = 1.0,
                              byzantine_scale: float = 10.0, intercept: bool = False,
                              n_test: int = 50):
    """``[data] source = "mixture-regression"``: a Federation of (X, y) machines."""
    mr = make_mixture_regression(n_machines, n_samples, n_features, n_clusters, alpha=alpha,
                                 noise=noise, coef_scale=coef_scale,
                                 byzantine_scale=byzantine_scale, intercept=intercept,
                                 n_test=n_test, random_state=seed)
    return _federation(mr, f"{n_clusters} linear regressions", n_machines, n_features, alpha)


def make_mixture_logistic(n_machines: int = 100, n_samples: int = 100, n_features: int = 5,
                          n_clusters: int = 2, *, alpha: float = 0.1, coef_scale: float = 2.0,
                          byzantine_scale: float = 10.0, n_test: int = 0,
                          random_state: RandomState = None) -> MixtureRegression:
    """Mixture of logistic regressions over machines (the classification counterpart).

    Honest machine i of cluster j: ``x ~ N(0, I_d)``, ``y ~ Bernoulli(σ(x·w*_j
    + b*_j))`` with ``w*_j`` i.i.d. ``N(0, coef_scale²)`` and ``b*_j ~ N(0,
    1)``; Byzantine machines (a fraction ``alpha``, drawn as for the
    regressions) label their points with a model of their own, ``w ~ N(0,
    byzantine_scale²)`` (data poisoning). Same fields as
    :func:`make_mixture_regression` (``ys`` integer labels in {0, 1}). O(m n d).
    """
    m, n, d, k, n_test, coef_scale, byzantine_scale, seed, bad, honest, rng = _setup(
        n_machines, n_samples, n_features, n_clusters, alpha, coef_scale, byzantine_scale,
        n_test, random_state)
    W = coef_scale * rng.normal(size=(k, d))
    b = rng.normal(size=k)
    clusters = _assign_clusters(rng, m, k, honest)
    liar = lambda r: (byzantine_scale * r.normal(size=d), byzantine_scale * r.normal())
    # sigmoid(z) = (1 + tanh(z / 2)) / 2: no overflow for large |z|
    label = lambda z, r: (r.uniform(size=z.shape[0]) < 0.5 * (1.0 + np.tanh(0.5 * z))).astype(
        np.int64)
    Xs, ys, Xt, yt = _draw_machines(seed, d, n, n_test, clusters, W, b, liar, label)
    return MixtureRegression(Xs, ys, W, b, clusters, sorted(bad), Xt, yt)


def mixture_logistic_source(seed: int, *, n_machines: int = 100, n_samples: int = 100,
                            n_features: int = 5, n_clusters: int = 2, alpha: float = 0.1,
                            coef_scale: float = 2.0, byzantine_scale: float = 10.0,
                            n_test: int = 100):
    """``[data] source = "mixture-logistic"``: a Federation of (X, y in {0, 1}) machines."""
    mr = make_mixture_logistic(n_machines, n_samples, n_features, n_clusters, alpha=alpha,
                               coef_scale=coef_scale, byzantine_scale=byzantine_scale,
                               n_test=n_test, random_state=seed)
    return _federation(mr, f"{n_clusters} logistic regressions", n_machines, n_features, alpha)
