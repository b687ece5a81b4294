"""A SuperNode that dies and comes back (its state lost, under a new node id or its old
one) or connects late takes part from the next round whose client step needs no earlier
device state; claims on a device that a live node serves are refused and named (real
ServerApp / ClientApp, messages through protobuf on an in-process grid)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.coreset.protocol import CoresetProtocol  # noqa: E402
from fedclust.flower.apps import ServerSpec, make_client_app, make_server_app  # noqa: E402
from fedclust.flower.grid import HELLO_TYPE, LocalGrid, run_server_app  # noqa: E402
from fedclust.kfed.protocol import KFedProtocol  # noqa: E402
from fedclust.lloyd.protocol import DistributedLloydProtocol  # noqa: E402
from fedclust.privacy import DifferentialPrivacy  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402


class MissesRounds(InProcessTransport):
    """The in-process transport where chosen devices are absent from chosen rounds
    (``missed``: device id -> round indices) and present in every other one."""

    def __init__(self, missed):
        super().__init__()
        self.missed = missed

    def _round(self, protocol, state, request, targets, *args):
        here = [z for z in targets if request.round not in self.missed.get(z, ())]
        return super()._round(protocol, state, request, here, *args)


def _devices():
    rng = np.random.default_rng(11)
    centers = rng.normal(scale=6.0, size=(3, 3))
    return [centers[rng.integers(0, 3, 40)] + rng.normal(size=(40, 3)) for _ in range(4)]


def _lloyd(private=False):
    if not private:
        return DistributedLloydProtocol(3, max_rounds=6, tol=1e-12, init="sample")
    dp = DifferentialPrivacy(3.0, 1e-6, data_bound=40.0, noise_seed=2)
    return DistributedLloydProtocol(3, max_rounds=6, init="candidates", privacy=dp,
                                    n_features=3)


def _client(devices):
    return make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                        devices[int(ctx.node_config["partition-id"])]),
                           policy=lambda ctx: DevicePolicy(allow_collect=True,
                                                           allow_noise_seed=True))


def _run(protocol, devices, on_push, *, n_nodes=None, min_nodes=None):
    n_nodes = len(devices) if n_nodes is None else n_nodes
    spec = ServerSpec.for_protocol(protocol, 3, min_nodes=min_nodes or n_nodes,
                                   node_wait_s=0.0, round_timeout_s=None,
                                   collect_outputs=True)
    box = {}
    grid = LocalGrid(_client(devices), [{"partition-id": i} for i in range(n_nodes)],
                     on_push=on_push)
    run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(
        out=out, extra=extra)), grid)
    return box["out"], box["extra"], grid


def _round_of(messages):
    # "3", or "3.<stage>" in a secure round; None for a hello
    group = messages[0].metadata.group_id.split(".")[0] if messages else ""
    return int(group) if group.lstrip("-").isdigit() else None


def _dies_then_returns(device, dies_at, back_at, *, same_id):
    """``on_push``: ``device``'s node stops answering at round ``dies_at`` and its
    SuperNode starts again (empty state) while round ``back_at`` is sent."""
    seen = {}

    def on_push(grid, messages):
        r = _round_of(messages)
        node = grid.node_ids[device] if "node" not in seen else seen["node"]
        if r == dies_at and "node" not in seen:
            seen["node"] = node
            grid.stop(node)
        elif r == back_at and "back" not in seen:
            seen["back"] = grid.restart(seen["node"], same_id=same_id)
    return on_push, seen


@pytest.mark.parametrize("same_id", [False, True])
def test_a_restarted_node_rejoins_at_the_next_round(same_id):
    devices = _devices()
    on_push, seen = _dies_then_returns(1, dies_at=2, back_at=3, same_id=same_id)
    out, extra, grid = _run(_lloyd(), devices, on_push)
    assert (seen["back"] == seen["node"]) is same_id
    # it timed out in round 2, was not asked in round 3, and rejoined before round 4
    assert [(e["device"], e["round"], e["node"]) for e in extra["rejoined"]] == \
        [(1, 4, seen["back"])]
    assert "timed out" in extra["rejoined"][0]["missed"]
    assert extra["rejoined"][0]["previous_node"] == seen["node"]
    assert out.log.failed == {} and out.log.participants == [0, 1, 2, 3]
    assert extra["nodes"]["1"] == seen["back"]
    # the same maths as an in-process run in which device 1 missed rounds 2 and 3 only
    ref = MissesRounds({1: (2, 3)}).run(_lloyd(), dict(enumerate(devices)), 3)
    assert out.result.n_rounds == ref.result.n_rounds >= 5
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.result.cost_history == ref.result.cost_history
    for z in range(4):
        np.testing.assert_array_equal(out.device_outputs[z]["labels"],
                                      ref.device_outputs[z]["labels"])
    # ... which is not the run in which it never came back
    gone = MissesRounds({1: range(2, 100)}).run(_lloyd(), dict(enumerate(devices)), 3)
    assert out.result.cost_history != gone.result.cost_history


def test_a_restarted_node_rejoins_a_private_run():
    # private Lloyd (candidate init, trust-radius rounds, noise seed): the device keeps only
    # its clipped-point count between rounds; its restarted node counts its rounds afresh
    devices = _devices()
    on_push, seen = _dies_then_returns(2, dies_at=3, back_at=4, same_id=True)
    out, extra, _ = _run(_lloyd(private=True), devices, on_push)
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(2, 5)]
    assert out.log.failed == {}
    ref = MissesRounds({2: (3, 4)}).run(_lloyd(private=True), dict(enumerate(devices)), 3)
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.result.cost_history == ref.result.cost_history
    np.testing.assert_array_equal(out.device_outputs[2]["labels"],
                                  ref.device_outputs[2]["labels"])


def test_a_dead_node_still_listed_is_not_asked_again_every_round():
    devices = _devices()
    hellos = {}

    def on_push(grid, messages):
        for m in messages:
            if m.metadata.message_type == HELLO_TYPE:
                hellos[m.metadata.dst_node_id] = hellos.get(m.metadata.dst_node_id, 0) + 1
        if _round_of(messages) == 2:
            grid.stop(grid.node_ids[1])   # dead, but listed: Flower waits for its heartbeat

    out, extra, grid = _run(_lloyd(), devices, on_push)
    assert set(hellos.values()) == {1}        # the start's hello only: no timeout per round
    assert "timed out" in out.log.failed[1] and extra["rejoined"] == []
    assert out.result.n_rounds >= 5


def test_a_late_node_joins_at_the_next_round():
    devices = _devices()
    joined = {}

    def on_push(grid, messages):
        if _round_of(messages) == 2 and not joined:
            joined["node"] = grid.add_node({"partition-id": 3})

    out, extra, _ = _run(_lloyd(), devices, on_push, n_nodes=3)
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(3, 3)]
    assert extra["rejoined"][0]["missed"] == "not connected at the start"
    assert extra["rejoined"][0]["previous_node"] is None
    assert out.log.participants == [0, 1, 2, 3]
    ref = MissesRounds({3: (0, 1, 2)}).run(_lloyd(), dict(enumerate(devices)), 3)
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.result.cost_history == ref.result.cost_history


def test_a_node_claiming_a_live_device_is_refused_and_named():
    devices = _devices()
    extra_node = {}

    def on_push(grid, messages):
        if _round_of(messages) == 2 and not extra_node:
            extra_node["id"] = grid.add_node({"partition-id": 2})   # device 2 is alive

    out, extra, _ = _run(_lloyd(), devices, on_push)
    ref = InProcessTransport().run(_lloyd(), dict(enumerate(devices)), 3)
    why = extra["nodes_failed"][str(extra_node["id"])]
    assert "claims device id 2" in why and "serves in this run" in why
    assert extra["rejoined"] == [] and extra["nodes"]["2"] != extra_node["id"]
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)


def test_two_nodes_claiming_one_failed_device_are_both_refused():
    devices = _devices()
    added = []

    def on_push(grid, messages):
        r = _round_of(messages)
        if r == 1 and not added:
            grid.stop(grid.node_ids[1])
        elif r == 2 and not added:
            added.extend(grid.add_node({"partition-id": 1}) for _ in range(2))

    out, extra, _ = _run(_lloyd(), devices, on_push)
    for node in added:
        assert "all claim device id 1" in extra["nodes_failed"][str(node)]
    assert extra["rejoined"] == [] and 1 in out.log.failed and 1 not in out.log.participants


def test_a_protocol_that_needs_earlier_device_state_refuses_the_rejoin_by_name():
    # coresets: the "coreset" round reads the local clustering each device kept from "costs"
    devices = _devices()
    sent_to_new = []
    seen = {}

    def on_push(grid, messages):
        if _round_of(messages) == 0 and not seen:
            seen["old"] = grid.node_ids[1]
            seen["new"] = grid.restart(seen["old"])    # dies before answering round 0
        sent_to_new.extend(m.metadata.message_type for m in messages
                           if m.metadata.dst_node_id == seen.get("new"))

    out, extra, _ = _run(CoresetProtocol(3, 30), devices, on_push)
    why = out.log.failed[1]
    assert "timed out" in why and "cannot rejoin" in why and "'coreset'" in why
    assert extra["rejoined"] == [] and 1 not in out.log.participants
    assert sent_to_new == [HELLO_TYPE]       # asked who it is, never sent a data round


def test_k_fed_assigns_a_device_whose_node_came_back_as_a_late_device():
    # k-FED has one round; a device that lost it and came back before the end is assigned
    # to the final centers as a late device (its late step needs no earlier state)
    devices = _devices()
    seen = {}

    def on_push(grid, messages):
        if _round_of(messages) == 0 and not seen:
            seen["new"] = grid.restart(grid.node_ids[1])   # round 0 is lost with the old node

    out, extra, _ = _run(KFedProtocol(3, 3), devices, on_push)
    assert [(e["device"], e["late"], e["node"]) for e in extra["rejoined"]] == \
        [(1, True, seen["new"])]
    assert out.log.failed == {} and out.log.late == [1] and out.log.participants == [0, 2, 3]
    ref = InProcessTransport(late_devices=[1]).run(KFedProtocol(3, 3), dict(enumerate(devices)), 3)
    assert ref.log.late == [1]
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    for z in range(4):
        np.testing.assert_array_equal(out.device_outputs[z]["labels"],
                                      ref.device_outputs[z]["labels"])


def test_a_rejected_device_does_not_rejoin():
    devices = _devices()

    def tamper(z, r, arrays):   # device 1 sends sums of the wrong shape in round 2
        return {**arrays, "sums": arrays["sums"][:1]} if (z, r) == (1, 2) else arrays

    seen = {}

    def on_push(grid, messages):
        if _round_of(messages) == 3 and not seen:
            seen["new"] = grid.restart(grid.node_ids[1])

    spec = ServerSpec.for_protocol(_lloyd(), 3, min_nodes=4, node_wait_s=0.0,
                                   round_timeout_s=None)
    box = {}
    grid = LocalGrid(make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                                  devices[int(ctx.node_config["partition-id"])]),
                                     tamper=tamper),
                     [{"partition-id": i} for i in range(4)], on_push=on_push)
    run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(
        out=out, extra=extra)), grid)
    out, extra = box["out"], box["extra"]
    assert 1 in out.log.rejected and extra["rejoined"] == []
    assert "was rejected in this run" in extra["nodes_failed"][str(seen["new"])]


def test_a_restarted_node_rejoins_a_securely_summed_run():
    from fedclust.flower.grid import secure_spec

    devices = _devices()
    runs = []
    for secure in (False, True):
        on_push, _ = _dies_then_returns(1, dies_at=2, back_at=3, same_id=False)
        spec = ServerSpec.for_protocol(_lloyd(), 3, min_nodes=4, node_wait_s=0.0,
                                       round_timeout_s=None, **secure_spec(secure))
        box = {}
        grid = LocalGrid(_client(devices), [{"partition-id": i} for i in range(4)],
                         on_push=on_push)
        run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(
            out=out, extra=extra)), grid)
        runs.append((box["out"], box["extra"]))
    (plain, e_plain), (secure, e_secure) = runs
    assert [(e["device"], e["round"]) for e in e_secure["rejoined"]] == [(1, 4)]
    assert secure.log.failed == {}
    # the server held only sums: the same centers up to the fixed-point encoding
    np.testing.assert_allclose(secure.result.centers, plain.result.centers, atol=1e-6)
    np.testing.assert_allclose(secure.result.cost_history, plain.result.cost_history,
                               rtol=1e-7)


def test_a_device_missing_when_the_run_resumed_rejoins_once_its_node_connects(tmp_path):
    from fedclust.flower.apps import ServerAppFailed

    devices = _devices()
    kw = dict(min_nodes=3, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path),
              collect_outputs=True)

    def crash(grid, messages):
        if _round_of(messages) == 2:
            raise RuntimeError("connection lost")

    def late(grid, messages):
        if _round_of(messages) == 3 and len(grid.node_ids) == 3:
            grid.add_node({"partition-id": 3})

    spec = ServerSpec.for_protocol(_lloyd(), 3, **kw)
    nodes = [{"partition-id": i} for i in range(4)]
    with pytest.raises(ServerAppFailed, match="connection lost"):
        run_server_app(make_server_app(spec), LocalGrid(_client(devices), nodes, on_push=crash))
    box = {}
    again = ServerSpec.for_protocol(_lloyd(), 3, resume=True, **kw)
    run_server_app(make_server_app(again, on_result=lambda out, extra: box.update(
        out=out, extra=extra)), LocalGrid(_client(devices), nodes[:3], on_push=late))
    out, extra = box["out"], box["extra"]
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(3, 4)]
    assert "not connected when the run resumed" in extra["rejoined"][0]["missed"]
    assert out.log.failed == {} and out.log.participants == [0, 1, 2, 3]
    ref = MissesRounds({3: (2, 3)}).run(_lloyd(), dict(enumerate(devices)), 3)
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)


def test_a_restarted_fedavg_node_resumes_nothing_it_lost_and_matches_in_process():
    # a FedAvg round needs only the device's rows and the broadcast model, so its node may
    # come back; FedAvg itself leaves a device that missed a round out of the later rounds,
    # on both transports
    from fedclust.fl.fedavg import FedAvgProtocol

    rng = np.random.default_rng(5)
    W = rng.normal(size=(3, 3))
    devices = []
    for _ in range(4):
        X = rng.normal(size=(30, 3))
        devices.append((X, np.argmax(X @ W + 0.3 * rng.normal(size=(30, 3)), axis=1)))

    def proto():
        return FedAvgProtocol(model="softmax", n_features=3, n_classes=3, rounds=6,
                              local_mode="gd", lr=0.5)

    on_push, seen = _dies_then_returns(2, dies_at=2, back_at=3, same_id=False)
    out, extra, _ = _run(proto(), devices, on_push)
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(2, 4)]
    assert out.log.failed == {}
    ref = MissesRounds({2: (2, 3)}).run(proto(), dict(enumerate(devices)), 3)
    np.testing.assert_array_equal(out.result.models, ref.result.models)
    assert list(out.result.round_devices) == list(ref.result.round_devices) == [4, 4, 3, 3, 3, 3]
    full = MissesRounds({}).run(proto(), dict(enumerate(devices)), 3)
    assert not np.array_equal(out.result.models, full.result.models)


def test_a_restarted_robust_node_rejoins_at_the_next_step():
    # the robust pipeline asks every clustered machine each step: the node that came back
    # answers again, as the in-process machine that missed exactly those rounds
    from fedclust.robust.protocol import RobustRegressionProtocol

    rng = np.random.default_rng(8)
    betas = rng.normal(scale=3.0, size=(2, 3))
    devices = []
    for z in range(6):
        X = rng.normal(size=(40, 3))
        devices.append((X, X @ betas[z % 2] + 0.1 * rng.normal(size=40)))

    def proto():
        return RobustRegressionProtocol(n_clusters=2, n_features=3, rounds=5)

    on_push, seen = _dies_then_returns(3, dies_at=2, back_at=3, same_id=True)
    out, extra, _ = _run(proto(), devices, on_push)
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(3, 4)]
    assert out.log.failed == {} and 3 in out.log.participants
    ref = MissesRounds({3: (2, 3)}).run(proto(), dict(enumerate(devices)), 3)
    np.testing.assert_array_equal(out.result.coef, ref.result.coef)
    gone = MissesRounds({3: (2, 3, 4, 5, 6)}).run(proto(), dict(enumerate(devices)), 3)
    assert not np.array_equal(out.result.coef, gone.result.coef)
