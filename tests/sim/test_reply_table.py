"""A round's batches of k-FED replies reach the server column-wise (``ReplyTable``): the
same result, verdicts, byte counts, kept summaries and forgets as the one-device-at-a-time
codec path, which an identity tamper forces (a tamper rewrites replies one by one)."""

import numpy as np
import pytest

from fedclust.core.checkpoint import from_plain, to_plain
from fedclust.core.messages import ReplyTable, StackedReplies
from fedclust.kfed import KFed
from fedclust.kfed.messages import LocalCenters
from fedclust.kfed.protocol import KFedProtocol
from fedclust.sim.meter import CommunicationMeter
from fedclust.sim.transport import InProcessTransport
from fedclust.unlearning.store import SummaryStore, digest_message, recording

K, D = 6, 4


def _federation(n_devices, seed=0, n_rows=10):
    """``n_devices`` devices of ``n_rows`` points (more than one transport chunk of 1,024
    for n_devices > 1,024) around K well-separated means, two of them per device."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=20.0, size=(K, D))
    devices = {}
    for z in range(n_devices):
        pick = rng.choice(K, 2, replace=False)
        devices[z] = means[pick[rng.integers(0, 2, n_rows)]] + rng.normal(size=(n_rows, D))
    return devices


def _identity(z, r, arrays):
    return arrays


def _recorded_run(protocol, devices, **kw):
    store = SummaryStore(sorted(devices))
    with recording(protocol, store):
        out = InProcessTransport(n_jobs=1, **kw).run(protocol, devices, random_state=3)
    return out, store


def _assert_same_run(fast, slow, fast_store, slow_store):
    np.testing.assert_array_equal(fast.result.centers, slow.result.centers)
    assert list(fast.result.local_centers) == list(slow.result.local_centers)
    for z in slow.result.local_centers:
        np.testing.assert_array_equal(fast.result.local_centers[z], slow.result.local_centers[z])
        np.testing.assert_array_equal(fast.result.local_counts[z], slow.result.local_counts[z])
        np.testing.assert_array_equal(fast.result.center_labels[z],
                                      slow.result.center_labels[z])
    assert fast.device_outputs.keys() == slow.device_outputs.keys()
    for z in slow.device_outputs:
        np.testing.assert_array_equal(fast.device_outputs[z]["labels"],
                                      slow.device_outputs[z]["labels"])
    assert fast.meter.summary() == slow.meter.summary()   # bytes per device and direction
    assert fast.log.rejected == slow.log.rejected
    assert fast.log.participants == slow.log.participants
    # the server keeps the same summaries, in the same device order, with the same digests
    [fr], [sr] = fast_store.rounds, slow_store.rounds
    assert list(fr.replies) == list(sr.replies)
    assert fast_store.digest() == slow_store.digest()
    fa, fm = fast_store.to_arrays()
    sa, sm = slow_store.to_arrays()
    assert fm == sm and fa.keys() == sa.keys()
    for key in sa:
        np.testing.assert_array_equal(fa[key], sa[key])


@pytest.mark.parametrize("server", ["farthest-lloyd1", "weighted-kmeans++"])
def test_batches_reach_the_server_whole_and_give_the_per_device_result(server):
    devices = _federation(2100)   # three transport chunks
    fast, fast_store = _recorded_run(KFedProtocol(K, 2, server=server), devices)
    slow, slow_store = _recorded_run(KFedProtocol(K, 2, server=server), devices,
                                     tamper=_identity)
    kept = fast_store.rounds[0].replies
    assert isinstance(kept, ReplyTable) and kept.columnar   # no message object per device
    assert not isinstance(slow_store.rounds[0].replies, ReplyTable)
    _assert_same_run(fast, slow, fast_store, slow_store)


class _NanRow(KFedProtocol):
    """Honest device maths, but one device's row of its batch is broken on the way out."""

    bad_device = 1500   # in the second transport chunk

    def client_steps_stacked(self, request, devices, *, seed, states):
        batches, rest = super().client_steps_stacked(request, devices, seed=seed, states=states)
        for batch in batches:
            if self.bad_device in batch.ids:
                batch.arrays["centers"][batch.ids.index(self.bad_device), 0, 0] = np.nan
        return batches, rest


def _nan_for_bad(z, r, arrays):
    if z != _NanRow.bad_device:
        return arrays
    arrays = {name: a.copy() for name, a in arrays.items()}
    arrays["centers"][0, 0] = np.nan
    return arrays


def test_a_nan_reply_is_rejected_by_name_and_the_other_batches_stay_whole():
    devices = _federation(2100)
    bad = _NanRow.bad_device
    fast, fast_store = _recorded_run(_NanRow(K, 2), devices)
    slow, slow_store = _recorded_run(KFedProtocol(K, 2), devices, tamper=_nan_for_bad)
    assert list(fast.log.rejected) == [bad] and f"device {bad}" in fast.log.rejected[bad]
    assert bad not in fast.log.participants and bad not in fast_store.rounds[0].replies
    _assert_same_run(fast, slow, fast_store, slow_store)


