"""KFed(trim=α): the Byzantine-robust server (fedclust.kfed.robust_server)."""

import numpy as np
import pytest

from conftest import make_structured_federation, matched_accuracy
from fedclust import KFed, ValidationError
from fedclust.core.protocol import RunLog
from fedclust.flower.results import log_from_json, log_to_json
from fedclust.kfed.protocol import KFedProtocol
from fedclust.kfed.robust_server import distrusted_centers
from fedclust.sim.transport import InProcessTransport

K, KL, M0 = 8, 2, 6      # 4 groups x 6 devices = 24 devices


@pytest.fixture(scope="module")
def fed():
    devices, labels, means = make_structured_federation(k=K, k_local=KL, m0=M0, d=20, n_per=40,
                                                        sep=15.0, seed=3)
    return devices, labels, means


def _liars(n_devices, alpha, seed=0):
    return set(np.random.default_rng(seed).choice(n_devices, int(alpha * n_devices),
                                                  replace=False).tolist())


def _tamper(kind, liars, scale):
    rng = np.random.default_rng(9)
    point = rng.normal(size=20) * scale

    def tamper(z, r, arrays):
        if z not in liars:
            return arrays
        C = arrays["centers"]
        if kind == "large":
            C = rng.normal(size=C.shape) * 50 * scale
        elif kind == "flip":
            C = -C
        elif kind == "collude":
            C = np.broadcast_to(point, C.shape).copy()
        return {**arrays, "centers": C}
    return tamper


def _honest_accuracy(model, labels, liars):
    honest = [z for z in range(len(labels)) if z not in liars]
    return matched_accuracy(np.concatenate([labels[z] for z in honest]),
                            np.concatenate([model.device_labels_[z] for z in honest]))


def test_trim_zero_is_the_papers_server(fed):
    devices, _, _ = fed
    a = KFed(K, KL, random_state=1).fit(devices)
    b = KFed(K, KL, trim=0.0, random_state=1).fit(devices)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert b.run_log_.distrusted == {}


def test_clean_federation_trim_changes_nothing_that_matters(fed):
    devices, labels, means = fed
    m = KFed(K, KL, trim=0.2, random_state=1).fit(devices)
    assert matched_accuracy(np.concatenate(labels), np.concatenate(m.device_labels_)) == 1.0
    assert m.run_log_.distrusted == {}   # every true cluster is held by 6 > 4 devices


@pytest.mark.parametrize("kind", ["large", "flip", "collude"])
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_robust_server_survives_attacks_where_the_plain_one_does_not(fed, kind, alpha):
    devices, labels, means = fed
    liars = _liars(len(devices), alpha)
    scale = float(np.linalg.norm(means, axis=1).mean())
    attack = InProcessTransport(tamper=_tamper(kind, liars, scale))
    robust = KFed(K, KL, trim=alpha, random_state=1).fit(devices, transport=attack)
    assert _honest_accuracy(robust, labels, liars) == 1.0
    # the devices it distrusted are exactly the liars
    assert set(robust.run_log_.distrusted) == liars
    # final centers stay next to the true means, whatever the liars sent
    d = np.sqrt(((robust.cluster_centers_[:, None] - means[None]) ** 2).sum(-1))
    assert d.min(axis=0).max() < 1.0
    if kind == "large":   # the paper's server collapses: lies take global centers
        plain = KFed(K, KL, random_state=1).fit(devices, transport=attack)
        assert _honest_accuracy(plain, labels, liars) < 0.9


def test_bounded_influence_however_far_the_lies(fed):
    devices, labels, means = fed
    liars = _liars(len(devices), 0.1, seed=4)
    centers = []
    for far in (1e3, 1e6):
        def tamper(z, r, arrays, far=far):
            if z not in liars:
                return arrays
            return {**arrays, "centers": np.full_like(arrays["centers"], far)
                    + np.arange(arrays["centers"].shape[0])[:, None]}
        m = KFed(K, KL, trim=0.1, random_state=1).fit(devices,
                                                      transport=InProcessTransport(tamper=tamper))
        centers.append(np.sort(m.cluster_centers_, axis=0))
    np.testing.assert_allclose(centers[0], centers[1])


def test_distrust_groups_by_device_support():
    rng = np.random.default_rng(0)
    true = np.array([[0.0, 0.0], [100.0, 0.0]])
    honest = [true + rng.normal(scale=0.5, size=(2, 2)) for _ in range(8)]
    liars = [np.array([[50.0, 50.0], [50.0, 50.0]]) for _ in range(2)]  # colluding, coincide
    d = distrusted_centers(honest + liars, trim=0.2, n_clusters=2)
    assert d.n_trim == 2
    assert not d.keep[16:].any() and (d.support[16:] == 1).all()
    # honest centers: corroborated beyond t; in 2-D with 8 devices a group takes its own
    # radius (3 x median distance), so one tail center (2.3 sigma out) may be left over
    assert d.keep[:16].sum() >= 15
    assert (d.support[:16][d.keep[:16]] > d.n_trim).all()


def test_trim_parameter_checks_and_config_round_trip():
    with pytest.raises(ValidationError, match="trim=0.5 must be < 0.5"):
        KFed(2, 1, trim=0.5).fit([np.random.default_rng(0).normal(size=(10, 2))] * 3)
    with pytest.raises(ValidationError, match="trim"):
        KFedProtocol(2, 1, trim=-0.1)
    p = KFedProtocol(4, 2, trim=0.25)
    assert KFedProtocol.from_config(p.config()).trim == 0.25


