"""scikit-learn's estimator contract on every public estimator.

scikit-learn's own checks (``parametrize_with_checks``) run on small instances;
the checks a federated estimator cannot pass are listed in ``EXPECTED_FAILED``
with their reason (the same table is in docs/sklearn.md). ``xfail_strict``
makes a listed check that starts passing an error, so the list stays exact.
Beside them: clone / get_params / set_params / repr, ``fit_predict == labels_``,
and ``fit(X, groups=...)`` equal to the list-of-devices fit.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_clusterer
from sklearn.utils.estimator_checks import parametrize_with_checks

import fedclust as fc
from fedclust import ValidationError
from fedclust.core.estimators import split_federation
from fedclust.robust.clustering import KGeomedians, KMeansLloyd, TrimmedKMeans
from fedclust.robust.edge_cutting import EdgeCutting

PUBLIC = [fc.KFed, fc.DistributedLloyd, fc.DistributedPCA, fc.DistributedKMeans,
          fc.EvolvingGaussians, fc.FedGaussClustering, fc.FedGaussClassifier, fc.FedAvg,
          fc.IFCA, fc.ClusteredFedAvg, TrimmedKMeans, KGeomedians, KMeansLloyd, EdgeCutting,
          fc.RobustClusteredRegression, fc.RobustClusteredClassification]


def _check_instances() -> list:
    """Small, fast settings; scikit-learn's checks pass one X: a federation of one device."""
    return [
        fc.KFed(n_clusters=3, n_local_clusters=3, random_state=0),
        fc.DistributedLloyd(n_clusters=3, random_state=0),
        fc.DistributedPCA(n_components=2, random_state=0),
        fc.DistributedKMeans(n_clusters=3, coreset_size=50, random_state=0),
        # the checks' 50-point blobs: a new cluster's volume sized for small data (the
        # default 0.003 starts 19 clusters there, adjusted Rand 0.38 < the check's 0.4)
        fc.EvolvingGaussians(volume_fraction=0.05),
        fc.FedGaussClustering(),
        fc.FedGaussClassifier(),
        fc.FedAvg(model="softmax", rounds=3),
        fc.IFCA(n_clusters=1, model="softmax", rounds=3),
        fc.ClusteredFedAvg(n_clusters=1, n_local_clusters=2, model="softmax", rounds=3),
        TrimmedKMeans(n_clusters=3, random_state=0),
        # duplicates="weight": repeating a row is weighting it (the check's invariance)
        KGeomedians(n_clusters=3, duplicates="weight", random_state=0),
        KMeansLloyd(n_clusters=3, random_state=0),
        EdgeCutting(),
        fc.RobustClusteredRegression(n_clusters=1, rounds=2),
        fc.RobustClusteredClassification(n_clusters=1, rounds=2),
    ]


# -- the checks that cannot apply, and why ----------------------------------------------
_OBJECT = ("object arrays are refused with one clear error (strings and objects are not "
           "cast to float silently)")
_LABELS_FL = ("numeric labels are class indices 0..C-1 (the check's -1 is refused, not "
              "encoded); string labels are encoded")
_CONTINUOUS_FL = ("a non-integer label is refused as 'label 0.5 is not a class index', not "
                  "with scikit-learn's 'Unknown label type' wording")
_Y2D = "y must be 1-D per device: a column vector is refused, not raveled with a warning"
_ONE_MACHINE = ("n_clusters counts clusters of machines: the check's one array is one "
                "machine, which cannot hold the n_clusters=2 it sets")
_BINARY = ("binary logistic regression: labels must be 0/1 and the check's y has the "
           "labels 0, 1, 2")
_COMMON = {"check_dtype_object": _OBJECT}

_INIT_ROWS = ("the robust initialisation ranks groups by the rows that support them, not by "
              "their weights (a weight is not a witness), so a weighted row and its repeats "
              "can seed different groups")
