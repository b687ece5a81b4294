"""KFed's defaults: the weighted-kmeans++ server, n_local_clusters='auto', the warning.

Federations are generated here: overlapping Gaussian groups, small non-IID sites
(each holds a few of the groups in uneven shares), scored against scikit-learn's
pooled KMeans(n_init=10) on the same rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from fedclust import KFed
from fedclust.core.exceptions import IncompatibleMessageError
from fedclust.flower.results import log_from_json, log_to_json
from fedclust.kfed.local_auto import auto_range, kmeans_bic, local_kmeans_auto
from fedclust.kfed.summary import summary_ladder, summary_size
from fedclust.kfed.messages import LocalSummary
from fedclust.kfed.explain import center_split


def _overlapping_federation(seed, k=4, d=6, n_sites=14, spread=2.5):
    """k groups whose means are ``spread`` σ apart on average; every site holds 1-3 groups
    in Dirichlet shares and 15-60 points."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=spread, size=(k, d))
    devices, labels = [], []
    for _ in range(n_sites):
        held = rng.choice(k, size=rng.integers(1, 4), replace=False)
        n = int(rng.integers(15, 61))
        share = rng.dirichlet(np.ones(len(held)))
        g = held[rng.choice(len(held), size=n, p=share)]
        devices.append(means[g] + rng.normal(size=(n, d)))
        labels.append(g)
    return devices, labels


def _cost(X, C):
    return float(((X[:, None, :] - C[None]) ** 2).sum(-1).min(1).sum())


@pytest.mark.parametrize("n_local", ["auto", 2, 3])
def test_default_close_to_pooled_kmeans_on_overlapping_small_sites(n_local):
    ratios, gaps = [], []
    for seed in range(3):
        devices, labels = _overlapping_federation(seed)
        X, y = np.concatenate(devices), np.concatenate(labels)
        pooled = KMeans(4, n_init=10, random_state=seed).fit(X)
        model = KFed(4, n_local, random_state=seed).fit(devices)
        ratios.append(_cost(X, model.cluster_centers_) / pooled.inertia_)
        gaps.append(adjusted_rand_score(y, pooled.labels_) - adjusted_rand_score(y, model.labels_))
    assert np.mean(ratios) <= 1.05 and max(ratios) <= 1.10, ratios
    assert np.mean(gaps) <= 0.05, gaps


def test_default_beats_paper_server_on_overlapping_small_sites():
    worse = 0
    for seed in range(3):
        devices, _ = _overlapping_federation(seed + 10)
        X = np.concatenate(devices)
        ours = _cost(X, KFed(4, 3, random_state=seed).fit(devices).cluster_centers_)
        paper = _cost(X, KFed(4, 3, server="farthest-lloyd1",
                              random_state=seed).fit(devices).cluster_centers_)
        worse += ours > paper * 1.001
    assert worse == 0


def test_default_labels_are_the_nearest_final_center_and_reproducible():
    devices, _ = _overlapping_federation(3)
    m = KFed(4, random_state=7).fit(devices)
    np.testing.assert_array_equal(m.labels_, m.predict(np.concatenate(devices)))
    again = KFed(4, random_state=7).fit(devices)
    np.testing.assert_array_equal(m.cluster_centers_, again.cluster_centers_)
    # devices permuted together with their ids: same answer
    perm = np.random.default_rng(0).permutation(len(devices))
    p = KFed(4, random_state=7).fit([devices[i] for i in perm], device_ids=perm.tolist())
    np.testing.assert_allclose(p.cluster_centers_, m.cluster_centers_, atol=1e-9)


def test_int_and_per_device_n_local_clusters_still_work():
    devices, _ = _overlapping_federation(4)
    per = [1 + z % 3 for z in range(len(devices))]
    m = KFed(4, per, random_state=0).fit(devices)
    # with the default server a device never summarises by fewer than min(2k, n/5) centers,
    # and sends a rung of its ladder from there
    for X, c, kz in zip(devices, m.local_centers_, per):
        start = max(kz, summary_size(len(X), 4))
        assert len(c) >= start == max(kz, auto_range(len(X), 4)[1])
        assert len(c) in summary_ladder(len(X), X.shape[1], 4, start=start)
    paper = KFed(4, per, server="farthest-lloyd1", random_state=0).fit(devices)
    assert [len(c) for c in paper.local_centers_] == per
    assert m.communication_["bytes_up"] == sum(len(c) * (6 + 2) * 8 for c in m.local_centers_)
    assert m.communication_["bytes_down"] == len(devices) * 4 * 6 * 8


