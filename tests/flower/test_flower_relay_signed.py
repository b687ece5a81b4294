"""Signed relay keys: nodes with an identity sign their X25519 key for each edge.

A relay (the ServerApp, or whoever runs the SuperLink) that swaps a key, drops a
signature or replays one from another edge or run is refused by name at both ends
of the edge before anything is sealed; the honest signed run is the in-process
flooding run, bit for bit and byte for byte.
"""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

from flwr.app import ConfigRecord  # noqa: E402

from fedclust.core.policy import DevicePolicy, PolicyRefusal  # noqa: E402
from fedclust.core.secagg import (array_to_bytes, bytes_to_array, sign,  # noqa: E402
                                  x25519_keypair)
from fedclust.core.secure_sum import make_identities  # noqa: E402
from fedclust.coreset import DistributedKMeans  # noqa: E402
from fedclust.coreset.graph import make_graph, run_on_graph  # noqa: E402
from fedclust.flower import relay  # noqa: E402
from fedclust.flower.apps import make_client_app, make_server_app  # noqa: E402
from fedclust.flower.codec import arrays_to_record  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402
from fedclust.flower.relay_client import _check_peer_keys  # noqa: E402
from fedclust.flower.spec import ServerSpec  # noqa: E402

KW = dict(n_clusters=4, coreset_size=120, n_components=5, random_state=4)
N = 8


@pytest.fixture(scope="module")
def devices():
    rng = np.random.default_rng(11)
    means = rng.normal(scale=6.0, size=(4, 8))
    out = {}
    for z in range(N):
        n = int(rng.integers(30, 60))
        out[z] = means[rng.integers(0, 4, size=n)] + rng.normal(size=(n, 8))
    return out


@pytest.fixture(scope="module")
def graph():
    # dense enough that the graph stays connected without any two nodes
    g = make_graph("gnp", N, p=0.6, random_state=5)
    for u, v in g.edges():
        h = g.copy()
        h.remove_nodes_from([u, v])
        assert nx.is_connected(h)
    return g


def _protocol():
    return DistributedKMeans(**KW)._protocol(N)


def run_relayed(devices, graph, identities, grid_cls=LocalGrid, policies=None, seed=4):
    """The relaying ServerApp and the ClientApp over a LocalGrid whose nodes hold
    ``identities`` (device id -> DeviceIdentity); ``grid_cls`` may tamper as a relay."""
    protocol = _protocol()
    ids = sorted(devices)
    data = {i: (z, np.asarray(devices[z])) for i, z in enumerate(ids)}
    spec = ServerSpec.for_protocol(protocol, seed, min_nodes=len(ids), node_wait_s=0.0,
                                   round_timeout_s=None, collect_outputs=True,
                                   graph_edges=relay.graph_edges(graph))
    box = {}
    server_app = make_server_app(spec, on_result=lambda out, extra: box.update(out=out,
                                                                                extra=extra))
    default = DevicePolicy(allow_collect=True, allow_noise_seed=True)
    client_app = make_client_app(
        lambda ctx: data[int(ctx.node_config["partition-id"])],
        identity=lambda ctx: identities.get(data[int(ctx.node_config["partition-id"])][0]),
        policy=lambda ctx: (policies or {}).get(data[int(ctx.node_config["partition-id"])][0],
                                                default))
    grid = grid_cls(client_app, [{"partition-id": i, "num-partitions": len(ids)}
                                 for i in range(len(ids))])
    run_server_app(server_app, grid)
    return box["out"], box["extra"], grid


class _RelayGrid(LocalGrid):
    """A LocalGrid that lets a test rewrite what the relay sends (a deviating server).

    ``rewrite(stage, device, content)`` edits each message's records in place; every
    sealed packet the nodes send back is kept in ``packets`` as ``(header, bytes)``.
    """

    rewrite = None
    packets: list = []

    def push_messages(self, messages):
        messages = list(messages)
        device_of = {n: i for i, n in enumerate(self.node_ids)}  # device i on partition i
        for m in messages:
            if m.metadata.group_id.startswith("graph.") and type(self).rewrite is not None:
                stage = m.metadata.group_id.rsplit(".", 1)[1]
                type(self).rewrite(stage, device_of[m.metadata.dst_node_id], m.content)
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        out = super().pull_messages(message_ids)
        for r in out:
            if not r.has_error() and relay.HEADS in r.content.config_records:
                heads = r.content.config_records[relay.HEADS]
                arrays = r.content.array_records[relay.PACKETS]
                for key, text in heads.items():
                    type(self).packets.append((json.loads(str(text)),
                                               arrays[key].numpy().tobytes()))
        return out


def _grid(rewrite):
    return type("TamperGrid", (_RelayGrid,), {"rewrite": staticmethod(rewrite), "packets": []})


def _in_process(devices, graph):
    return run_on_graph(_protocol(), devices, graph, 4)


