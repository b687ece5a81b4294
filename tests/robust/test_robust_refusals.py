"""Bad per-machine input to the robust clustered regression / classification is refused with
the machine and the value named (never numpy's error for a ragged list, never a message about
the shape when the dtype is wrong), and predict_device checks its rows as predict does."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import RobustClusteredClassification, RobustClusteredRegression
from fedclust.core.exceptions import ValidationError

MAKERS = {
    "regression": lambda: RobustClusteredRegression(2, rounds=3, random_state=0),
    "classification": lambda: RobustClusteredClassification(2, rounds=3, random_state=0),
}


def _machines(kind, seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(30, 3)) for _ in range(4)]
    w = [np.array([1.0, 2, 3]), np.array([-3.0, 1, -2])]
    scores = [X @ w[z % 2] for z, X in enumerate(Xs)]
    if kind == "regression":
        return Xs, [s + 0.1 * rng.normal(size=30) for s in scores]
    ys = [(s > 0).astype(int) for s in scores]
    for y in ys:
        y[:2] = [0, 1]
    return Xs, ys


def _replace(seq, i, value):
    out = list(seq)
    out[i] = value
    return out


FIT_REFUSALS = [   # (bad (Xs, ys), fragment)
    (lambda Xs, ys: (_replace(Xs, 1, [[1.0, 2, 3], [1.0, 2]]), ys),
     "machine 1: X could not be read as an array"),
    (lambda Xs, ys: (_replace(Xs, 2, Xs[2].astype(str)), ys), "machine 2: X has dtype <U"),
    (lambda Xs, ys: (_replace(Xs, 0, Xs[0].astype(object)), ys),
     "machine 0: X has dtype object"),
    (lambda Xs, ys: (_replace(Xs, 3, Xs[3] + 1j), ys), "machine 3: X has dtype complex128"),
    (lambda Xs, ys: (Xs, _replace(ys, 1, ys[1].astype(str))), "machine 1: y has dtype <U"),
    (lambda Xs, ys: (Xs, _replace(ys, 2, ys[2].reshape(-1, 1))),
     "machine 2: y must be 1-D, got an array of shape (30, 1)"),
    (lambda Xs, ys: (Xs, _replace(ys, 3, np.r_[ys[3][:4], np.nan, ys[3][5:]])),
     "machine 3: y contains a non-finite value nan at index (4,)"),
]


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("bad, fragment", FIT_REFUSALS)
def test_fit_refuses_bad_machines_by_name(kind, bad, fragment):
    Xs, ys = _machines(kind)
    with pytest.raises(ValidationError) as info:
        MAKERS[kind]().fit(*bad(Xs, ys))
    assert fragment in str(info.value)
    assert MAKERS[kind]().fit(Xs, ys).n_clusters_ == 2


PREDICT_REFUSALS = [   # (X, fragment)
    (np.array([[0.0, np.nan, 1.0]]), "non-finite value nan at index (0, 1)"),
    (np.zeros((2, 2)), "X has 2 features"),
    (np.zeros(3), "X must be 2-D"),
    (np.array([[1e200, 0.0, 0.0]]), "values reach 1e+200"),
]


@pytest.mark.parametrize("X, fragment", PREDICT_REFUSALS)
def test_predict_device_checks_its_rows(X, fragment):
    Xs, ys = _machines("regression")
    model = MAKERS["regression"]().fit(Xs, ys)
    with pytest.raises(ValidationError) as info:
        model.predict_device(0, X)
    assert fragment in str(info.value)
    c = model.device_model(0)
    np.testing.assert_allclose(model.predict_device(0, Xs[0]),
                               Xs[0] @ model.coef_[c] + model.intercept_[c], rtol=1e-12)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_generators_of_machines_fit_as_lists_and_a_dict_is_refused(kind):
    Xs, ys = _machines(kind, seed=1)
    from_lists = MAKERS[kind]().fit(Xs, ys)
    from_generators = MAKERS[kind]().fit((X for X in Xs), (y for y in ys))
    np.testing.assert_array_equal(from_generators.coef_, from_lists.coef_)
    np.testing.assert_array_equal(from_generators.device_clusters_, from_lists.device_clusters_)
    with pytest.raises(ValidationError) as info:
        MAKERS[kind]().fit(dict(enumerate(Xs)), dict(enumerate(ys)))
    assert "X is a dict of devices" in str(info.value) and "and y in the same order" in str(info.value)
    with pytest.raises(ValidationError) as info:
        MAKERS[kind]().fit(Xs, 5)
    assert "one array per machine" in str(info.value) and "int" in str(info.value)
