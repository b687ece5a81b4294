"""The Gaussians' trie server (``server="tree"``): its shape and node results depend only
on the owners below each node, so a forget recomputes one path, bit for bit equal to a
fresh fit without the owner (property tests over random federations and random
sequences of device and row forgets)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedclust import FedGaussClassifier, FedGaussClustering
from fedclust.core.exceptions import ValidationError
from fedclust.gauss.protocol import GaussProtocol
from fedclust.gauss.server import merge_messages
from fedclust.gauss.tree_merge import TreeMerge, owner_key


def _federation(rng, n_devices, d=3, k=4):
    means = rng.normal(size=(k, d)) * 6
    Xs, ys = [], []
    for _ in range(n_devices):
        n = int(rng.integers(30, 70))
        own = rng.choice(k, size=2, replace=False)
        y = own[rng.integers(2, size=n)]
        Xs.append(means[y] + rng.normal(size=(n, d)))
        ys.append(y)
    return Xs, ys


def _messages(rng, n_devices, d=3):
    Xs, _ = _federation(rng, n_devices, d)
    proto = GaussProtocol()
    request = proto.next_request(proto.start(list(range(n_devices)), 0))
    return proto, [proto.client_step(request, X, device_id=i, seed=0, state={})
                   for i, X in enumerate(Xs)]


def _same_set(a, b) -> bool:
    return (a.C == b.C and all(np.array_equal(getattr(a, f)[:a.C], getattr(b, f)[:b.C])
                               for f in ("mu", "S", "n", "cls", "last"))
            and all(np.array_equal(x, y) for x, y in zip(a.g[1:], b.g[1:])))


def test_owner_key_is_fixed_by_the_id_alone():
    assert owner_key(17) == owner_key(np.int64(17))
    keys = {owner_key(z) for z in range(2000)}
    assert len(keys) == 2000 and all(0 <= k < 2 ** 64 for k in keys)
    # about half the ids on each side of the first split (a hash, not the id's order)
    first = sum(k >> 63 for k in keys)
    assert 900 < first < 1100


@pytest.mark.parametrize("seed", range(3))
def test_removing_an_owner_recomputes_its_path_and_equals_a_fresh_merge(seed):
    rng = np.random.default_rng(seed)
    n = 24
    proto, msgs = _messages(rng, n)
    ids = [int(z) for z in rng.choice(10_000, size=n, replace=False)]
    tree = TreeMerge(leaf_size=2)
    tree.merge(msgs, ids, proto.settings, 0)
    every_node = len(tree.last_work)
    assert every_node >= n // 2   # the first call computes every node
    for gone in rng.choice(n, size=3, replace=False):
        keep = [i for i in range(n) if i != gone]
        got = tree.merge([msgs[i] for i in keep], [ids[i] for i in keep], proto.settings, 0)
        fresh_tree = TreeMerge(leaf_size=2)
        fresh = fresh_tree.merge([msgs[i] for i in keep], [ids[i] for i in keep],
                                 proto.settings, 0)
        assert _same_set(got, fresh)
        # the path of one owner: at most its depth in the trie plus the root step
        assert "root" in tree.last_work
        assert 2 <= len(tree.last_work) <= 2 + max(int(w.split(":")[0])
                                                 for w in fresh_tree.last_work if w != "root")
        assert len(tree.last_work) < every_node / 2
        msgs, ids = [msgs[i] for i in keep], [ids[i] for i in keep]
        n -= 1


def test_the_result_does_not_depend_on_the_order_of_the_owners():
    rng = np.random.default_rng(4)
    proto, msgs = _messages(rng, 11)
    ids = list(range(100, 111))
    a = TreeMerge(leaf_size=2).merge(msgs, ids, proto.settings, 0)
    perm = rng.permutation(11)
    b = TreeMerge(leaf_size=2).merge([msgs[i] for i in perm], [ids[i] for i in perm],
                                     proto.settings, 0)
    assert _same_set(a, b)
    # the trie follows the ids: other ids give another shape
    c_tree = TreeMerge(leaf_size=2)
    c_tree.merge(msgs, [z + 1 for z in ids], proto.settings, 0)
    a_tree = TreeMerge(leaf_size=2)
    a_tree.merge(msgs, ids, proto.settings, 0)
    assert c_tree.last_work != a_tree.last_work


def test_a_few_owners_give_the_flat_server_result():
    """Up to ``leaf_size`` owners the trie is one leaf: the flat server's merge on the same
    pooled statistics, apart from the flat server's pooling order."""
    rng = np.random.default_rng(5)
    proto, msgs = _messages(rng, 2)
    tree = TreeMerge().merge(msgs, [0, 1], proto.settings, 0)
    flat = merge_messages(msgs, proto.settings, 0)
    assert tree.C == flat.C
    np.testing.assert_allclose(tree.n[:tree.C], flat.n[:flat.C])
    np.testing.assert_allclose(tree.mu[:tree.C], flat.mu[:flat.C], rtol=1e-10, atol=1e-10)


