"""FederatedPreprocessor: one counted round equal to scikit-learn's pooled imputer + scaler."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.impute import SimpleImputer
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedclust import ValidationError
from fedclust.sites.preprocess import FederatedPreprocessor


def _federation(seed=0, sizes=(30, 51, 7, 12), d=6, missing=0.2):
    rng = np.random.default_rng(seed)
    shift = rng.normal(0, 50, d)
    spread = np.array([1, 10, 1e3, 1e-3, 0, 3.0])[:d]
    devs = []
    for z, n in enumerate(sizes):
        X = shift + z + rng.normal(size=(n, d)) * spread  # sites differ in location
        X[:, 4] = 7.0  # one constant column
        X[rng.random(X.shape) < missing] = np.nan
        devs.append(X)
    return devs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_sklearn_pooled_fit(seed):
    devs = _federation(seed)
    pre = FederatedPreprocessor(impute="mean", scale="standard").fit(devs)
    ref = make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()).fit(np.vstack(devs))
    np.testing.assert_allclose(pre.mean_, ref[1].mean_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pre.scale_, ref[1].scale_, rtol=1e-10)
    got = np.vstack(pre.transform(devs))
    np.testing.assert_allclose(got, ref.transform(np.vstack(devs)), rtol=1e-9, atol=1e-9)
    # the constant column keeps scale 1, as in scikit-learn
    assert pre.scale_[4] == 1.0


def test_impute_only_and_scale_only():
    devs = _federation(3)
    pre = FederatedPreprocessor(impute="mean", scale="none").fit(devs)
    ref = SimpleImputer(strategy="mean").fit(np.vstack(devs))
    np.testing.assert_allclose(np.vstack(pre.transform(devs)), ref.transform(np.vstack(devs)),
                               rtol=1e-12)
    full = [np.nan_to_num(X, nan=1.0) for X in devs]
    pre = FederatedPreprocessor(impute="none", scale="standard").fit(full)
    np.testing.assert_allclose(np.vstack(pre.transform(full)),
                               StandardScaler().fit_transform(np.vstack(full)), rtol=1e-9,
                               atol=1e-9)


def test_bytes_and_no_row_leaves_a_site():
    devs = _federation(0)
    d = devs[0].shape[1]
    pre = FederatedPreprocessor().fit(devs)
    c = pre.communication_
    assert c["rounds"] == 1
    assert c["bytes_up"] == len(devs) * (24 * d + 8)   # count, sum, m2 per column + rows
    assert c["bytes_down"] == len(devs) * 16 * d       # pooled mean and scale


def test_site_order_does_not_matter():
    devs = _federation(4)
    a = FederatedPreprocessor().fit(devs)
    b = FederatedPreprocessor().fit(devs[::-1])
    np.testing.assert_allclose(a.mean_, b.mean_, rtol=1e-13)
    np.testing.assert_allclose(a.scale_, b.scale_, rtol=1e-12)


def test_impute_none_names_site_row_column():
    devs = _federation(0, missing=0.0)
    devs[2][3, 1] = np.nan
    with pytest.raises(ValidationError, match=r"clinic-c: row 3, column 'chol' is missing and "
                                              r"impute='none'"):
        FederatedPreprocessor(impute="none").fit(
            devs, columns=["age", "chol", "c", "d", "e", "f"],
            names=["clinic-a", "clinic-b", "clinic-c", "clinic-d"])


def test_all_missing_column_is_refused():
    devs = _federation(0)
    for X in devs:
        X[:, 2] = np.nan
    with pytest.raises(ValidationError, match="column 'x2' has no value at any site"):
        FederatedPreprocessor().fit(devs)


def test_progress_shows_rounds_and_devices(capsys):
    FederatedPreprocessor(progress=True).fit(_federation(0))
    err = capsys.readouterr().err
    assert "preprocess rounds" in err and "column_moments: 4/4 devices" in err
    assert "round 0 (column_moments)" in err and "4/4" in err
