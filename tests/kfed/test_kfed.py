"""The KFed estimator end to end, against scikit-learn and the federated invariances."""

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

import fedclust
from conftest import blobs, make_structured_federation, matched_accuracy, sorted_rows
from fedclust import KFed
from fedclust.core.random import device_rng, device_uniforms
from fedclust.kfed.batched import n_uniforms
from fedclust import NotFittedError, ValidationError
from fedclust.kfed.local import _spectral_seed

K, KL, M0, D = 16, 4, 5, 50


@pytest.fixture(scope="module")
def fed():
    return make_structured_federation(k=K, k_local=KL, m0=M0, d=D, n_per=20, seed=0)


@pytest.fixture(scope="module")
def fitted(fed):
    devices, _, _ = fed
    return KFed(K, KL, server="farthest-lloyd1", random_state=0).fit(devices)


def _label_map(y_true, y_pred):
    """Global cluster -> true component, by Hungarian matching."""
    M = np.zeros((y_pred.max() + 1, y_true.max() + 1))
    np.add.at(M, (y_pred, y_true), 1)
    r, c = linear_sum_assignment(-M)
    return dict(zip(r.tolist(), c.tolist()))


# ------------------------------------------------------------------ API

def test_api_attributes(fed, fitted):
    devices, _, _ = fed
    m = fitted
    assert m.cluster_centers_.shape == (K, D)
    assert len(m.device_labels_) == len(devices)
    for X, lab, lc, cnt in zip(devices, m.device_labels_, m.local_centers_, m.local_counts_):
        assert lab.shape == (len(X),)
        assert lab.min() >= 0 and lab.max() < K
        assert lc.shape == (KL, D)
        assert cnt.sum() == len(X)
    np.testing.assert_array_equal(m.labels_, np.concatenate(m.device_labels_))
    comm = m.communication_
    for key in ("rounds", "bytes_up", "bytes_down", "bytes_total"):
        assert key in comm
    assert comm["bytes_total"] == comm["bytes_up"] + comm["bytes_down"]
    assert m.run_log_.participants == list(range(len(devices)))
    assert isinstance(m.seed_, int)


def test_predict_is_nearest_center(fed, fitted):
    devices, _, _ = fed
    rng = np.random.default_rng(1)
    Xq = rng.normal(size=(30, D)) * 10
    np.testing.assert_array_equal(fitted.predict(Xq),
                                  cdist(Xq, fitted.cluster_centers_).argmin(axis=1))
    # on well-separated data the induced labels are the nearest final centers
    for X, lab in zip(devices, fitted.device_labels_):
        np.testing.assert_array_equal(fitted.predict(X), lab)


def test_fit_predict_returns_labels(fed):
    devices, _, _ = fed
    labs = KFed(K, KL, random_state=3).fit_predict(devices)
    ref = KFed(K, KL, random_state=3).fit(devices)
    assert isinstance(labs, np.ndarray) and labs.shape == (sum(len(X) for X in devices),)
    np.testing.assert_array_equal(labs, ref.labels_)
    np.testing.assert_array_equal(labs, np.concatenate(ref.device_labels_))


# ------------------------------------------------------------------ accuracy

def test_structured_federation_accuracy_one(fed, fitted):
    _, labels, _ = fed
    assert matched_accuracy(np.concatenate(labels), fitted.labels_) == 1.0


@pytest.mark.parametrize("server", ["farthest-lloyd1", "farthest-lloyd", "single-linkage"])
@pytest.mark.parametrize("weighted", [False, True])
def test_all_server_methods_accuracy_one(fed, server, weighted):
    devices, labels, _ = fed
    m = KFed(K, KL, server=server, weighted=weighted, random_state=1).fit(devices)
    assert matched_accuracy(np.concatenate(labels), m.labels_) == 1.0