def test_kept_node_results_are_reused_only_for_the_same_inputs():
    rng = np.random.default_rng(6)
    proto, msgs = _messages(rng, 9)
    ids = list(range(9))
    tree = TreeMerge(leaf_size=2)
    first = tree.merge(msgs, ids, proto.settings, 0)
    again = tree.merge(msgs, ids, proto.settings, 0)
    assert tree.last_work == [] and _same_set(first, again)
    # an equal but new message object is recomputed (identity, not a guess at equality)
    changed = dataclasses.replace(msgs[3], means=msgs[3].means + 0.5)
    moved = tree.merge(msgs[:3] + [changed] + msgs[4:], ids, proto.settings, 0)
    assert tree.last_work and not np.array_equal(moved.mu[:moved.C], first.mu[:first.C])
    # the returned set is a copy: changing it leaves the kept result alone
    moved.mu[:moved.C] += 1.0
    back = tree.merge(msgs[:3] + [changed] + msgs[4:], ids, proto.settings, 0)
    assert tree.last_work == [] and not np.array_equal(back.mu[:back.C], moved.mu[:moved.C])


FAMILIES = {
    "clustering": (lambda: FedGaussClustering(server="tree", random_state=1), False,
                   ["means_", "covariances_", "counts_"]),
    "classifier": (lambda: FedGaussClassifier(server="tree", random_state=1), True,
                   ["means_", "covariances_", "counts_", "fisher_scores_"]),
    "2-rounds": (lambda: FedGaussClustering(server="tree", n_rounds=2, random_state=1), False,
                 ["means_", "covariances_", "counts_"]),
}


def _same_model(a, b, attrs):
    return (all(np.array_equal(getattr(a, k), getattr(b, k)) for k in attrs)
            and a.device_ids_ == b.device_ids_
            and all(np.array_equal(x, y) for x, y in zip(a.device_labels_, b.device_labels_))
            and a._unlearning_.store.digest() == b._unlearning_.store.digest())


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("trial", range(2))
def test_random_forget_sequences_equal_a_retrain(family, trial):
    make, supervised, attrs = FAMILIES[family]
    rng = np.random.default_rng(500 + 10 * trial + len(family))
    n = int(rng.integers(9, 13))
    Xs, ys = _federation(rng, n)
    ids = [int(z) for z in rng.choice(500, size=n, replace=False)]
    data = {z: (X, y) for z, X, y in zip(ids, Xs, ys)}
    model = make().fit(Xs, ys, device_ids=ids) if supervised else make().fit(Xs, device_ids=ids)
    nodes = len(model._unlearning_.protocol.server_work)
    for step in range(4):
        alive = [z for z in ids if z in data]
        if step % 2 == trial % 2 and len(alive) > 5:
            z = int(rng.choice(alive))
            model.forget(devices=[z])
            del data[z]
        else:
            z = int(rng.choice(alive))
            X, y = data[z]
            rows = rng.choice(len(X), size=int(rng.integers(1, 6)), replace=False)
            model.forget(rows={z: rows})
            data[z] = (np.delete(X, rows, axis=0), np.delete(y, rows))
        rec = model.forget_log_[-1]
        if family != "2-rounds":   # one merge: only the changed owner's path
            assert rec.server_work and rec.server_work[-1] == "root"
            assert len(rec.server_work) < nodes
        assert rec.to_json()["server_work"] == rec.server_work
        kept = [z for z in ids if z in data]
        Xk = [data[z][0] for z in kept]
        fresh = (make().fit(Xk, [data[z][1] for z in kept], device_ids=kept) if supervised
                 else make().fit(Xk, device_ids=kept))
        assert _same_model(model, fresh, attrs), f"{family}: step {step} differs from a retrain"
    report = model.verify()
    assert report.summaries and report.retrain and report.ok


def test_verify_recomputes_every_node_instead_of_reusing_them():
    from fedclust.unlearning.replay import replay

    rng = np.random.default_rng(8)
    Xs, _ = _federation(rng, 8)
    model = FedGaussClustering(server="tree", random_state=0).fit(Xs)
    model.forget(devices=[3])
    u = model._unlearning_
    _, final = u.protocol._tree._final
    final.mu[:final.C] += 1.0   # a corrupted kept result
    reused = replay(u.protocol, u.store, u.seed).result   # what a reuse would give
    assert not np.array_equal(reused.means, u.result.means)
    assert model.verify().ok   # verify computed every node again
    # and a tampered summary is caught
    rec = u.store.rounds[0]
    z = sorted(rec.replies)[0]
    rec.replies[z] = dataclasses.replace(rec.replies[z], means=rec.replies[z].means + 3.0)
    rec.digests.pop(z, None)
    report = model.verify()
    assert not report.summaries and not report.ok


