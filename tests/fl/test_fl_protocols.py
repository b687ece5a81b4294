"""FedAvg / IFCA / k-FED + FedAvg: invariances, bytes, faults, bad input, both transports."""

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.core.messages import load_message, save_message
from fedclust.core.random import device_rng, server_rng
from fedclust.fl import (IFCA, ClusteredFedAvg, FedAvg, SoftmaxRegression, local_update,
                         rotated_federation)
from fedclust.fl.messages import ClusterModel, LossReport, ModelParams, ModelSet, ModelUpdate
from fedclust.metrics import matched_accuracy
from fedclust.sim.transport import InProcessTransport

FED = rotated_federation(0, n_devices=12, n_train=40, n_test=20)
SMALL = dict(rounds=3, n_hidden=8, lr=0.1, random_state=3)


def test_fedavg_one_client_is_centralized_sgd():
    X, y = FED.devices[0], FED.labels[0]
    m = FedAvg("softmax", rounds=4, local_epochs=2, batch_size=7, lr=0.2,
               random_state=5).fit([X], [y])
    ref = SoftmaxRegression(64, 10)
    ref.set_params(ref.init_params(server_rng(5, 500)))
    for r in range(4):  # the device's stream of request r orders the batches
        ref.local_sgd(X, y, epochs=2, batch_size=7, lr=0.2, rng=device_rng(5, 0, r))
    np.testing.assert_allclose(m.models_[0], ref.get_params(), rtol=1e-12, atol=1e-15)


def test_fedavg_weights_updates_by_sample_count():
    Xs, ys = [FED.devices[0][:10], FED.devices[1]], [FED.labels[0][:10], FED.labels[1]]
    m = FedAvg("softmax", rounds=1, lr=0.3, random_state=2).fit(Xs, ys)
    scratch = SoftmaxRegression(64, 10)
    start = scratch.init_params(server_rng(2, 500))
    ups = [local_update(scratch, start, X, y, lr=0.3, rng=device_rng(2, z, 0))[0]
           for z, (X, y) in enumerate(zip(Xs, ys))]
    np.testing.assert_allclose(m.models_[0], (10 * ups[0] + 40 * ups[1]) / 50, rtol=1e-12)
    u = FedAvg("softmax", rounds=1, lr=0.3, weighted=False, random_state=2).fit(Xs, ys)
    np.testing.assert_allclose(u.models_[0], (ups[0] + ups[1]) / 2, rtol=1e-12)


def test_ifca_with_one_cluster_is_fedavg():
    a = FedAvg(**SMALL).fit(FED.devices, FED.labels)
    b = IFCA(n_clusters=1, **SMALL).fit(FED.devices, FED.labels)
    np.testing.assert_array_equal(a.models_, b.models_)
    assert b.device_clusters_ == [0] * 12


def test_clustered_fedavg_finds_rotation_groups_and_beats_global():
    fed = rotated_federation(1, n_devices=16, n_train=60, n_test=40)
    kw = dict(rounds=12, n_hidden=30, lr=0.1, random_state=0)
    c = ClusteredFedAvg(n_clusters=4, **kw).fit(fed.devices, fed.labels, test_X=fed.test_devices,
                                                test_y=fed.test_labels)
    truth = [g[0] for g in fed.extra["rotations"]]
    assert matched_accuracy(np.array(truth), np.array(c.device_clusters_)) == 1.0
    g = FedAvg(**kw).fit(fed.devices, fed.labels, test_X=fed.test_devices, test_y=fed.test_labels)
    assert c.history_[-1]["test_accuracy"] > g.history_[-1]["test_accuracy"] + 0.05
    # a device is served by its cluster's model; predict routes points by k-FED centers
    X0 = fed.test_devices[0]
    ref = c._model(c.models_[c.device_clusters_[0]]).predict(X0)
    np.testing.assert_array_equal(c.predict_device(0, X0), ref)
    assert c.predict(X0).shape == (40,)


def test_kprime_two_trains_each_local_cluster():
    fed = rotated_federation(2, n_devices=8, n_local_clusters=2, n_train=40, n_test=20)
    c = ClusteredFedAvg(n_clusters=4, n_local_clusters=2, **SMALL).fit(fed.devices, fed.labels)
    assert c.models_.shape[0] == 4
    assert all(len(lab) == 40 for lab in c.device_labels_)
    # every training image goes to the model of its own rotation (k-FED separates the
    # four rotations of the digits), so each device trains two different models
    rot = np.concatenate(fed.extra["point_rotations"])
    assert matched_accuracy(rot, np.concatenate(c.device_labels_)) >= 0.95
    assert all(len(np.unique(lab)) == 2 for lab in c.device_labels_)
    # every model moved away from the others: each got its own cluster's updates
    dist = np.linalg.norm(c.models_[:, None] - c.models_[None], axis=-1)
    assert dist[~np.eye(4, dtype=bool)].min() > 1e-3
    assert c.predict_device(3, fed.test_devices[3]).shape == (20,)