@pytest.mark.parametrize("first_device", ["widest", "random", 0, 7])
def test_first_device_options(fed, first_device):
    devices, labels, _ = fed
    m = KFed(K, KL, server="farthest-lloyd1", first_device=first_device, random_state=2).fit(devices)
    assert matched_accuracy(np.concatenate(labels), m.labels_) == 1.0
    if isinstance(first_device, int):
        assert m.seed_device_ == first_device


def test_per_device_n_local_clusters():
    rng = np.random.default_rng(4)
    means = 12 * rng.normal(size=(6, 10))
    comps = [[0, 1], [2, 3, 4], [5], [0, 2, 4, 5], [1, 3, 5]]
    devices, truth = [], []
    for c in comps:
        X, y = blobs(25, means[c], rng)
        devices.append(X)
        truth.append(np.asarray(c)[y])
    k_local = [len(c) for c in comps]
    m = KFed(6, k_local, server="farthest-lloyd1", random_state=0).fit(devices)
    assert [lc.shape[0] for lc in m.local_centers_] == k_local
    assert matched_accuracy(np.concatenate(truth), m.labels_) == 1.0
    assert m.communication_["bytes_up"] == sum(k * (10 + 1) * 8 for k in k_local)


# ------------------------------------------------------------------ one device = centralized

@pytest.mark.parametrize("seed", [0, 5])
def test_single_device_equals_lloyd_from_same_init(seed):
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(5, 6))  # overlapping: Lloyd has work to do
    X, _ = blobs(40, means, rng)
    m = KFed(5, 5, server="farthest-lloyd1", random_state=seed).fit([X])
    theta = _spectral_seed(X, 5, device_rng(seed, 0, 0), project=True,
                           uniforms=device_uniforms(seed, [0], 0, n_uniforms(5))[0])
    km = KMeans(5, init=theta, n_init=1, algorithm="lloyd", tol=1e-4).fit(X)
    assert adjusted_rand_score(km.labels_, m.device_labels_[0]) == 1.0
    np.testing.assert_allclose(sorted_rows(m.cluster_centers_), sorted_rows(km.cluster_centers_),
                               rtol=1e-9, atol=1e-9)
    # server with k' = k centers and k clusters leaves them as they are
    np.testing.assert_array_equal(sorted_rows(m.cluster_centers_),
                                  sorted_rows(m.local_centers_[0]))


def test_single_device_matches_sklearn_best_of_10():
    rng = np.random.default_rng(6)
    means = 10 * rng.normal(size=(6, 8))
    X, y = blobs(50, means, rng)
    m = KFed(6, 6, server="farthest-lloyd1", random_state=0).fit([X])
    km = KMeans(6, n_init=10, random_state=0).fit(X)
    lab = m.device_labels_[0]
    assert adjusted_rand_score(km.labels_, lab) == 1.0
    assert adjusted_rand_score(y, lab) == 1.0
    inertia = ((X - m.cluster_centers_[lab]) ** 2).sum()
    assert inertia == pytest.approx(km.inertia_, rel=1e-8)


def test_single_cluster():
    X = np.random.default_rng(7).normal(size=(40, 3))
    m = KFed(1, 1, random_state=0).fit([X[:20], X[20:]])
    np.testing.assert_allclose(m.cluster_centers_[0], X.mean(axis=0), atol=1e-12)
    assert all((lab == 0).all() for lab in m.device_labels_)


# ------------------------------------------------------------------ invariances

def test_device_order_invariance(fed, fitted):
    devices, _, _ = fed
    perm = np.random.default_rng(8).permutation(len(devices))
    m = KFed(K, KL, server="farthest-lloyd1", random_state=0).fit([devices[i] for i in perm], device_ids=perm.tolist())
    np.testing.assert_array_equal(sorted_rows(m.cluster_centers_),
                                  sorted_rows(fitted.cluster_centers_))
    # same physical device -> same labels, up to the (shared) row order of the centers
    relabel = {}
    for pos, z in enumerate(perm):
        a = fitted.device_labels_[z]
        b = m.device_labels_[pos]
        for i, j in zip(a.tolist(), b.tolist()):
            assert relabel.setdefault(i, j) == j
        np.testing.assert_array_equal(fitted.local_centers_[z], m.local_centers_[pos])
    for i, j in relabel.items():
        np.testing.assert_array_equal(fitted.cluster_centers_[i], m.cluster_centers_[j])


