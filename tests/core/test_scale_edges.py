"""Edges of the number line: every family refuses data whose squares overflow or underflow
float64 in one line, and runs on a constant feature and on d >> n (finite results)."""

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.cli import main
from fedclust.core.validation import check_scale
from fedclust.coreset import DistributedKMeans
from fedclust.fl import IFCA
from fedclust.gauss.estimator import EvolvingGaussians, FedGaussClustering
from fedclust.kfed import KFed
from fedclust.lloyd import DistributedLloyd
from fedclust.robust import RobustClusteredClassification, RobustClusteredRegression


def _fed(d=4, n=30, n_dev=6, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(2, d)) * 8
    Xs, ys = [], []
    for _ in range(n_dev):
        lab = rng.integers(0, 2, n)
        Xs.append(means[lab] + rng.normal(size=(n, d)))
        ys.append(lab)
    return Xs, ys


FAMILIES = {
    "kfed": lambda X, y: KFed(2, 2, random_state=0).fit(X).cluster_centers_,
    "kfed-trim": lambda X, y: KFed(2, 2, trim=0.2, random_state=0).fit(X).cluster_centers_,
    "lloyd": lambda X, y: DistributedLloyd(2, random_state=0).fit(X).cluster_centers_,
    "coreset": lambda X, y: DistributedKMeans(2, random_state=0).fit(X).cluster_centers_,
    "gauss": lambda X, y: FedGaussClustering(random_state=0).fit(X).cluster_centers_,
    "ifca": lambda X, y: IFCA(
        2, "logistic", rounds=2, random_state=0).fit(X, y).models_,
    "robust-regression": lambda X, y: RobustClusteredRegression(
        2, rounds=2, l2=0.1, random_state=0).fit(X, [v.astype(float) for v in y]).coef_,
    "robust-classification": lambda X, y: RobustClusteredClassification(
        2, rounds=2, random_state=0).fit(X, y).coef_,
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("factor, needle", [(1e300, "overflow"), (1e-300, "underflow")])
def test_extreme_scales_are_refused_in_one_line(family, factor, needle):
    Xs, ys = _fed()
    with pytest.raises(ValidationError, match=needle) as err:
        FAMILIES[family]([X * factor for X in Xs], ys)
    assert "\n" not in str(err.value) and "constant" in str(err.value)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("case", ["constant feature", "d >> n"])
def test_constant_feature_and_wide_data_give_finite_models(family, case):
    if case == "constant feature":
        Xs, ys = _fed(seed=1)
        for X in Xs:
            X[:, 1] = 3.0
    else:
        Xs, ys = _fed(d=120, n=8, seed=2)
    out = np.asarray(FAMILIES[family](Xs, ys), dtype=float)
    assert out.size and np.isfinite(out).all()


def test_clustering_is_unchanged_just_inside_the_limits():
    # equivariance: the same partition at 1e100 and 1e-100 as at 1 (the check refuses nothing)
    Xs, _ = _fed(seed=3)
    ref = KFed(2, 2, random_state=0).fit(Xs)
    for f in (1e100, 1e-100):
        m = KFed(2, 2, random_state=0).fit([X * f for X in Xs])
        for a, b in zip(ref.device_labels_, m.device_labels_):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(m.cluster_centers_ / f, ref.cluster_centers_, rtol=1e-9)


def test_check_scale_names_the_device_and_the_value():
    Xs, _ = _fed()
    Xs[4] = Xs[4] * 1e200
    with pytest.raises(ValidationError, match=r"values reach .*e\+20\d \(device 14\)"):
        check_scale(Xs, ids=[10, 11, 12, 13, 14, 15])
    check_scale([np.zeros((3, 2))])               # no spread at all: left to the families
    check_scale([np.full((3, 2), 1e150)])         # large but within the limit
    with pytest.raises(ValidationError, match="float32"):
        check_scale([np.full((3, 2), 1e16, dtype=np.float32)])


def test_single_owner_gauss_refuses_too():
    X = np.random.default_rng(0).normal(size=(50, 3))
    with pytest.raises(ValidationError, match="overflow"):
        EvolvingGaussians().fit(X * 1e300)


@pytest.mark.parametrize("factor, code, needle", [(1e300, 2, "overflow"),
                                                  (1e-300, 2, "underflow")])
def test_cli_refuses_extreme_data_in_one_line(tmp_path, capsys, factor, code, needle):
    Xs, ys = _fed()
    path = tmp_path / "data.npz"
    np.savez(path, X=np.concatenate(Xs) * factor, y=np.concatenate(ys))
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(f'seed = 0\n[data]\nsource = "npz"\npath = "{path}"\n'
                   '[partition]\nkind = "iid"\nn_devices = 4\n'
                   '[algorithm]\nname = "kfed"\nn_clusters = 2\nn_local_clusters = 2\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == code
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_turns_an_unexpected_error_into_one_line(tmp_path, capsys, monkeypatch):
    import fedclust.cli as cli

    def boom(*a, **k):
        raise np.linalg.LinAlgError("Eigenvalues did not converge")

    monkeypatch.setattr(cli, "_execute", boom)
    cfg = tmp_path / "cfg.toml"
    cfg.write_text('seed = 0\n[data]\nsource = "gaussians"\nn_features = 4\nn_clusters = 2\n'
                   '[algorithm]\nname = "kfed"\nn_clusters = 2\nn_local_clusters = 1\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 3  # an internal error (README: exit codes)
    err = capsys.readouterr().err
    assert err.startswith("fedclust: internal error: LinAlgError") and err.count("\n") == 1
