"""Exact unlearning: every forget equals a fresh fit without the data (same seed, same ids).

Property tests: random federations (sizes, device ids, device order) and random
sequences of forgets (whole devices and rows, interleaved); after every step
the model, the kept summaries and the devices' labels are compared bit for bit
with an independent fresh ``fit`` on what remains.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedclust import (ClusteredFedAvg, DistributedKMeans, FedAvg, FedGaussClassifier,
                      FedGaussClustering, KFed)
from fedclust.baselines import DistributedLloyd
from fedclust.core.exceptions import NotFittedError, ValidationError
from fedclust.unlearning import DevicesNeeded


def _federation(rng, n_devices, d=4, k=4, supervised=False):
    means = rng.normal(size=(k, d)) * 6
    Xs, ys = [], []
    for _ in range(n_devices):
        n = int(rng.integers(25, 60))
        own = rng.choice(k, size=2, replace=False)
        y = own[rng.integers(2, size=n)]
        Xs.append(means[y] + rng.normal(size=(n, d)))
        ys.append(y)
    return Xs, ys


def _labels_equal(a, b):
    return all((x is None and y is None) or np.array_equal(x, y)
               for x, y in zip(a.device_labels_, b.device_labels_))


def _same_model(a, b, attrs):
    for name in attrs:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, list):
            if len(x) != len(y) or not all(np.array_equal(p, q) for p, q in zip(x, y)):
                return False
        elif not np.array_equal(x, y):
            return False
    return (a.device_ids_ == b.device_ids_ and _labels_equal(a, b)
            and a._unlearning_.store.digest() == b._unlearning_.store.digest())


FAMILIES = {
    "kfed": (lambda: KFed(4, 2, random_state=11), False, ["cluster_centers_", "local_centers_"]),
    "kfed-kmeans++": (lambda: KFed(4, 2, server="kmeans++", weighted=True, random_state=5),
                      False, ["cluster_centers_", "local_centers_"]),
    "kfed-random-first": (lambda: KFed(4, 2, first_device="random", random_state=2), False,
                          ["cluster_centers_"]),
    "kfed-trim": (lambda: KFed(4, 2, trim=0.2, random_state=3), False, ["cluster_centers_"]),
    "gauss": (lambda: FedGaussClustering(random_state=1), False,
              ["means_", "covariances_", "counts_"]),
    "gauss-classifier": (lambda: FedGaussClassifier(random_state=1), True,
                         ["means_", "covariances_", "counts_", "fisher_scores_"]),
    "gauss-2-rounds": (lambda: FedGaussClustering(n_rounds=2, random_state=1), False,
                       ["means_", "covariances_", "counts_"]),
    "coreset": (lambda: DistributedKMeans(4, random_state=4), False, ["cluster_centers_"]),
    # points_per_device follows the number of devices: a forget rebuilds the protocol
    "lloyd": (lambda: DistributedLloyd(4, max_rounds=5, random_state=6), False,
              ["cluster_centers_", "cost_history_"]),
}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("trial", range(2))
def test_random_forget_sequences_equal_a_retrain(family, trial):
    make, supervised, attrs = FAMILIES[family]
    rng = np.random.default_rng(1000 * trial + len(family))
    n = int(rng.integers(6, 9))
    Xs, ys = _federation(rng, n)
    ids = [int(z) for z in rng.choice(200, size=n, replace=False)]  # stable ids, any order
    data = {z: (X, y) for z, X, y in zip(ids, Xs, ys)}
    model = make().fit(Xs, ys, device_ids=ids) if supervised else make().fit(Xs, device_ids=ids)
    for step in range(3):
        alive = [z for z in ids if z in data]
        if rng.random() < 0.5 and len(alive) > 4:
            z = int(rng.choice(alive))
            model.forget(devices=[z])
            del data[z]
            assert model.forget_log_[-1].devices == [z]
        else:
            z = int(rng.choice(alive))
            X, y = data[z]
            rows = rng.choice(len(X), size=int(rng.integers(1, 6)), replace=False)
            model.forget(rows={z: rows})
            data[z] = (np.delete(X, rows, axis=0), np.delete(y, rows))
            rec = model.forget_log_[-1]
            assert rec.rows == {z: sorted(rows.tolist())}
            assert (0, z) in rec.recomputed or any(d == z for _, d in rec.recomputed)
        kept = [z for z in ids if z in data]
        Xk = [data[z][0] for z in kept]
        fresh = (make().fit(Xk, [data[z][1] for z in kept], device_ids=kept) if supervised
                 else make().fit(Xk, device_ids=kept))
        assert _same_model(model, fresh, attrs), f"{family}: step {step} differs from a retrain"
    report = model.verify()
    assert report.summaries and report.retrain and report.ok


def test_one_shot_device_forget_asks_no_device_and_needs_no_data():
    rng = np.random.default_rng(3)
    Xs, _ = _federation(rng, 7)
    model = KFed(4, 2, random_state=0).fit(Xs)
    model._unlearning_.data.clear()   # every device offline: only the server's summaries
    model.forget(devices=[2, 5])
    rec = model.forget_log_[-1]
    assert rec.recomputed == [] and not rec.retrained
    fresh = KFed(4, 2, random_state=0).fit([Xs[i] for i in (0, 1, 3, 4, 6)],
                                           device_ids=[0, 1, 3, 4, 6])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert model.verify().retrain is None and model.verify().summaries


def test_rows_without_the_devices_data_ask_for_it():
    rng = np.random.default_rng(4)
    Xs, _ = _federation(rng, 5)
    model = KFed(4, 2, random_state=0).fit(Xs)
    model._unlearning_.data.clear()
    with pytest.raises(ValidationError, match="device 1 must run its step again"):
        model.forget(rows={1: [0]})
    model.forget(rows={1: [0, 3]}, data={1: Xs[1]})
    fresh = KFed(4, 2, random_state=0).fit([Xs[0], np.delete(Xs[1], [0, 3], 0), *Xs[2:]])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_multi_round_forget_is_a_recorded_retrain_and_needs_the_devices():
    rng = np.random.default_rng(5)
    Xs, _ = _federation(rng, 5)
    model = DistributedKMeans(4, random_state=1).fit(Xs)
    model.forget(devices=[0])
    rec = model.forget_log_[-1]
    assert rec.retrained and {z for _, z in rec.recomputed} == {1, 2, 3, 4}
    model._unlearning_.data.clear()
    with pytest.raises(DevicesNeeded, match="must compute again"):
        model.forget(devices=[1])


def test_clustered_fedavg_retrains_only_the_changed_clusters():
    rng = np.random.default_rng(0)
    d = 4
    W = [rng.normal(size=d) for _ in range(2)]
    Xs, ys = [], []
    for z in range(8):
        X = rng.normal(size=(40, d)) + (3 if z % 2 else -3)
        Xs.append(X)
        ys.append((X @ W[z % 2] > 0).astype(int))
    kw = dict(model="logistic", rounds=3, random_state=1)
    model = ClusteredFedAvg(2, **kw).fit(Xs, ys)
    cluster = model.device_clusters_[3]
    mates = {z for z in range(8) if z != 3 and model.device_clusters_[z] == cluster}
    model.forget(devices=[3])
    asked = {z for _, z in model.forget_log_[-1].recomputed}
    assert asked == mates            # the other cluster's members were not asked again
    keep = [z for z in range(8) if z != 3]
    fresh = ClusteredFedAvg(2, **kw).fit([Xs[z] for z in keep], [ys[z] for z in keep],
                                         device_ids=keep)
    assert all(np.array_equal(a, b) for a, b in zip(model.models_, fresh.models_))
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert _labels_equal(model, fresh)
    # FedAvg: one global model, every device is asked again (a retrain, and it says so)
    avg = FedAvg(**kw).fit(Xs, ys)
    avg.forget(devices=[3])
    assert avg.forget_log_[-1].retrained
    fresh = FedAvg(**kw).fit([Xs[z] for z in keep], [ys[z] for z in keep], device_ids=keep)
    assert np.array_equal(avg.models_, fresh.models_)


def test_verify_detects_a_tampered_summary():
    rng = np.random.default_rng(6)
    Xs, _ = _federation(rng, 5)
    model = KFed(4, 2, random_state=0).fit(Xs)
    rec = model._unlearning_.store.rounds[0]
    msg = rec.replies[2]
    rec.replies[2] = dataclasses.replace(msg, centers=msg.centers + 1.0)
    rec.digests.pop(2, None)
    report = model.verify()
    assert not report.summaries and not report.retrain and not report.ok


def test_forget_errors_are_clear():
    rng = np.random.default_rng(7)
    Xs, _ = _federation(rng, 4)
    with pytest.raises(NotFittedError):
        KFed(4, 2).forget(devices=[0])
    model = KFed(4, 2, random_state=0).fit(Xs)
    with pytest.raises(ValidationError, match="device 9 is not in the model"):
        model.forget(devices=[9])
    with pytest.raises(ValidationError, match="no site named 'x'"):
        model.forget(devices=["x"])
    with pytest.raises(ValidationError, match="nothing to forget"):
        model.forget()
    with pytest.raises(ValidationError, match=r"device 1 has \d+ rows; row index 999"):
        model.forget(rows={1: [0, 999]})
    with pytest.raises(ValidationError, match="no device would remain"):
        model.forget(devices=[0, 1, 2, 3])
    assert model.forget_log_ == []   # failed forgets leave the model as it was
    fresh = KFed(4, 2, random_state=0).fit(Xs)
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_forget_under_secure_aggregation_is_refused():
    from fedclust.sim import InProcessTransport

    rng = np.random.default_rng(8)
    Xs, ys = _federation(rng, 4)
    model = FedGaussClassifier(kappa_f=0.01, random_state=0).fit(
        Xs, ys, transport=InProcessTransport(secure_aggregation=True))
    with pytest.raises(ValidationError, match="secure aggregation"):
        model.forget(devices=[0])


def test_forget_follows_groups_row_order_by_device_afterwards():
    rng = np.random.default_rng(9)
    Xs, _ = _federation(rng, 4)
    X = np.concatenate(Xs)
    groups = np.repeat([30, 10, 20, 40], [len(x) for x in Xs])
    model = KFed(4, 2, random_state=0).fit(X, groups=groups)
    model.forget(devices=[20])
    fresh = KFed(4, 2, random_state=0).fit(X[groups != 20], groups=groups[groups != 20])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    # labels_ lists the remaining devices' rows in device order (10, 30, 40)
    order = np.concatenate([np.flatnonzero(groups[groups != 20] == g) for g in (10, 30, 40)])
    assert np.array_equal(model.labels_, fresh.labels_[order])


def test_flower_server_keeps_the_summaries_and_forgets_offline_sites():
    pytest.importorskip("flwr")
    from fedclust.flower import FlowerInMemoryTransport

    rng = np.random.default_rng(10)
    Xs, _ = _federation(rng, 5)
    model = KFed(4, 2, random_state=0).fit(Xs, transport=FlowerInMemoryTransport())
    assert model._unlearning_.data == {}      # the server holds no device data
    model.forget(devices=[2])                 # device 2 has left: its summary suffices
    assert model.forget_log_[-1].recomputed == []
    keep = [0, 1, 3, 4]
    fresh = KFed(4, 2, random_state=0).fit([Xs[z] for z in keep], device_ids=keep)
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    # row level: the site runs its step again on its own rows (given here as data=)
    model.forget(rows={3: [0, 1]}, data={3: Xs[3]})
    fresh = KFed(4, 2, random_state=0).fit(
        [Xs[0], Xs[1], np.delete(Xs[3], [0, 1], 0), Xs[4]], device_ids=keep)
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_private_kfed_forgets_a_device_from_the_noisy_releases_and_refuses_rows():
    from fedclust.privacy import DifferentialPrivacy

    rng = np.random.default_rng(11)
    Xs, _ = _federation(rng, 6)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=30.0, noise_seed=4)
    model = KFed(4, 2, privacy=dp, random_state=0).fit(Xs)
    model._unlearning_.data.clear()
    model.forget(devices=[1])
    assert model.forget_log_[-1].recomputed == []   # no device releases again
    keep = [0, 2, 3, 4, 5]
    fresh = KFed(4, 2, privacy=dp, random_state=0).fit([Xs[z] for z in keep], device_ids=keep)
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    with pytest.raises(ValidationError, match="row deletion is refused under privacy"):
        model.forget(rows={2: [0]}, data={2: Xs[2]})


def test_fl_model_size_follows_the_remaining_labels():
    rng = np.random.default_rng(12)
    Xs = [rng.normal(size=(30, 3)) for _ in range(5)]
    ys = [rng.integers(0, 2, size=30) for _ in range(5)]
    ys[3][:5] = 2                       # only device 3 holds class 2
    kw = dict(model="softmax", rounds=2, random_state=1)
    model = FedAvg(**kw).fit(Xs, ys)
    assert list(model.classes_) == [0, 1, 2]
    model.forget(devices=[3])
    keep = [0, 1, 2, 4]
    fresh = FedAvg(**kw).fit([Xs[z] for z in keep], [ys[z] for z in keep], device_ids=keep)
    assert list(model.classes_) == [0, 1] and np.array_equal(model.models_, fresh.models_)
    assert model.forget_log_[-1].retrained


def test_a_pickled_model_keeps_the_summaries_but_no_device_data():
    import pickle

    rng = np.random.default_rng(13)
    Xs, _ = _federation(rng, 5)
    model = pickle.loads(pickle.dumps(KFed(4, 2, random_state=0).fit(Xs)))
    assert model._unlearning_.data == {} and model._unlearning_.memory == {}
    model.forget(devices=[1])
    fresh = KFed(4, 2, random_state=0).fit([Xs[z] for z in (0, 2, 3, 4)], device_ids=[0, 2, 3, 4])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)


def test_a_row_deletions_check_runs_the_device_step_on_one_blas_thread(monkeypatch):
    """The check of a device's new summary (reused by the replay) must round as the fit's
    device step did: one BLAS thread, whatever the caller's setting. With two threads a
    large device's centers differ in their last bits from a retrain's."""
    from fedclust.core.threads import controller
    from fedclust.kfed.protocol import KFedProtocol

    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(60, 4)) + 5.0 * (z % 3) for z in range(6)]
    model = KFed(3, 2, random_state=0).fit(Xs)
    seen = []
    original = KFedProtocol.client_steps

    def recording(self, *args, **kwargs):
        seen.extend(lib["num_threads"] for lib in controller().info()
                    if lib["user_api"] == "blas")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(KFedProtocol, "client_steps", recording)
    with controller().limit(limits=2, user_api="blas"):
        outside = [lib["num_threads"] for lib in controller().info() if lib["user_api"] == "blas"]
        model.forget(rows={1: [0, 5]})
    assert seen and set(seen) == {1}, (seen, outside)