# --------------------------------------------------------------------------- honest runs
def test_signed_relay_equals_in_process_flooding(devices, graph):
    idn = make_identities(sorted(devices))
    a = _in_process(devices, graph)
    b, extra, _ = run_relayed(devices, graph, idn)
    c, extra_plain, _ = run_relayed(devices, graph, {})
    assert np.array_equal(a.result.centers, b.result.centers)
    assert np.array_equal(a.result.coreset_points, b.result.coreset_points)
    sa, sb, sc = a.summary(), b.meter.summary(), c.meter.summary()
    # the signatures travel in the key exchange, not in the packets
    assert sb.pop("relay_bytes") == sc.pop("relay_bytes") > 0
    assert sa == sb == sc
    assert not b.log.failed and not b.log.rejected
    assert extra["signed_relay_keys"] == sorted(devices)
    assert extra_plain["signed_relay_keys"] == []
    n_arcs = 2 * graph.number_of_edges()
    assert extra["graph_key_bytes"] == {"public_keys": 32 * n_arcs, "signatures": 64 * n_arcs}
    assert extra_plain["graph_key_bytes"] == {"public_keys": 32 * n_arcs, "signatures": 0}


# --------------------------------------------------------------------------- a deviating relay
def _edge(graph):
    u, v = sorted(graph.edges())[0]
    return int(u), int(v)


def _assert_refused(out, pairs, what):
    for z, nb in pairs:
        why = out.log.failed.get(z, "")
        assert f"device {z}: the relay key of neighbour {nb}" in why, (z, why)
        assert what in why
        assert "\n" not in why
    assert set(out.log.failed) == {z for z, _ in pairs}
    assert not set(out.log.participants) & set(out.log.failed)


def test_swapped_key_is_refused_at_both_ends(devices, graph):
    """A man in the middle on edge u-v: the relay gives v its own key as u's."""
    u, v = _edge(graph)
    _, r_pub = x25519_keypair()

    def swap(stage, z, content):
        if z == v and relay.PEERS in content.array_records:
            peers = {k: a.numpy() for k, a in content.array_records[relay.PEERS].items()}
            peers[str(u)] = bytes_to_array(r_pub)
            content[relay.PEERS] = arrays_to_record(peers)

    grid_cls = _grid(swap)
    idn = make_identities(sorted(devices))
    out, extra, _ = run_relayed(devices, graph, idn, grid_cls=grid_cls)
    # v checks u's signature on u's real key; u checks v's signature, made over the swapped key
    _assert_refused(out, [(u, v), (v, u)], "not signed")
    # both ends refused before sealing anything: the relay got no packet from them
    assert grid_cls.packets
    assert not [h for h, _ in grid_cls.packets if h["src"] in (u, v)]
    # the server kept going: the others agree on a result without u and v
    assert sorted(out.log.participants) == sorted(set(devices) - {u, v})
    assert np.isfinite(out.result.centers).all()


def test_unsigned_swap_is_a_man_in_the_middle(devices, graph):
    """Without identities the same swap goes through (the limit the docs state): the relay
    opens what v sealed for u."""
    u, v = _edge(graph)
    r_priv, r_pub = x25519_keypair()
    seen = {}

    def swap(stage, z, content):
        if relay.PEERS in content.array_records:
            peers = {k: a.numpy() for k, a in content.array_records[relay.PEERS].items()}
            if z == u:
                seen["pub_v"] = array_to_bytes(peers[str(v)])  # v's key, as relayed to u
            if z == v:
                peers[str(u)] = bytes_to_array(r_pub)
                content[relay.PEERS] = arrays_to_record(peers)

    grid_cls = _grid(swap)
    run_relayed(devices, graph, {}, grid_cls=grid_cls)
    to_u = [(h, s) for h, s in grid_cls.packets if h["src"] == v and h["dst"] == u]
    assert to_u
    header, sealed = to_u[0]
    opened = relay.open_message(r_priv, seen["pub_v"], header, sealed)
    assert set(opened) == {name for name, _, _ in header["layout"]}
    assert all(np.isfinite(a).all() for a in opened.values() if a.dtype.kind == "f")


def test_dropped_signature_is_refused(devices, graph):
    u, v = _edge(graph)

    def drop(stage, z, content):
        if z == v and relay.SIGS in content.config_records:
            sigs = dict(content.config_records[relay.SIGS].items())
            sigs.pop(str(u))
            content[relay.SIGS] = ConfigRecord(sigs)

    out, _, _ = run_relayed(devices, graph, make_identities(sorted(devices)),
                            grid_cls=_grid(drop))
    _assert_refused(out, [(v, u)], "without its signature")


def test_signature_from_another_edge_is_refused(devices, graph):
    """The relay hands v the signature u made for another neighbour w."""
    u, v = _edge(graph)
    w = next(int(x) for x in sorted(graph.neighbors(u)) if x != v)
    batch = {}

    def replay(stage, z, content):
        if relay.SIGS in content.config_records and stage == "compute":
            batch[z] = content
            if v in batch and w in batch:
                sigs = dict(batch[v].config_records[relay.SIGS].items())
                sigs[str(u)] = batch[w].config_records[relay.SIGS][str(u)]
                batch[v][relay.SIGS] = ConfigRecord(sigs)

    out, _, _ = run_relayed(devices, graph, make_identities(sorted(devices)),
                            grid_cls=_grid(replay))
    _assert_refused(out, [(v, u)], "not signed")


