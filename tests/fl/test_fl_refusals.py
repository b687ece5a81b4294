"""Bad input to the FL front doors' fit / predict / score is refused with the device, row or
value named (never a scikit-learn traceback from ``score``), and valid input still scores as
the accuracy computed here from ``predict``."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import ClusteredFedAvg, FedAvg, IFCA
from fedclust.core.exceptions import ValidationError

MAKERS = {
    "FedAvg": lambda: FedAvg(rounds=2, random_state=0),
    "IFCA": lambda: IFCA(2, rounds=2, random_state=0),
    "ClusteredFedAvg": lambda: ClusteredFedAvg(2, rounds=2, random_state=0),
}


def _devices(seed=0):
    rng = np.random.default_rng(seed)
    Xs = [rng.normal(size=(30, 3)) + 3 * (z % 2) for z in range(4)]
    ys = [(X[:, 0] > 1.5).astype(int) for X in Xs]
    for y in ys:
        y[:2] = [0, 1]
    return Xs, ys


def _with(ys, z, i, value):
    out = [y.astype(float) for y in ys]
    out[z][i] = value
    return out


FIT_REFUSALS = [   # (X, y from the valid (Xs, ys), fragment)
    (lambda Xs, ys: (Xs, _with(ys, 2, 3, np.nan)), "device 2: y contains a non-finite value nan "
     "at index 3"),
    (lambda Xs, ys: (Xs, _with(ys, 1, 0, -np.inf)), "device 1: y contains a non-finite value -inf"),
    (lambda Xs, ys: (Xs, [ys[0], ys[1][:-1], ys[2], ys[3]]), "device 1: X has 30 rows but y has "
     "shape (29,)"),
    (lambda Xs, ys: (None, ys), "X is None"),
]


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("bad, fragment", FIT_REFUSALS)
def test_fit_refuses_bad_labels_by_device_and_index(name, bad, fragment):
    Xs, ys = _devices()
    with pytest.raises(ValidationError) as info:
        MAKERS[name]().fit(*bad(Xs, ys))
    assert fragment in str(info.value)
    assert MAKERS[name]().fit(Xs, ys).predict(Xs[0]).shape == (30,)


SCORE_REFUSALS = [   # (X, y, fragment)
    (np.zeros((0, 3)), np.zeros(0, dtype=int), "X has 0 rows"),
    (np.zeros((5, 3)), np.zeros(4, dtype=int), "X has 5 rows but y has shape (4,)"),
    (np.zeros((5, 3)), np.r_[0.0, 1, np.nan, 0, 1], "non-finite value nan at index 2"),
    (np.zeros((5, 3)), np.zeros((5, 1), dtype=int), "y has shape (5, 1)"),
    (np.full((2, 3), 1e200), np.zeros(2, dtype=int), "values reach 1e+200"),
]


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("X, y, fragment", SCORE_REFUSALS)
def test_score_refuses_bad_input_by_value(name, X, y, fragment):
    Xs, ys = _devices()
    model = MAKERS[name]().fit(Xs, ys)
    with pytest.raises(ValidationError) as info:
        model.score(X, y)
    assert fragment in str(info.value)
    with pytest.raises(ValidationError) as info:
        model.predict(np.full((2, 3), 1e200))
    assert "values reach 1e+200" in str(info.value)
    Xt, yt = _devices(1)
    assert model.score(Xt[0], yt[0]) == np.mean(model.predict(Xt[0]) == yt[0])
