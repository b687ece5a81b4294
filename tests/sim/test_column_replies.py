"""Replies held column-wise in the in-process transport (``Protocol.client_steps_stacked``):
the same replies, bytes, verdicts and outputs as the one-device-at-a-time codec path,
which an identity tamper forces (a tamper rewrites replies one by one)."""

import numpy as np
import pytest

from fedclust.core.exceptions import IncompatibleMessageError
from fedclust.core.messages import StackedReplies
from fedclust.core.protocol import Request
from fedclust.kfed.local import local_scatter, local_scatter_stacked
from fedclust.kfed.messages import LabelMap, LocalCenters, LocalSummary
from fedclust.kfed.protocol import KFedProtocol
from fedclust.sim.transport import InProcessTransport

K, D = 6, 5


def _federation(seed=0):
    """60 devices of 12 points (batched) and 3 devices of other sizes (their own batches or
    alone), drawn around 6 well-separated means."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=20.0, size=(K, D))
    devices = {}
    sizes = [12] * 60 + [17, 9, 30]
    for z, n in enumerate(sizes):
        pick = rng.choice(K, 2, replace=False)
        devices[z] = means[pick[rng.integers(0, 2, n)]] + rng.normal(size=(n, D))
    return devices


def _identity(z, r, arrays):
    return arrays


def _run(protocol, devices, **kw):
    return InProcessTransport(n_jobs=1, **kw).run(protocol, devices, random_state=3)


@pytest.mark.parametrize("server", ["farthest-lloyd1", "weighted-kmeans++"])
def test_column_path_equals_one_device_at_a_time(server):
    devices = _federation()
    fast = _run(KFedProtocol(K, 2, server=server), devices)
    slow = _run(KFedProtocol(K, 2, server=server), devices, tamper=_identity)
    np.testing.assert_array_equal(fast.result.centers, slow.result.centers)
    for z in devices:
        np.testing.assert_array_equal(fast.result.local_centers[z], slow.result.local_centers[z])
        np.testing.assert_array_equal(fast.result.local_counts[z], slow.result.local_counts[z])
        np.testing.assert_array_equal(fast.device_outputs[z]["labels"],
                                      slow.device_outputs[z]["labels"])
    assert fast.meter.summary() == slow.meter.summary()   # bytes per device and direction
    assert fast.log.participants == slow.log.participants == sorted(devices)
    assert not fast.log.rejected and not fast.log.failed


def test_bytes_per_device_are_the_replies_own():
    devices = _federation()
    protocol = KFedProtocol(K, 2, server="weighted-kmeans++")   # replies: LocalSummary
    out = _run(protocol, devices)
    for z, X in devices.items():
        k_sent = protocol.k_sent(2, len(X))
        assert out.meter.up[z] == k_sent * (D * 8 + 8 + 8)   # centers, counts, scatter
        assert out.meter.down[z] == K * D * 8                 # the final centers
    assert out.meter.messages_up == len(devices)
    assert out.meter.messages_down == 2 * len(devices)   # the round's request and the final


class _OneBadRow(KFedProtocol):
    """Honest device maths, but one device's row of a batch is broken on the way out."""

    bad_device = 7
    field, value = "counts", 0

    def client_steps_stacked(self, request, devices, *, seed, states):
        batches, rest = super().client_steps_stacked(request, devices, seed=seed, states=states)
        for batch in batches:
            if self.bad_device in batch.ids:
                batch.arrays[self.field][batch.ids.index(self.bad_device)] = self.value
        return batches, rest


def _break(z, r, arrays, field="counts", value=0):
    if z != _OneBadRow.bad_device:
        return arrays
    arrays = {name: a.copy() for name, a in arrays.items()}
    arrays[field][...] = value
    return arrays


@pytest.mark.parametrize("field,value", [("counts", 0), ("centers", np.nan)])
def test_a_broken_row_is_rejected_by_name_and_the_rest_kept(field, value):
    devices = _federation()
    protocol = _OneBadRow(K, 2, server="farthest-lloyd1")
    protocol.field, protocol.value = field, value
    out = _run(protocol, devices)
    bad = _OneBadRow.bad_device
    assert list(out.log.rejected) == [bad]
    assert f"device {bad}" in out.log.rejected[bad]
    assert out.log.participants == [z for z in sorted(devices) if z != bad]
    # the same verdict, word for word, as the one-by-one codec gives the same bytes
    ref = _run(KFedProtocol(K, 2, server="farthest-lloyd1"), devices,
               tamper=lambda z, r, a: _break(z, r, a, field, value))
    assert out.log.rejected == ref.log.rejected
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.meter.summary() == ref.meter.summary()


def _batch(n_devices, k, d, rng):
    return StackedReplies(LocalCenters, list(range(n_devices)), {
        "centers": rng.normal(size=(n_devices, k, d)),
        "counts": rng.integers(1, 9, size=(n_devices, k))})


