"""Robust estimators of fedclust.core.robust: geometric median, trimmed mean, median."""

import warnings

import numpy as np
import pytest
from scipy.optimize import minimize

from fedclust import ValidationError
from fedclust.core.robust import (aggregate, coordinate_median, geometric_median, trimmed_mean)


def _objective(X, w, z):
    return float((w * np.linalg.norm(X - z, axis=1)).sum())


@pytest.mark.parametrize("m,p,seed", [(5, 2, 0), (20, 3, 1), (60, 8, 2), (9, 1, 3), (3, 5, 4)])
def test_geometric_median_matches_scipy_minimiser(m, p, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(m, p)) * rng.uniform(0.5, 3, size=p)
    w = rng.uniform(0.1, 2.0, size=m)
    z = geometric_median(X, w)
    ref = minimize(lambda v: _objective(X, w, v), np.median(X, axis=0), method="Nelder-Mead",
                   options=dict(xatol=1e-11, fatol=1e-13, maxiter=200000, maxfev=200000))
    assert _objective(X, w, z) <= ref.fun + 1e-9 * max(1.0, ref.fun)
    np.testing.assert_allclose(z, ref.x, atol=1e-4)
    # optimality: the weighted unit vectors towards the points sum to ~0 (off the data points;
    # at a data point j the pull of the others is at most w_j)
    D = X - z
    r = np.linalg.norm(D, axis=1)
    on = r == 0
    g = (w[~on, None] * D[~on] / r[~on, None]).sum(axis=0)
    assert np.linalg.norm(g) <= w[on].sum() + 1e-6 * w.sum()


def test_geometric_median_collinear_is_weighted_median_on_the_line():
    u = np.array([3.0, -4.0, 12.0]) / 13.0
    t = np.array([-5.0, -1.0, 0.5, 2.0, 40.0])
    X = 1.0 + t[:, None] * u[None, :]
    np.testing.assert_array_equal(geometric_median(X), X[2])      # odd count: the middle row
    w = np.array([1.0, 1.0, 1.0, 1.0, 10.0])
    np.testing.assert_array_equal(geometric_median(X, w), X[4])   # weight majority wins
    # even count, even weight split: the midpoint of the median interval
    np.testing.assert_allclose(geometric_median(X[:4]), 0.5 * (X[1] + X[2]), atol=1e-12)
    # 1-D input: m scalars
    assert geometric_median([1.0, 2.0, 100.0]).tolist() == [2.0]


def test_geometric_median_repeated_point_and_majority_weight():
    X = np.array([[1.0, 2.0]] * 3 + [[5.0, 7.0], [3.0, -1.0]])
    np.testing.assert_array_equal(geometric_median(X), [1.0, 2.0])
    same = np.tile([[0.5, -0.25, 3.0]], (4, 1))
    np.testing.assert_array_equal(geometric_median(same), same[0])
    Y = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-3.0, 2.0]])
    np.testing.assert_array_equal(geometric_median(Y, [3.0, 1.0, 1.0, 1.0]), [0.0, 0.0])
    # an equilateral triangle: the centre (Fermat point), not a vertex
    T = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    np.testing.assert_allclose(geometric_median(T), [0.5, np.sqrt(3) / 6], atol=1e-9)


def test_geometric_median_weights_equal_repetition_and_zero_weight_ignored():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(7, 3))
    reps = np.array([1, 2, 1, 3, 1, 1, 2])
    np.testing.assert_allclose(geometric_median(X, reps), geometric_median(np.repeat(X, reps, 0)),
                               atol=1e-9)
    Xo = np.vstack([X, [[1e9, 1e9, 1e9]]])
    np.testing.assert_allclose(geometric_median(Xo, np.r_[np.ones(7), 0.0]), geometric_median(X),
                               atol=1e-12)
    np.testing.assert_allclose(geometric_median(X, np.ones(7)), geometric_median(X), atol=0)


