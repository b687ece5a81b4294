"""Rows given to a fitted center model (k-FED, distributed Lloyd, distributed k-means): bad
input is refused with the value named, and valid rows still get the nearest-center labels and
the k-means score computed here by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import DistributedKMeans, DistributedLloyd, KFed
from fedclust.core.exceptions import ValidationError

MAKERS = {
    "KFed": lambda: KFed(4, 2, random_state=0),
    "DistributedLloyd": lambda: DistributedLloyd(4, random_state=0),
    "DistributedKMeans": lambda: DistributedKMeans(4, coreset_size=60, random_state=0),
}


def _federation(seed=0, d=3):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(4, d)) * 8
    return [means[rng.integers(4, size=40)] + rng.normal(size=(40, d)) for _ in range(4)]


def _by_hand(X, centers):
    d2 = ((X[:, None, :] - centers[None]) ** 2).sum(axis=2)
    return d2.argmin(axis=1), -d2.min(axis=1).sum()


HUGE = np.array([[1e151, 0.0, 0.0], [0.0, 1.0, 2.0]])

REFUSALS = [   # (method, X, fragment of the message)
    ("predict", HUGE, "values reach 1e+151"),
    ("score", HUGE, "values reach 1e+151"),
    ("predict", np.full((2, 3), 1e308), "values reach 1e+308"),
    ("score", -np.full((2, 3), 1e308), "values reach 1e+308"),
    ("predict", np.array([[0.0, np.nan, 1.0]]), "non-finite value nan at index (0, 1)"),
    ("predict", np.zeros((2, 2)), "X has 2 features"),
    ("score", np.zeros((2, 3)).astype(str), "dtype <U32 (strings)"),
]


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("method, X, fragment", REFUSALS)
def test_bad_rows_are_refused_and_valid_rows_still_work(name, method, X, fragment):
    Xs = _federation()
    model = MAKERS[name]().fit(Xs)
    with pytest.raises(ValidationError) as info:
        getattr(model, method)(X)
    assert fragment in str(info.value)
    rows = np.vstack([Xs[0][:5], [[1e149, -1e149, 0.0]]])   # below the limit: accepted
    labels, score = _by_hand(rows, model.cluster_centers_)
    np.testing.assert_array_equal(model.predict(rows), labels)
    assert model.score(rows) == pytest.approx(score, rel=1e-12)


@pytest.mark.parametrize("name", list(MAKERS))
def test_float32_rows_are_checked_against_float32_limits(name):
    model = MAKERS[name]().fit([X.astype(np.float32) for X in _federation(1)])
    with pytest.raises(ValidationError) as info:
        model.predict(np.array([[1e16, 0, 0]], dtype=np.float32))
    assert "values reach 1e+16" in str(info.value) and "float32" in str(info.value)
    assert model.predict(np.array([[1e14, 0, 0]], dtype=np.float32)).shape == (1,)


@pytest.mark.parametrize("name", list(MAKERS))
def test_none_as_the_data_is_refused_by_name(name):
    with pytest.raises(ValidationError) as info:
        MAKERS[name]().fit(None)
    assert "X is None" in str(info.value)
    assert MAKERS[name]().fit(_federation(2)).cluster_centers_.shape == (4, 3)


WEIGHT_REFUSALS = [   # (sample_weight for 6 rows, fragment)
    (np.array(["a"] * 6), "sample_weight has dtype <U1 (strings)"),
    (np.r_[1.0, np.nan, 1, 1, 1, 1], "sample_weight contains a non-finite value nan at index (1,)"),
    (np.ones(4), "got shape (4,)"),
    (np.r_[1.0, 1, 1, -0.5, 1, 1], "(-0.5 at index 3)"),
    (np.ones((6, 1)), "sample_weight must be 1-D"),
]


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize("weight, fragment", WEIGHT_REFUSALS)
def test_score_refuses_bad_sample_weight_by_value(name, weight, fragment):
    Xs = _federation(3)
    model = MAKERS[name]().fit(Xs)
    rows = Xs[1][:6]
    with pytest.raises(ValidationError) as info:
        model.score(rows, sample_weight=weight)
    assert fragment in str(info.value)
    w = np.arange(6) % 3   # integer weights: read as numbers
    d2 = ((rows[:, None, :] - model.cluster_centers_[None]) ** 2).sum(axis=2).min(axis=1)
    assert model.score(rows, sample_weight=w) == pytest.approx(-(w * d2).sum(), rel=1e-12)


@pytest.mark.parametrize("name", list(MAKERS))
def test_float16_rows_are_labelled_in_float64_as_the_fit_reads_them(name):
    """float16 squared distances overflow at 256: the rows are read as float64, as fit does."""
    Xs = [X * 100 for X in _federation(4)]
    model = MAKERS[name]().fit([X.astype(np.float16) for X in Xs])
    rows = Xs[0].astype(np.float16)
    labels, score = _by_hand(rows.astype(np.float64), model.cluster_centers_)
    np.testing.assert_array_equal(model.predict(rows), labels)
    assert model.score(rows) == pytest.approx(score, rel=1e-12)


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_dict_of_devices_is_refused_not_read_as_its_keys(name):
    Xs = _federation(5)
    with pytest.raises(ValidationError) as info:
        MAKERS[name]().fit({10 + z: X for z, X in enumerate(Xs)})
    assert "X is a dict of devices" in str(info.value)
    assert "device_ids=list(X.keys())" in str(info.value) and "same order" not in str(info.value)
    by_ids = MAKERS[name]().fit(Xs, device_ids=[10, 11, 12, 13])
    plain = MAKERS[name]().fit(Xs)
    np.testing.assert_array_equal(by_ids.predict(Xs[0]), _by_hand(Xs[0], by_ids.cluster_centers_)[0])
    assert plain.cluster_centers_.shape == by_ids.cluster_centers_.shape == (4, 3)