def test_same_seed_same_result(fed, fitted):
    devices, _, _ = fed
    again = KFed(K, KL, server="farthest-lloyd1", random_state=0).fit(devices)
    np.testing.assert_array_equal(again.cluster_centers_, fitted.cluster_centers_)
    for a, b in zip(again.device_labels_, fitted.device_labels_):
        np.testing.assert_array_equal(a, b)
    # random_state=None records a seed that reproduces the run
    m = KFed(K, KL, random_state=None).fit(devices)
    r = KFed(K, KL, random_state=m.seed_).fit(devices)
    np.testing.assert_array_equal(m.cluster_centers_, r.cluster_centers_)


def test_different_seed_changes_device_streams():
    rng = np.random.default_rng(9)
    X = rng.uniform(size=(200, 3))  # no structure: the seed decides the local solution
    cs = {KFed(6, 6, random_state=s).fit([X]).cluster_centers_.round(8).tobytes()
          for s in range(4)}
    assert len(cs) > 1


def test_byte_counts_formula(fed, fitted):
    devices, _, _ = fed
    comm = fitted.communication_
    assert comm["rounds"] == 1
    assert comm["bytes_up"] == sum(KL * (D + 1) * 8 for _ in devices)
    assert comm["bytes_down"] == sum(KL * 8 for _ in devices)
    for z in range(len(devices)):
        assert comm["per_device"][str(z)] == {"up": KL * (D + 1) * 8, "down": KL * 8}


def test_float32_federation():
    devices, labels, _ = make_structured_federation(k=8, k_local=4, m0=3, d=10, n_per=15,
                                                    seed=10)
    m = KFed(8, 4, server="farthest-lloyd1", random_state=0).fit(
        [X.astype(np.float32) for X in devices])
    assert m.cluster_centers_.dtype == np.float32
    assert matched_accuracy(np.concatenate(labels), m.labels_) == 1.0
    assert m.communication_["bytes_up"] == len(devices) * 4 * (10 * 4 + 8)


# ------------------------------------------------------------------ new devices

def test_assign_device_held_out(fed):
    devices, labels, means = fed
    m = KFed(K, KL, random_state=0).fit(devices)
    before = m.cluster_centers_.copy()
    mapping = _label_map(np.concatenate(labels), m.labels_)
    rng = np.random.default_rng(11)
    comps = np.arange(8, 12)  # group 2
    y = np.repeat(comps, 15)
    Xn = means[y] + rng.standard_normal((len(y), D))
    lab = m.assign_device(Xn, KL)
    assert lab.shape == (len(y),)
    np.testing.assert_array_equal(np.array([mapping[int(v)] for v in lab]), y)
    np.testing.assert_array_equal(m.cluster_centers_, before)
    assert m.device_labels_[-1] is lab or np.array_equal(m.device_labels_[-1], lab)
    assert len(m.device_labels_) == len(devices) + 1
    # the other devices are untouched
    for a, b in zip(m.device_labels_[:-1], KFed(K, KL, random_state=0).fit(devices).device_labels_):
        np.testing.assert_array_equal(a, b)


def test_assign_device_wrong_d(fitted):
    with pytest.raises(ValidationError, match="features"):
        fitted.assign_device(np.zeros((20, D + 1)), KL)


# ------------------------------------------------------------------ validation

def _good(n=20, d=3, seed=0):
    return np.random.default_rng(seed).normal(size=(n, d))


def _bad_fit(devices, *frags, k=2, kl=2):
    with pytest.raises(ValidationError) as exc:
        KFed(k, kl, random_state=0).fit(devices)
    assert isinstance(exc.value, ValueError)
    text = str(exc.value)
    for f in frags:
        assert f in text, text
    return text


