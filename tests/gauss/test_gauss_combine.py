"""Entropy combining of the server's components (Baudry et al. 2010), ``combine="entropy"``."""

import numpy as np
import pytest
from scipy.special import xlogy
from sklearn.mixture import GaussianMixture

from fedclust import FedGaussClustering, ValidationError
from fedclust.gauss.combine import (_ridgeline_unimodal, change_point, combine_by_entropy,
                                    combine_unimodal, entropy_path,
                                    model_points, model_posteriors)
from fedclust.gauss.model import ClusterSet, Settings
from fedclust.gauss.protocol import GaussProtocol
from fedclust.gauss.stats import moments


def _cluster_set(parts):
    """A ClusterSet whose clusters are the exact statistics of the row blocks ``parts``."""
    X = np.vstack(parts)
    D = X.shape[1]
    cs = ClusterSet(D, Settings())
    cs.set_global(*moments(X))
    mu = np.array([p.mean(0) for p in parts])
    S = np.array([(p - p.mean(0)).T @ (p - p.mean(0)) for p in parts])
    n = np.array([len(p) for p in parts], float)
    cs.add(mu, S, n, np.zeros(len(parts), np.int64), np.zeros(len(parts), np.int64))
    return cs


def _sklearn_mixture(cs):
    """scikit-learn's GaussianMixture holding exactly the model of ``cs``."""
    C = cs.C
    cov = cs.covariance(np.arange(C))
    gm = GaussianMixture(C, covariance_type="full")
    gm.weights_ = cs.n[:C] / cs.n[:C].sum()
    gm.means_ = cs.mu[:C].copy()
    gm.covariances_ = cov
    gm.precisions_cholesky_ = np.linalg.cholesky(np.linalg.inv(cov))
    return gm


def _three_clusters(seed=0):
    """Rows of three separated 2-D Gaussians; the first is cut in two halves at its mean."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(1200, 2))
    B = rng.normal(size=(800, 2)) * 0.7 + [12.0, 0.0]
    C = rng.normal(size=(900, 2)) * 1.2 + [0.0, 14.0]
    return [A[A[:, 0] < 0], A[A[:, 0] >= 0], B, C], (A, B, C)


def test_posteriors_are_scikit_learns_on_the_same_model():
    parts, _ = _three_clusters(1)
    cs = _cluster_set(parts)
    pts, w = model_points(cs, n_points=256)
    T, weight = model_posteriors(cs, n_points=256)
    assert T.shape == (4 * 256, 4)
    np.testing.assert_array_equal(weight, w)
    np.testing.assert_allclose(weight.reshape(4, 256).sum(1), cs.n[:4])
    np.testing.assert_allclose(T, _sklearn_mixture(cs).predict_proba(pts), atol=1e-10)
    # each component's points have its mean and covariance (quasi-random: close)
    cov = cs.covariance(np.arange(4))
    for k in range(4):
        P = pts[k * 256:(k + 1) * 256]
        scale = np.sqrt(np.diag(cov[k]))
        np.testing.assert_allclose(P.mean(0), cs.mu[k], atol=0.05 * scale.max())
        np.testing.assert_allclose(np.cov(P.T), cov[k], atol=0.1 * cov[k].max())


def test_expected_entropy_matches_monte_carlo_with_scikit_learn():
    """The quasi-random estimate of the posterior entropy summed over the rows the model
    describes, against plain Monte Carlo with scikit-learn's predict_proba."""
    parts, _ = _three_clusters(2)
    cs = _cluster_set(parts)
    T, weight = model_posteriors(cs)
    ours = -(weight[:, None] * xlogy(T, T)).sum()
    gm = _sklearn_mixture(cs)
    X, _ = gm.sample(200_000)
    R = gm.predict_proba(X)
    ref = -xlogy(R, R).sum(axis=1).mean() * cs.n[:cs.C].sum()
    assert ref > 100.0   # the two halves overlap: a real entropy, not a tie at zero
    assert ours == pytest.approx(ref, rel=0.03)


def test_entropy_path_takes_the_largest_drop_and_sums_the_columns():
    rng = np.random.default_rng(3)
    T = rng.dirichlet(np.full(5, 0.4), size=300)
    w = rng.uniform(0.5, 2.0, size=300)
    merges, ent = entropy_path(T, w)
    assert len(merges) == 4 and ent.shape == (5,)
    cols = [T[:, [k]] for k in range(5)]
    for j, (a, b) in enumerate(merges):
        M = np.hstack(cols)
        assert ent[j] == pytest.approx(-(w[:, None] * xlogy(M, M)).sum())
        # brute force: every pair's entropy after summing its two columns
        best = None
        for p in range(len(cols)):
            for q in range(p + 1, len(cols)):
                s = cols[p] + cols[q]
                rest = [c for i, c in enumerate(cols) if i not in (p, q)]
                M2 = np.hstack(rest + [s])
                e = -(w[:, None] * xlogy(M2, M2)).sum()
                if best is None or e < best[0]:
                    best = (e, p, q)
        assert (a, b) == best[1:]
        cols[a] = cols[a] + cols[b]
        del cols[b]
    assert ent[-1] == pytest.approx(0.0, abs=1e-12)


