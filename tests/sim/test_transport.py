"""The in-process transport: dropout, late devices, tampered replies, failing clients."""

import numpy as np
import pytest

from conftest import make_structured_federation, matched_accuracy
from fedclust import KFed
from fedclust import ValidationError
from fedclust.kfed.protocol import KFedProtocol
from fedclust.sim.transport import InProcessTransport

K, KL, D = 8, 4, 10


@pytest.fixture(scope="module")
def fed():
    # 2 groups x 5 devices; every group keeps >= 1 device under the faults used below
    return make_structured_federation(k=K, k_local=KL, m0=5, d=D, n_per=15, seed=3)


def _fit(devices, **transport_kw):
    return KFed(K, KL, server="farthest-lloyd1", random_state=0).fit(
        devices, transport=InProcessTransport(**transport_kw))


def _up(k=KL, d=D):
    return k * (d + 1) * 8


# ------------------------------------------------------------------ dropout / late

@pytest.mark.parametrize("frac", [0.1, 0.3])
def test_dropout_fraction(fed, frac):
    devices, labels, _ = fed
    Z = len(devices)
    m = _fit(devices, dropout=frac)
    dropped = m.run_log_.dropped
    assert len(dropped) == round(frac * Z)
    assert len(set(dropped)) == len(dropped) and set(dropped) <= set(range(Z))
    assert m.run_log_.participants == [z for z in range(Z) if z not in dropped]
    for z in range(Z):
        if z in dropped:
            assert m.device_labels_[z] is None and m.local_centers_[z] is None
        else:
            assert m.device_labels_[z].shape == (len(devices[z]),)
    assert m.communication_["bytes_up"] == (Z - len(dropped)) * _up()
    assert all(str(z) not in m.communication_["per_device"] for z in dropped)
    part = m.run_log_.participants
    assert matched_accuracy(np.concatenate([labels[z] for z in part]),
                            np.concatenate([m.device_labels_[z] for z in part])) == 1.0


def test_dropout_is_seeded(fed):
    devices, _, _ = fed
    a = _fit(devices, dropout=0.3).run_log_.dropped
    b = _fit(devices, dropout=0.3).run_log_.dropped
    assert a == b


def test_explicit_dropped_and_late(fed):
    devices, labels, _ = fed
    m = _fit(devices, dropped=[2], late_devices=[7])
    assert m.run_log_.dropped == [2] and m.run_log_.late == [7]
    assert m.device_labels_[2] is None
    assert m.device_labels_[7] is not None
    assert 7 not in m.run_log_.participants


def test_unknown_fault_ids_raise(fed):
    devices, _, _ = fed
    with pytest.raises(ValidationError, match="99"):
        _fit(devices, dropped=[99])


@pytest.mark.parametrize("bad", [{"dropout": 1.5}, {"late": -0.1},
                                 {"on_client_error": "ignore"}])
def test_bad_transport_options(fed, bad):
    devices, _, _ = fed
    with pytest.raises(ValidationError):
        _fit(devices, **bad)


