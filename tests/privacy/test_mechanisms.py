"""The mechanisms' building blocks: clipping at the bound, and Gaussian noise that is
centred, independent per entry, present at every std > 0 and keyed per stream."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.privacy import (clip_contribution, clip_points, gaussian, noise_rng,
                              symmetric_gaussian)


def test_one_row_over_the_bound_is_clipped_and_counted():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [30.0, 40.0]])
    Xc, n = clip_points(X, 5.0)
    assert n == 1
    np.testing.assert_array_equal(Xc[:2], X[:2])          # on or inside: untouched
    np.testing.assert_allclose(Xc[2], [3.0, 4.0])
    Xc, n = clip_points(X[:2], 5.0)
    assert n == 0 and np.array_equal(Xc, X[:2])


def test_a_contribution_on_the_bound_is_not_clipped():
    (a, b), clipped = clip_contribution([np.array([3.0]), np.array([2.0])], [1.0, 2.0], 5.0)
    assert not clipped
    np.testing.assert_array_equal(a, [3.0])
    (a, b), clipped = clip_contribution([np.array([3.0]), np.array([2.0])], [1.0, 2.0], 2.5)
    assert clipped
    np.testing.assert_allclose([a[0], 2.0 * b[0]], [1.5, 2.0])


@pytest.mark.parametrize("std", [0.5, 1.0, 3.0])
def test_gaussian_noise_is_centred_independent_and_of_the_given_std(std):
    x = np.zeros((400, 50))
    y = gaussian(x, std, noise_rng(7))
    assert y.shape == x.shape
    assert abs(y.mean()) < 4 * std / np.sqrt(y.size)
    assert y.std() == pytest.approx(std, rel=0.02)
    # entries are independent: the 50 columns are uncorrelated
    C = np.corrcoef(y.T)
    assert np.abs(C[np.triu_indices(50, 1)]).max() < 0.25
    assert np.array_equal(gaussian(x, 0.0, noise_rng(7)), x)


@pytest.mark.parametrize("std", [0.5, 1.0])
def test_symmetric_noise_is_centred_independent_on_the_upper_triangle(std):
    d = 6
    draws = np.stack([symmetric_gaussian(np.eye(d), std, noise_rng(s)) for s in range(600)])
    E = draws - np.eye(d)
    np.testing.assert_array_equal(E, np.swapaxes(E, 1, 2))
    iu = np.triu_indices(d)
    U = E[:, iu[0], iu[1]]
    assert np.abs(U.mean(axis=0)).max() < 5 * std / np.sqrt(600)
    assert U.std(axis=0) == pytest.approx(np.full(U.shape[1], std), rel=0.12)
    C = np.corrcoef(U.T)
    assert np.abs(C[np.triu_indices(U.shape[1], 1)]).max() < 0.2


def test_noise_streams_differ_by_key_and_repeat_by_seed():
    a = noise_rng(3, 0, 1).normal(size=5)
    assert np.array_equal(a, noise_rng(3, 0, 1).normal(size=5))
    assert not np.array_equal(a, noise_rng(3, 1, 1).normal(size=5))
    assert not np.array_equal(a, noise_rng(3, 0, 2).normal(size=5))
    assert not np.array_equal(a, noise_rng(4, 0, 1).normal(size=5))
    # unseeded: the cryptographic sampler, two draws differ
    zero = np.zeros(5)
    assert not np.array_equal(gaussian(zero, 1.0, noise_rng(None)),
                              gaussian(zero, 1.0, noise_rng(None)))


# -- post-processing of the candidate release (fedclust.privacy.kmeans) -----------------
def test_candidates_below_the_count_threshold_are_dropped_and_the_rest_weighted():
    from fedclust.privacy import kmeans as pk

    sums = np.array([[5.0, 0.0], [0.5, 0.5], [0.0, 6.0], [10.0, 10.0]])
    counts = np.array([5.0, 0.5, 3.0, 2.5])
    # k = 1: candidates 0 and 2 (counts >= 3) are averaged with weights 5 and 3
    C, w = pk.centers_from_candidates(sums, counts, 1, bound=None, min_count=3.0, seed=0)
    np.testing.assert_allclose(C, [[5.0 / 8.0, 6.0 / 8.0]], atol=1e-9)
    np.testing.assert_allclose(w, [8.0])
    # too few above the threshold: the k largest counts are kept, whatever they are
    C, w = pk.centers_from_candidates(sums, counts, 2, bound=None, min_count=10.0, seed=0)
    order = np.argsort(w)
    np.testing.assert_allclose(C[order], [[0.0, 2.0], [1.0, 0.0]])
    np.testing.assert_allclose(w[order], [3.0, 5.0])
    # a kept count below 1 still divides its sum
    C, w = pk.centers_from_candidates(sums[:2], np.array([0.5, 0.25]), 2, bound=None,
                                      min_count=10.0, seed=0)
    np.testing.assert_allclose(C, [[10.0, 0.0], [2.0, 2.0]])
    # centroids outside the data ball are pulled onto it, along their direction
    C, _ = pk.centers_from_candidates(np.array([[30.0, 40.0], [0.3, 0.4]]), np.ones(2), 2,
                                      bound=5.0, min_count=0.5, seed=0)
    np.testing.assert_allclose(C, [[3.0, 4.0], [0.3, 0.4]])


def test_private_local_centers_noise_each_statistic_with_its_own_release(monkeypatch):
    from fedclust.privacy import DifferentialPrivacy, calibrate
    from fedclust.privacy import kmeans as pk

    spec = DifferentialPrivacy(1.0, 1e-6, data_bound=3.0)
    rels = calibrate(spec, [pk.moments_release(spec), pk.sums_release(spec, 2)]).releases
    used = {}
    real_m, real_s = pk.noisy_moments, pk.noisy_cluster_sums
    monkeypatch.setattr(pk, "noisy_moments", lambda *a: used.setdefault("m", a[3]) and real_m(*a))
    monkeypatch.setattr(pk, "noisy_cluster_sums",
                        lambda *a: used.setdefault("s", (a[2], a[0].shape)) and real_s(*a))
    X = clip_points(np.random.default_rng(0).normal(size=(400, 4)) * 2, 3.0)[0]
    centers, _ = pk.private_local_centers(X, 2, spec, rels, np.random.default_rng(1),
                                          noise_rng(2), seed=3)
    assert used["m"] is rels[0]
    assert used["s"][0] is rels[1] and used["s"][1][1] == 2    # sums in the top-2 subspace
    assert centers.shape == (2, 4)


def test_gaussian_subspace_is_the_covariance_eigendecomposition():
    from fedclust.privacy import kmeans as pk

    rng = np.random.default_rng(8)
    X = rng.normal(size=(500, 4)) * [3.0, 1.0, 0.3, 0.05] + [10.0, -5.0, 2.0, 0.0]
    n, s, Q = pk.device_moments(X, None)
    mean, V, lam = pk.gaussian_subspace(n, s, Q, 2)
    ref_lam, ref_V = np.linalg.eigh(np.cov(X.T, bias=True))
    np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(lam, ref_lam[::-1][:2], rtol=1e-9)
    np.testing.assert_allclose(np.abs(V.T @ ref_V[:, ::-1][:, :2]), np.eye(2), atol=1e-9)
    # small variances are kept as they are (only negative noise is cut at 0)
    _, _, lam4 = pk.gaussian_subspace(n, s, Q, 4)
    np.testing.assert_allclose(lam4, ref_lam[::-1], rtol=1e-6)
    assert lam4.min() < 0.01


def test_candidate_count_and_spread():
    from fedclust.privacy import kmeans as pk

    assert pk.n_candidates(10_000, 1.0, 3) == 150            # capped at 50 k
    assert pk.n_candidates(10_000, 1.0, 3, cap=40) == 40
    assert pk.n_candidates(1_000, 10.0, 3) == 12             # 8 count stds per candidate
    assert pk.n_candidates(1_000, 1.0, 3) == 50              # at least 20 points each
    assert pk.n_candidates(10, 1.0, 3) == 3                  # never fewer than k
    lam = np.array([4.0, 0.25])
    coords = pk.draw_candidates(np.zeros(3), np.eye(3)[:, :2], lam, 4000, np.random.default_rng(0))
    assert coords.std(axis=0) == pytest.approx(np.sqrt(lam), rel=0.05)


# -- the preprocessing release (fedclust.privacy.columns) --------------------------------
def test_column_release_without_noise_gives_the_pooled_statistics():
    from fedclust.privacy import columns as pc

    rng = np.random.default_rng(9)
    low, high = np.array([0.0, -4.0, 10.0]), np.array([10.0, 4.0, 50.0])
    X = rng.uniform(low, high, size=(80, 3))
    X[rng.random(X.shape) < 0.15] = np.nan
    ok = ~np.isnan(X)
    count = ok.sum(axis=0)
    total = np.nansum(X, axis=0)
    m2 = np.nansum((X - np.nanmean(X, axis=0)) ** 2, axis=0)
    out = pc.noisy_column_moments(80, count, total, m2, low, high, 0.0, rng)
    np.testing.assert_allclose(out["mean"], np.nanmean(X, axis=0), rtol=1e-12)
    # variance over rows, a missing cell imputed at the mean (adds nothing)
    np.testing.assert_allclose(out["var"], m2 / 80, rtol=1e-12)
    np.testing.assert_array_equal(out["count"], count)
    assert out["n_rows"] == 80 and np.all(out["var_floor"] == 0)


def test_column_release_noise_is_centred_independent_with_the_documented_floor():
    from fedclust.privacy import columns as pc

    low, high = np.array([0.0, 0.0, -2.0]), np.array([4.0, 4.0, 2.0])   # w = 2, 2, 2
    count, total = np.array([500, 800, 800]), np.array([1000.0, 1600.0, 0.0])
    m2 = np.array([1000.0, 1600.0, 800.0])
    outs = [pc.noisy_column_moments(1000, count, total, m2, low, high, 3.0, noise_rng(s))
            for s in range(400)]
    means = np.array([o["mean"] for o in outs])
    rows = np.array([o["n_rows"] for o in outs], float)
    counts = np.array([o["count"] for o in outs], float)
    assert np.abs(means.mean(axis=0) - [2.0, 2.0, 0.0]).max() < 0.01
    assert abs(rows.mean() - 1000) < 4 * 3.0 / 20
    # every released coordinate has its own noise
    assert abs(np.corrcoef(rows, counts[:, 0])[0, 1]) < 0.3
    C = np.corrcoef(means.T)
    assert np.abs(C[np.triu_indices(3, 1)]).max() < 0.3
    o = outs[0]
    np.testing.assert_allclose(o["var_floor"], 4.0 * 3.0 / o["n_rows"], rtol=2e-3)
    v = np.array([x["var"] for x in outs])
    np.testing.assert_allclose(v.mean(axis=0), m2 / 1000, atol=0.02)
    assert v.max() <= 4.0                                    # never above w² = 4


def test_site_scaling_keeps_an_empty_column_finite():
    from types import SimpleNamespace

    from fedclust.privacy import columns as pc

    low, high = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    site = SimpleNamespace(count=np.array([50, 0]), total=np.array([40.0, 0.0]),
                           m2=np.array([2.0, 0.0]), n_rows=50)
    (scaled,) = pc.clip_sites([site], low, high, 5)
    f = scaled.n_rows / 50
    assert 0 < f < 1
    np.testing.assert_allclose(scaled.total, site.total * f)
    assert np.isfinite(scaled.m2).all() and np.isfinite(scaled.count).all()


def test_column_bounds_and_site_rows_are_checked_by_name():
    from fedclust.core.exceptions import ValidationError
    from fedclust.privacy import columns as pc

    with pytest.raises(ValidationError, match=r"bounds of column 'c' are \[1.0, nan\]"):
        pc.column_ranges([[0, 1], [0, 1], [1, np.nan]], 3, ["a", "b", "c"])
    with pytest.raises(ValidationError, match=r"bounds of column 2 are \[3.0, 3.0\]"):
        pc.column_ranges([[0, 1], [0, 1], [3, 3]], 3)
    with pytest.raises(ValidationError, match=r"bounds of column 0 are \[3.0, 3.0\]"):
        pc.column_ranges([[3, 3], [0, 1]], 2)
    assert pc.check_site_rows(1) == 1
    for bad in (0, True, 2.0):
        with pytest.raises(ValidationError, match="site_rows=.* must be an int >= 1"):
            pc.check_site_rows(bad)
    X = np.array([[0.0, 5.0], [np.nan, 2.0]])
    Xc, n = pc.clip_columns(X, np.array([0.0, 0.0]), np.array([1.0, 5.0]))
    assert n == 0 and Xc is X                       # values on a range's edge are inside


def test_site_scaling_matches_the_release_vector_computed_from_the_rows():
    """Device level: each site is scaled by min(1, bound / ‖v‖), with v = (rows, counts,
    Σ(x − c)/w, Σ((x − c)/w)² − count/2) computed here from the raw rows (columns with
    one value and with none included)."""
    from types import SimpleNamespace

    from fedclust.privacy import columns as pc

    rng = np.random.default_rng(11)
    low, high = np.array([0.0, -3.0, 5.0, 1.0]), np.array([2.0, 3.0, 9.0, 4.0])
    c, w = (low + high) / 2, (high - low) / 2
    site_rows = 1
    bound = site_rows * np.sqrt(1 + 2.25 * 4)
    sites, vectors = [], []
    for n in (1, 3, 6, 40):
        X = rng.uniform(low, high, (n, 4))
        X[:, 3] = np.nan                       # a column with no value
        X[1:, 1] = np.nan                      # a column with one value
        ok = ~np.isnan(X)
        count = ok.sum(axis=0)
        total = np.nansum(X, axis=0)
        mean = np.divide(total, count, out=np.zeros(4), where=count > 0)
        m2 = np.nansum((X - mean) ** 2, axis=0)
        sites.append(SimpleNamespace(count=count, total=total, m2=m2, n_rows=n))
        Z = (X - c) / w
        vectors.append(np.concatenate([[n], count, np.nansum(Z, axis=0),
                                       np.nansum(Z ** 2, axis=0) - 0.5 * count]))
    scaled = pc.clip_sites(sites, low, high, site_rows)
    n_scaled = 0
    for site, out, v in zip(sites, scaled, vectors):
        f = min(1.0, bound / np.linalg.norm(v))
        if f == 1.0:
            assert out is site
            continue
        n_scaled += 1
        assert float(out.n_rows) == pytest.approx(f * site.n_rows, rel=1e-12)
        np.testing.assert_allclose(out.count, f * site.count, rtol=1e-12)
        np.testing.assert_allclose(out.total, f * site.total, rtol=1e-12)
        np.testing.assert_allclose(out.m2, f * site.m2, rtol=1e-12)
    assert n_scaled >= 3


def test_column_release_variance_never_below_its_noise_floor_on_wide_ranges():
    """The released variance is clipped below at the Q-noise level w²·std/rows (when that
    is under w²), here where the floor exceeds 1: a constant column gives noise only."""
    from fedclust.privacy import columns as pc

    low, high = np.array([0.0, -1.0]), np.array([20.0, 1.0])   # w = 10 and 1
    count, total, m2 = np.array([100, 100]), np.array([1000.0, 0.0]), np.zeros(2)
    floors_hit = 0
    for s in range(60):
        out = pc.noisy_column_moments(100, count, total, m2, low, high, 5.0, noise_rng(s))
        floor = out["var_floor"]
        np.testing.assert_allclose(floor, np.array([100.0, 1.0]) * 5.0 / out["n_rows"], rtol=6e-3)
        lower = np.minimum(floor, (high - low) ** 2 / 4)
        assert np.all(out["var"] >= lower * (1 - 1e-12))
        floors_hit += int(out["var"][0] == pytest.approx(lower[0]))
        assert out["count"].dtype.kind == "i" and isinstance(out["n_rows"], int)
    assert floors_hit >= 10