def test_change_point_of_a_hand_curve():
    # steep from K = 9 to 6 (slope 40), flat below (slope 1): the break is at K = 6
    K = np.arange(9, 0, -1)
    ent = np.where(K >= 6, 5.0 + 40.0 * (K - 6), 5.0 - (6 - K) * 1.0)
    assert change_point(ent) == 6
    assert change_point(np.array([3.0, 0.0])) == 2   # too short to fit two segments


def test_halves_of_one_gaussian_combine_and_separated_ones_do_not():
    parts, (A, B, C) = _three_clusters(4)
    cs = _cluster_set(parts)
    uids = cs.uid[:4].copy()
    assert combine_by_entropy(cs) == 1
    assert cs.C == 3
    # the combined cluster is exactly the whole first Gaussian's statistics
    for rows in (A, B, C):
        k = int(np.argmin(np.linalg.norm(cs.mu[:3] - rows.mean(0), axis=1)))
        assert cs.n[k] == len(rows)
        np.testing.assert_allclose(cs.mu[k], rows.mean(0), atol=1e-10)
        d = rows - rows.mean(0)
        np.testing.assert_allclose(cs.S[k], d.T @ d, rtol=1e-10, atol=1e-8)
    # the second half's identity maps to the first's
    assert cs.joined[int(uids[1])] == int(uids[0])


def test_separated_clusters_stay_apart_with_one_split():
    """Five separated Gaussians, the first cut in two halves: the halves combine, the
    Gaussians the data separates do not."""
    rng = np.random.default_rng(5)
    centres = np.array([[0, 0], [15, 0], [0, 15], [15, 15], [30, 0]], float)
    parts = [rng.normal(size=(400, 2)) + c for c in centres]
    half = parts[0]
    parts = [half[half[:, 1] < 0], half[half[:, 1] >= 0]] + parts[1:]
    cs = _cluster_set(parts)
    combine_by_entropy(cs)
    assert cs.C == 5


def test_federated_fit_with_combine_and_settings_checks():
    parts, (A, B, C) = _three_clusters(6)
    X = np.vstack([A, B, C])
    owners = np.array_split(np.random.default_rng(0).permutation(X), 3)
    fc = FedGaussClustering(random_state=0, combine="entropy").fit(owners)
    assert fc.counts_.sum() == len(X)
    assert fc.n_clusters_ <= FedGaussClustering(random_state=0).fit(owners).n_clusters_
    with pytest.raises(ValidationError, match="combine"):
        FedGaussClustering(combine="baudry").fit(owners)
    with pytest.raises(ValidationError, match="merge_test"):
        GaussProtocol(combine="entropy", merge_test="volume")
    with pytest.raises(ValidationError, match="server='flat'"):
        FedGaussClustering(combine="unimodal", server="tree").fit(owners)
    p = GaussProtocol(combine="entropy")
    assert GaussProtocol.from_config(p.config()).combine == "entropy"


def test_forget_with_combine_equals_a_retrain():
    rng = np.random.default_rng(7)
    centres = rng.uniform(-10, 10, size=(5, 2))
    owners = [np.vstack([rng.normal(size=(int(rng.integers(60, 120)), 2)) * 0.8 + c
                         for c in centres]) for _ in range(5)]
    ids = [3, 11, 4, 20, 8]
    model = FedGaussClustering(random_state=1, combine="entropy").fit(owners, device_ids=ids)
    model.forget(devices=[4])
    kept = [i for i, z in enumerate(ids) if z != 4]
    fresh = FedGaussClustering(random_state=1, combine="entropy").fit(
        [owners[i] for i in kept], device_ids=[ids[i] for i in kept])
    for name in ("means_", "covariances_", "counts_"):
        np.testing.assert_array_equal(getattr(model, name), getattr(fresh, name))


# -- ridgeline unimodality (combine="unimodal") ---------------------------------------
def _grid_modes(w1, m1, C1, w2, m2, C2):
    """Local maxima of the 2-D mixture density on a fine grid (independent reference)."""
    from scipy.ndimage import maximum_filter
    from scipy.stats import multivariate_normal

    lo = np.minimum(m1, m2) - 4.0
    hi = np.maximum(m1, m2) + 4.0
    gx, gy = np.meshgrid(np.linspace(lo[0], hi[0], 500), np.linspace(lo[1], hi[1], 500))
    pts = np.column_stack([gx.ravel(), gy.ravel()])
    f = (w1 * multivariate_normal(m1, C1).pdf(pts)
         + w2 * multivariate_normal(m2, C2).pdf(pts)).reshape(gx.shape)
    peak = (f == maximum_filter(f, size=5)) & (f > 1e-6 * f.max())
    return int(peak[2:-2, 2:-2].sum())