def test_byte_counts_follow_the_formulas():
    Z, R = 12, 3
    f = FedAvg(**SMALL).fit(FED.devices, FED.labels)
    p = f.models_.shape[1]
    assert p == 65 * 8 + 9 * 10
    assert f.communication_["bytes_down"] == R * Z * 8 * p
    assert f.communication_["bytes_up"] == R * Z * (8 * p + 24)
    assert sum(h["bytes_down"] for h in f.history_) == R * Z * 8 * p
    i = IFCA(n_clusters=3, **SMALL).fit(FED.devices, FED.labels)
    assert i.communication_["bytes_down"] == R * Z * 8 * 3 * p
    c = ClusteredFedAvg(n_clusters=4, **SMALL).fit(FED.devices, FED.labels)
    sizes = np.bincount(c.device_clusters_, minlength=4)
    setup_up = Z * (64 + 1) * 8
    per_round_down = sum(n * (8 * p + 8 + 16 * n) for n in sizes)
    assert c.communication_["bytes_up"] == setup_up + R * Z * (8 * p + 24)
    assert c.communication_["bytes_down"] == R * per_round_down + Z * 8  # + label maps


def test_messages_codec_round_trip(tmp_path):
    msgs = [ModelParams(np.arange(4.0)), ModelSet(np.ones((2, 3))),
            ClusterModel(np.ones(3), np.int64(1), np.array([4, 4]), np.array([0, 1])),
            ModelUpdate(np.ones(3) / 3, np.int64(2), np.int64(9), np.float64(0.25)),
            LossReport(np.float64(1.5), np.int64(3))]
    for i, msg in enumerate(msgs):
        back = type(msg).from_arrays(msg.to_arrays())
        save_message(msg, tmp_path / f"{i}.npz")
        disk = load_message(tmp_path / f"{i}.npz")
        for a, b, c in zip(msg.to_arrays().values(), back.to_arrays().values(),
                           disk.to_arrays().values()):
            assert a.tobytes() == b.tobytes() == c.tobytes() and a.dtype == c.dtype
    assert msgs[3].nbytes == 3 * 8 + 24


def test_bad_replies_are_rejected_by_name_and_the_run_goes_on():
    def tamper(z, rnd, arrays):
        if "params" in arrays and z == 1:
            arrays = dict(arrays, params=np.full_like(arrays["params"], np.nan))
        if "params" in arrays and z == 2:
            arrays = dict(arrays, params=arrays["params"][:5])
        return arrays

    m = FedAvg(**SMALL).fit(FED.devices, FED.labels, transport=InProcessTransport(tamper=tamper))
    assert "non-finite" in m.run_log_.rejected[1]
    assert "device 2" in m.run_log_.rejected[2] and "parameters" in m.run_log_.rejected[2]
    assert np.isfinite(m.models_).all()
    assert [h["devices"] for h in m.history_] == [10, 10, 10]


def test_dropout_and_late_devices():
    t = InProcessTransport(dropped=[0], late_devices=[5])
    c = ClusteredFedAvg(n_clusters=4, **SMALL).fit(FED.devices, FED.labels, transport=t)
    assert c.run_log_.dropped == [0] and c.run_log_.late == [5]
    assert c.device_clusters_[0] == -1
    # the late device is assigned to the k-FED centers: same cluster as its rotation peers
    peers = [z for z in range(12) if z % 4 == 1 and z != 5]
    assert {c.device_clusters_[z] for z in peers} == {c.device_clusters_[5]}
    f = FedAvg(**SMALL).fit(FED.devices, FED.labels, transport=t)
    assert all(h["devices"] == 10 for h in f.history_)


def test_same_seed_same_result_and_device_order():
    a = IFCA(n_clusters=2, clients_per_round=5, **SMALL).fit(FED.devices, FED.labels)
    b = IFCA(n_clusters=2, clients_per_round=5, **SMALL).fit(FED.devices, FED.labels)
    np.testing.assert_array_equal(a.models_, b.models_)
    perm = np.random.default_rng(0).permutation(12)
    c = IFCA(n_clusters=2, clients_per_round=5, **SMALL).fit(
        [FED.devices[i] for i in perm], [FED.labels[i] for i in perm], device_ids=perm.tolist())
    np.testing.assert_array_equal(a.models_, c.models_)


@pytest.mark.parametrize("selection", ["pow-d", "kfed-pow-d"])
def test_power_of_choice_keeps_m_devices(selection):
    m = FedAvg(selection=selection, clients_per_round=3, n_candidates=6, n_clusters=4,
               **SMALL).fit(FED.devices, FED.labels)
    assert [h["devices"] for h in m.history_] == [3, 3, 3]
    assert m.communication_["setup_bytes_up"] > 0