def test_check_batch_gives_check_reply_verdicts():
    rng = np.random.default_rng(1)
    protocol = KFedProtocol(3, {0: 2, 1: 4, 2: 4}, server="farthest-lloyd1", n_features=5)
    state = protocol.start([0, 1, 2], 0)
    request = Request(round=0, action="local_centers")
    for d in (5, 4):   # 4 features: every device refused (the federation has 5)
        batch = _batch(3, 3, d, rng)
        messages = batch.messages()
        expected = {}
        for z, msg in zip(batch.ids, messages):
            try:
                protocol.check_reply(state, request, z, msg)
            except IncompatibleMessageError as exc:
                expected[z] = str(exc)
        got = {z: str(e) for z, e in protocol.check_batch(state, request, batch, messages).items()}
        assert got == expected
        assert set(got) == ({0} if d == 5 else {0, 1, 2})   # device 0 may send only 2


def test_stacked_messages_are_the_decoded_wires():
    rng = np.random.default_rng(2)
    batch = _batch(4, 3, 2, rng)
    assert LocalCenters.check_stacked(batch.arrays)
    for wire, msg in zip(batch.wires(), batch.messages()):
        ref = LocalCenters.from_arrays(wire, sender="x")
        assert type(msg) is LocalCenters
        np.testing.assert_array_equal(msg.centers, ref.centers)
        np.testing.assert_array_equal(msg.counts, ref.counts)
        assert msg.nbytes == batch.nbytes_each == 3 * 2 * 8 + 3 * 8


@pytest.mark.parametrize("breakage", ["zero count", "nan", "missing field", "extra dim",
                                      "int centers", "count shape"])
def test_check_stacked_refuses_what_from_arrays_refuses(breakage):
    rng = np.random.default_rng(3)
    arrays = dict(_batch(4, 3, 2, rng).arrays)
    if breakage == "zero count":
        arrays["counts"][2, 1] = 0
    elif breakage == "nan":
        arrays["centers"][1, 0, 0] = np.nan
    elif breakage == "missing field":
        del arrays["counts"]
    elif breakage == "extra dim":
        arrays["counts"] = arrays["counts"][:, :, None]
    elif breakage == "int centers":
        arrays["centers"] = arrays["centers"].astype(np.int64)
    else:
        arrays["counts"] = arrays["counts"][:, :2]
    assert not LocalCenters.check_stacked(arrays)
    wires = StackedReplies(LocalCenters, [0, 1, 2, 3], arrays).wires() \
        if "counts" in arrays else [{"centers": c} for c in arrays["centers"]]
    refused = [isinstance(m, IncompatibleMessageError)
               for m in LocalCenters.from_arrays_many(wires, [f"d{i}" for i in range(4)])]
    assert any(refused)


def test_stacked_label_maps_and_summaries():
    rng = np.random.default_rng(4)
    labels = {"global_labels": rng.integers(0, 5, size=(3, 4))}
    assert LabelMap.check_stacked(labels)
    summary = {"centers": rng.normal(size=(3, 2, 4)), "counts": np.ones((3, 2), np.int64),
               "scatter": np.ones((3, 3))}
    assert not LocalSummary.check_stacked(summary)   # scatter of 3 for 2 centers


def test_local_scatter_stacked_is_each_devices_local_scatter():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(7, 11, 3))
    C = rng.normal(size=(7, 4, 3))
    L = rng.integers(0, 4, size=(7, 11))
    L[0] = 0   # a device with empty clusters
    S = local_scatter_stacked(X, C, L)
    for b in range(7):
        np.testing.assert_array_equal(S[b], local_scatter(X[b], C[b], L[b]))


def test_stacked_client_finish_equals_client_finish_and_is_recorded():
    from fedclust.unlearning.store import SummaryStore, recording

    rng = np.random.default_rng(6)
    protocol = KFedProtocol(K, 3)
    G = rng.integers(0, K, size=(5, 3))
    batch = StackedReplies(LabelMap, [10, 11, 12, 13, 14], {"global_labels": G})
    datas = [rng.normal(size=(8, D)) for _ in range(5)]
    states = [{"local_labels": rng.integers(0, 3, size=8)} for _ in range(5)]
    states[2]["n_clipped"] = np.asarray(4)
    one = [protocol.client_finish(m, X, s) for m, X, s in zip(batch.messages(), datas, states)]
    memory = {}
    with recording(protocol, SummaryStore([]), memory, dict(zip(batch.ids, datas))):
        many = protocol.client_finish_stacked(batch, datas, states)
    assert memory == dict(zip(batch.ids, states))   # each device's own state, kept for forget
    for a, b in zip(one, many):
        assert a.keys() == b.keys()
        np.testing.assert_array_equal(a["labels"], b["labels"])
        assert a["labels"].dtype == b["labels"].dtype == np.int64
    np.testing.assert_array_equal(many[2]["n_clipped"], 4)
    # devices of different sizes in one batch: one at a time, the same answers
    states[1] = {"local_labels": rng.integers(0, 3, size=5)}
    datas[1] = datas[1][:5]
    mixed = protocol.client_finish_stacked(batch, datas, states)
    for m, X, s, got in zip(batch.messages(), datas, states, mixed):
        np.testing.assert_array_equal(got["labels"], protocol.client_finish(m, X, s)["labels"])
