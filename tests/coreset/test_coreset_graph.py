"""General graphs: flooding invariants, per-edge bytes, bad graphs, the paper's partitions."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from fedclust import DistributedKMeans, DistributedPCA, ValidationError
from fedclust.coreset.graph import FloodStats, check_graph, flood, make_graph
from fedclust.sim.partition import (apply_partition, degree_partition, partition,
                                    similarity_partition, unbalanced_partition,
                                    weighted_partition)


@pytest.fixture(scope="module")
def devices():
    rng = np.random.default_rng(0)
    means = 5.0 * rng.standard_normal((4, 10))
    X = np.concatenate([m + rng.standard_normal((250, 10)) for m in means])
    return [X[p] for p in weighted_partition(len(X), 9, random_state=1)]


@pytest.mark.parametrize("kind", ["gnp", "grid", "preferential", "complete", "star"])
def test_flood_crosses_each_edge_at_most_twice_and_matches_bfs_formula(kind):
    g = make_graph(kind, 12, random_state=4)
    assert nx.is_connected(g)
    for origin in g.nodes:
        stats = FloodStats()
        reached = flood(g, origin, 10, stats)
        assert reached == set(g.nodes)
        assert max(stats.edge_crossings.values()) <= 2
        dist = nx.single_source_shortest_path_length(g, origin)
        for u, v in g.edges:   # twice exactly when both ends are at the same hop distance
            e = (min(u, v), max(u, v))
            assert stats.edge_crossings[e] == (2 if dist[u] == dist[v] else 1)
        assert stats.bytes_total == 10 * sum(stats.edge_crossings.values())
        assert sum(stats.sent.values()) == sum(stats.received.values()) == stats.bytes_total


def test_every_node_assembles_the_same_coreset(devices):
    km = DistributedKMeans(4, 200, n_components=5, graph="gnp", random_state=0).fit(devices)
    assert len(km.coreset_digests_) == len(devices)
    assert len(set(km.coreset_digests_.values())) == 1
    comm = km.communication_
    assert comm["max_crossings_per_message"] <= 2
    assert sum(comm["per_edge"].values()) == comm["bytes_total"]
    assert sum(v["sent"] for v in comm["per_node"].values()) == comm["bytes_total"]


def test_tree_graph_equals_star_with_bytes_times_edges(devices):
    # on a tree every message crosses every edge exactly once: bytes = (n - 1) * star upload
    star = DistributedKMeans(4, 200, n_components=5, random_state=2).fit(devices)
    path = nx.path_graph(len(devices))
    tree = DistributedKMeans(4, 200, n_components=5, graph=path, random_state=2).fit(devices)
    np.testing.assert_array_equal(star.cluster_centers_, tree.cluster_centers_)
    np.testing.assert_array_equal(star.coreset_[1], tree.coreset_[1])
    for a, b in zip(star.device_labels_, tree.device_labels_):
        np.testing.assert_array_equal(a, b)
    n_edges = len(devices) - 1
    assert tree.communication_["bytes_total"] == n_edges * star.communication_["bytes_up"]


def test_adjacency_matrix_and_pca_on_grid(devices):
    A = nx.to_numpy_array(make_graph("grid", 9))
    a = DistributedKMeans(4, 200, graph=A, random_state=1).fit(devices)
    b = DistributedKMeans(4, 200, graph="grid", random_state=1).fit(devices)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.communication_ == b.communication_
    p = DistributedPCA(3, graph="grid", random_state=0).fit(devices)
    q = DistributedPCA(3, random_state=0).fit(devices)
    np.testing.assert_array_equal(p.components_, q.components_)


def test_disconnected_graph_names_components(devices):
    g = nx.Graph()
    g.add_nodes_from(range(9))
    g.add_edges_from([(0, 1), (1, 2), (3, 4), (5, 6), (6, 7), (7, 8)])
    with pytest.raises(ValidationError, match=r"disconnected: 3 components.*\[0, 1, 2\].*\[3, 4\]"):
        DistributedKMeans(4, 100, graph=g).fit(devices)


def test_bad_graphs(devices):
    with pytest.raises(ValidationError, match="5 x 5 but there are 9 devices"):
        DistributedKMeans(4, 100, graph=np.ones((5, 5))).fit(devices)
    A = nx.to_numpy_array(nx.cycle_graph(9))
    A[0, 4] = 1
    with pytest.raises(ValidationError, match=r"not symmetric: A\[0, 4\]"):
        DistributedKMeans(4, 100, graph=A).fit(devices)
    with pytest.raises(ValidationError, match="graph has 4 nodes but there are 9"):
        DistributedKMeans(4, 100, graph=nx.path_graph(4)).fit(devices)
    with pytest.raises(ValidationError, match="graph='ring'"):
        DistributedKMeans(4, 100, graph="ring").fit(devices)
    with pytest.raises(ValidationError, match="Flower"):
        from fedclust.sim.transport import InProcessTransport
        DistributedKMeans(4, 100, graph="grid").fit(devices, transport=InProcessTransport())
    with pytest.raises(ValidationError, match="directed"):
        check_graph(nx.DiGraph(nx.path_graph(3)), 3)
    named = nx.relabel_nodes(nx.path_graph(3), {0: "a", 1: "b", 2: "c"})
    with pytest.raises(ValidationError, match=r"positions 0\.\.2; got 'a', 'b', 'c' \(relabel"):
        check_graph(named, 3)
    check_graph(nx.convert_node_labels_to_integers(named), 3)   # the fix the message names


def test_tampered_message_on_graph_is_rejected_by_name(devices):
    from fedclust.coreset.graph import run_on_graph
    from fedclust.coreset.protocol import CoresetProtocol

    def tamper(z, rnd, arrays):
        if z == 3 and "weights" in arrays:
            arrays = dict(arrays, weights=np.full_like(arrays["weights"], np.nan))
        return arrays

    proto = CoresetProtocol(4, 200, n_features=10)
    run = run_on_graph(proto, dict(enumerate(devices)), make_graph("gnp", 9, random_state=0),
                       0, tamper=tamper)
    assert "device 3" in run.log.rejected[3] and "non-finite" in run.log.rejected[3]
    assert 3 not in set(run.result.coreset_owner.tolist())
    assert run.result.centers.shape == (4, 10)


def test_partitions_of_the_paper():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((300, 3)), rng.standard_normal((300, 3)) + 20])
    for parts in (weighted_partition(600, 10, random_state=0),
                  unbalanced_partition(600, 10, random_state=0),
                  similarity_partition(X, 6, random_state=0),
                  degree_partition(600, make_graph("preferential", 10, random_state=0),
                                   random_state=0),
                  partition("uniform", X, None, 7, random_state=0)):
        devs, _ = apply_partition(X, None, parts)   # every index once, no empty device
        assert sum(len(d) for d in devs) == 600
    # unbalanced: the big half has about 20x the data of the small half
    sizes = np.sort([len(p) for p in unbalanced_partition(42000, 10, random_state=1)])
    assert 15 < sizes[5:].mean() / sizes[:5].mean() < 25
    # degree-proportional: a star's hub gets about half the points
    hub = degree_partition(20000, nx.star_graph(9), random_state=0)[0]
    assert abs(len(hub) / 20000 - 0.5) < 0.02
    # similarity: the two far-apart blobs mostly go to different nodes
    parts = similarity_partition(X, 2, random_state=3)
    purity = max(np.mean(parts[0] < 300), np.mean(parts[0] >= 300))
    assert purity > 0.9
    with pytest.raises(ValidationError, match="needs graph"):
        partition("degree", X, None, 10)
    with pytest.raises(ValidationError, match="not symmetric|symmetric"):
        degree_partition(10, np.triu(np.ones((3, 3))))


def test_empty_node_still_relays(devices):
    # a path whose middle node holds no data: it must still forward the others' messages
    d = devices[0].shape[1]
    devs = [devices[0], devices[1], np.zeros((0, d)), devices[3], devices[4]]
    km = DistributedKMeans(4, 150, n_components=4, graph=nx.path_graph(5),
                           random_state=0).fit(devs)
    assert len(set(km.coreset_digests_.values())) == 1
    assert set(km.coreset_owner_.tolist()) == {0, 1, 3, 4}
    assert km.communication_["per_node"]["2"]["sent"] > 0
    assert km.device_labels_[2].shape == (0,)
