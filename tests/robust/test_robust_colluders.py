"""Colluding groups with data of their own (tight, consistent, well-formed) against the 3-stage
pipeline and the robust clustering: constructions other than the benchmark's (d, k, m, α,
distances, seeds)."""

import numpy as np
import pytest

from fedclust.core.random import server_rng
from fedclust.robust import (RobustClusteredRegression, TrimmedKMeans, estimation_error,
                             make_mixture_regression, misclustering_rate)
from fedclust.robust.init import coincident_groups, supported_groups
from fedclust.robust.local import local_erm
from fedclust.sim.byzantine import poison_devices


def _run(mr, ys, clusters, seed, **kw):
    truth = np.hstack([mr.coef, mr.intercept[:, None]])
    out = {}
    for name, conf in (("plain", dict(clustering="kmeans", aggregator="mean")), ("robust", {})):
        r = RobustClusteredRegression(len(truth), rounds=8, random_state=seed, **conf, **kw).fit(
            mr.Xs, ys)
        out[name] = (estimation_error(np.hstack([r.coef_, r.intercept_[:, None]]), truth),
                     misclustering_rate(r.device_clusters_, clusters), r)
    return out


@pytest.mark.parametrize("m, d, k, alpha, far, seed", [
    (200, 8, 4, 0.12, 20.0, 3),
    (150, 6, 2, 0.2, 6.0, 8),
])
def test_coordinated_far_group_is_left_out(m, d, k, alpha, far, seed):
    mr = make_mixture_regression(m, 30, d, k, alpha=0.0, noise=0.3, random_state=seed)
    rng = np.random.default_rng(seed)
    target = far * rng.normal(size=d)
    poisoned, bad = poison_devices(list(zip(mr.Xs, mr.ys)), alpha, seed, attack="coordinated",
                                   target=target)
    clusters = mr.clusters.copy()
    clusters[bad] = -1
    res = _run(mr, [y for _, y in poisoned], clusters, seed, beta=alpha + 0.1)
    assert res["robust"][0] <= 0.47 * res["plain"][0]          # gain >= 53%
    assert res["robust"][1] <= 0.02
    assert (res["robust"][2].device_clusters_[bad] == -1).all()


def test_colluders_next_to_a_true_cluster_do_not_pollute_it():
    seed = 17
    mr = make_mixture_regression(210, 40, 9, 3, alpha=0.0, noise=0.5, random_state=seed)
    erm_spread = 0.5 * np.sqrt(10 / 40)
    u = np.random.default_rng(1).normal(size=9)
    target = mr.coef[1] + 4.0 * erm_spread * u / np.linalg.norm(u)
    poisoned, bad = poison_devices(list(zip(mr.Xs, mr.ys)), 0.15, seed, attack="coordinated",
                                   target=target)
    clusters = mr.clusters.copy()
    clusters[bad] = -1
    res = _run(mr, [y for _, y in poisoned], clusters, seed, beta=0.25)
    assert res["robust"][0] <= 0.47 * res["plain"][0]
    assert res["robust"][1] <= 0.02


def test_supported_groups_leave_out_a_smaller_group_and_nothing_on_clean_data():
    rng = np.random.default_rng(5)
    honest = np.concatenate([c + 0.3 * rng.normal(size=(60, 3))
                             for c in ([0, 0, 0], [6, 0, 0], [0, 6, 0])])
    lab, suspect = supported_groups(honest, coincident_groups(honest), 3, server_rng(0, 0))
    assert not suspect.any() and (lab >= 0).all()
    assert len(set(zip(lab, np.repeat(np.arange(3), 60)))) == 3
    group = np.array([40.0, 40.0, 0.0]) + 0.3 * rng.normal(size=(25, 3))
    P = np.vstack([honest, group])
    lab, suspect = supported_groups(P, coincident_groups(P), 3, server_rng(0, 0))
    assert suspect[180:].all() and not suspect[:180].any()
    assert (lab[180:] >= 3).all() and (lab[:180] < 3).all()


def test_trimmed_kmeans_holds_the_spare_group_out():
    rng = np.random.default_rng(6)
    X = np.concatenate([c + rng.normal(size=(80, 5)) for c in np.eye(5)[:3] * 12]
                       + [np.full(5, 60.0) + rng.normal(size=(30, 5))])
    est = TrimmedKMeans(3, random_state=0).fit(X)
    assert not est.inlier_mask_[240:].any() and est.suspect_mask_[240:].all()
    truth = np.repeat(np.arange(3), 80)
    assert misclustering_rate(est.labels_[:240], truth) == 0.0


