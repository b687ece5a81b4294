"""Graph protocols on Flower: the ServerApp only relays, along the graph's edges.

Compared with the in-process flooding run (fedclust.coreset.graph.run_on_graph):
the same centers bit for bit, the same rounds, bytes per edge and per node;
every relayed packet crosses one edge and is sealed so the relay cannot read it.
"""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

from fedclust.coreset import DistributedKMeans  # noqa: E402
from fedclust.coreset.graph import make_graph  # noqa: E402
from fedclust.core.exceptions import IncompatibleMessageError, ValidationError  # noqa: E402
from fedclust.core.secagg import x25519_keypair  # noqa: E402
from fedclust.flower import relay  # noqa: E402
from fedclust.flower.grid import FlowerInMemoryTransport, LocalGrid  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402


@pytest.fixture(scope="module")
def devices():
    rng = np.random.default_rng(7)
    means = rng.normal(scale=6.0, size=(5, 10))
    out = []
    for z in range(10):
        n = int(rng.integers(30, 70))
        out.append(means[rng.integers(0, 5, size=n)] + rng.normal(size=(n, 10)))
    return out


KW = dict(n_clusters=5, coreset_size=150, n_components=6, random_state=4)


class _SpyGrid(LocalGrid):
    """A LocalGrid that keeps every relayed packet (what the relay sees)."""

    seen: list = []

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            recs = m.content
            if relay.HEADS in recs.config_records and relay.PACKETS in recs.array_records:
                heads = recs.config_records[relay.HEADS]
                arrays = recs.array_records[relay.PACKETS]
                for key, text in heads.items():
                    _SpyGrid.seen.append((m.metadata.dst_node_id, json.loads(str(text)),
                                          arrays[key].numpy()))
        return super().push_messages(messages)


@pytest.fixture
def spy(monkeypatch):
    import fedclust.flower.grid as grid_mod

    _SpyGrid.seen = []
    monkeypatch.setattr(grid_mod, "LocalGrid", _SpyGrid)
    return _SpyGrid


def test_gnp_graph_on_flower_equals_in_process_flooding(devices, spy):
    g = make_graph("gnp", len(devices), p=0.3, random_state=2)
    a = DistributedKMeans(graph=g, **KW).fit(devices)
    t = FlowerInMemoryTransport()
    b = DistributedKMeans(graph=g, **KW).fit(devices, transport=t)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert np.array_equal(a.coreset_[0], b.coreset_[0])
    assert np.array_equal(a.coreset_[1], b.coreset_[1])
    for x, y in zip(a.device_labels_, b.device_labels_):
        assert np.array_equal(x, y)
    ca, cb = a.communication_, b.communication_
    assert cb.pop("relay_bytes") > 0
    assert ca == cb  # rounds, per-edge and per-node bytes, crossings, messages
    assert ca["rounds"] == 4 and ca["max_crossings_per_message"] <= 2
    assert a.run_log_ == b.run_log_
    # the relay handed each packet only to a neighbour of its sender, and only to the addressee
    node_of = {int(z): n for z, n in t.last_extra_["nodes"].items()}
    assert spy.seen
    for dst_node, header, _ in spy.seen:
        assert g.has_edge(header["src"], header["dst"])
        assert node_of[header["dst"]] == dst_node
    # crossings per edge as counted by the relay's own deliveries
    per_edge = {}
    for _, h, sealed in spy.seen:
        e = "%d-%d" % tuple(sorted((h["src"], h["dst"])))
        per_edge[e] = per_edge.get(e, 0) + sealed.size - 16
    assert per_edge == ca["per_edge"]


def test_relay_sees_only_ciphertext_and_sizes(devices, spy):
    g = nx.path_graph(len(devices))  # every message crosses several hops
    b = DistributedKMeans(graph=g, **KW).fit(devices, transport=FlowerInMemoryTransport())
    # the coreset points the nodes exchanged, as raw bytes: no relayed packet contains them
    pts = np.ascontiguousarray(b.coreset_[0])
    probes = [pts[i].tobytes() for i in range(0, len(pts), 17)]
    blobs = [s.tobytes() for _, h, s in spy.seen if h["action"] == "coreset"]
    assert blobs
    assert not any(p in blob for p in probes for blob in blobs)
    # ... while the sizes are visible: payload bytes + the 16-byte tag
    for _, h, s in spy.seen:
        n = sum(np.dtype(dt).itemsize * int(np.prod(sh)) for _, dt, sh in h["layout"])
        assert s.size == n + 16
    # and a relay without the pair key cannot open a packet
    _, h, s = spy.seen[0]
    priv, _ = x25519_keypair()
    _, other = x25519_keypair()
    with pytest.raises(IncompatibleMessageError, match="altered"):
        relay.open_message(priv, other, h, s.tobytes())


