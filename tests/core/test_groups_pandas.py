"""``fit(X, groups=df["site"])``: pandas' text columns (object or string dtype) and object
arrays of Python values name the devices as their plain numpy form does."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import make_blobs

import fedclust as fc
from fedclust.core.estimators import split_federation
from fedclust.core.exceptions import ValidationError


def _data():
    X, _ = make_blobs(240, centers=3, n_features=2, random_state=0)
    sites = np.array(["site-c", "site-a", "site-b"])[np.arange(240) % 3]
    return X, sites


def test_object_array_of_strings_is_the_string_array():
    X, sites = _data()
    ref = fc.KFed(3, 2, random_state=0).fit(X, groups=sites)
    got = fc.KFed(3, 2, random_state=0).fit(X, groups=sites.astype(object))
    np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(got.labels_, ref.labels_)
    by_list = fc.KFed(3, 2, random_state=0).fit(
        [X[sites == s] for s in ("site-a", "site-b", "site-c")])
    np.testing.assert_array_equal(got.cluster_centers_, by_list.cluster_centers_)


def test_pandas_text_columns():
    pd = pytest.importorskip("pandas")
    X, sites = _data()
    ref = fc.KFed(3, 2, random_state=0).fit(X, groups=sites)
    for column in (pd.Series(sites, dtype=object), pd.Series(sites, dtype="string"),
                   pd.DataFrame({"site": sites})["site"]):
        got = fc.KFed(3, 2, random_state=0).fit(X, groups=column)
        np.testing.assert_array_equal(got.cluster_centers_, ref.cluster_centers_)
        np.testing.assert_array_equal(got.labels_, ref.labels_)
    # a classifier too, with the labels in a column of the same frame
    df = pd.DataFrame({"site": sites, "y": (X[:, 0] > 0).astype(int)})
    a = fc.FedGaussClassifier().fit(X, df["y"], groups=df["site"])
    b = fc.FedGaussClassifier().fit(X, df["y"].to_numpy(), groups=sites)
    np.testing.assert_array_equal(a.means_, b.means_)


def test_object_array_of_python_ints_names_the_devices():
    X, _ = _data()
    ids = np.array([4, 9, 2])[np.arange(240) % 3]
    fed = split_federation(X, groups=ids.astype(object))
    assert fed.device_ids == [2, 4, 9]
    ref = split_federation(X, groups=ids)
    for a, b in zip(fed.devices, ref.devices):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad, words", [
    ([None, "a", "b"], ["row 0", "None", "strings"]),
    (["a", 1.5, "b"], ["row 1", "1.5", "float"]),
    ([1.5, 2.5, 3.5], ["row 0", "1.5", "integers or strings"]),
    ([True, False, True], ["row 0", "True", "integers or strings"]),
])
def test_other_object_groups_name_the_row(bad, words):
    X, _ = _data()
    groups = np.array(bad * 80, dtype=object)
    with pytest.raises(ValidationError) as err:
        split_federation(X, groups=groups)
    for w in words:
        assert w in str(err.value)
