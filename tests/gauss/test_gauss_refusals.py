"""Bad input to the Gaussian families' predict / predict_proba / score is refused with the
value named (never a NaN or -inf score, never a scikit-learn traceback), and valid input still
scores as computed here from the model's own outputs."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import EvolvingGaussians, FedGaussClassifier, FedGaussClustering
from fedclust.core.exceptions import ValidationError


def _owners(seed=0, d=3):
    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0, 0], [6, 6, 0], [0, 6, 6]])[:, :d]
    ys = [rng.integers(3, size=60) for _ in range(3)]
    return [means[y] + rng.normal(size=(60, d)) for y in ys], ys


def _fitted(name):
    Xs, ys = _owners()
    if name == "FedGaussClassifier":
        return FedGaussClassifier(random_state=0).fit(Xs, ys)
    if name == "EvolvingGaussians":
        return EvolvingGaussians().fit(np.vstack(Xs))
    return FedGaussClustering(random_state=0).fit(Xs)


HUGE = np.array([[0.0, 2e151, 0.0]])
CLUSTERINGS = ["FedGaussClustering", "EvolvingGaussians"]

REFUSALS = [   # (models, method, X, fragment)
    (CLUSTERINGS, "score", np.zeros((0, 3)), "X has 0 rows"),
    (CLUSTERINGS + ["FedGaussClassifier"], "predict", HUGE, "values reach 2e+151"),
    (CLUSTERINGS + ["FedGaussClassifier"], "predict_proba", HUGE, "values reach 2e+151"),
    (CLUSTERINGS, "score", np.full((2, 3), -1e308), "values reach 1e+308"),
    (CLUSTERINGS, "score_samples", np.array([[1.0, np.inf, 0.0]]),
     "non-finite value inf at index (0, 1)"),
]
CASES = [(name, method, X, fragment) for names, method, X, fragment in REFUSALS
         for name in names]


@pytest.mark.parametrize("name, method, X, fragment", CASES)
def test_bad_rows_are_refused_and_valid_rows_still_score(name, method, X, fragment):
    model = _fitted(name)
    with pytest.raises(ValidationError) as info:
        getattr(model, method)(X)
    assert fragment in str(info.value)
    rows = _owners(5)[0][0]
    proba = model.predict_proba(rows)
    assert np.isfinite(proba).all() and np.allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_array_equal(model.predict(rows), model.classes_[proba.argmax(axis=1)]
                                  if name == "FedGaussClassifier" else proba.argmax(axis=1))
    if name != "FedGaussClassifier":
        assert model.score(rows) == pytest.approx(model.score_samples(rows).mean(), rel=1e-12)


CLASSIFIER_SCORE_REFUSALS = [   # (X rows, y, fragment)
    (10, np.zeros(7, dtype=int), "X has 10 rows but y has shape (7,)"),
    (10, np.r_[np.zeros(4), np.nan, np.zeros(5)], "non-finite value nan at index 4"),
    (10, np.zeros((10, 1), dtype=int), "y has shape (10, 1)"),
    (0, np.zeros(0, dtype=int), "X has 0 rows"),
]


@pytest.mark.parametrize("n, y, fragment", CLASSIFIER_SCORE_REFUSALS)
def test_classifier_score_refuses_bad_labels_by_value(n, y, fragment):
    model = _fitted("FedGaussClassifier")
    Xt, yt = _owners(6)
    with pytest.raises(ValidationError) as info:
        model.score(Xt[0][:n], y)
    assert fragment in str(info.value)
    assert model.score(Xt[0], yt[0]) == np.mean(model.predict(Xt[0]) == yt[0])


@pytest.mark.parametrize("make", [lambda: FedGaussClustering(random_state=0),
                                  lambda: FedGaussClassifier(random_state=0)])
def test_none_as_the_data_is_refused_by_name(make):
    Xs, ys = _owners(7)
    fit = (lambda m, X: m.fit(X)) if isinstance(make(), FedGaussClustering) else \
        (lambda m, X: m.fit(X, ys))
    with pytest.raises(ValidationError) as info:
        fit(make(), None)
    assert "X is None" in str(info.value)
    assert fit(make(), Xs).predict(Xs[0]).shape == (60,)