def test_seal_round_trip_and_tampering():
    a_priv, a_pub = x25519_keypair()
    b_priv, b_pub = x25519_keypair()
    arrays = {"points": np.arange(12.0).reshape(4, 3), "n": np.asarray(4, dtype=np.int64)}
    header = {"src": 1, "dst": 2, "round": 0, "origin": 1, "action": "x",
              "layout": relay.array_layout(arrays)}
    sealed = relay.seal_message(a_priv, b_pub, header, arrays)
    got = relay.open_message(b_priv, a_pub, header, sealed)
    assert set(got) == set(arrays)
    for k in arrays:
        assert np.array_equal(got[k], arrays[k]) and got[k].dtype == arrays[k].dtype
    flipped = bytearray(sealed)
    flipped[3] ^= 1
    with pytest.raises(IncompatibleMessageError, match="altered"):
        relay.open_message(b_priv, a_pub, header, bytes(flipped))
    # a replayed packet under another round or origin does not open either
    for change in ({"round": 1}, {"origin": 3}):
        with pytest.raises(IncompatibleMessageError, match="altered"):
            relay.open_message(b_priv, a_pub, {**header, **change}, sealed)


def test_tampered_node_is_rejected_by_name_as_in_process(devices):
    g = make_graph("gnp", len(devices), p=0.4, random_state=1)

    def tamper(z, rnd, arrays):
        if z == 3 and "points" in arrays:
            arrays = dict(arrays, points=np.full_like(arrays["points"], np.nan))
        return arrays

    from fedclust.coreset.graph import run_on_graph
    from fedclust.coreset.protocol import CoresetProtocol

    proto = CoresetProtocol(5, 150, n_components=6)
    a = run_on_graph(proto, dict(enumerate(devices)), g, 4, tamper=tamper)
    b = FlowerInMemoryTransport(tamper=tamper).run(proto, dict(enumerate(devices)), 4, graph=g)
    assert list(a.log.rejected) == list(b.log.rejected) == [3]
    assert "device 3" in b.log.rejected[3]
    assert np.array_equal(a.result.centers, b.result.centers)


def test_graph_must_cover_the_devices_and_no_faults(devices):
    proto = DistributedKMeans(**KW)._protocol(10)
    g = nx.path_graph(len(devices) - 1)
    with pytest.raises(ValidationError, match="graph's nodes"):
        FlowerInMemoryTransport().run(proto, dict(enumerate(devices)), 0, graph=g)
    with pytest.raises(ValidationError, match="no coordinator"):
        FlowerInMemoryTransport(dropout=0.2).run(proto, dict(enumerate(devices)), 0,
                                                 graph=nx.path_graph(len(devices)))
    with pytest.raises(ValidationError, match="only a star"):
        DistributedKMeans(graph="gnp", **KW).fit(devices, transport=InProcessTransport())


def test_result_codec_round_trip(devices):
    from fedclust.coreset.protocol import CoresetResult
    from fedclust.core.protocol import RunLog

    m = DistributedKMeans(**KW).fit(devices)
    res = CoresetResult(m.cluster_centers_, m.cluster_centers_[:, :2], m.coreset_[0],
                        m.coreset_[1], m.coreset_owner_, np.zeros(3), np.eye(3), np.ones(3),
                        123, 4.5, RunLog())
    arrays, kinds = relay.result_to_arrays(res)
    back = relay.result_from_arrays(CoresetResult, arrays, kinds, RunLog())
    assert relay.result_digest(back) == relay.result_digest(res)
    assert back.n_points == 123 and isinstance(back.n_points, int) and back.solver_cost == 4.5


@pytest.mark.slow
def test_gnp_graph_on_the_flower_simulation(devices):
    pytest.importorskip("ray")
    from fedclust.flower.transport import FlowerSimulationTransport

    g = make_graph("gnp", 6, p=0.5, random_state=3)
    devs = devices[:6]
    a = DistributedKMeans(graph=g, **KW).fit(devs)
    b = DistributedKMeans(graph=g, **KW).fit(devs, transport=FlowerSimulationTransport())
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    cb = dict(b.communication_)
    cb.pop("relay_bytes")
    assert a.communication_ == cb


def test_simulation_job_points_ray_at_an_existing_cluster(tmp_path, monkeypatch, devices):
    """``ray_address``: ray.init connects (address, no local CPU count), actors ask 1 CPU."""
    import fedclust.flower.transport as tmod
    from fedclust.core.exceptions import FedClustError

    class _Exited:
        def __init__(self, *a, **kw):
            pass

        def wait(self, timeout=None):
            return 1

    monkeypatch.setattr(tmod.subprocess, "Popen", _Exited)
    tr = tmod.FlowerSimulationTransport(ray_address="ray://head:10001", keep_dir=str(tmp_path))
    with pytest.raises(FedClustError, match="exited with status 1"):
        DistributedKMeans(**KW).fit(devices[:3], transport=tr)
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["backend_config"]["init_args"]["address"] == "ray://head:10001"
    assert "num_cpus" not in job["backend_config"]["init_args"]
    assert job["backend_config"]["client_resources"]["num_cpus"] == 1


def test_a_resumed_graph_run_runs_again_and_says_so(devices, tmp_path):
    # the nodes hold the whole graph computation: the relay has no rounds to resume from
    g = make_graph("gnp", len(devices), p=0.3, random_state=2)
    a = DistributedKMeans(graph=g, **KW).fit(devices)
    t = FlowerInMemoryTransport(result_dir=str(tmp_path), resume=True)
    b = DistributedKMeans(graph=g, **KW).fit(devices, transport=t)
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert any("graph run keeps no rounds on the server" in w for w in b.run_log_.warnings)
    assert not any("graph run" in w for w in a.run_log_.warnings)