def test_kmeans_bic_peaks_at_the_true_number_of_separated_groups():
    rng = np.random.default_rng(5)
    for g in (1, 2, 3, 5):
        X = np.concatenate([rng.normal(size=(60, 4)) + 12.0 * rng.normal(size=4)
                            for _ in range(g)])
        scores = []
        for k in range(1, 8):
            km = KMeans(k, n_init=5, random_state=0).fit(X)
            scores.append(kmeans_bic(len(X), 4, np.bincount(km.labels_, minlength=k),
                                     km.inertia_))
        assert int(np.argmax(scores)) + 1 == g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auto_never_sends_fewer_centers_than_the_groups_a_device_holds(seed):
    """Devices with a known number of groups (1-4, unevenly sized, d=3, k=4)."""
    rng = np.random.default_rng(100 + seed)
    k, d = 4, 3
    means = 8.0 * rng.normal(size=(k, d))
    devices, held = [], []
    for z in range(10):
        g = rng.choice(k, size=1 + z % k, replace=False)
        sizes = rng.integers(10, 50, size=len(g))
        devices.append(np.concatenate([means[j] + rng.normal(size=(s, d))
                                       for j, s in zip(g, sizes)]))
        held.append(len(g))
    m = KFed(k, "auto", random_state=seed).fit(devices)
    sent = [len(c) for c in m.local_centers_]
    for X, h, s in zip(devices, held, sent):   # the default server: a rung of the ladder
        assert h <= s and s in summary_ladder(len(X), d, k)
    bic = KFed(k, "auto", server="kmeans++", random_state=seed).fit(devices)
    for X, h, c in zip(devices, held, bic.local_centers_):
        lo, hi = auto_range(len(X), k)
        assert h <= len(c) and lo <= len(c) <= hi <= 2 * k
    rng_dev = np.random.default_rng(seed)
    res = local_kmeans_auto(devices[0], k, rng_dev)
    assert len(res.message.centers) >= held[0]


def test_auto_range_small_device():
    assert auto_range(12, 4) == (2, 2)      # 12 points: clusters of >= 5 on average
    assert auto_range(400, 3) == (3, 6)
    assert auto_range(3, 3) == (1, 1)


def _blobs(rng, centers, n):
    return np.concatenate([c + rng.normal(scale=0.5, size=(n, len(c))) for c in centers])


def test_warning_fires_when_final_centers_miss_local_clusters_and_not_otherwise():
    rng = np.random.default_rng(0)
    groups = 10.0 * np.eye(4)
    devices = [_blobs(rng, groups[[z % 4, (z + 1) % 4]], 30) for z in range(8)]
    good = KFed(4, random_state=0).fit(devices)
    assert good.run_log_.warnings == []
    bad = KFed(2, random_state=0).fit(devices)   # k too small: two groups share a center
    assert len(bad.run_log_.warnings) == 1
    assert "holds more than one group" in bad.run_log_.warnings[0]
    # the log's JSON form (Flower results) keeps it
    assert log_from_json(log_to_json(bad.run_log_)).warnings == bad.run_log_.warnings


def test_local_summary_rejects_bad_scatter_and_reads_negative_as_zero():
    ok = {"centers": np.zeros((2, 3)), "counts": np.array([1, 2]),
          "scatter": np.array([0.0, 1.0])}
    assert LocalSummary.from_arrays(ok).scatter.tolist() == [0.0, 1.0]
    with pytest.raises(IncompatibleMessageError, match="scatter"):
        LocalSummary.from_arrays({**ok, "scatter": np.array([0.0])}, sender="device 3")
    with pytest.raises(IncompatibleMessageError, match="scatter"):
        LocalSummary.from_arrays({**ok, "scatter": np.array([0.0, np.nan])}, sender="device 3")
    # scatter only feeds the warning: a negative (lying) value counts as 0
    C, w = np.array([[0.0, 0.0], [4.0, 0.0]]), np.array([2.0, 2.0])
    neg, zero = (center_split(C, w, np.array([s, 2.0])) for s in (-5.0, 0.0))
    assert neg.cost == zero.cost == 2.0 + 2 * 2 * 2.0 ** 2 and neg.gain == zero.gain


def test_auto_is_refused_with_a_clear_error_for_other_strings():
    with pytest.raises(Exception, match="n_local_clusters='many'"):
        KFed(2, "many").fit([np.random.default_rng(0).normal(size=(20, 2))])


_CLI = """
seed = 3
[data]
source = "gaussians"
n_features = 5
n_clusters = 6
n_local_clusters = 2
m0 = 3
separation = 60.0
n_per_component = 30

[algorithm]
name = "kfed"
n_clusters = {k}
"""


@pytest.mark.parametrize("k, warned", [(2, True), (6, False)])
def test_cli_prints_the_warning_only_when_it_fires(tmp_path, capsys, k, warned):
    import json

    from fedclust.cli import main

    cfg = tmp_path / "cfg.toml"
    cfg.write_text(_CLI.format(k=k))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    assert ("warning: k-FED:" in out) is warned
    assert bool(res["run_log"]["warnings"]) is warned


def test_auto_refuses_a_one_point_device_unless_raw_points_are_allowed():
    rng = np.random.default_rng(1)
    devices = [rng.normal(size=(40, 2)), rng.normal(size=(1, 2))]
    with pytest.raises(Exception, match="device 1 has n_z=1 points"):
        KFed(2, random_state=0).fit(devices)
    m = KFed(2, allow_raw_points=True, random_state=0).fit(devices)
    np.testing.assert_array_equal(m.local_centers_[1], devices[1])