def test_key_and_signature_from_another_run_are_refused(devices, graph):
    """u's key and signature for edge u-v recorded in one run, replayed in the next
    (same Flower run id: the fresh key of v is what makes the old signature fail)."""
    u, v = _edge(graph)
    idn = make_identities(sorted(devices))
    old = {}

    def record(stage, z, content):
        if z == v and relay.PEERS in content.array_records:
            old["key"] = content.array_records[relay.PEERS][str(u)].numpy()
        if z == v and relay.SIGS in content.config_records:
            old["sig"] = str(content.config_records[relay.SIGS][str(u)])

    run_relayed(devices, graph, idn, grid_cls=_grid(record))
    assert set(old) == {"key", "sig"}

    def replay(stage, z, content):
        if z == v and relay.PEERS in content.array_records:
            peers = {k: a.numpy() for k, a in content.array_records[relay.PEERS].items()}
            peers[str(u)] = old["key"]
            content[relay.PEERS] = arrays_to_record(peers)
        if z == v and relay.SIGS in content.config_records:
            sigs = dict(content.config_records[relay.SIGS].items())
            sigs[str(u)] = old["sig"]
            content[relay.SIGS] = ConfigRecord(sigs)

    out, _, _ = run_relayed(devices, graph, idn, grid_cls=_grid(replay))
    _assert_refused(out, [(u, v), (v, u)], "not signed")


def test_skipped_sign_step_is_refused(devices, graph):
    """A relay that hides the signing step: every node with an identity refuses."""
    def strip(stage, z, content):
        if stage == "compute" and relay.SIGS in content.config_records:
            del content.config_records[relay.SIGS]

    from fedclust.flower.spec import ServerAppFailed

    first = min(int(x) for x in graph.neighbors(0))
    with pytest.raises(ServerAppFailed, match=r"every node of the graph failed \(device 0: .*"
                       f"device 0: the relay key of neighbour {first} comes without its "
                       "signature"):
        run_relayed(devices, graph, make_identities(sorted(devices)), grid_cls=_grid(strip))


def test_signed_node_refuses_an_unsigned_neighbour(devices, graph, caplog):
    """A node with an identity next to one without: every signed neighbour of the unsigned
    node refuses its key, which cuts it off; the relay stops naming the disagreement."""
    import logging

    from fedclust.flower.spec import ServerAppFailed

    idn = make_identities(sorted(devices))
    u, _ = _edge(graph)
    del idn[u]
    with caplog.at_level(logging.WARNING), pytest.raises(ServerAppFailed,
                                                         match="do not agree"):
        run_relayed(devices, graph, idn)
    refusals = [r.getMessage() for r in caplog.records if "relay key of neighbour" in
                r.getMessage()]
    expected = sorted(int(x) for x in graph.neighbors(u))
    assert sorted(int(m.split("device ")[1].split(":")[0]) for m in refusals) == expected
    for m in refusals:
        assert f"the relay key of neighbour {u} comes without its signature" in m


def test_policy_signed_without_identity_refuses_relay_keys():
    """The check itself: a 'signed' policy and no identity key is a refusal by name."""
    keys = {"public": bytes_to_array(x25519_keypair()[1]),
            "peer.3": bytes_to_array(x25519_keypair()[1])}
    with pytest.raises(PolicyRefusal, match="device 2: its policy requires signed relay keys"):
        _check_peer_keys(keys, None, None, 4242, 2)


def test_statement_binds_run_edge_and_both_keys():
    a, b = x25519_keypair()[1], x25519_keypair()[1]
    base = relay.relay_key_statement(7, 1, 2, a, b)
    others = [relay.relay_key_statement(8, 1, 2, a, b), relay.relay_key_statement(7, 2, 1, a, b),
              relay.relay_key_statement(7, 1, 3, a, b), relay.relay_key_statement(7, 1, 2, b, a),
              relay.relay_key_statement(7, 1, 2, a, x25519_keypair()[1])]
    assert len({base, *others}) == 6
    idn = make_identities([1, 2])
    keys = {"public": bytes_to_array(b), "peer.1": bytes_to_array(a)}
    good = sign(idn[1].private, base).hex()
    _check_peer_keys(keys, {"1": good}, idn[2], 7, 2)  # v=2 checks u=1's signature
    with pytest.raises(PolicyRefusal, match="neighbour 1 is not signed"):
        _check_peer_keys(keys, {"1": good}, idn[2], 8, 2)
    with pytest.raises(PolicyRefusal, match="neighbour 1 is not signed"):
        _check_peer_keys(keys, {"1": "zz"}, idn[2], 7, 2)
    keys["peer.5"] = bytes_to_array(a)
    with pytest.raises(PolicyRefusal, match="neighbour 5 has no identity key"):
        _check_peer_keys(keys, {"1": good}, idn[2], 7, 2)
