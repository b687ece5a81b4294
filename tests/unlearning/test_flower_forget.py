"""Forgetting on Flower: the sites' own forget requests through the real ClientApp.

A model fitted on the Flower apps (every message through protobuf) is asked to
forget by its sites: one leaves (``forget="device"``), one deleted rows from
its data file (``forget="rows"``: it runs its step again itself). The result
must equal, bit for bit, a fresh in-process fit on what remains with the same
seed and device ids. A server that asks a device to forget another device, or
sends a malformed request, is refused by the device's name.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402

from fedclust import FedGaussClustering, KFed  # noqa: E402
from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.core.protocol import Request  # noqa: E402
from fedclust.flower import FlowerInMemoryTransport  # noqa: E402
from fedclust.flower.apps import make_client_app  # noqa: E402
from fedclust.flower.codec import ERROR, FORGET, request_to_content  # noqa: E402
from fedclust.flower.forget import forget_on_grid, make_forget_server_app  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402


def _federation(rng, n_devices, d=4, k=4):
    means = rng.normal(size=(k, d)) * 6
    Xs = []
    for _ in range(n_devices):
        n = int(rng.integers(25, 60))
        y = rng.choice(k, size=2, replace=False)[rng.integers(2, size=n)]
        Xs.append(means[y] + rng.normal(size=(n, d)))
    return Xs


def _grid(data, configs, policy=None):
    """One node per device: ``data`` device id -> its current rows; ``configs`` device id
    -> extra node config (its ``forget`` request)."""
    ids = sorted(data)
    app = make_client_app(lambda ctx: (ids[int(ctx.node_config["partition-id"])],
                                       data[ids[int(ctx.node_config["partition-id"])]]),
                          policy=policy)
    return LocalGrid(app, [{"partition-id": i, **configs.get(z, {})} for i, z in enumerate(ids)])


def _as_server(grid, fn):
    """``fn(grid)`` inside a ServerApp run on ``grid`` (Flower's task identity set)."""
    app, box = ServerApp(), {}

    @app.main()
    def main(g, context):
        box["out"] = fn(g)

    run_server_app(app, grid)
    return box["out"]


def _forget(model, grid, **kw):
    return _as_server(grid, lambda g: forget_on_grid(model, g, **kw))


@pytest.mark.parametrize("estimator", [lambda: KFed(4, 2, random_state=3),
                                       lambda: FedGaussClustering(random_state=3)])
def test_sites_withdraw_through_the_client_app_and_the_model_equals_a_fresh_fit(estimator):
    rng = np.random.default_rng(21)
    Xs = _federation(rng, 6)
    ids = [11, 12, 13, 14, 15, 16]
    model = estimator().fit(Xs, device_ids=ids, transport=FlowerInMemoryTransport())
    data = dict(zip(ids, Xs))
    data[14] = np.delete(Xs[3], [0, 5, 7], axis=0)   # site 14 deleted rows from its file
    grid = _grid(data, {13: {"forget": "device"}, 14: {"forget": "rows"}})
    box = {}
    run_server_app(make_forget_server_app(model, on_result=lambda r: box.update(r=r)), grid)
    report = box["r"]
    assert report.devices == [13] and report.rows == [14] and report.refused == {}
    assert report.record.devices == [13]
    keep = [11, 12, 14, 15, 16]
    fresh = estimator().fit([data[z] for z in keep], device_ids=keep)
    for attr in ("cluster_centers_", "means_", "covariances_", "weights_"):
        if hasattr(fresh, attr):
            assert np.array_equal(getattr(model, attr), getattr(fresh, attr)), attr
    assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
    # nothing left to forget: the nodes that withdrew are gone from the model
    again = _forget(model, _grid({z: data[z] for z in keep}, {}))
    assert again.record is None and again.devices == again.rows == []


def test_a_node_refuses_another_device_and_a_malformed_request_by_name():
    rng = np.random.default_rng(22)
    Xs = _federation(rng, 4)
    model = KFed(4, 2, random_state=0).fit(Xs, device_ids=[0, 1, 2, 3])
    grid = _grid(dict(enumerate(Xs)), {2: {"forget": "rows"}})
    proto = model._unlearning_.protocol
    first = proto.next_request(proto.start([0, 1, 2, 3], 0))

    def _ask(head):
        content = request_to_content(proto, Request(first.round, "fedclust_forget"), 0,
                                     first.payload_for(2), **head)
        msg = Message(content, dst_node_id=grid.node_ids[2],
                      message_type="query.fedclust_forget", group_id="forget")
        (reply,) = grid.send_and_receive([msg])
        return reply.content

    def ask(head):
        return _as_server(grid, lambda g: _ask(head))

    other = ask({"forget-device": 3, "forget-action": first.action})
    assert other.config_records[ERROR]["type"] == "PolicyRefusal"
    assert other.config_records[ERROR]["message"].startswith(
        "device 2: refuses to forget device 3")
    bad = ask({"forget-action": first.action})
    assert "device 2: the forget request names no device" in bad.config_records[ERROR]["message"]
    bad = ask({"forget-device": 2, "forget-action": "no_such_round"})
    assert "device 2: the forget request's first action 'no_such_round'" in (
        bad.config_records[ERROR]["message"])
    ok = ask({"forget-device": 2, "forget-action": first.action})
    assert ok.config_records[FORGET]["level"] == "rows" and ERROR not in ok.config_records


def test_the_policy_decides_whether_a_node_may_ask_and_bad_answers_are_rejected():
    rng = np.random.default_rng(23)
    Xs = _federation(rng, 4)
    model = KFed(4, 2, random_state=0).fit(Xs, device_ids=[0, 1, 2, 3])
    name = model._unlearning_.protocol.name
    acts = set(model._unlearning_.protocol.reply_types)
    strict = DevicePolicy(actions={name: acts})                      # no forget action
    report = _forget(model, _grid(dict(enumerate(Xs)), {1: {"forget": "device"}},
                                         policy=lambda ctx: strict))
    assert report.record is None and list(report.refused) == [1]
    assert "device 1: refuses action 'fedclust_forget'" in report.refused[1]
    before = model.cluster_centers_.copy()
    # a node whose new summary is malformed is named and skipped; the others go on
    data = dict(enumerate(Xs))
    data[2] = Xs[2][:1]      # one row left: fewer rows than local clusters, the step fails
    report = _forget(model, _grid(data, {1: {"forget": "device"},
                                                2: {"forget": "rows"}}))
    assert report.devices == [1] and list(report.refused) == [2]
    assert report.refused[2].startswith("device 2:")
    fresh = KFed(4, 2, random_state=0).fit([Xs[0], Xs[2], Xs[3]], device_ids=[0, 2, 3])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
    assert not np.array_equal(before, model.cluster_centers_)
    # a device the server names but that no connected node answers for
    report = _forget(model, _grid({0: Xs[0], 3: Xs[3]}, {}), devices=[2])
    assert list(report.refused) == [2] and "no connected node" in report.refused[2]


def test_the_generic_server_app_forgets_a_saved_model_from_the_run_config(tmp_path):
    import json

    from fedclust.core.registry import get_algorithm
    from fedclust.flower.apps import make_server_app
    from fedclust.sites.files_out import load_model, save_model
    from fedclust.unlearning.saved import saved_section

    rng = np.random.default_rng(24)
    Xs = _federation(rng, 5)
    model = KFed(4, 2, random_state=1).fit(Xs, device_ids=[0, 1, 2, 3, 4])
    sites = ["a", "b", "c", "d", "e"]
    save_model(tmp_path / "model.npz", get_algorithm("kfed").export(model, None),
               algorithm="kfed", sites=sites, unlearning=saved_section(model, sites))
    data = dict(enumerate(Xs))
    data[0] = Xs[0][5:]                               # site a deleted its first five rows
    grid = _grid(data, {0: {"forget": "rows"}, 3: {"forget": "device"}})
    run_server_app(make_server_app(result_root=tmp_path), grid,
                   {"forget-model": "model.npz", "forget-out": "new/model.npz"})
    doc = json.loads((tmp_path / "new" / "forget.json").read_text())
    assert doc["devices"] == [3] and doc["rows"] == [0] and doc["refused"] == {}
    saved = load_model(tmp_path / "new" / "model.npz")
    assert saved.sites == ["a", "b", "c", "e"]
    fresh = KFed(4, 2, random_state=1).fit([data[z] for z in (0, 1, 2, 4)],
                                           device_ids=[0, 1, 2, 4])
    assert np.array_equal(saved.exported.arrays["centers"], fresh.cluster_centers_)
    # a model path outside the app's output folder is refused
    with pytest.raises(Exception, match="outside the app's output folder"):
        run_server_app(make_server_app(result_root=tmp_path / "new"), grid,
                       {"forget-model": str(tmp_path / "model.npz")})


def test_under_privacy_a_site_may_leave_but_not_release_its_rows_again():
    from fedclust.privacy import DifferentialPrivacy

    rng = np.random.default_rng(25)
    Xs = _federation(rng, 5)
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=30.0, noise_seed=4)
    model = KFed(4, 2, privacy=dp, random_state=0).fit(Xs, device_ids=[0, 1, 2, 3, 4])
    data = dict(enumerate(Xs))
    data[1] = Xs[1][3:]
    report = _forget(model, _grid(data, {1: {"forget": "rows"}, 4: {"forget": "device"}}))
    assert list(report.refused) == [1] and report.devices == [4]
    assert report.refused[1].startswith("device 1: PolicyRefusal: device 1: refuses to release")
    fresh = KFed(4, 2, privacy=dp, random_state=0).fit(Xs[:4], device_ids=[0, 1, 2, 3])
    assert np.array_equal(model.cluster_centers_, fresh.cluster_centers_)
