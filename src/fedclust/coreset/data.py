"""Synthetic high-dimensional data shaped like Daily and Sports Activities (DSA).

DSA (UCI) is 9,120 segments × 5,625 features (125 samples × 45 sensor
channels) of 19 activities; it is not available here. :func:`make_low_rank_mixture`
draws the same shape with the structure that matters for disPCA: k clusters
whose means and within-cluster variation live in a low-dimensional subspace,
plus isotropic noise in all d dimensions. Projecting to a few dozen
dimensions then keeps the k-means cost, as the paper observes on DSA.
"""

from __future__ import annotations

import numpy as np

from ..core.random import RandomState, root_seed
from ..core.validation import check_float, check_int

__all__ = ["make_low_rank_mixture"]


def make_low_rank_mixture(n_samples: int = 9120, n_features: int = 5625, n_clusters: int = 19,
                          *, signal_dim: int = 30, separation: float = 4.0,
                          within: float = 1.0, noise: float = 0.5,
                          random_state: RandomState = None) -> tuple[np.ndarray, np.ndarray]:
    """k Gaussian clusters in a random ``signal_dim``-dimensional subspace plus noise.

    Point i of cluster c: ``U (separation · μ_c + within · g_i) + noise · e_i``
    with U (d × r) orthonormal, μ_c, g_i ~ N(0, I_r), e_i ~ N(0, I_d).
    Cluster sizes are equal up to one.

    Returns
    -------
    X : ndarray (n_samples, n_features) float64
    y : ndarray (n_samples,) int64 cluster ids
    """
    n = check_int(n_samples, "n_samples", min_value=1)
    d = check_int(n_features, "n_features", min_value=1)
    k = check_int(n_clusters, "n_clusters", min_value=1)
    r = check_int(signal_dim, "signal_dim", min_value=1, max_value=d)
    sep = check_float(separation, "separation", min_value=0.0)
    wid = check_float(within, "within", min_value=0.0)
    sig = check_float(noise, "noise", min_value=0.0)
    rng = np.random.default_rng(root_seed(random_state))
    U, _ = np.linalg.qr(rng.standard_normal((d, r)))
    mu = sep * rng.standard_normal((k, r))
    y = rng.permutation(np.arange(n) % k).astype(np.int64)
    coef = mu[y] + wid * rng.standard_normal((n, r))
    X = coef @ U.T
    X += sig * rng.standard_normal((n, d))
    return X, y


def low_rank_source(seed: int, *, n_points: int = 9120, n_features: int = 5625, n_clusters: int = 19,
            signal_dim: int = 30, separation: float = 4.0, within: float = 1.0,
            noise: float = 0.5):
    # ``n_points``, not ``n_samples``: the config's pooled ``n_samples`` subsamples afterwards
    n_points = check_int(n_points, "n_points", min_value=1)  # named as the config names it
    return make_low_rank_mixture(n_points, n_features, n_clusters, signal_dim=signal_dim,
                                 separation=separation, within=within, noise=noise,
                                 random_state=seed)