def test_the_table_is_the_mapping_of_its_batches_messages():
    rng = np.random.default_rng(1)
    batches = [StackedReplies(LocalCenters, ids, {
        "centers": rng.normal(size=(len(ids), 3, 2)),
        "counts": rng.integers(1, 9, size=(len(ids), 3))}) for ids in ([4, 1, 7], [2, 9])]
    ref = {z: m for b in batches for z, m in zip(b.ids, b.messages())}
    table = ReplyTable(batches)
    assert list(table) == table.ids == [4, 1, 7, 2, 9] and len(table) == 5
    assert 7 in table and 3 not in table and "summed" not in table
    for name in ("centers", "counts"):
        for got, z in zip(table.column(name), table.ids):
            np.testing.assert_array_equal(got, getattr(ref[z], name))
    copy = table.copy()
    assert table.columnar   # reading ids and columns built no message
    assert [digest_message(table[z]) for z in table] == [digest_message(ref[z]) for z in ref]
    assert not table.columnar
    del table[1]
    table[3] = ref[4]
    assert list(table) == [4, 7, 2, 9, 3] and len(table) == 5
    assert 3 in table and 1 not in table
    np.testing.assert_array_equal(table.column("counts")[-1], ref[4].counts)
    assert copy.columnar and list(copy) == [4, 1, 7, 2, 9]   # the copy did not change
    assert list(dict(copy)) == list(ref)
    # checkpointed as the dictionary of its messages
    arrays = {}
    back = from_plain(to_plain(copy, arrays), arrays)
    assert type(back) is dict and list(back) == list(ref)
    for z in ref:
        assert digest_message(back[z]) == digest_message(ref[z])


def test_forget_after_a_columnar_fit_equals_forget_after_a_per_device_fit():
    Xs = list(_federation(1300, seed=2).values())
    fast = KFed(K, 2, server="farthest-lloyd1", random_state=0).fit(
        Xs, transport=InProcessTransport(n_jobs=1))
    slow = KFed(K, 2, server="farthest-lloyd1", random_state=0).fit(
        Xs, transport=InProcessTransport(n_jobs=1, tamper=_identity))
    assert isinstance(fast._unlearning_.store.rounds[0].replies, ReplyTable)
    np.testing.assert_array_equal(fast.cluster_centers_, slow.cluster_centers_)
    assert fast.communication_ == slow.communication_
    for model in (fast, slow):
        model.forget(devices=[5, 1100])
    np.testing.assert_array_equal(fast.cluster_centers_, slow.cluster_centers_)
    for a, b in zip(fast.device_labels_, slow.device_labels_):
        np.testing.assert_array_equal(a, b)
    assert fast.verify().ok and slow.verify().ok
    fresh = KFed(K, 2, server="farthest-lloyd1", random_state=0).fit(
        [X for i, X in enumerate(Xs) if i not in (5, 1100)],
        device_ids=[i for i in range(len(Xs)) if i not in (5, 1100)])
    # the downdate agrees with a retrain up to rounding (its sums are updated, not redone)
    np.testing.assert_allclose(fast.cluster_centers_, fresh.cluster_centers_, rtol=1e-12)


def test_checkpointed_run_equals_the_plain_run(tmp_path):
    devices = _federation(1100)
    plain, plain_store = _recorded_run(KFedProtocol(K, 2), devices)
    saved, saved_store = _recorded_run(KFedProtocol(K, 2), devices, checkpoint_dir=tmp_path)
    assert (tmp_path / "checkpoint.npz").exists()
    _assert_same_run(saved, plain, saved_store, plain_store)


def test_per_device_counts_are_every_devices_sums():
    meter = CommunicationMeter()
    meter.record_up_many([3, 1, 2], 10)
    meter.record_up(1, 5)
    meter.record_down_many([1, 4], 7)
    per = meter.summary()["per_device"]
    assert list(per) == ["1", "2", "3", "4"]
    assert per == {"1": {"up": 15, "down": 7}, "2": {"up": 10, "down": 0},
                   "3": {"up": 10, "down": 0}, "4": {"up": 0, "down": 7}}


class _OwnCheck(KFedProtocol):
    """A subclass with its own reply check: it must see every reply as a message."""

    seen = None

    def check_reply(self, state, request, device_id, reply):
        type(self).seen = type(reply)
        super().check_reply(state, request, device_id, reply)

    def check_batch(self, state, request, batch, messages):
        return super(KFedProtocol, self).check_batch(state, request, batch, messages)


def test_a_subclass_with_its_own_checks_gets_messages():
    from fedclust.lloyd.refine import RefinedKFedProtocol

    assert KFedProtocol(K, 2).reads_stacked_replies
    assert not _OwnCheck(K, 2).reads_stacked_replies
    assert not RefinedKFedProtocol(K, 2, refine_rounds=1).reads_stacked_replies
    devices = _federation(300)
    out, store = _recorded_run(_OwnCheck(K, 2), devices)
    assert _OwnCheck.seen is LocalCenters
    assert type(store.rounds[0].replies) is dict
    ref, ref_store = _recorded_run(KFedProtocol(K, 2), devices)
    _assert_same_run(out, ref, store, ref_store)