EXPECTED_FAILED: dict[str, dict[str, str]] = {
    "KFed": {**_COMMON,
             "check_fit2d_1sample": "a device with 1 point cannot have n_local_clusters >= 1 "
                                    "centers of its own; refused as 'n_z=1 points'"},
    "DistributedLloyd": _COMMON,
    "DistributedPCA": _COMMON,
    "DistributedKMeans": {**_COMMON,
                          "check_non_transformer_estimators_n_iter":
                              "max_iter bounds the server's coreset solve; its iteration "
                              "count is not reported back"},
    "EvolvingGaussians": _COMMON,
    "FedGaussClustering": _COMMON,
    "FedGaussClassifier": {
        **_COMMON,
        "check_classifiers_regression_target": "labels may be any sortable values, floats "
                                               "included: float labels are that many classes",
        "check_supervised_y_2d": _Y2D},
    **{name: {**_COMMON, "check_classifiers_classes": _LABELS_FL,
              "check_classifiers_regression_target": _CONTINUOUS_FL,
              "check_supervised_y_2d": _Y2D}
       for name in ("FedAvg", "IFCA", "ClusteredFedAvg")},
    "TrimmedKMeans": {"check_dtype_object": _OBJECT,
                      "check_sample_weight_equivalence_on_dense_data": _INIT_ROWS},
    "KGeomedians": {"check_dtype_object": _OBJECT,
                    "check_sample_weight_equivalence_on_dense_data": _INIT_ROWS},
    "KMeansLloyd": {"check_dtype_object": _OBJECT,
                    "check_sample_weight_equivalence_on_dense_data": _INIT_ROWS},
    "EdgeCutting": {"check_dtype_object": _OBJECT},
    "RobustClusteredRegression": {**_COMMON,
                                  "check_methods_sample_order_invariance": _ONE_MACHINE},
    "RobustClusteredClassification": {
        **_COMMON, "check_methods_sample_order_invariance": _ONE_MACHINE,
        **{c: _BINARY for c in (
            "check_fit_score_takes_y", "check_estimators_overwrite_params",
            "check_dont_overwrite_parameters", "check_estimators_fit_returns_self",
            "check_readonly_memmap_input", "check_n_features_in_after_fitting",
            "check_positive_only_tag_during_fit", "check_estimators_dtypes",
            "check_f_contiguous_array_estimator", "check_methods_subset_invariance",
            "check_fit2d_1feature", "check_dict_unchanged", "check_fit2d_predict1d")}},
}


def _expected_failed(estimator) -> dict[str, str]:
    return EXPECTED_FAILED[type(estimator).__name__]


def _applicable(estimator, check) -> bool:
    # check_array_api_input skips itself unless SCIPY_ARRAY_API is set and the
    # estimator supports the array API; fedclust is numpy-only, so it never applies.
    name = getattr(check, "func", check).__name__
    return name != "check_array_api_input"


_ALL = parametrize_with_checks(_check_instances(), expected_failed_checks=_expected_failed,
                               xfail_strict=True)
_CHECKS = pytest.mark.parametrize(
    _ALL.args[0], [p for p in _ALL.args[1]
                   if _applicable(*(p.values if hasattr(p, "values") else p))],
    **_ALL.kwargs)


@_CHECKS
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def test_every_public_estimator_is_checked():
    checked = {type(e) for e in _check_instances()}
    assert checked == set(PUBLIC)
    assert set(EXPECTED_FAILED) == {c.__name__ for c in PUBLIC}
    for name, reasons in EXPECTED_FAILED.items():
        for check, reason in reasons.items():
            assert check.startswith("check_") and len(reason) > 20, (name, check)


def test_public_api_lists_the_federated_estimators():
    for name in ("KFed", "DistributedLloyd", "DistributedPCA", "DistributedKMeans",
                 "EvolvingGaussians", "FedGaussClustering", "FedGaussClassifier", "FedAvg",
                 "IFCA", "ClusteredFedAvg", "RobustClusteredRegression",
                 "RobustClusteredClassification"):
        assert name in fc.__all__ and getattr(fc, name) in PUBLIC


# -- clone, get_params, set_params, repr -----------------------------------------------
@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_get_params_lists_the_init_signature(cls):
    est = cls()
    names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    params = est.get_params()
    assert sorted(params) == sorted(names)
    for p in names:  # stored unchanged: the default object itself
        assert params[p] is inspect.signature(cls.__init__).parameters[p].default