def test_distrusted_devices_survive_the_run_log_codec():
    log = RunLog(participants=[1, 2], distrusted={2: "device 2: lies"})
    assert log_from_json(log_to_json(log)) == log


def test_trim_counts_a_fractional_liar_share_up():
    # 30 devices at trim = 0.05: 1.5 devices may lie, so 2 colluders (own noise, no two
    # reports coincide) must not out-vote the bound and be kept next to 4 true clusters
    rng = np.random.default_rng(3)
    true = 20.0 * rng.normal(size=(4, 5))
    honest = [true + 0.3 * rng.normal(size=(4, 5)) for _ in range(28)]
    far = 200.0 * np.ones(5) + 20.0 * rng.normal(size=(4, 5))
    liars = [far + 0.3 * rng.normal(size=(4, 5)) for _ in range(2)]
    d = distrusted_centers(honest + liars, trim=0.05, n_clusters=4)
    assert d.n_trim == 2
    assert not d.keep[4 * 28:].any()
    assert d.keep[:4 * 28].all()


def test_weighted_trimmed_server_weighs_each_center_by_its_count():
    """Ten honest devices, two 1-D groups; device 9's center near 0 holds 1000 points,
    every other center 1. The count-weighted 10 %-trimmed mean of the group near 0 keeps
    only device 9's mass (it holds more than 80 % of the weight): 0.09 exactly; without
    weights it is the middle devices' mean."""
    from fedclust.kfed.server import aggregate_centers

    centers = [np.array([[0.01 * z], [100.0 + 0.01 * z]]) for z in range(10)]
    counts = [np.array([1000 if z == 9 else 1, 1]) for z in range(10)]
    rng = np.random.default_rng(0)
    got = aggregate_centers(centers, 2, counts=counts, weighted=True, trim=0.1, rng=rng)
    low = got.centers[np.argmin(got.centers[:, 0]), 0]
    assert low == pytest.approx(0.09, abs=1e-12)
    plain = aggregate_centers(centers, 2, counts=counts, trim=0.1, rng=rng)
    assert 0.03 < plain.centers[:, 0].min() < 0.06
    with pytest.raises(ValidationError, match=r"^weighted=True needs the devices' counts$"):
        aggregate_centers(centers, 2, weighted=True, trim=0.1)


def test_trimmed_server_keeps_a_chosen_first_device_when_it_is_trusted():
    from fedclust.kfed.server import aggregate_centers

    rng = np.random.default_rng(1)
    centers = [np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]) + rng.normal(0, 0.3, (3, 2))
               for _ in range(8)]
    centers.append(np.full((3, 2), 500.0) + rng.normal(0, 1.0, (3, 2)))   # a lone liar
    got = aggregate_centers(centers, 3, trim=0.2, first_device=5)
    assert got.seed_device == 5
    widest = aggregate_centers(centers, 3, trim=0.2)
    assert aggregate_centers(centers, 3, trim=0.2, first_device=8).seed_device \
        == widest.seed_device != 8        # the liar is not kept: the default choice instead


def _three_groups(n_devices=8, liar=True, seed=1):
    rng = np.random.default_rng(seed)
    base = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    centers = [base[rng.permutation(3)] + rng.normal(0, 0.3, (3, 2)) for _ in range(n_devices)]
    if liar:
        centers.append(np.full((3, 2), 500.0) + rng.normal(0, 1.0, (3, 2)))
    return base, centers


def test_trimmed_server_labels_every_devices_centers_by_the_nearest_final_center():
    from fedclust.kfed.server import aggregate_centers

    base, centers = _three_groups()
    got = aggregate_centers(centers, 3, trim=0.2)
    np.testing.assert_allclose(np.sort(got.centers, axis=0), np.sort(base, axis=0), atol=0.5)
    assert len(got.center_labels) == len(centers) and isinstance(got.n_iter, int)
    for C, labels in zip(centers, got.center_labels):
        d = ((C[:, None, :] - got.centers[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(labels, d.argmin(axis=1))


def test_server_on_millions_of_centers_takes_the_blocked_path_to_the_same_clusters(monkeypatch):
    """Past LARGE_N centers k-means++ seeds from a coreset and runs blocked Lloyd
    (core.kmeans.weighted_kmeans); with the threshold lowered it must find the groups the
    small-input path finds, weights included."""
    from fedclust.kfed import server

    base, centers = _three_groups(n_devices=30, liar=False)
    counts = [np.array([1, 1, 50]) for _ in centers]
    small = server.aggregate_centers(centers, 3, counts=counts, weighted=True, method="kmeans++",
                                     rng=np.random.default_rng(0))
    monkeypatch.setattr(server, "LARGE_N", 10)
    large = server.aggregate_centers(centers, 3, counts=counts, weighted=True, method="kmeans++",
                                     rng=np.random.default_rng(0), max_iter=50)
    np.testing.assert_allclose(np.sort(large.centers, axis=0), np.sort(small.centers, axis=0),
                               atol=1e-6)
    for a, b in zip(large.center_labels, small.center_labels):
        assert len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist()))   # same partition


def test_single_linkage_server_reports_no_iterations_and_n_clusters_is_checked():
    from fedclust.kfed.server import aggregate_centers

    _, centers = _three_groups(liar=False)
    assert aggregate_centers(centers, 3, method="single-linkage").n_iter == 0
    for bad in ("3", 2.0, True, 0):
        with pytest.raises(ValidationError, match=rf"^n_clusters={bad!r} must be an integer >= 1$"):
            aggregate_centers(centers, bad)
