"""Tests of the Gaussian federation generator and the .npz loaders (tmp files only)."""

import math

import numpy as np
import pytest

from fedclust.datasets import (DataNotFoundError, FederatedData, default_data_dir,
                               load_benchmark, load_mnist, load_npz,
                               make_federated_gaussians)
from fedclust import ValidationError


# -------------------------------------------------------------- generator

def test_structure_of_federation():
    fd = make_federated_gaussians(n_features=20, n_clusters=9, m0=4, n_per_component=40,
                                  random_state=0)
    k, kp, m0 = 9, 3, 4
    assert fd.n_devices == math.ceil(k / kp) * m0 == 12
    assert fd.n_features == 20 and fd.means.shape == (9, 20)
    assert fd.X.shape == (9 * 40, 20) and fd.X.dtype == np.float64
    assert fd.y.dtype == np.int64
    assert np.array_equal(np.bincount(fd.y), np.full(9, 40))
    for z, yz in enumerate(fd.labels):
        g = fd.meta["device_group"][z]
        # exactly the k' components of its group, evenly (10 points each)
        assert sorted(np.unique(yz)) == fd.meta["groups"][g] == list(range(3 * g, 3 * g + 3))
        assert np.array_equal(np.bincount(yz, minlength=9)[3 * g:3 * g + 3], [10, 10, 10])


def test_uneven_last_group_and_default_k_local():
    fd = make_federated_gaussians(n_features=5, n_clusters=7, n_local_clusters=3, m0=2,
                                  n_per_component=11, random_state=1)
    assert fd.meta["groups"] == [[0, 1, 2], [3, 4, 5], [6]]
    assert fd.n_devices == 6
    sizes = [len(y) for y in fd.labels]
    assert sum(sizes) == 77
    assert sorted(np.unique(fd.labels[-1])) == [6]
    # 11 points of a component over 2 devices: 5 or 6 each
    for yz in fd.labels:
        assert set(np.bincount(yz)[np.unique(yz)]) <= {5, 6}
    assert make_federated_gaussians(n_features=5, n_clusters=16, m0=1,
                                    random_state=0).meta["n_local_clusters"] == 4


def test_points_follow_their_component():
    sigma = 2.0
    fd = make_federated_gaussians(n_features=50, n_clusters=4, n_local_clusters=2, m0=2,
                                  n_per_component=400, sigma=sigma, random_state=2)
    X, y = fd.X, fd.y
    for r in range(4):
        Xr = X[y == r]
        assert np.abs(Xr.mean(0) - fd.means[r]).max() < 5 * sigma / math.sqrt(400)
        assert Xr.std(0).mean() == pytest.approx(sigma, rel=0.05)


@pytest.mark.parametrize("c,sigma", [(100.0, 1.0), (10.0, 3.0)])
def test_separation_scale(c, sigma):
    fd = make_federated_gaussians(n_features=200, n_clusters=40, m0=1, separation=c,
                                  sigma=sigma, n_per_component=10, random_state=3)
    M = fd.means
    D2 = ((M[:, None] - M[None]) ** 2).sum(-1)[np.triu_indices(40, 1)]
    # E||mu_r - mu_s||^2 = c^2 sigma^2
    assert D2.mean() == pytest.approx((c * sigma) ** 2, rel=0.05)


def test_reproducible_and_seed_dependent():
    a = make_federated_gaussians(n_features=10, n_clusters=4, n_per_component=20, random_state=7)
    b = make_federated_gaussians(n_features=10, n_clusters=4, n_per_component=20, random_state=7)
    c = make_federated_gaussians(n_features=10, n_clusters=4, n_per_component=20, random_state=8)
    assert all(np.array_equal(x, y) for x, y in zip(a.devices, b.devices))
    assert all(np.array_equal(x, y) for x, y in zip(a.labels, b.labels))
    assert not np.allclose(a.means, c.means)
    d = make_federated_gaussians(n_features=10, n_clusters=4, n_per_component=20,
                                 random_state=np.random.default_rng(7))
    assert d.X.shape == a.X.shape


def test_generator_bad_parameters():
    with pytest.raises(ValidationError, match="n_clusters=0 must be >= 1"):
        make_federated_gaussians(n_clusters=0)
    with pytest.raises(ValidationError, match="n_local_clusters=5 must be <= 4"):
        make_federated_gaussians(n_clusters=4, n_local_clusters=5)
    with pytest.raises(ValidationError, match="m0=0 must be >= 1"):
        make_federated_gaussians(m0=0)
    with pytest.raises(ValidationError, match="sigma=0.0 must be > 0"):
        make_federated_gaussians(sigma=0.0)
    with pytest.raises(ValidationError, match="separation=-1.0 must be >= 0"):
        make_federated_gaussians(separation=-1.0)
    with pytest.raises(ValidationError, match="n_per_component=3 < m0=5"):
        make_federated_gaussians(n_per_component=3)
    # 4 components x 1 point = 4 points per device, not more than k'=4
    with pytest.raises(ValidationError, match="smallest device would get 4 points"):
        make_federated_gaussians(n_features=3, n_clusters=16, m0=5, n_per_component=5)
    with pytest.raises(ValidationError, match="random_state"):
        make_federated_gaussians(random_state="x")


def test_federated_data_checks():
    fd = FederatedData([np.zeros((2, 3)), np.ones((1, 3))], [np.array([0, 1]), np.array([1])])
    assert fd.n_devices == 2 and fd.X.shape == (3, 3) and list(fd.y) == [0, 1, 1]
    with pytest.raises(ValidationError, match="2 devices but 1 label arrays"):
        FederatedData([np.zeros((2, 3)), np.zeros((2, 3))], [np.zeros(2)])
    with pytest.raises(ValidationError, match="device 1 has 2 features but device 0 has 3"):
        FederatedData([np.zeros((2, 3)), np.zeros((2, 2))], [np.zeros(2), np.zeros(2)])