@pytest.mark.parametrize("est", _check_instances(), ids=lambda e: type(e).__name__)
def test_clone_of_unfitted_equals_params(est):
    twin = clone(est)
    assert twin is not est and type(twin) is type(est)
    assert twin.get_params() == est.get_params()


@pytest.mark.parametrize("est", _check_instances(), ids=lambda e: type(e).__name__)
def test_set_params_round_trip_and_repr(est):
    key = "random_state" if "random_state" in est.get_params() else next(iter(est.get_params()))
    value = 1234 if key == "random_state" else est.get_params()[key]
    assert est.set_params(**{key: value}) is est
    assert est.get_params()[key] == value
    text = repr(est)
    assert text.startswith(type(est).__name__ + "(")
    if key == "random_state":
        assert "random_state=1234" in text
    with pytest.raises(ValueError, match="Invalid parameter"):
        est.set_params(not_a_parameter=1)


def test_positional_arguments_and_repr_of_kfed():
    est = fc.KFed(16, 4)
    assert est.get_params()["n_clusters"] == 16 and est.get_params()["n_local_clusters"] == 4
    assert repr(est) == "KFed(n_clusters=16, n_local_clusters=4)"


def test_init_stores_invalid_values_fit_refuses_them():
    est = fc.KFed(n_clusters="two")          # no validation in __init__
    assert est.n_clusters == "two"
    with pytest.raises(ValidationError, match="n_clusters='two'"):
        est.fit(np.zeros((10, 2)))


def test_mixins_give_the_estimator_types():
    assert all(is_clusterer(c()) for c in (fc.KFed, fc.DistributedLloyd, fc.DistributedKMeans,
                                          fc.EvolvingGaussians, fc.FedGaussClustering,
                                          TrimmedKMeans, EdgeCutting))
    assert is_classifier(fc.FedGaussClassifier()) and is_classifier(fc.FedAvg())
    assert not is_classifier(fc.FedAvg(model="linear"))     # the linear model is a regressor
    assert hasattr(fc.DistributedPCA(), "fit_transform")


def test_fitted_clone_is_unfitted():
    X = _blobs()[0]
    est = fc.KFed(3, 3, random_state=0).fit(X)
    twin = clone(est)
    assert not hasattr(twin, "cluster_centers_")
    with pytest.raises(fc.NotFittedError):
        twin.labels_