@pytest.mark.parametrize("value,frag", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "inf")])
def test_non_finite(value, frag):
    X = _good(seed=1)
    X[4, 2] = value
    _bad_fit([_good(), X], "device 1", frag, "(4, 2)")


def test_empty_device():
    _bad_fit([_good(), np.empty((0, 3))], "device 1", "0 points")


def test_too_few_points():
    _bad_fit([_good(), _good(n=2)], "device 1", "n_z=2", "n_local_clusters=2",
             "allow_raw_points")


def test_too_few_points_allowed_with_raw_points():
    rng = np.random.default_rng(12)
    means = 20 * rng.normal(size=(2, 3))
    X0, _ = blobs(10, means, rng)
    X1 = means + 0.01 * rng.normal(size=(2, 3))  # n_z = 2 = k_z
    m = KFed(2, 2, allow_raw_points=True, random_state=0).fit([X0, X1])
    np.testing.assert_array_equal(m.local_centers_[1], X1)
    assert m.device_labels_[1].shape == (2,)


def test_different_d():
    _bad_fit([_good(d=3), _good(d=4)], "device 1", "4 features", "device 0 has 3")


def test_sum_k_local_below_k():
    _bad_fit([_good(), _good()], "sum(n_local_clusters)=4", "n_clusters=5", k=5, kl=2)


@pytest.mark.parametrize("bad", [np.array([["a", "b", "c"]] * 5),
                                 np.array([[1.0, "x", 2.0]] * 5, dtype=object)])
def test_non_numeric(bad):
    _bad_fit([_good(), bad], "device 1", "dtype")


@pytest.mark.parametrize("k", [0, -3])
def test_bad_k(k):
    _bad_fit([_good()], f"n_clusters={k}", k=k, kl=2)


@pytest.mark.parametrize("kl", [0, -1, [2, 0]])
def test_bad_k_local(kl):
    _bad_fit([_good(), _good(seed=1)], "n_local_clusters", k=2, kl=kl)


def test_k_local_list_wrong_length():
    _bad_fit([_good(), _good(seed=1)], "3 values", "2 devices", k=2, kl=[1, 1, 1])


def test_one_d_device():
    _bad_fit([_good(), np.arange(10.0)], "device 1", "2-D", "(10,)")


def test_empty_device_list():
    _bad_fit([], "empty")


def test_single_array_is_one_device():
    X = _good(n=40)
    one = KFed(2, 3, random_state=0).fit(X)
    ref = KFed(2, 3, random_state=0).fit([X])
    np.testing.assert_array_equal(one.cluster_centers_, ref.cluster_centers_)
    np.testing.assert_array_equal(one.labels_, ref.labels_)
    assert len(one.device_labels_) == 1


def test_three_d_array_refused():
    _bad_fit(np.zeros((2, 5, 3)), "2-D", "(2, 5, 3)")


def test_bad_device_ids():
    _bad_fit_ids = lambda ids: KFed(2, 2).fit([_good(), _good(seed=1)], device_ids=ids)
    for ids in ([0, 0], [0], [0, -1]):
        with pytest.raises(ValidationError):
            _bad_fit_ids(ids)


def test_bad_server_option():
    with pytest.raises(ValidationError, match="server"):
        KFed(2, 2, server="kmeans").fit([_good()])


def test_predict_before_fit():
    with pytest.raises(NotFittedError):
        KFed(2, 2).predict(_good())
    with pytest.raises(NotFittedError):
        KFed(2, 2).assign_device(_good())
    assert issubclass(NotFittedError, fedclust.FedClustError)


def test_predict_wrong_d(fitted):
    with pytest.raises(ValidationError) as exc:
        fitted.predict(np.zeros((4, D + 2)))
    assert str(D + 2) in str(exc.value) and str(D) in str(exc.value)


def test_predict_bad_values(fitted):
    X = np.zeros((4, D))
    X[1, 3] = np.nan
    with pytest.raises(ValidationError, match="nan"):
        fitted.predict(X)
