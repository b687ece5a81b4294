"""Iterative filtering: clean data = the mean, bounded under outliers where coordinate-wise rules
lose a factor sqrt(p), weights, bad input, and its use as the stage-3 aggregator."""

import numpy as np
import pytest

from fedclust import RobustClusteredRegression, ValidationError
from fedclust.core.robust import coordinate_median, trimmed_mean
from fedclust.robust import estimation_error, iterative_filtering, make_mixture_regression
from fedclust.sim.byzantine import ByzantineTamper
from fedclust.sim.transport import InProcessTransport


def test_clean_gaussian_rows_give_the_mean():
    rng = np.random.default_rng(0)
    for p in (3, 40):
        H = rng.normal(size=(300, p))
        mu, w = iterative_filtering(H, return_weights=True)
        assert w.sum() > 0.97 * 300                     # (almost) nothing filtered
        np.testing.assert_allclose(mu, H.mean(axis=0), atol=0.05)


def test_hidden_cluster_of_outliers_in_many_dimensions():
    rng = np.random.default_rng(1)
    p = 50
    H = rng.normal(size=(200, p))
    err = []
    for dist in (6.0, 60.0, 6000.0):
        O = dist * np.ones(p) / np.sqrt(p) + 0.1 * rng.normal(size=(50, p))   # 20% outliers
        X = np.vstack([H, O])
        mu, w = iterative_filtering(X, return_weights=True)
        err.append(np.linalg.norm(mu - H.mean(axis=0)))
        assert w[200:].sum() < 0.05 * w[:200].sum()      # the outliers lost their weight
    assert max(err) < 0.5                                # bounded however far they go
    X = np.vstack([H, 6.0 * np.ones(p) / np.sqrt(p) + 0.1 * rng.normal(size=(50, p))])
    # the coordinate-wise rules pay sqrt(p): each coordinate is moved a little
    assert np.linalg.norm(trimmed_mean(X, 0.25) - H.mean(axis=0)) > 3 * err[0]
    assert np.linalg.norm(coordinate_median(X) - H.mean(axis=0)) > 3 * err[0]


def test_weights_and_permutation():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(40, 4))
    np.testing.assert_allclose(iterative_filtering(np.repeat(X, 2, axis=0)),
                               iterative_filtering(X, weights=np.full(40, 2.0)), atol=1e-12)
    perm = rng.permutation(40)
    np.testing.assert_allclose(iterative_filtering(X[perm]), iterative_filtering(X), atol=1e-12)
    with pytest.raises(ValidationError, match="weights"):
        iterative_filtering(X, weights=-np.ones(40))
    with pytest.raises(ValidationError, match="threshold"):
        iterative_filtering(X, threshold=1.0)
    with pytest.raises(ValidationError):
        iterative_filtering(np.array([[np.nan, 1.0]]))


def test_filter_as_stage3_aggregator():
    mr = make_mixture_regression(60, 30, 5, 3, alpha=0.0, noise=0.3, random_state=2)
    t = ByzantineTamper(range(60), 0.15, 7, attack="large-norm", scale=100.0)
    truth = np.hstack([mr.coef, mr.intercept[:, None]])
    r = RobustClusteredRegression(3, aggregator="filter", beta=0.2, random_state=0).fit(
        mr.Xs, mr.ys, transport=InProcessTransport(tamper=t))
    assert estimation_error(np.hstack([r.coef_, r.intercept_[:, None]]), truth) < 0.25