# -- fit_predict == labels_, and the groups form ---------------------------------------
def _blobs(n=240, d=3, k=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=8.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    return centers[y] + rng.normal(size=(n, d)), y


def _federation(n=240, seed=0):
    """X (n, d), cluster labels, and interleaved device ids (not sorted, not contiguous)."""
    X, y = _blobs(n, seed=seed)
    groups = np.random.default_rng(seed + 1).choice([7, 2, 5], size=n)
    return X, y, groups


def _split(X, groups, *arrays):
    ids = sorted(set(groups.tolist()))
    out = [[X[groups == z] for z in ids]] + [[a[groups == z] for z in ids] for a in arrays]
    return ids, out


CLUSTERERS = [
    lambda: fc.KFed(3, 3, random_state=0),
    lambda: fc.DistributedLloyd(3, random_state=0),
    lambda: fc.DistributedKMeans(3, coreset_size=60, random_state=0),
    lambda: fc.FedGaussClustering(volume_fraction=0.05),
]


@pytest.mark.parametrize("make", CLUSTERERS, ids=lambda m: type(m()).__name__)
def test_fit_predict_equals_labels_(make):
    X, _, groups = _federation()
    ids, (devices,) = _split(X, groups)
    labs = make().fit_predict(devices)
    est = make().fit(devices)
    assert isinstance(labs, np.ndarray) and labs.shape == (len(X),)
    np.testing.assert_array_equal(labs, est.labels_)
    np.testing.assert_array_equal(labs, np.concatenate(est.device_labels_))
    labs_g = make().fit_predict(X, groups=groups)
    np.testing.assert_array_equal(labs_g, make().fit(X, groups=groups).labels_)


@pytest.mark.parametrize("make", CLUSTERERS, ids=lambda m: type(m()).__name__)
def test_groups_form_equals_the_list_of_devices(make):
    X, _, groups = _federation()
    ids, (devices,) = _split(X, groups)
    by_list = make().fit(devices, device_ids=ids)
    by_groups = make().fit(X, groups=groups)
    np.testing.assert_array_equal(by_groups.cluster_centers_, by_list.cluster_centers_)
    assert by_groups.device_ids_ == ids                  # integer groups are the device ids
    labels = by_groups.labels_
    assert labels.shape == (len(X),)
    for z, lab in zip(ids, by_list.device_labels_):      # labels_ in the row order of X
        np.testing.assert_array_equal(labels[groups == z], lab)
    np.testing.assert_array_equal(by_groups.predict(X), by_list.predict(X))


def test_string_groups_order_devices_by_sorted_name():
    X, _, groups = _federation()
    names = np.array(["site-c", "site-a", "site-b"])[np.searchsorted([2, 5, 7], groups)]
    est = fc.KFed(3, 3, random_state=0).fit(X, groups=names)
    ref = fc.KFed(3, 3, random_state=0).fit(
        [X[names == s] for s in ("site-a", "site-b", "site-c")])
    assert est.device_ids_ == [0, 1, 2]
    np.testing.assert_array_equal(est.cluster_centers_, ref.cluster_centers_)
    for pos, s in enumerate(("site-a", "site-b", "site-c")):
        np.testing.assert_array_equal(est.labels_[names == s], ref.device_labels_[pos])


def test_groups_form_for_pca():
    X, _, groups = _federation()
    ids, (devices,) = _split(X, groups)
    a = fc.DistributedPCA(2, random_state=0).fit(X, groups=groups)
    b = fc.DistributedPCA(2, random_state=0).fit(devices, device_ids=ids)
    np.testing.assert_array_equal(a.components_, b.components_)
    np.testing.assert_allclose(a.fit_transform(X, groups=groups), b.transform(X))


def test_groups_form_for_classifiers():
    X, y, groups = _federation()
    ids, (devices, labels) = _split(X, groups, y)
    for make in (lambda: fc.FedGaussClassifier(),
                 lambda: fc.FedAvg(model="softmax", rounds=3, random_state=0),
                 lambda: fc.IFCA(2, model="softmax", rounds=3, random_state=0),
                 lambda: fc.ClusteredFedAvg(2, 1, model="softmax", rounds=3, random_state=0)):
        a = make().fit(X, y, groups=groups)
        b = make().fit(devices, labels, device_ids=ids)
        np.testing.assert_array_equal(a.predict(X), b.predict(X))
        if hasattr(b, "models_"):
            np.testing.assert_array_equal(a.models_, b.models_)
        else:
            np.testing.assert_array_equal(a.means_, b.means_)
        assert a.score(X, y) == b.score(X, y) > 0.9


def test_groups_form_for_robust_regression():
    rng = np.random.default_rng(0)
    w = np.array([[1.0, -2.0], [-3.0, 0.5]])
    groups = np.repeat(np.arange(8), 30)
    X = rng.normal(size=(240, 2))
    y = np.einsum("nd,nd->n", X, w[groups % 2]) + 0.01 * rng.normal(size=240)
    order = rng.permutation(240)                              # rows of the devices interleaved
    X, y, groups = X[order], y[order], groups[order]
    ids, (devices, labels) = _split(X, groups, y)
    a = fc.RobustClusteredRegression(2, rounds=2, random_state=0).fit(X, y, groups=groups)
    b = fc.RobustClusteredRegression(2, rounds=2, random_state=0).fit(devices, labels,
                                                                     device_ids=ids)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.device_clusters_, b.device_clusters_)


def test_single_array_is_one_device_everywhere():
    X, y, _ = _federation()
    a = fc.DistributedKMeans(3, coreset_size=60, random_state=0).fit(X)
    b = fc.DistributedKMeans(3, coreset_size=60, random_state=0).fit([X])
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    rows = X.tolist()                                       # a list of rows is one array too
    c = fc.DistributedKMeans(3, coreset_size=60, random_state=0).fit(rows)
    np.testing.assert_array_equal(c.labels_, b.labels_)


