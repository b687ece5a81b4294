"""Secure aggregation on the in-process transport: the server's code sees only sums."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import make_structured_federation

from fedclust import KFed
from fedclust.baselines import DistributedLloyd
from fedclust.core.exceptions import ValidationError
from fedclust.core.secure_sum import SUMMED, SecureAggregation
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.sim.transport import InProcessTransport


@pytest.fixture(scope="module")
def fed():
    devices, _, _ = make_structured_federation(k=4, k_local=2, m0=3, d=5, n_per=20, seed=3)
    return devices  # 6 devices


class _Spy(DistributedLloydProtocol):
    """Records what the server maths receives in the Lloyd rounds."""

    seen: list

    def server_step(self, state, request, replies):
        if request.action == "lloyd":
            self.seen.append({z: {k: v.copy() for k, v in r.to_arrays().items()}
                              for z, r in replies.items()})
        super().server_step(state, request, replies)


def _run(fed, tamper=None, secure=True):
    p = _Spy(4, points_per_device=5, max_rounds=3, tol=0.0)
    p.seen = []
    devs = dict(enumerate(fed))
    out = InProcessTransport(secure_aggregation=secure, tamper=tamper).run(p, devs, 11)
    return p, out


def test_secure_lloyd_matches_plaintext_within_fixed_point(fed):
    a = DistributedLloyd(4, random_state=2, max_rounds=5).fit(fed)
    b = DistributedLloyd(4, random_state=2, max_rounds=5, secure_aggregation=True).fit(fed)
    assert a.n_rounds_ == b.n_rounds_
    # sums carry at most n * 2**-21 error per entry; centers = sums / counts
    assert np.abs(a.cluster_centers_ - b.cluster_centers_).max() < len(fed) * 2.0 ** -20
    assert b.communication_["secure_exchanges"] == 3 * (b.n_rounds_ - 1)
    assert b.communication_["bytes_up"] > a.communication_["bytes_up"]
    c = DistributedLloyd(4, random_state=2, max_rounds=5,
                         secure_aggregation=SecureAggregation(frac_bits=30)).fit(fed)
    assert np.abs(a.cluster_centers_ - c.cluster_centers_).max() < len(fed) * 2.0 ** -30


def test_server_code_receives_only_the_sum(fed):
    p, _ = _run(fed)
    plain, _ = _run(fed, secure=False)
    assert all(list(step) == [SUMMED] for step in p.seen)
    for step, ref in zip(p.seen, plain.seen):
        total = step[SUMMED]
        assert not any(np.array_equal(total["sums"], r["sums"]) for r in ref.values())
        np.testing.assert_allclose(total["sums"], sum(r["sums"] for r in ref.values()),
                                   atol=len(fed) * 2.0 ** -21, rtol=0)
        assert np.array_equal(total["counts"], sum(r["counts"] for r in ref.values()))


def test_server_input_unchanged_when_replies_change_with_the_sum_fixed(fed):
    def shift(z, rnd, arrays):
        if z not in (0, 1) or "counts" not in arrays:
            return arrays
        arrays = dict(arrays)
        sign = 1 if z == 0 else -1
        arrays["sums"] = arrays["sums"] + sign * 0.25
        arrays["counts"] = arrays["counts"] + sign * np.array([1, -1, 0, 0])
        return arrays

    a, _ = _run(fed)
    b, _ = _run(fed, tamper=shift)
    assert len(a.seen) == len(b.seen) == 3
    for x, y in zip(a.seen, b.seen):
        for field in ("sums", "counts", "cost"):
            assert np.array_equal(x[SUMMED][field], y[SUMMED][field])
    # without secure aggregation the server does see the change
    def shift_sums(z, rnd, arrays):
        return {**arrays, "sums": arrays["sums"] + 0.25} if z == 0 and "sums" in arrays else arrays

    c, _ = _run(fed, secure=False)
    d, _ = _run(fed, tamper=shift_sums, secure=False)
    assert np.array_equal(c.seen[0][0]["sums"] + 0.25, d.seen[0][0]["sums"])


def test_a_third_dropping_after_masking_are_named_and_the_run_completes(fed):
    t = InProcessTransport(secure_aggregation=True, drop_after_masking=[1, 4],
                           on_client_error="drop")
    m = DistributedLloyd(4, random_state=2, max_rounds=4, secure_aggregation=True).fit(
        fed, transport=t)
    assert sorted(m.run_log_.failed) == [1, 4]
    assert "dropped after masking" in m.run_log_.failed[1]
    assert m.run_log_.participants == [0, 2, 3, 5]
    assert np.isfinite(m.cluster_centers_).all()
    # what the server unmasks is the plaintext sum over the four survivors (their masks
    # with the dropped two are reconstructed and removed), to fixed-point precision
    p = _Spy(4, points_per_device=5, max_rounds=3, tol=0.0)
    p.seen = []
    InProcessTransport(secure_aggregation=True, drop_after_masking=[1, 4],
                       on_client_error="drop").run(p, dict(enumerate(fed)), 11)
    plain, _ = _run(fed, secure=False)
    (summed,) = p.seen[0].values()
    for field in ("sums", "counts", "cost"):
        survivors = sum(plain.seen[0][z][field] for z in (0, 2, 3, 5))
        everyone = sum(plain.seen[0][z][field] for z in range(6))
        np.testing.assert_allclose(summed[field], survivors, rtol=0, atol=4 * 2.0 ** -20)
        assert np.abs(survivors - everyone).max() > 1.0


def test_rounds_that_cannot_be_summed_are_refused(fed):
    with pytest.raises(ValidationError, match="protocol 'kfed' has no round whose replies the "
                                              "server only sums .*local centers"):
        KFed(4, 2, random_state=0).fit(fed, transport=InProcessTransport(secure_aggregation=True))
    with pytest.raises(ValidationError, match="transport has secure_aggregation off"):
        DistributedLloyd(4, secure_aggregation=True).fit(fed, transport=InProcessTransport())


def test_flower_message_api_gives_the_same_secure_result(fed, monkeypatch):
    """The real ServerApp/ClientApp (every message through protobuf): bit-identical to
    the in-process secure run (masks cancel exactly mod 2**64); no Lloyd reply that
    reaches the server carries the plaintext record."""
    pytest.importorskip("flwr")
    from fedclust.flower.codec import REPLY, SECAGG
    from fedclust.flower.grid import FlowerInMemoryTransport, LocalGrid

    seen = []
    pull = LocalGrid.pull_messages

    def spy(self, ids):
        out = pull(self, ids)
        seen.extend(out)
        return out

    monkeypatch.setattr(LocalGrid, "pull_messages", spy)

    a = DistributedLloyd(4, random_state=2, max_rounds=4, secure_aggregation=True).fit(fed)
    t = FlowerInMemoryTransport(secure_aggregation=True)
    b = DistributedLloyd(4, random_state=2, max_rounds=4, secure_aggregation=True).fit(
        fed, transport=t)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.communication_ == b.communication_
    assert a.run_log_ == b.run_log_
    lloyd = [m for m in seen if m.metadata.message_type == "query.lloyd"]
    assert len(lloyd) == 4 * len(fed) * (b.n_rounds_ - 1)  # four stages per secure round
    assert all(REPLY not in m.content.array_records and SECAGG in m.content.array_records
               for m in lloyd)
    assert {k for m in lloyd for k in m.content.array_records[SECAGG].keys()} == {
        "c_pk", "s_pk", "dst", "ct", "y", "layout", "bad_src", "ids", "kind", "share"}


# -- FedAvg --------------------------------------------------------------------
def test_fedavg_secure_sums_match_plaintext_and_hide_updates():
    from fedclust.fl import FedAvg, IFCA, rotated_federation
    from fedclust.fl.messages import SummedUpdate
    from fedclust.fl.protocol import FedAvgProtocol

    fed = rotated_federation(0, n_devices=6, n_train=30, n_test=5)
    kw = dict(rounds=3, lr=0.2, random_state=4)
    a = FedAvg("softmax", **kw).fit(fed.devices, fed.labels)
    b = FedAvg("softmax", **kw).fit(fed.devices, fed.labels,
                                     transport=InProcessTransport(secure_aggregation=True))
    # weighted sums of 30-sample updates: error <= 6 * 2**-21 on each sum, / 180 samples
    assert np.abs(a.models_ - b.models_).max() < 1e-6
    for ha, hb in zip(a.history_, b.history_):
        assert ha["devices"] == hb["devices"] == 6
        assert abs(ha["train_loss"] - hb["train_loss"]) < 1e-6
    assert b.communication_["secure_exchanges"] == 3 * 3

    seen = []

    class Spy(FedAvgProtocol):
        def _train_step(self, state, request, replies):
            seen.append(dict(replies))
            super()._train_step(state, request, replies)

    p = Spy(model="softmax", n_features=64, n_classes=10, rounds=2, secure_sum=True)
    InProcessTransport(secure_aggregation=True).run(
        p, {z: (X, y) for z, (X, y) in enumerate(zip(fed.devices, fed.labels))}, 1)
    assert all(list(r) == [SUMMED] and isinstance(r[SUMMED], SummedUpdate) for r in seen)
    assert int(seen[0][SUMMED].n_devices) == 6 and float(seen[0][SUMMED].weight) == 180.0
    with pytest.raises(ValidationError, match="needs aggregator='mean'"):
        FedAvgProtocol(model="softmax", n_features=64, aggregator="median", secure_sum=True)
    with pytest.raises(ValidationError, match="protocol 'ifca' has no round"):
        IFCA(n_clusters=2, model="softmax", rounds=1, random_state=0).fit(
            fed.devices, fed.labels, transport=InProcessTransport(secure_aggregation=True))


def test_fedavg_keyword_equals_the_secure_transport_and_refuses_what_it_cannot_sum():
    from fedclust.fl import FedAvg, rotated_federation
    from fedclust.fl.protocol import FedAvgProtocol
    from fedclust.privacy import DifferentialPrivacy

    fed = rotated_federation(1, n_devices=5, n_train=20, n_test=5)
    kw = dict(rounds=2, lr=0.2, random_state=3)
    by_transport = FedAvg("softmax", **kw).fit(
        fed.devices, fed.labels, transport=InProcessTransport(secure_aggregation=True))
    by_keyword = FedAvg("softmax", secure_aggregation=True, **kw).fit(fed.devices, fed.labels)
    np.testing.assert_array_equal(by_keyword.models_, by_transport.models_)
    assert by_keyword.communication_["secure_exchanges"] == 3 * 2
    with pytest.raises(ValidationError, match="transport has secure_aggregation off"):
        FedAvg("softmax", secure_aggregation=True, **kw).fit(
            fed.devices, fed.labels, transport=InProcessTransport())
    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-5, unit="device", clip_norm=1.0)
    with pytest.raises(ValidationError, match="needs the distributed noise"):
        FedAvgProtocol(model="softmax", n_features=64, privacy=dp, secure_sum=True)


def test_fedavg_secure_on_flower_message_api_is_identical():
    pytest.importorskip("flwr")
    from fedclust.fl import FedAvg, rotated_federation
    from fedclust.flower.grid import FlowerInMemoryTransport

    fed = rotated_federation(1, n_devices=4, n_train=20, n_test=5)
    kw = dict(rounds=1, lr=0.2, random_state=6)
    a = FedAvg("softmax", **kw).fit(fed.devices, fed.labels,
                                     transport=InProcessTransport(secure_aggregation=True))
    b = FedAvg("softmax", **kw).fit(fed.devices, fed.labels,
                                     transport=FlowerInMemoryTransport(secure_aggregation=True))
    assert np.array_equal(a.models_, b.models_)
    assert a.communication_ == b.communication_


def test_secure_meter_survives_the_result_files(fed, tmp_path):
    """What a deployed ServerApp writes and `fedclust flower result` reads keeps the
    secure exchanges (result.npz, no pickle)."""
    pytest.importorskip("flwr")
    from fedclust.flower.results import load_run_output, save_run_output

    p = DistributedLloydProtocol(4, points_per_device=5, max_rounds=2, tol=0.0)
    out = InProcessTransport(secure_aggregation=True).run(p, dict(enumerate(fed)), 3)
    save_run_output(out, p.name, tmp_path)
    back, _ = load_run_output(tmp_path)
    assert back.meter.secure_exchanges == out.meter.secure_exchanges == 6
    assert back.meter.summary() == out.meter.summary()


def test_generated_app_config_carries_secure_aggregation(tmp_path):
    """`[simulation] secure_aggregation = true` reaches the Flower run config, FedAvg's
    protocol is built in its summable form, and k-FED is refused up front."""
    from fedclust.config import check_config
    from fedclust.flower_app import app_run_config

    fedavg = check_config({"seed": 1, "data": {"source": "rotated-images", "n_devices": 3,
                                               "n_train": 10, "n_test": 2},
                           "algorithm": {"name": "fedavg", "model": "softmax", "rounds": 1},
                           "simulation": {"secure_aggregation": True}})
    rc = app_run_config(fedavg, result_dir=tmp_path, faults=False)
    assert rc["secure-aggregation"] is True and rc["params.secure_sum"] is True
    kfed = check_config({"seed": 1, "data": {"source": "gaussians", "n_features": 3,
                                             "n_clusters": 2, "n_local_clusters": 1, "m0": 2},
                         "algorithm": {"name": "kfed", "n_clusters": 2, "n_local_clusters": 1},
                         "simulation": {"secure_aggregation": True}})
    with pytest.raises(ValidationError, match="protocol 'kfed' has no round"):
        app_run_config(kfed, result_dir=tmp_path)
