"""Models, local update and server aggregation of the FL wing."""

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.core.random import device_rng
from fedclust.fl import (MLP, LinearRegression, LogisticRegression, SoftmaxRegression,
                         aggregate_updates, local_update, make_model)
from fedclust.fl.server import average_per_cluster, sample_candidates, select_by_loss

RNG = np.random.default_rng(0)


def _cases():
    X = RNG.normal(size=(25, 6))
    return [(LinearRegression(6, l2=0.1), X, RNG.normal(size=25)),
            (LogisticRegression(6, l2=0.1), X, RNG.integers(0, 2, 25)),
            (SoftmaxRegression(6, 3, l2=0.1), X, RNG.integers(0, 3, 25)),
            (MLP(6, 5, 3, l2=0.1), X, RNG.integers(0, 3, 25))]


@pytest.mark.parametrize("case", range(4))
def test_gradient_matches_finite_differences(case):
    model, X, y = _cases()[case]
    theta = 0.5 * np.random.default_rng(case).normal(size=model.n_params)
    model.set_params(theta)
    g = model.gradient(X, y)
    fd = np.empty_like(theta)
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = 1e-6
        model.set_params(theta + e)
        up = model.loss(X, y)
        model.set_params(theta - e)
        fd[i] = (up - model.loss(X, y)) / 2e-6
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


def test_linear_loss_against_hand_formula_and_params_roundtrip():
    m = LinearRegression(2)
    m.set_params([1.0, -2.0, 0.5])
    X = np.array([[1.0, 1.0], [0.0, 2.0]])
    y = np.array([0.0, 1.0])
    r = X @ [1.0, -2.0] + 0.5 - y
    assert m.loss(X, y) == pytest.approx(0.5 * np.mean(r ** 2))
    p = m.get_params()
    p[0] = 99.0  # a copy
    assert m.get_params()[0] == 1.0
    with pytest.raises(ValidationError, match="3 parameters"):
        m.set_params(np.zeros(4))


def test_softmax_sgd_learns_separable_data():
    X = np.vstack([RNG.normal(-3, 1, (50, 2)), RNG.normal(3, 1, (50, 2))])
    y = np.repeat([0, 1], 50)
    m = SoftmaxRegression(2, 2)
    m.local_sgd(X, y, epochs=5, batch_size=8, lr=0.5, rng=np.random.default_rng(1))
    assert m.score(X, y) > 0.97


def test_local_update_sgd_is_model_sgd_and_gd_is_one_step():
    model, X, y = _cases()[3]
    theta = model.init_params(np.random.default_rng(3))
    new, n, loss = local_update(model, theta, X, y, epochs=2, batch_size=4, lr=0.1,
                                rng=device_rng(7, 2, 0))
    ref = MLP(6, 5, 3, l2=0.1)
    ref.set_params(theta)
    assert loss == pytest.approx(ref.loss(X, y)) and n == 25
    ref.local_sgd(X, y, epochs=2, batch_size=4, lr=0.1, rng=device_rng(7, 2, 0))
    np.testing.assert_array_equal(new, ref.get_params())
    gd, _, _ = local_update(model, theta, X, y, mode="gd", lr=0.1)
    ref.set_params(theta)
    np.testing.assert_allclose(gd, theta - 0.1 * ref.gradient(X, y))


def test_make_model_sizes_and_bad_labels():
    X = np.zeros((4, 7))
    m = make_model(None, X, np.array([0, 1, 2, 1]))
    assert (m.kind, m.n_features, m.n_hidden, m.n_classes) == ("mlp", 7, 200, 3)
    assert m.n_params == 8 * 200 + 201 * 3
    with pytest.raises(ValidationError, match="outside the model's classes"):
        m.check_data(X, np.array([0, 1, 5, 1]), "device 3")
    with pytest.raises(ValidationError, match="device 3: X has 4 rows"):
        m.check_data(X, np.array([0, 1]), "device 3")
    with pytest.raises(ValidationError, match="expects 7 features"):
        m.check_data(np.zeros((4, 3)), np.zeros(4), "device 1")
    with pytest.raises(ValidationError, match="binary"):
        make_model("logistic", X, np.array([0, 1, 2, 0]))


def test_aggregate_weighted_mean_and_robust_rules_of_identical_updates():
    P = RNG.normal(size=(3, 5))
    w = np.array([1.0, 2.0, 7.0])
    np.testing.assert_allclose(aggregate_updates(P, w), (w @ P) / w.sum())
    same = np.tile(P[0], (6, 1))
    for rule in ("trimmed-mean", "median", "mean"):
        np.testing.assert_allclose(aggregate_updates(same, aggregator=rule, beta=0.2), P[0])
    # different updates with outliers: scipy's coordinate-wise median and trimmed mean
    from scipy.stats import trim_mean
    V = RNG.normal(size=(10, 4))
    V[[2, 7], 1] = [1e6, -1e6]
    for m in (9, 10):
        np.testing.assert_allclose(aggregate_updates(V[:m], aggregator="median"),
                                   np.median(V[:m], axis=0), rtol=1e-12)
        for beta in (0.1, 0.2, 0.3):
            np.testing.assert_allclose(aggregate_updates(V[:m], aggregator="trimmed-mean",
                                                         beta=beta),
                                       trim_mean(V[:m], beta, axis=0), rtol=1e-12)
    assert abs(aggregate_updates(V, aggregator="trimmed-mean", beta=0.1)[1]) < 10
    # integer counts = repeated updates
    rep = np.repeat(P, [1, 2, 7], axis=0)
    np.testing.assert_allclose(aggregate_updates(P, [1, 2, 7]), rep.mean(axis=0))
    with pytest.raises(ValidationError, match="aggregator"):
        aggregate_updates(P, aggregator="mode")


def test_per_cluster_average_keeps_unchosen_and_selection_rules():
    prev = np.arange(6.0).reshape(3, 2)
    P = np.array([[10.0, 10.0], [20.0, 20.0]])
    out = average_per_cluster(P, [2, 2], prev)
    np.testing.assert_allclose(out, [[0, 1], [2, 3], [15, 15]])
    losses = {1: 0.5, 2: 3.0, 3: 2.0, 4: 2.5}
    assert select_by_loss(losses, 2) == [2, 4]
    # one per cluster: 2 and 4 share a cluster, so 3 replaces 4
    assert select_by_loss(losses, 2, {1: 0, 2: 1, 3: 0, 4: 1}) == [2, 3]
    assert select_by_loss(losses, 3, {1: 0, 2: 0, 3: 0, 4: 0}) == [2, 3, 4]
    cand = sample_candidates([0, 1, 2, 3], [0, 0, 5, 5], 2, np.random.default_rng(0))
    assert cand == [2, 3]  # zero-size devices are never drawn
