"""KFed.fit over an iterator of devices: the same model as over a list, rows not kept."""

import numpy as np
import pytest

from conftest import make_structured_federation

from fedclust import KFed
from fedclust.core.exceptions import ValidationError
from fedclust.kfed import stream
from fedclust.kfed.protocol import KFedProtocol


@pytest.fixture(scope="module")
def fed():
    devices, labels, _ = make_structured_federation(k=6, k_local=2, m0=4, d=5, n_per=12, seed=3)
    return devices


@pytest.mark.parametrize("server", ["farthest-lloyd1", "kmeans++", "single-linkage",
                                    "weighted-kmeans++"])
def test_generator_gives_the_list_result(fed, server):
    a = KFed(6, 2, server=server, random_state=2).fit(fed)
    b = KFed(6, 2, server=server, random_state=2).fit(X for X in fed)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert len(b.local_centers_) == len(fed) == len(b.device_ids_)
    for z in range(len(fed)):
        assert np.array_equal(a.local_centers_[z], b.local_centers_[z])
        assert np.array_equal(a.local_counts_[z], b.local_counts_[z])
        assert np.array_equal(a.center_labels_[z], b.center_labels_[z])
    assert b.communication_["bytes_up"] == a.communication_["bytes_up"]
    assert b.seed_device_ == a.seed_device_
    assert all(lab is None for lab in b.device_labels_)
    # predict labels rows from the kept centers exactly as the list-fitted model
    assert np.array_equal(a.predict(fed[0]), b.predict(fed[0]))


def test_chunks_and_odd_devices(fed, monkeypatch):
    monkeypatch.setattr(stream, "CHUNK_ROWS", 30)  # several chunks, shapes mixed in one chunk
    devs = [X[: 8 + (i % 3)] for i, X in enumerate(fed)]
    a = KFed(6, 2, random_state=1).fit(devs)
    b = KFed(6, 2, random_state=1).fit(iter(devs), device_ids=range(100, 100 + len(devs)))
    c = KFed(6, 2, random_state=1).fit(devs, device_ids=list(range(100, 100 + len(devs))))
    assert list(b.device_ids_) == list(range(100, 100 + len(devs)))
    assert np.array_equal(b.cluster_centers_, c.cluster_centers_)
    for z in range(len(devs)):
        assert np.array_equal(b.local_centers_[z], c.local_centers_[z])
    # the random streams follow the ids: other ids, other k-means++ draws, same final clusters
    np.testing.assert_allclose(np.sort(a.cluster_centers_, axis=0),
                               np.sort(b.cluster_centers_, axis=0), atol=1.0)


def test_memory_holds_centers_not_rows():
    # 3000 devices x 50 rows: the fit keeps (Σ k_z, d) centers, never the rows
    rng = np.random.default_rng(0)
    means = rng.normal(scale=20, size=(4, 3))

    def gen():
        for z in range(3000):
            yield means[[z % 4, (z + 1) % 4]].repeat(25, axis=0) + rng.normal(size=(50, 3))

    m = KFed(4, 2, server="kmeans++", random_state=0).fit(gen())
    assert m.local_centers_.data.shape == (6000, 3)
    assert len(m.device_labels_) == 3000
    got = np.sort(m.cluster_centers_, axis=0)
    np.testing.assert_allclose(got, np.sort(means, axis=0), atol=0.2)


def test_bad_device_in_a_stream_is_named(fed):
    bad = [X.copy() for X in fed]
    bad[5][0, 0] = np.nan
    with pytest.raises(ValidationError, match="device 5"):
        KFed(6, 2, random_state=0).fit(iter(bad))
    wrong_d = list(fed)
    wrong_d[7] = np.ones((10, 4))
    with pytest.raises(ValidationError, match="device 7"):
        KFed(6, 2, random_state=0).fit(iter(wrong_d))
    with pytest.raises(ValidationError, match="empty"):
        KFed(6, 2, random_state=0).fit(iter([]))