def test_same_result_on_flower():
    from fedclust.flower import FlowerInMemoryTransport

    for est in (IFCA(n_clusters=2, n_init=2, restart_rounds=1, **SMALL),
                ClusteredFedAvg(n_clusters=4, n_local_clusters=2, routing="gate", **SMALL)):
        a = est.fit(FED.devices, FED.labels).models_
        comm = est.communication_["bytes_total"]
        gates = getattr(est, "device_gates_", None)
        b = est.fit(FED.devices, FED.labels, transport=FlowerInMemoryTransport())
        np.testing.assert_array_equal(a, b.models_)
        assert b.communication_["bytes_total"] == comm
        if gates is not None:  # the devices' gates (client_finish) travel back through Flower
            for g, h in zip(gates, b.device_gates_):
                np.testing.assert_array_equal(g["clusters"], h["clusters"])
                np.testing.assert_allclose(g["coef"], h["coef"], rtol=1e-6, atol=1e-9)


def test_bad_input_names_device_and_value():
    Xs, ys = list(FED.devices[:3]), list(FED.labels[:3])
    with pytest.raises(ValidationError, match="device 1: X has 40 rows"):
        FedAvg().fit(Xs, [ys[0], ys[1][:5], ys[2]])
    bad = [ys[0], ys[1].copy(), ys[2]]
    bad[1][0] = 12
    with pytest.raises(ValidationError, match="device 1: label 12"):
        FedAvg(SoftmaxRegression(64, 10)).fit(Xs, bad)
    Xn = [Xs[0], Xs[1].copy(), Xs[2]]
    Xn[1][2, 3] = np.nan
    with pytest.raises(ValidationError, match="device 1 contains a non-finite"):
        FedAvg().fit(Xn, ys)
    with pytest.raises(ValidationError, match="device 2 has 0 points"):
        FedAvg().fit([Xs[0], Xs[1], Xs[2][:0]], [ys[0], ys[1], ys[2][:0]])
    with pytest.raises(ValidationError, match="n_clusters=0"):
        IFCA(n_clusters=0).fit(Xs, ys)
    with pytest.raises(ValidationError, match="clients_per_round=4 is larger"):
        FedAvg(clients_per_round=4).fit(Xs, ys)
    with pytest.raises(ValidationError, match="device 0: X has shape"):
        FedAvg(SoftmaxRegression(10, 10)).fit(Xs, ys)


def test_ifca_restarts_keep_the_start_with_the_lowest_loss_and_pay_for_all():
    kw = dict(rounds=4, n_hidden=8, lr=0.1, random_state=3)
    one = IFCA(n_clusters=4, **kw).fit(FED.devices, FED.labels)
    many = IFCA(n_clusters=4, n_init=3, restart_rounds=2, **kw).fit(FED.devices, FED.labels)
    assert one.restart_losses_.size == 0 and one.best_start_ == 0
    assert many.restart_losses_.shape == (3,)
    assert many.best_start_ == int(np.argmin(many.restart_losses_))
    assert many.history_[1]["train_loss"] == pytest.approx(many.restart_losses_.min())
    per_round = one.history_[0]["bytes_down"]  # all 12 devices download k models
    assert [h["bytes_down"] for h in many.history_] == [3 * per_round] * 2 + [per_round] * 2
    assert [h["devices"] for h in many.history_] == [12] * 4
    # start 0 is the single-start run's initialisation: same loss in the first round
    assert many.history_[0]["train_loss"] <= one.history_[0]["train_loss"] + 1e-12
    with pytest.raises(ValidationError, match="restart_rounds=4 must be below rounds=4"):
        IFCA(n_clusters=2, n_init=2, restart_rounds=4, rounds=4).fit(FED.devices, FED.labels)


def test_ifca_power_of_choice_keeps_m_devices_and_pays_for_the_probes():
    kw = dict(rounds=2, n_hidden=8, lr=0.1, random_state=3)
    i = IFCA(n_clusters=2, selection="pow-d", clients_per_round=3, n_candidates=6,
             **kw).fit(FED.devices, FED.labels)
    p = i.models_.shape[1]
    assert [h["devices"] for h in i.history_] == [3, 3]
    # per round: 6 candidates download the k = 2 models to probe, 3 download them to train
    assert [h["bytes_down"] for h in i.history_] == [(6 + 3) * 8 * 2 * p] * 2
    assert i.communication_["setup_bytes_up"] == 12 * 16  # the size round
    with pytest.raises(ValidationError, match="IFCA supports selection='random' or 'pow-d'"):
        IFCA(n_clusters=2, selection="kfed-pow-d", clients_per_round=3,
             **kw).fit(FED.devices, FED.labels)
