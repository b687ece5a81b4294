"""The default k-FED on generated overlapping federations of small devices, against
scikit-learn's KMeans(n_init=10) on the pooled rows: same basin (ARI between the two
labelings) and nearly the same cost."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from fedclust import KFed
from fedclust.kfed.server import WEIGHTED_PP_INIT


def _overlapping_federation(seed, k=12, d=5, n_devices=40, n_points=40, held=4):
    """k unit-variance Gaussians with means drawn at scale 2 (neighbours overlap); every
    device holds 40 rows from 4 of them."""
    rng = np.random.default_rng(seed)
    means = 2.0 * rng.normal(size=(k, d))
    devices = []
    for _ in range(n_devices):
        groups = rng.choice(k, held, replace=False)
        devices.append(means[rng.choice(groups, n_points)] + rng.normal(size=(n_points, d)))
    return devices


def test_the_default_lands_in_the_pooled_basin_on_overlapping_small_devices():
    costs, aris = [], []
    for seed in range(6):
        devices = _overlapping_federation(seed)
        X = np.concatenate(devices)
        ref = KMeans(12, n_init=10, random_state=0).fit(X)
        model = KFed(12, random_state=0).fit(devices)
        cost = ((X[:, None, :] - model.cluster_centers_[None]) ** 2).sum(axis=2).min(axis=1).sum()
        costs.append(cost / ref.inertia_)
        aris.append(adjusted_rand_score(ref.labels_, model.labels_))
    # 11 server starts left two of these seeds 1.5 % and 2.5 % above the pooled cost
    # (mean ARI 0.89 against the pooled labels)
    assert max(costs) <= 1.01, costs
    assert np.mean(aris) >= 0.9, aris


def test_more_server_starts_never_raise_the_weighted_cost():
    # start s draws by keys of (seed, device, center, s, step): the first 11 starts are
    # the same whatever the count, so the best of WEIGHTED_PP_INIT + 1 is at most the best
    # of 11 (same device centers, same seed)
    import fedclust.kfed.server as server
    from fedclust.kfed.keyed import keyed_weighted_kmeans

    devices = _overlapping_federation(3)
    model = KFed(12, random_state=0).fit(devices)
    C = np.concatenate(list(model.local_centers_))
    w = np.concatenate(list(model.local_counts_)).astype(float)
    sizes = [len(c) for c in model.local_centers_]
    parts = np.split(C, np.cumsum(sizes)[:-1])
    best = {}
    for n_init in (10, WEIGHTED_PP_INIT):
        old, server.WEIGHTED_PP_INIT = server.WEIGHTED_PP_INIT, n_init
        try:
            res = keyed_weighted_kmeans(C, 12, w, parts, list(range(len(parts))), 5,
                                        max_iter=300, tol=1e-4)
        finally:
            server.WEIGHTED_PP_INIT = old
        best[n_init] = res.inertia
    assert best[WEIGHTED_PP_INIT] <= best[10] * (1 + 1e-12)


def test_weighted_starts_follow_the_budget_by_hand():
    from fedclust.kfed.server import weighted_starts

    assert weighted_starts(100, 3) == 100          # 10⁶ // 300 = 3333, capped at 100
    assert weighted_starts(2_000, 10) == 50        # 10⁶ // 20,000
    assert weighted_starts(40_000, 20) == 10       # 10⁶ // 800,000 = 1, never below 10
    assert weighted_starts(0, 3) == 100


def test_auto_sends_the_summary_to_the_default_server_and_bic_to_the_others():
    from fedclust.kfed.local_auto import auto_range
    from fedclust.kfed.summary import summary_size

    rng = np.random.default_rng(1)
    # two well-separated groups per device: BIC keeps 2 local clusters, the summary 2k = 6
    devices = [np.concatenate([rng.normal(size=(40, 3)), 8.0 + rng.normal(size=(40, 3))])
               for _ in range(4)] + [rng.normal(size=(12, 3))]
    default = KFed(3, "auto", random_state=0).fit(devices)
    assert [len(c) for c in default.local_centers_] == [summary_size(len(X), 3)
                                                        for X in devices] == [6] * 4 + [2]
    other = KFed(3, "auto", server="kmeans++", random_state=0).fit(devices)
    sent = [len(c) for c in other.local_centers_]
    assert all(auto_range(len(X), 3)[0] <= s <= auto_range(len(X), 3)[1]
               for X, s in zip(devices, sent))
    assert sent[:4] != [6] * 4
