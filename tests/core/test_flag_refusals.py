"""A yes/no setting that is not a bool is refused by name (``weighted="no"`` is truthy and
would silently mean True); numpy's bool is a bool and fits as the Python one does."""

from __future__ import annotations

import numpy as np
import pytest

import fedclust as fc
from fedclust.core.exceptions import ValidationError

FLAGS = {   # estimator -> (maker, its yes/no settings, supervised)
    "KFed": (lambda **kw: fc.KFed(3, 2, random_state=0, **kw),
             ["weighted", "allow_raw_points", "progress"], False),
    "DistributedLloyd": (lambda **kw: fc.DistributedLloyd(3, random_state=0, **kw),
                         ["progress"], False),
    "DistributedPCA": (lambda **kw: fc.DistributedPCA(2, random_state=0, **kw),
                       ["center", "progress"], False),
    "DistributedKMeans": (lambda **kw: fc.DistributedKMeans(3, random_state=0, **kw),
                          ["center", "progress"], False),
    "FedGaussClustering": (lambda **kw: fc.FedGaussClustering(random_state=0, **kw),
                           ["progress"], False),
    "FedGaussClassifier": (lambda **kw: fc.FedGaussClassifier(random_state=0, **kw),
                           ["progress"], True),
    "RobustClusteredRegression": (
        lambda **kw: fc.RobustClusteredRegression(2, random_state=0, **kw),
        ["fit_intercept", "drop_outliers", "adaptive_beta", "progress"], True),
    "RobustClusteredClassification": (
        lambda **kw: fc.RobustClusteredClassification(2, random_state=0, **kw),
        ["fit_intercept", "drop_outliers", "adaptive_beta", "progress"], True),
    "FedAvg": (lambda **kw: fc.FedAvg(random_state=0, **kw), ["weighted", "progress"], True),
    "IFCA": (lambda **kw: fc.IFCA(2, random_state=0, **kw), ["weighted", "progress"], True),
    "ClusteredFedAvg": (lambda **kw: fc.ClusteredFedAvg(random_state=0, **kw),
                        ["weighted", "progress"], True),
}
CASES = [(name, flag) for name, (_, flags, _) in FLAGS.items() for flag in flags]


def _fit(model, supervised):
    rng = np.random.default_rng(0)
    means = rng.normal(size=(3, 4)) * 6
    Xs = [means[rng.integers(3, size=40)] + rng.normal(size=(40, 4)) for _ in range(6)]
    if not supervised:
        return model.fit(Xs)
    return model.fit(Xs, [(X[:, 0] > 0).astype(np.int64) for X in Xs])


def _state(model):
    return {k: v for k, v in vars(model).items()
            if k.endswith("_") and not k.startswith("_") and isinstance(v, np.ndarray)}


@pytest.mark.parametrize("name, flag", CASES)
@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_yes_no_setting_that_is_not_a_bool_is_refused_by_name(name, flag, value):
    make, _, supervised = FLAGS[name]
    with pytest.raises(ValidationError) as info:
        _fit(make(**{flag: value}), supervised)
    assert str(info.value) == f"{name}: {flag}={value!r} must be True or False"


@pytest.mark.parametrize("name, flag", CASES)
def test_numpy_bools_fit_as_python_bools(name, flag):
    make, _, supervised = FLAGS[name]
    default = make().get_params()[flag]
    a = _state(_fit(make(**{flag: np.bool_(default)}), supervised))
    b = _state(_fit(make(**{flag: default}), supervised))
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