def test_large_kmeanspp_server_uses_the_stacked_kernel(monkeypatch):
    # above LARGE_N device centers the stream never builds per-device arrays for the server
    monkeypatch.setattr(stream, "LARGE_N", 100)
    rng = np.random.default_rng(1)
    means = rng.normal(scale=30, size=(5, 4))
    devs = [means[[z % 5, (z + 2) % 5]].repeat(10, axis=0) + rng.normal(size=(20, 4))
            for z in range(400)]
    called = {}
    orig = stream.weighted_kmeans

    def spy(*a, **kw):
        called["n"] = a[0].shape[0]
        return orig(*a, **kw)

    monkeypatch.setattr(stream, "weighted_kmeans", spy)
    m = KFed(5, 2, server="kmeans++", random_state=0).fit(iter(devs))
    assert called["n"] == 800
    X = np.concatenate(devs)
    cost = ((X[:, None] - m.cluster_centers_[None]) ** 2).sum(-1).min(1).sum()
    ref = ((X[:, None] - means[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.05 * ref


@pytest.mark.parametrize("server", ["farthest-lloyd1", "kmeans++"])
def test_threads_over_chunks_give_the_one_thread_result(fed, monkeypatch, server):
    # many small chunks in flight at once: results taken in stream order, bit for bit
    monkeypatch.setattr(stream, "CHUNK_ROWS", 25)
    devs = [X[: 8 + (i % 4)] for i, X in enumerate(fed)]
    proto = KFedProtocol(6, 2, server=server)
    one = stream.fit_stream(proto, iter(devs), 123, n_jobs=1)
    many = stream.fit_stream(proto, iter(devs), 123, n_jobs=4)
    for name in ("centers", "local_centers", "local_counts", "center_labels", "offsets"):
        assert np.array_equal(getattr(one, name), getattr(many, name)), name
    assert one.n_points == many.n_points == sum(len(X) for X in devs)
    # a bad device in a later chunk: the same named error whatever the threads
    bad = [X.copy() for X in devs]
    bad[9][2, 1] = np.inf
    for jobs in (1, 4):
        with pytest.raises(ValidationError, match="device 9"):
            stream.fit_stream(proto, iter(bad), 123, n_jobs=jobs)


@pytest.mark.parametrize("large_n", [100_000, 100])   # final Lloyd whole, or in row blocks
def test_default_server_streamed_on_the_stack_equals_the_list_fit(monkeypatch, large_n):
    # the default (keyed coreset) server runs on the stacked centers in place: never the
    # per-device list and its concatenation, and the list fit's result bit for bit
    from fedclust.kfed import keyed
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 100)
    monkeypatch.setattr(keyed, "SAMPLE_PER_CLUSTER", 20)
    monkeypatch.setattr(keyed, "LARGE_N", large_n)
    rng = np.random.default_rng(4)
    means = rng.normal(scale=30, size=(5, 4))
    devs = [means[[z % 5, (z + 2) % 5]].repeat(10, axis=0) + rng.normal(size=(20, 4))
            for z in range(400)]
    ids = list(range(1000, 1400))
    a = KFed(5, 2, random_state=3).fit(devs, device_ids=ids)
    called = []
    monkeypatch.setattr(stream, "aggregate_centers", lambda *x, **kw: called.append(1))
    b = KFed(5, 2, random_state=3).fit(iter(devs), device_ids=iter(ids))
    assert not called
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    for z in range(len(devs)):
        assert np.array_equal(a.center_labels_[z], b.center_labels_[z])
    X = np.concatenate(devs)
    cost = ((X[:, None] - b.cluster_centers_[None]) ** 2).sum(-1).min(1).sum()
    ref = ((X[:, None] - means[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.05 * ref


def test_default_kfed_streams_with_auto_summaries(fed):
    # KFed()'s defaults (n_local_clusters="auto", the default server) stream: each device
    # sizes its summary from its own shape, as in the list fit
    a = KFed(6, random_state=5).fit(fed)
    b = KFed(6, random_state=5).fit(X for X in fed)
    assert all(lab is None for lab in b.device_labels_)   # streamed: rows not kept
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    for z in range(len(fed)):
        assert np.array_equal(a.local_centers_[z], b.local_centers_[z])
        assert np.array_equal(a.center_labels_[z], b.center_labels_[z])
    assert b.communication_["bytes_up"] == a.communication_["bytes_up"]
    # a one-row device would send its raw point: named, as in the list fit
    with pytest.raises(ValidationError, match="device 3 has n_z=1"):
        KFed(6, random_state=5).fit(iter(list(fed[:3]) + [fed[3][:1]]))


def test_default_server_on_thousands_of_streamed_devices_is_the_list_fit(monkeypatch):
    # 3,000 devices (12,000 device centers): the keyed coreset's keys and weights made per
    # block from the offsets (blocks cut through devices), the final Lloyd in row blocks
    # on integer counts: the list fit's centers and center labels bit for bit
    from fedclust.kfed import keyed
    monkeypatch.setattr(keyed, "SAMPLED_ABOVE", 0)
    monkeypatch.setattr(keyed, "SAMPLE_MIN", 500)
    monkeypatch.setattr(keyed, "LARGE_N", 1000)
    monkeypatch.setattr(keyed, "_KEY_BLOCK", 777)
    rng = np.random.default_rng(8)
    means = rng.normal(scale=20, size=(12, 5))
    devs = [means[[z % 12, (z + 5) % 12]].repeat(10, axis=0) + rng.normal(size=(20, 5))
            for z in range(3000)]
    ids = [7 * z + 3 for z in range(3000)]
    a = KFed(12, random_state=6).fit(devs, device_ids=ids)
    b = KFed(12, random_state=6).fit(iter(devs), device_ids=iter(ids))
    assert len(b.local_centers_.data) == 12_000   # every device sent 4 centers
    assert b.center_labels_.data.dtype == np.int8   # the smallest type that holds k
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    for z in range(len(devs)):
        assert np.array_equal(a.local_counts_[z], b.local_counts_[z])
        assert np.array_equal(a.center_labels_[z], b.center_labels_[z])
    X = np.concatenate(devs)
    cost = ((X[:, None] - b.cluster_centers_[None]) ** 2).sum(-1).min(1).sum()
    ref = ((X[:, None] - means[None]) ** 2).sum(-1).min(1).sum()
    assert cost <= 1.05 * ref


def test_stacked_keys_are_center_keys():
    from fedclust.kfed.keyed import StackedKeys, center_keys
    sizes = np.array([3, 1, 4, 2, 5], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    for ids in (range(5), [40, 7, 19, 3, 11]):
        owner, local = center_keys(ids, sizes)
        keys = StackedKeys(ids, offsets)
        for rows in (slice(0, 15), slice(2, 9), np.array([0, 3, 4, 14, 8])):
            o, li = keys[rows]
            assert np.array_equal(o, owner[rows]) and np.array_equal(li, local[rows])