def test_equal_gaussians_are_unimodal_up_to_two_standard_deviations():
    eye = np.eye(2)
    for dist, uni in ((1.9, True), (2.1, False), (0.0, True), (5.0, False)):
        assert _ridgeline_unimodal(1.0, np.zeros(2), eye, 1.0, np.array([dist, 0.0]),
                                   eye) is uni


def test_ridgeline_mode_count_matches_a_grid_search():
    rng = np.random.default_rng(11)
    checked = {True: 0, False: 0}
    for _ in range(40):
        m2 = rng.uniform(-3.5, 3.5, 2)
        A1, A2 = rng.normal(size=(2, 2, 2)) * 0.8
        C1 = A1 @ A1.T + 0.3 * np.eye(2)
        C2 = A2 @ A2.T + 0.3 * np.eye(2)
        w1, w2 = rng.uniform(0.1, 1.0, 2)
        modes = _grid_modes(w1, np.zeros(2), C1, w2, m2, C2)
        if modes not in (1, 2):
            continue
        uni = _ridgeline_unimodal(w1, np.zeros(2), C1, w2, m2, C2)
        assert uni is (modes == 1)
        checked[uni] += 1
    assert min(checked.values()) >= 5   # both outcomes are exercised


def test_a_fragment_on_a_cluster_joins_it_and_separated_clusters_do_not():
    rng = np.random.default_rng(12)
    big = rng.normal(size=(2000, 2))
    frag = rng.normal(size=(60, 2)) * 0.5 + [1.2, 0.0]   # no mode of its own
    far1 = rng.normal(size=(800, 2)) + [12.0, 0.0]
    far2 = rng.normal(size=(900, 2)) * 1.3 + [0.0, 13.0]
    cs = _cluster_set([big, frag, far1, far2])
    assert combine_unimodal(cs) == 1
    assert cs.C == 3
    joined = np.vstack([big, frag])
    k = int(np.argmin(np.linalg.norm(cs.mu[:3] - joined.mean(0), axis=1)))
    assert cs.n[k] == len(joined)
    np.testing.assert_allclose(cs.mu[k], joined.mean(0), atol=1e-10)
    d = joined - joined.mean(0)
    np.testing.assert_allclose(cs.S[k], d.T @ d, rtol=1e-10, atol=1e-8)
    # nothing unimodal left: a second call changes nothing
    assert combine_unimodal(cs) == 0


@pytest.mark.parametrize("combine", ["unimodal"])
def test_forget_with_unimodal_combine_equals_a_retrain(combine):
    rng = np.random.default_rng(8)
    centres = rng.uniform(-8, 8, size=(6, 2))
    owners = [np.vstack([rng.normal(size=(int(rng.integers(50, 110)), 2)) * 0.9 + c
                         for c in centres]) for _ in range(4)]
    ids = [5, 1, 9, 2]
    model = FedGaussClustering(random_state=2, combine=combine).fit(owners, device_ids=ids)
    model.forget(devices=[9])
    fresh = FedGaussClustering(random_state=2, combine=combine).fit(
        [owners[0], owners[1], owners[3]], device_ids=[5, 1, 2])
    for name in ("means_", "covariances_", "counts_"):
        np.testing.assert_array_equal(getattr(model, name), getattr(fresh, name))


def _combinable_federation(combine):
    """Three owners of data where the default model keeps components that ``combine``
    joins: a skewed cluster beside a blob (entropy), six overlapping blobs of varied
    widths (unimodal)."""
    if combine == "entropy":
        rng = np.random.default_rng(9)
        skew = np.column_stack([rng.exponential(1.0, 1500), rng.normal(size=1500)])
        X = np.vstack([skew, rng.normal(size=(600, 2)) * 0.5 + [9.0, 0.0]])
        return np.array_split(rng.permutation(X), 3), len(X)
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(1500, centers=6, cluster_std=[0.6, 1.0, 1.5, 0.8, 1.2, 2.0],
                      random_state=1)
    return np.array_split(np.random.default_rng(1).permutation(X), 3), len(X)


@pytest.mark.parametrize("combine", ["entropy", "unimodal"])
def test_combine_same_on_flower_and_bytes_unchanged(combine):
    from fedclust.flower import FlowerInMemoryTransport

    owners, n_rows = _combinable_federation(combine)
    base = FedGaussClustering(random_state=0).fit(owners)
    a = FedGaussClustering(random_state=0, combine=combine).fit(owners)
    b = FedGaussClustering(random_state=0, combine=combine).fit(
        owners, transport=FlowerInMemoryTransport())
    assert a.n_clusters_ < base.n_clusters_   # the step did combine something
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.counts_, b.counts_)
    assert a.counts_.sum() == n_rows
    assert a.communication_["bytes_up"] == base.communication_["bytes_up"]