def test_late_devices_are_assigned_and_counted(fed):
    devices, labels, _ = fed
    Z = len(devices)
    m = _fit(devices, late=0.4)
    late = m.run_log_.late
    assert len(late) == round(0.4 * Z)
    assert not set(late) & set(m.run_log_.participants)
    assert all(m.device_labels_[z] is not None for z in range(Z))
    # late devices' labels are the nearest final center of each of their local centers
    for z in late:
        lc = m.local_centers_[z]
        near = ((lc[:, None, :] - m.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
        np.testing.assert_array_equal(m.center_labels_[z], near)
    assert matched_accuracy(np.concatenate(labels), m.labels_) == 1.0
    comm = m.communication_
    assert comm["rounds"] == 1
    assert comm["bytes_up"] == Z * _up()
    assert comm["bytes_down"] == Z * KL * 8
    for z in late:
        assert comm["per_device"][str(z)] == {"up": _up(), "down": KL * 8}


def test_late_devices_do_not_move_the_centers(fed):
    devices, _, _ = fed
    m = _fit(devices, late_devices=[1, 6])
    ref = KFed(K, KL, server="farthest-lloyd1", random_state=0).fit(
        [X for z, X in enumerate(devices) if z not in (1, 6)],
        device_ids=[z for z in range(len(devices)) if z not in (1, 6)])
    np.testing.assert_array_equal(m.cluster_centers_, ref.cluster_centers_)


# ------------------------------------------------------------------ tampered replies

def _tamper_one(target, fn):
    def tamper(z, rnd, arrays):
        return fn(dict(arrays)) if z == target else arrays
    return tamper


def _nan(a):
    c = a["centers"].copy()
    c[0, 0] = np.nan
    return {**a, "centers": c}


TAMPERS = {
    "nan": _nan,
    "inf": lambda a: {**a, "centers": np.full_like(a["centers"], np.inf)},
    "flat": lambda a: {**a, "centers": a["centers"].ravel()},
    "counts_len": lambda a: {**a, "counts": a["counts"][:-1]},
    "counts_zero": lambda a: {**a, "counts": np.zeros_like(a["counts"])},
    "extra": lambda a: {**a, "raw": np.zeros((3, D))},
    "missing": lambda a: {"centers": a["centers"]},
    "strings": lambda a: {**a, "centers": a["centers"].astype(str)},
    "objects": lambda a: {**a, "centers": a["centers"].astype(object)},
    "too_many": lambda a: {"centers": np.vstack([a["centers"], a["centers"] + 1]),
                           "counts": np.concatenate([a["counts"], a["counts"]])},
}


@pytest.mark.parametrize("target", [0, 4])
@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_reply_is_rejected_by_name(fed, name, target):
    devices, labels, _ = fed
    m = _fit(devices, tamper=_tamper_one(target, TAMPERS[name]))
    log = m.run_log_
    assert list(log.rejected) == [target]
    assert f"device {target}" in log.rejected[target]
    assert log.participants == [z for z in range(len(devices)) if z != target]
    assert m.device_labels_[target] is None
    others = [z for z in range(len(devices)) if z != target]
    assert matched_accuracy(np.concatenate([labels[z] for z in others]),
                            np.concatenate([m.device_labels_[z] for z in others])) == 1.0


@pytest.mark.parametrize("target", [0, 4])
def test_wrong_dimension_reply_rejects_only_the_liar(fed, target):
    # A well-formed reply with d+1 features: only that device is at fault,
    # whichever position it has in the round.
    devices, _, _ = fed
    widen = lambda a: {**a, "centers": np.hstack([a["centers"], np.zeros((len(a["centers"]), 1))])}
    m = _fit(devices, tamper=_tamper_one(target, widen))
    assert list(m.run_log_.rejected) == [target]
    assert f"device {target}" in m.run_log_.rejected[target]
    assert m.cluster_centers_.shape == (K, D)


def test_all_replies_rejected_raises(fed):
    devices, _, _ = fed
    with pytest.raises(ValidationError, match="device"):
        _fit(devices, tamper=lambda z, r, a: _nan(dict(a)))


def test_tampered_late_device_rejected(fed):
    devices, _, _ = fed
    m = _fit(devices, late_devices=[3], tamper=_tamper_one(3, _nan))
    assert list(m.run_log_.rejected) == [3]
    assert "device 3" in m.run_log_.rejected[3]
    assert m.device_labels_[3] is None


def test_late_device_with_too_many_centers_rejected(fed):
    # the protocol-level check (at most k_z centers) applies to late replies too
    devices, _, _ = fed
    m = _fit(devices, late_devices=[3], tamper=_tamper_one(3, TAMPERS["too_many"]))
    assert list(m.run_log_.rejected) == [3]
    assert m.device_labels_[3] is None


# ------------------------------------------------------------------ failing clients

def _with_constant_device(devices, z):
    devs = list(devices)
    devs[z] = np.ones_like(devs[z])  # fewer distinct points than k_z: the local step fails
    return devs


def test_failing_client_raises_by_default(fed):
    devices, _, _ = fed
    with pytest.raises(ValidationError, match="device 5"):
        _fit(_with_constant_device(devices, 5))


def test_failing_client_dropped_and_named(fed):
    devices, labels, _ = fed
    m = _fit(_with_constant_device(devices, 5), on_client_error="drop")
    log = m.run_log_
    assert list(log.failed) == [5]
    assert "device 5" in log.failed[5]
    assert 5 not in log.participants and m.device_labels_[5] is None
    others = [z for z in range(len(devices)) if z != 5]
    assert matched_accuracy(np.concatenate([labels[z] for z in others]),
                            np.concatenate([m.device_labels_[z] for z in others])) == 1.0
    assert m.communication_["bytes_up"] == len(others) * _up()


def test_failing_late_client_dropped(fed):
    devices, _, _ = fed
    m = _fit(_with_constant_device(devices, 5), late_devices=[5], on_client_error="drop")
    assert list(m.run_log_.failed) == [5]
    assert m.device_labels_[5] is None


# ------------------------------------------------------------------ protocol directly

def test_protocol_on_transport_with_sparse_ids(fed):
    devices, labels, _ = fed
    ids = [3 * z + 10 for z in range(len(devices))]
    proto = KFedProtocol(K, KL)
    out = InProcessTransport().run(proto, dict(zip(ids, devices)), random_state=4)
    assert sorted(out.device_outputs) == ids
    pred = np.concatenate([out.device_outputs[i]["labels"] for i in ids])
    assert matched_accuracy(np.concatenate(labels), pred) == 1.0
    assert out.meter.rounds == 1
    assert out.meter.bytes_up == len(ids) * _up()
    assert out.log.participants == ids


def test_protocol_config_round_trip():
    proto = KFedProtocol(5, {0: 2, 4: 3}, server="single-linkage", weighted=True, tol=1e-3)
    back = KFedProtocol.from_config(proto.config())
    assert back.config() == proto.config()
    assert back.k_local(4) == 3 and back.k_local(0) == 2
    with pytest.raises(ValidationError, match="device 9"):
        back.k_local(9)