def test_coordinated_poisoning_keeps_honest_sized_noise():
    mr = make_mixture_regression(40, 50, 5, 2, alpha=0.0, noise=1.0, random_state=2)
    target = np.arange(5.0)
    poisoned, bad = poison_devices(list(zip(mr.Xs, mr.ys)), 0.25, 2, attack="coordinated",
                                   target=target)
    assert len(bad) == 10
    for z in range(40):
        if z not in bad:
            assert poisoned[z][1] is mr.ys[z]
    W = np.array([local_erm(X, y, fit_intercept=False) for X, y in poisoned])[bad][:, :5]
    spread = np.linalg.norm(W - target, axis=1)
    # ERMs around the target at the honest noise scale (sqrt(p / n) = 0.32), none coinciding
    assert 0.1 < np.median(spread) < 0.6
    assert len(np.unique(coincident_groups(W))) == len(bad)


def _heavy_tailed_with_colluders(seed, n_colluders, d=6):
    rng = np.random.default_rng(seed)
    means = 8.0 * rng.normal(size=(3, d))
    X = [means[j] + rng.standard_t(3, size=(s, d)) for j, s in enumerate((90, 50, 60))]
    u = rng.normal(size=d)
    X.append(means.mean(0) + 40.0 * u / np.linalg.norm(u) + 1.2 * rng.normal(size=(n_colluders, d)))
    return np.vstack(X), np.repeat([0, 1, 2, -1], (90, 50, 60, n_colluders))


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_a_tight_group_beyond_k_does_not_make_two_true_clusters_one(seed):
    # heavy-tailed honest clusters (Student t, 3 dof), two of them 11-14 apart with median
    # radius 3; a tight colluding group of 40 far away: plain k-means gives the colluders a
    # centre and joins the two, at a capped cost close to leaving the colluders out
    X, lab = _heavy_tailed_with_colluders(seed, 40)
    est = TrimmedKMeans(3, random_state=seed).fit(X)
    assert misclustering_rate(est.labels_, lab) <= 0.02
    assert (est.labels_[lab == -1] == est.labels_[lab == -1][0]).all() or \
        not est.inlier_mask_[lab == -1].any()


def test_a_true_cluster_whose_tail_is_not_dense_outranks_a_smaller_tight_group():
    # the smallest true cluster (50, 3 of them outside the dense core) against 48 colluders
    # that are all dense: support counts the tail within the trimming radius
    rng = np.random.default_rng(4)
    P = np.vstack([rng.normal(size=(90, 4)), [12, 0, 0, 0] + rng.normal(size=(60, 4)),
                   [0, 12, 0, 0] + rng.normal(size=(47, 4)), [0, 40, 0, 0] + rng.normal(size=(48, 4))])
    tail = [0, 12, 0, 0] + 2.2 * np.eye(4)[[0, 2, 3]] * [[1], [1], [-1]]
    spot = np.arange(len(P) + 3)
    lab, suspect = supported_groups(P, spot[:len(P)], 3, server_rng(0, 0), extra=tail,
                                    extra_spot=spot[len(P):])
    assert (lab[-48:] >= 3).all() and suspect[-48:].all()
    assert len(np.unique(lab[150:197])) == 1 and lab[150] < 3


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_trimmed_kmeans_centre_trims_a_tight_group_inside_the_radius(seed):
    # 36 tight liars 2.5 sqrt(d) from a true centre (inside the trimming radius, too few to be
    # dense): the kept mean is trimmed along their direction, ending close to the honest fit
    # (the coordinate-wise mean of the kept points lands 0.5-0.9 further off)
    rng = np.random.default_rng(seed + 50)
    d, k, n = 6, 3, 450
    means = 8.0 * rng.normal(size=(k, d))
    lab = rng.integers(0, k, n)
    X = means[lab] + rng.normal(size=(n, d))
    u = rng.normal(size=d)
    liars = means[1] + 2.5 * np.sqrt(d) * u / np.linalg.norm(u) + 0.5 * rng.normal(size=(36, d))
    honest = estimation_error(TrimmedKMeans(k, random_state=seed).fit(X).cluster_centers_, means)
    est = TrimmedKMeans(k, random_state=seed).fit(np.vstack([X, liars]))
    assert estimation_error(est.cluster_centers_, means) <= honest + 0.3


def test_coordinated_poisoning_noise_matches_the_honest_erm_spread():
    # least-squares residuals are smaller than the noise (n - p of n degrees of freedom): the
    # liars' residuals are rescaled, so their ERMs scatter around the target as honest ERMs
    # scatter around their cluster's coefficients (n = 20, p = 8: unscaled, about 0.75 of it)
    mr = make_mixture_regression(200, 20, 8, 2, alpha=0.0, noise=1.0, random_state=5)
    target = np.full(8, 3.0)
    poisoned, bad = poison_devices(list(zip(mr.Xs, mr.ys)), 0.25, 5, attack="coordinated",
                                   target=target)
    W = np.array([local_erm(X, y) for X, y in poisoned])[:, :8]
    good = np.setdiff1d(np.arange(200), bad)
    honest = np.median(np.linalg.norm(W[good] - mr.coef[mr.clusters[good]], axis=1))
    liars = np.median(np.linalg.norm(W[bad] - target, axis=1))
    assert 0.85 < liars / honest < 1.18