@pytest.mark.parametrize("bad, frags", [
    (dict(groups=np.zeros(5)), ["groups has shape (5,)", "240 rows"]),
    (dict(groups=np.zeros((240, 2), int)), ["groups has shape (240, 2)"]),
    (dict(groups=np.full(240, 0.5)), ["groups has dtype float64", "integers or strings"]),
    (dict(groups=np.zeros(240, int), device_ids=[0]), ["groups or device_ids"]),
])
def test_groups_errors(bad, frags):
    X, _, _ = _federation()
    with pytest.raises(ValidationError) as exc:
        fc.KFed(3, 3).fit(X, **bad)
    for f in frags:
        assert f in str(exc.value)


def test_groups_with_a_list_of_devices_is_refused():
    X, _, groups = _federation()
    with pytest.raises(ValidationError, match="groups= needs X as one 2-D array"):
        fc.KFed(3, 3).fit([X[:100], X[100:]], groups=groups)


def test_groups_y_length_mismatch():
    X, y, groups = _federation()
    with pytest.raises(ValidationError, match=re.escape("y has shape (239,) but X has 240")):
        fc.FedAvg(model="softmax", rounds=1).fit(X, y[:-1], groups=groups)


def test_split_federation_orders_rows_and_restores_them():
    X = np.arange(12.0).reshape(6, 2)
    groups = np.array([3, 1, 3, 0, 1, 3])
    fed = split_federation(X, groups=groups)
    assert fed.device_ids == [0, 1, 3]
    np.testing.assert_array_equal(fed.devices[2], X[[0, 2, 5]])    # row order kept per device
    per_device = [np.array([10]), np.array([11, 12]), np.array([13, 14, 15])]
    np.testing.assert_array_equal(fed.rows.to_rows(per_device), [13, 11, 14, 10, 12, 15])
    # a device that did not take part: -1 in its rows
    np.testing.assert_array_equal(fed.rows.to_rows([None] + per_device[1:]),
                                  [13, 11, 14, -1, 12, 15])


def test_docs_table_lists_every_excluded_check():
    """docs/sklearn.md's table names every (check, estimator) pair excluded above."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "sklearn.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `check_")]
    listed = set()
    for row in rows:
        checks_cell, ests_cell = row.split("|")[1:3]
        names = [n.strip() for n in ests_cell.split(",")]
        names = [c.__name__ for c in PUBLIC] if names == ["all"] else names
        for check in re.findall(r"`(check_\w+)`", checks_cell):
            listed.update((check, n) for n in names)
    expected = {(c, n) for n, d in EXPECTED_FAILED.items() for c in d}
    assert listed == expected


def test_model_selection_tools_accept_the_estimators():
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    X, y, _ = _federation()
    pipe = make_pipeline(fc.DistributedPCA(2, random_state=0), fc.KFed(3, 3, random_state=0))
    labels = pipe.fit_predict(X)
    ref = fc.KFed(3, 3, random_state=0).fit_predict(
        fc.DistributedPCA(2, random_state=0).fit_transform(X))
    np.testing.assert_array_equal(labels, ref)
    assert list(pipe[0].get_feature_names_out()) == ["distributedpca0", "distributedpca1"]
    search = GridSearchCV(fc.FedGaussClassifier(), {"kappa_f": [0.0, 0.01]}, cv=3).fit(X, y)
    assert search.best_params_["kappa_f"] in (0.0, 0.01) and search.best_score_ > 0.9


def test_fl_single_array_with_a_test_set():
    X, y, _ = _federation()
    a = fc.FedAvg(model="softmax", rounds=2, random_state=0).fit(
        X[:200], y[:200], test_X=X[200:], test_y=y[200:])
    b = fc.FedAvg(model="softmax", rounds=2, random_state=0).fit(
        [X[:200]], [y[:200]], test_X=[X[200:]], test_y=[y[200:]])
    assert [h["test_accuracy"] for h in a.history_] == [h["test_accuracy"] for h in b.history_]
    assert a.history_[-1]["test_accuracy"] == a.score(X[200:], y[200:])