def test_server_parameter_is_checked_and_travels_in_the_config():
    with pytest.raises(ValidationError, match="server"):
        FedGaussClustering(server="star").fit([np.zeros((5, 2)) + np.arange(5)[:, None]])
    proto = GaussProtocol(server="tree")
    assert GaussProtocol.from_config(proto.config()).server == "tree"
    assert "server" not in GaussProtocol().config()
    from fedclust.privacy import DifferentialPrivacy

    with pytest.raises(ValidationError, match="server='tree' is not available with privacy"):
        FedGaussClustering(server="tree", privacy=DifferentialPrivacy(
            epsilon=1.0, delta=1e-5, data_bound=10.0)).fit([np.ones((20, 2))] * 3)


def test_the_tree_server_on_flower_equals_in_process_and_forgets_offline_owners():
    pytest.importorskip("flwr")
    from fedclust.flower import FlowerInMemoryTransport

    rng = np.random.default_rng(12)
    Xs, _ = _federation(rng, 10)
    ids = list(range(10))
    model = FedGaussClustering(server="tree", random_state=0).fit(
        Xs, device_ids=ids, transport=FlowerInMemoryTransport())
    local = FedGaussClustering(server="tree", random_state=0).fit(Xs, device_ids=ids)
    assert np.array_equal(model.means_, local.means_)
    model.forget(devices=[4])          # the owner is offline: its kept clusters suffice
    rec = model.forget_log_[-1]
    assert rec.recomputed == [] and rec.server_work[-1] == "root"
    keep = [z for z in ids if z != 4]
    fresh = FedGaussClustering(server="tree", random_state=0).fit([Xs[z] for z in keep],
                                                                  device_ids=keep)
    assert np.array_equal(model.means_, fresh.means_)
    assert np.array_equal(model.covariances_, fresh.covariances_)


@pytest.mark.parametrize("seed", [0, 3])
def test_many_small_owners_keep_the_flat_servers_clusters(seed):
    """30 owners of 20 rows of 15 blobs: a leaf of the trie sees about 10 rows per blob
    and joins neighbours; the higher nodes consolidate against the owners' own clusters
    and split such joins again, so the trie finds the flat server's clusters."""
    from sklearn.datasets import make_blobs
    from sklearn.metrics import adjusted_rand_score

    X, y = make_blobs(n_samples=600, centers=15, n_features=2, cluster_std=0.6,
                      center_box=(-10, 10), random_state=seed)
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), 30)
    flat = FedGaussClustering(random_state=0).fit([X[p] for p in parts])
    tree = FedGaussClustering(server="tree", random_state=0).fit([X[p] for p in parts])
    assert tree.n_clusters_ == flat.n_clusters_
    assert adjusted_rand_score(y, tree.predict(X)) >= adjusted_rand_score(
        y, flat.predict(X)) - 0.05


def test_consolidate_reports_the_cluster_holding_every_piece():
    """``consolidate(slots=...)``: the pieces given to each cluster pool (exact moments) to
    that cluster's statistics, so a node of the trie knows which cluster holds each owner
    cluster."""
    from fedclust.gauss.consolidate import consolidate, snapshot
    from fedclust.gauss.lazy_merge import merge_all_lazy
    from fedclust.gauss.local import add_clusters
    from fedclust.gauss.model import ClusterSet
    from fedclust.gauss.stats import merge_clusters

    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_samples=600, centers=15, n_features=2, cluster_std=0.6,
                      center_box=(-10, 10), random_state=0)
    proto = GaussProtocol()
    request = proto.next_request(proto.start(list(range(30)), 0))
    msgs = [proto.client_step(request, X[i::30], device_id=i, seed=0, state={})
            for i in range(30)]
    cs = ClusterSet(2, proto.settings, 0)
    srv = merge_messages(msgs, proto.settings, 0)   # only for the pooled statistics
    cs.set_global(*srv.g)
    for m in msgs:
        add_clusters(cs, m)
    pieces = snapshot(cs)
    merge_all_lazy(cs)
    slots = np.full(pieces["n"].size, -7, np.int64)
    consolidate(cs, pieces, slots=slots)
    # the consolidation moved pieces: the merges' record alone would not say where
    assert not np.array_equal(cs.row_clusters(pieces["uid"]), slots)
    assert slots.min() >= 0 and slots.max() < cs.C
    for k in range(cs.C):
        mine = np.flatnonzero(slots == k)
        n, mu, S = pieces["n"][mine[:1]], pieces["mu"][mine[:1]], pieces["S"][mine[:1]]
        for i in mine[1:]:
            n, mu, S = merge_clusters(n, mu, S, pieces["n"][[i]], pieces["mu"][[i]],
                                      pieces["S"][[i]])
        np.testing.assert_allclose(n[0], cs.n[k])
        np.testing.assert_allclose(mu[0], cs.mu[k], atol=1e-9)
        np.testing.assert_allclose(S[0], cs.S[k], rtol=1e-9, atol=1e-7)