def test_geometric_median_breakdown_bounded():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(60, 4))
    base = geometric_median(X)
    for far in (1e2, 1e5, 1e8):
        out = rng.normal(size=(25, 4)) * far   # 25 / 85 < 1/2
        z = geometric_median(np.vstack([X, out]))
        assert np.linalg.norm(z - base) < 3.0


def test_geometric_median_bad_input():
    with pytest.raises(ValidationError):
        geometric_median(np.array([[1.0, np.nan]]))
    with pytest.raises(ValidationError):
        geometric_median(np.zeros((0, 2)))
    with pytest.raises(ValidationError):
        geometric_median(np.ones((3, 2)), [1.0, -1.0, 1.0])
    with pytest.raises(ValidationError):
        geometric_median(np.ones((3, 2)), [0.0, 0.0, 0.0])
    with pytest.raises(ValidationError):
        geometric_median(np.ones((3, 2)), max_iter=0)


def test_geometric_median_warns_when_not_converged():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(50, 5))
    with pytest.warns(RuntimeWarning, match="did not meet"):
        geometric_median(X, max_iter=1, tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        geometric_median(X)


def test_trimmed_mean_without_outliers_is_mean_of_inner_order_statistics():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(20, 6))
    for beta, b in ((0.0, 0), (0.1, 2), (0.24, 4), (0.49, 9)):
        S = np.sort(X, axis=0)
        np.testing.assert_allclose(trimmed_mean(X, beta), S[b:20 - b].mean(axis=0), atol=1e-12)
    np.testing.assert_allclose(trimmed_mean(X, 0.0), X.mean(axis=0), atol=1e-12)


def test_weighted_and_unweighted_agree():
    rng = np.random.default_rng(9)
    X = rng.normal(size=(20, 5))
    ones = np.ones(20)
    np.testing.assert_allclose(trimmed_mean(X, 0.1, ones), trimmed_mean(X, 0.1), atol=1e-12)
    np.testing.assert_allclose(coordinate_median(X, ones), coordinate_median(X), atol=1e-12)
    np.testing.assert_allclose(aggregate(X, "mean", weights=ones), X.mean(axis=0), atol=1e-12)
    # integer weights = repeated rows
    reps = rng.integers(1, 4, size=20)
    np.testing.assert_allclose(coordinate_median(X, reps), np.median(np.repeat(X, reps, 0), 0),
                               atol=1e-12)
    Xr = np.repeat(X, reps, 0)
    beta = 0.2
    ref = []
    for j in range(5):  # weighted rule = trimming beta * W of weight from each end
        v = np.sort(Xr[:, j])
        cut = beta * len(v)
        lo, hi = int(np.floor(cut)), len(v) - int(np.floor(cut))
        keep = v[lo:hi].copy()
        wts = np.ones(len(keep))
        frac = cut - np.floor(cut)
        wts[0] -= frac
        wts[-1] -= frac
        ref.append((keep * wts).sum() / wts.sum())
    np.testing.assert_allclose(trimmed_mean(X, beta, reps), ref, atol=1e-12)


@pytest.mark.parametrize("rule", ["trimmed-mean", "median"])
def test_breakdown_outliers_move_the_estimate_boundedly(rule):
    rng = np.random.default_rng(10)
    X = rng.normal(size=(40, 3))
    alpha_n = 6                       # alpha = 6 / 46 ~ 0.13 < beta = 0.2
    lo, hi = X.min(axis=0), X.max(axis=0)
    for far in (1e1, 1e4, 1e9):
        out = np.vstack([X, far * rng.choice([-1.0, 1.0], size=(alpha_n, 3))])
        z = aggregate(out, rule, beta=0.2)
        assert (z >= lo - 1e-12).all() and (z <= hi + 1e-12).all()
    z_mean = aggregate(np.vstack([X, 1e9 * np.ones((alpha_n, 3))]), "mean")
    assert np.abs(z_mean).max() > 1e7   # the plain mean breaks


def test_trimmed_mean_rejects_beta_half():
    with pytest.raises(ValidationError, match="beta"):
        trimmed_mean(np.ones((4, 2)), 0.5)
    with pytest.raises(ValidationError):
        aggregate(np.ones((4, 2)), "mode")