# ---------------------------------------------------------------- loaders

def test_load_npz(tmp_path):
    p = tmp_path / "d.npz"
    np.savez(p, X=np.arange(6, dtype=np.int32).reshape(3, 2), y=np.array([1.0, 2.0, 1.0]))
    X, y = load_npz(p)
    assert X.dtype == np.float64 and X.shape == (3, 2) and X[2, 1] == 5
    assert y.dtype == np.int64 and list(y) == [1, 2, 1]


def test_load_npz_errors(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(DataNotFoundError, match="nope.npz.*not found.*data_dir"):
        load_npz(missing)
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError
        load_npz(missing)
    p = tmp_path / "a.npz"
    np.savez(p, X=np.zeros((2, 2)))
    with pytest.raises(ValidationError, match=r"no array 'y'; it holds \['X'\]"):
        load_npz(p)
    np.savez(p, X=np.array([[0.0, np.nan]]), y=[0])
    with pytest.raises(ValidationError, match="non-finite"):
        load_npz(p)
    np.savez(p, X=np.zeros((2, 2)), y=[0, 1, 2])
    with pytest.raises(ValidationError, match="2 rows but 'y' has 3 labels"):
        load_npz(p)
    np.savez(p, X=np.zeros((2, 2)), y=[0.5, 1])
    with pytest.raises(ValidationError, match="not integers"):
        load_npz(p)
    np.savez(p, X=np.array(["a", "b"]).reshape(2, 1), y=[0, 1])
    with pytest.raises(ValidationError, match="dtype"):
        load_npz(p)


def _fake_mnist(folder, n_train=6, n=10):
    folder.mkdir(parents=True, exist_ok=True)
    X = (np.arange(n * 4) % 256).astype(np.uint8).reshape(n, 4)
    np.savez(folder / "mnist_70k.npz", X=X, y=(np.arange(n) % 10).astype(np.uint8),
             n_train=np.int64(n_train))
    return X


def test_load_mnist(tmp_path):
    Xraw = _fake_mnist(tmp_path / "mnist")
    X, y = load_mnist(tmp_path)  # data dir with mnist/ inside
    assert X.shape == (10, 4) and np.allclose(X, Xraw / 255.0) and y.dtype == np.int64
    Xtr, ytr = load_mnist(tmp_path / "mnist" / "mnist_70k.npz", subset="train")
    Xte, yte = load_mnist(tmp_path / "mnist", subset="test", scale=False, dtype=np.float32)
    assert len(ytr) == 6 and len(yte) == 4 and list(yte) == [6, 7, 8, 9]
    assert Xte.dtype == np.float32 and np.array_equal(Xte, Xraw[6:])
    with pytest.raises(ValidationError, match="subset='val' is not supported"):
        load_mnist(tmp_path, subset="val")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match="no mnist_70k.npz in .*empty"):
        load_mnist(tmp_path / "empty")
    with pytest.raises(DataNotFoundError, match="MNIST file .*missing.npz.* not found"):
        load_mnist(tmp_path / "missing.npz")


def test_default_data_dir_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDCLUST_DATA", raising=False)
    assert default_data_dir() is None
    with pytest.raises(DataNotFoundError, match="FEDCLUST_DATA"):
        load_benchmark("sipu/s1")
    with pytest.raises(DataNotFoundError, match="FEDCLUST_DATA"):
        load_mnist()
    _fake_mnist(tmp_path / "mnist")
    monkeypatch.setenv("FEDCLUST_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    assert load_mnist()[0].shape == (10, 4)


def _fake_benchmark(root, name, X, y, **extra):
    p = root / "clustering-benchmarks-v1" / f"{name}.npz"
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez(p, X=X, y=y, **extra)


def test_load_benchmark_noise_and_relabel(tmp_path):
    X = np.arange(12, dtype=float).reshape(6, 2)
    y = np.array([2, 0, 5, 2, 0, 5])
    _fake_benchmark(tmp_path, "sipu/toy", X, y, y1=np.array([1, 1, 1, 2, 2, 2]))
    Xd, yd = load_benchmark("sipu/toy", tmp_path)
    assert np.array_equal(Xd, X[[0, 2, 3, 5]]) and list(yd) == [0, 1, 0, 1]
    Xk, yk = load_benchmark("sipu/toy", data_dir=str(tmp_path), drop_noise=False)
    assert np.array_equal(Xk, X) and list(yk) == [0, -1, 1, 0, -1, 1]
    _, y1 = load_benchmark("sipu/toy", tmp_path, labels="y1")
    assert list(y1) == [0, 0, 0, 1, 1, 1]


def test_load_benchmark_errors(tmp_path):
    with pytest.raises(ValidationError, match="must look like 'battery/dataset'"):
        load_benchmark("s1", tmp_path)
    with pytest.raises(ValidationError, match="must look like"):
        load_benchmark("../etc/passwd", tmp_path)
    with pytest.raises(DataNotFoundError, match="benchmark 'uci/ecoli' not found"):
        load_benchmark("uci/ecoli", tmp_path)
    with pytest.raises(DataNotFoundError, match="does not exist"):
        load_benchmark("uci/ecoli", tmp_path / "missing")
    _fake_benchmark(tmp_path, "x/allnoise", np.zeros((2, 1)), np.zeros(2, int))
    with pytest.raises(ValidationError, match="every point is noise"):
        load_benchmark("x/allnoise", tmp_path)
