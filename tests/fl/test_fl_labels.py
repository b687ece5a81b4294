"""FedAvg / IFCA / k-FED + FedAvg with string labels, and the model-name errors.

String labels are the sorted label values' class indices: the same fit as the index labels,
with ``classes_`` holding the strings and ``predict`` returning them.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_iris

from fedclust import ClusteredFedAvg, FedAvg, IFCA
from fedclust.core.exceptions import ValidationError
from fedclust.privacy import DifferentialPrivacy

NAMES = np.array(["setosa", "versicolor", "virginica"])   # sorted: index i is NAMES[i]


def _iris():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    groups = np.arange(len(y)) % 3
    return X, y, NAMES[y], groups


@pytest.mark.parametrize("as_object", [False, True])
def test_string_labels_fit_as_their_sorted_indices(as_object):
    X, y, names, groups = _iris()
    labels = names.astype(object) if as_object else names
    a = FedAvg("softmax", rounds=10, lr=0.2, random_state=0).fit(X, labels, groups=groups)
    b = FedAvg("softmax", rounds=10, lr=0.2, random_state=0).fit(X, y, groups=groups)
    np.testing.assert_array_equal(a.models_, b.models_)
    assert a.classes_.tolist() == NAMES.tolist()
    pred = a.predict(X)
    assert pred.dtype.kind == "U"
    np.testing.assert_array_equal(pred, NAMES[b.predict(X)])
    assert a.score(X, names) == b.score(X, y) > 0.8
    np.testing.assert_array_equal(a.predict_device(1, X[:7]), NAMES[b.predict_device(1, X[:7])])


def test_pandas_label_column():
    pd = pytest.importorskip("pandas")
    X, y, names, groups = _iris()
    df = pd.DataFrame({"label": names, "site": np.array(["a", "b", "c"])[groups]})
    a = FedAvg("softmax", rounds=5, random_state=0).fit(X, df["label"], groups=df["site"])
    b = FedAvg("softmax", rounds=5, random_state=0).fit(X, y, groups=groups)
    np.testing.assert_array_equal(a.models_, b.models_)
    np.testing.assert_array_equal(a.predict(X), NAMES[b.predict(X)])


def test_string_test_sets_and_routed_models():
    X, y, names, groups = _iris()
    Xs = [X[groups == z] for z in range(3)]
    ys, ns = [y[groups == z] for z in range(3)], [names[groups == z] for z in range(3)]
    kw = dict(rounds=4, lr=0.2, random_state=0)
    a = IFCA(2, "softmax", **kw).fit(Xs, ns, test_X=Xs, test_y=ns)
    b = IFCA(2, "softmax", **kw).fit(Xs, ys, test_X=Xs, test_y=ys)
    assert [h["test_accuracy"] for h in a.history_] == [h["test_accuracy"] for h in b.history_]
    np.testing.assert_array_equal(a.predict(X), NAMES[b.predict(X)])
    c = ClusteredFedAvg(2, 2, "softmax", routing="gate", **kw).fit(Xs, ns)
    d = ClusteredFedAvg(2, 2, "softmax", routing="gate", **kw).fit(Xs, ys)
    np.testing.assert_array_equal(c.score_devices(Xs, ns, routing="centers"),
                                  d.score_devices(Xs, ys, routing="centers"))
    np.testing.assert_array_equal(c.predict_device(2, X[:9]), NAMES[d.predict_device(2, X[:9])])
    with pytest.raises(ValidationError, match="not one of the classes"):
        c.score_devices(Xs, [ns[0], ns[1], np.full(len(ns[2]), "rose")])


def test_public_classes_name_a_label_no_device_holds():
    X, y, names, groups = _iris()
    keep = y < 2   # only two of the three classes on the devices
    m = FedAvg("softmax", rounds=3, classes=["virginica", "setosa", "versicolor"],
               random_state=0).fit(X[keep], names[keep], groups=groups[keep])
    assert m.classes_.tolist() == NAMES.tolist()
    assert m.models_.shape[1] == 3 * (X.shape[1] + 1)   # a softmax over the three classes
    with pytest.raises(ValidationError, match="not one of the classes"):
        FedAvg("softmax", rounds=1, classes=["setosa", "versicolor"]).fit(
            X, names, groups=groups)


def test_string_labels_under_privacy_need_the_public_classes():
    X, y, names, groups = _iris()
    dp = DifferentialPrivacy(2.0, 1e-5, unit="device", clip_norm=1.0, noise_seed=0)
    with pytest.raises(ValidationError, match="classes="):
        FedAvg("softmax", rounds=2, privacy=dp).fit(X, names, groups=groups)
    a = FedAvg("softmax", rounds=2, privacy=dp, classes=list(NAMES), random_state=0).fit(
        X, names, groups=groups)
    b = FedAvg("softmax", rounds=2, privacy=dp, classes=3, random_state=0).fit(
        X, y, groups=groups)
    np.testing.assert_array_equal(a.models_, b.models_)
    # an unknown label is refused by its row, never its value, under privacy
    odd = names.copy()
    odd[4] = "secret-label"
    with pytest.raises(ValidationError) as err:
        FedAvg("softmax", rounds=1, privacy=dp, classes=list(NAMES)).fit(X, odd, groups=groups)
    assert "row" in str(err.value) and "secret-label" not in str(err.value)


@pytest.mark.parametrize("ys, kw, words", [
    (lambda y, n: [n[:75], y[75:]], {}, ["device 1", "string labels"]),
    (lambda y, n: [n[:75], n[75:]], {"model": "linear"}, ["model='linear'", "strings"]),
    (lambda y, n: [y[:75], y[75:]], {"classes": ["a", "b", "c"]}, ["classes= lists strings"]),
    (lambda y, n: [n[:75], n[75:]], {"classes": 3}, ["classes=3", "labels themselves"]),
    (lambda y, n: [n[:25], n[25:50]], {}, ["one class", "'setosa'"]),
])
def test_label_errors(ys, kw, words):
    X, y, names, _ = _iris()
    parts = ys(y, names)
    Xs = [X[:len(parts[0])], X[len(parts[0]):len(parts[0]) + len(parts[1])]]
    with pytest.raises(ValidationError) as err:
        FedAvg(**{"model": "softmax", "rounds": 1, **kw}).fit(Xs, parts)
    for w in words:
        assert w in str(err.value)


def test_logistic_on_three_classes_suggests_softmax():
    X, y, names, groups = _iris()
    with pytest.raises(ValidationError, match="model='softmax'"):
        FedAvg("logistic", rounds=1).fit(X, y, groups=groups)
    with pytest.raises(ValidationError, match="model='softmax'"):
        FedAvg("logistic", rounds=1).fit(X, names, groups=groups)
    two = y < 2   # two string classes: the binary model
    m = FedAvg("logistic", rounds=3, random_state=0).fit(X[two], names[two], groups=groups[two])
    assert m.classes_.tolist() == ["setosa", "versicolor"]
    assert set(m.predict(X[two]).tolist()) <= {"setosa", "versicolor"}
