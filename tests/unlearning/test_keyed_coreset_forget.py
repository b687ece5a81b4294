"""Forgetting a device of a fit whose keyed server ran on a keyed coreset of the device
centers (above ``SAMPLED_ABOVE``): the step again, equal to a retrain; the coreset's draws."""

from __future__ import annotations

import numpy as np

from fedclust.kfed import keyed

from .keyed_helpers import K, federation, make_keyed, check_fresh


def _force_coreset(monkeypatch, n_centers):
    """The coreset path for a small federation: every size samples, m = 20 centers."""
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 20)
    monkeypatch.setattr(keyed, "SAMPLE_PER_CLUSTER", 1)
    assert keyed.sample_size(n_centers, K) == 20


def test_a_forget_of_a_coreset_fit_runs_the_step_again_and_equals_a_retrain(monkeypatch):
    # above SAMPLED_ABOVE device centers the starts run on a keyed coreset: a forget runs
    # the server step again on the kept summaries (no device computes), which must equal a
    # fresh fit on the remaining devices bit for bit, seed holders and coreset rows included
    rng = np.random.default_rng(41)
    n_dev = 60
    Xs = federation(rng, n_dev)
    ids = [int(z) for z in rng.choice(50_000, size=n_dev, replace=False)]
    full = make_keyed().fit(Xs, device_ids=ids)   # every start on all device centers
    n_centers = sum(len(c) for c in full.local_centers_)
    _force_coreset(monkeypatch, n_centers)
    model = make_keyed().fit(Xs, device_ids=ids)
    # the coreset path ran: its result is sampled_weighted_kmeans's on the same centers
    trace = model._unlearning_.trace
    assert trace is None   # no trace to follow: the starts saw a sample
    C = np.concatenate(model.local_centers_)
    w = np.concatenate(model.local_counts_).astype(float)
    owner = np.repeat(ids, [len(c) for c in model.local_centers_])
    local = np.concatenate([np.arange(len(c)) for c in model.local_centers_])
    order = np.argsort(owner, kind="stable")   # the server sees the devices by id
    res = keyed.sampled_weighted_kmeans(C[order], K, w[order], owner[order], local[order],
                                        model.seed_, 20, max_iter=300, tol=1e-4)
    assert np.array_equal(res.centers, model.cluster_centers_)
    # the coreset answer costs about what the all-centers one does on the pooled rows
    X = np.concatenate(Xs)
    cost = [float(((X[:, None] - m.cluster_centers_[None]) ** 2).sum(-1).min(1).sum())
            for m in (model, full)]
    assert cost[0] <= 1.05 * cost[1]
    gone: list[int] = []
    for zs in ([ids[3]], [ids[10], ids[40]], [int(owner[0])]):
        zs = [z for z in zs if z not in gone][:2]
        model.forget(devices=zs)
        gone.extend(zs)
        rec = model.forget_log_[-1]
        assert rec.path == "replay" and not rec.retrained   # the server step only
        check_fresh(model, Xs, ids, gone)
        assert model.verify().ok


def test_keyed_coreset_draws_do_not_depend_on_device_order():
    # a device center's inclusion is keyed by (seed, device id, center index): the same
    # rows whatever order the devices come in, and weights w / pi with pi = min(1, m q)
    rng = np.random.default_rng(5)
    n_dev, per = 400, 3
    C = rng.normal(size=(n_dev * per, 4)) * rng.uniform(0.5, 3, size=(n_dev * per, 1))
    w = rng.integers(1, 30, size=n_dev * per).astype(float)
    owner = np.repeat(rng.choice(10**6, size=n_dev, replace=False), per)
    local = np.tile(np.arange(per), n_dev)
    rows, ws = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, 9, 300)
    perm = rng.permutation(n_dev)
    p_rows = (perm[:, None] * per + np.arange(per)).ravel()
    rows2, ws2 = keyed.keyed_coreset(C[p_rows], w[p_rows], (C[p_rows] ** 2).sum(1),
                                     owner[p_rows], local[p_rows], 9, 300)
    got = sorted(zip(owner[rows], local[rows]))
    got2 = sorted(zip(owner[p_rows][rows2], local[p_rows][rows2]))
    assert got == got2 and 200 < len(rows) < 400
    np.testing.assert_allclose(np.sort(ws), np.sort(ws2), rtol=1e-12)
    # weights by hand: q = w/2W + w d^2 / 2 sum(w d^2) about the weighted mean
    mu = w @ C / w.sum()
    wd = w * ((C - mu) ** 2).sum(1)
    pi = np.minimum(1.0, 300 * (0.5 * w / w.sum() + 0.5 * wd / wd.sum()))
    np.testing.assert_allclose(ws, w[rows] / pi[rows], rtol=1e-12)
    # with m so large that every pi is 1 the coreset is every center at its own weight
    rows_all, ws_all = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, 9, 10**9)
    assert np.array_equal(rows_all, np.arange(len(C))) and np.array_equal(ws_all, w)


def test_keyed_coreset_cost_is_unbiased():
    # for fixed centers Q the coreset's weighted cost averages to the full weighted cost
    # over seeds (Horvitz-Thompson): 400 seeds, within 4 standard errors
    rng = np.random.default_rng(8)
    C = np.concatenate([rng.normal(size=(1500, 3)), rng.normal(size=(500, 3)) * 4 + 6])
    w = rng.integers(1, 10, size=len(C)).astype(float)
    owner, local = np.arange(len(C)) // 2, np.arange(len(C)) % 2
    Q = rng.normal(size=(5, 3)) * 3
    d2 = ((C[:, None] - Q[None]) ** 2).sum(-1).min(1)
    full = float(w @ d2)
    est = []
    for seed in range(400):
        rows, ws = keyed.keyed_coreset(C, w, (C * C).sum(1), owner, local, seed, 100)
        est.append(float(ws @ d2[rows]))
    est = np.array(est)
    assert abs(est.mean() - full) <= 4 * est.std() / np.sqrt(len(est))
    assert est.std() < 0.25 * full   # and the estimate is informative at m = 100
