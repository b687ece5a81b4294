"""A deviating server against the real Flower ClientApp (every message through protobuf,
the in-memory grid tier): each attack is refused by the node, in one line naming it."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Message  # noqa: E402

from fedclust.core.exceptions import ValidationError  # noqa: E402
from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.core.protocol import Request  # noqa: E402
from fedclust.core.secure_sum import (SecureAggregation, SecureSumServer,  # noqa: E402
                                      make_identities)
from fedclust.flower.apps import make_client_app  # noqa: E402
from fedclust.flower.codec import (ERROR, REPLY, SECAGG, SECAGG_STAGE, arrays_to_record,  # noqa: E402
                                   record_to_arrays, request_to_content)
from fedclust.flower.grid import FlowerInMemoryTransport, LocalGrid  # noqa: E402
from fedclust.lloyd.protocol import DistributedLloydProtocol  # noqa: E402
from fedclust.privacy import DifferentialPrivacy  # noqa: E402

N = 4


@pytest.fixture(autouse=True)
def _task_identity():
    """What Flower's runtime sets around a ServerApp (messages need a run id)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 4242, SUPERLINK_NODE_ID
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _devices(n=N, d=3):
    rng = np.random.default_rng(0)
    return {z: rng.normal(size=(30, d)) + (z % 2) * 3 for z in range(n)}


class Node:
    """The malicious server's view of N real ClientApp nodes over a LocalGrid."""

    def __init__(self, protocol, *, signed=False, policy=None):
        self.devs = _devices()
        self.idn = make_identities(range(N)) if signed else {}
        pol = policy or DevicePolicy()
        app = make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                           self.devs[int(ctx.node_config["partition-id"])]),
                              identity=lambda ctx: self.idn.get(
                                  int(ctx.node_config["partition-id"])),
                              policy=lambda ctx: pol)
        self.grid = LocalGrid(app, [{"partition-id": i} for i in range(N)])
        self.protocol = protocol.secure_form()
        self.seed = 3

    def ask(self, z, request, *, stage=None, arrays=None, **head):
        if stage is not None:
            head[SECAGG_STAGE] = stage
        content = request_to_content(self.protocol, request, self.seed, **head)
        if arrays is not None:
            content[SECAGG] = arrays_to_record(arrays)
        msg = Message(content, dst_node_id=self.grid.node_ids[z],
                      message_type=f"query.{request.action}", group_id="x")
        (reply,) = self.grid.send_and_receive([msg])
        if ERROR in reply.content.config_records:
            err = reply.content.config_records[ERROR]
            return f"{err['type']}: {err['message']}"
        key = SECAGG if stage is not None else REPLY
        return record_to_arrays(reply.content.array_records[key])

    def first_request(self):
        return self.protocol.next_request(self.protocol.start(list(range(N)), self.seed))


def _secure_to(node, settings, upto, lie=None):
    """Run the honest stages up to ``upto`` through the nodes; returns the server."""
    req = node.first_request()
    srv = SecureSumServer(range(N), req.round, settings, 1)
    for stage in srv.stages[:srv.stages.index(upto) + 1]:
        replies = {}
        for z, arrays in srv.requests(stage).items():
            arrays = lie(stage, z, dict(arrays)) if lie else arrays
            out = node.ask(z, Request(req.round, req.action, req.payload_for(z)
                                      if stage == "mask" else None), stage=stage, arrays=arrays)
            if isinstance(out, str):
                return srv, z, out
            replies[z] = out
        srv.take(stage, replies)
    return srv, None, None


def _lloyd():
    return DistributedLloydProtocol(2, max_rounds=2, tol=0.0, init="candidates")


@pytest.mark.parametrize("signed", [False, True])
def test_finding1_group_of_one_refused_by_the_node(signed):
    node = Node(_lloyd(), signed=signed)

    def alone(stage, z, arrays):
        if stage == "share" and z == 0:
            for key in ("ids", "x", "c_pk", "s_pk", "sig"):
                if key in arrays:
                    arrays[key] = arrays[key][:1]
            arrays["threshold"] = np.asarray(1, np.int64)
        return arrays

    settings = SecureAggregation(signed=signed)
    _, who, err = _secure_to(node, settings, "share", lie=alone)
    assert who == 0
    assert err.startswith("PolicyRefusal: device 0: refuses a secure-aggregation group of 1 "
                          "device(s) (minimum 2")


def test_finding2_mask_twice_refused_by_the_node():
    node = Node(_lloyd())
    srv, who, err = _secure_to(node, SecureAggregation(), "mask")
    assert err is None
    req = node.first_request()
    again = node.ask(1, Request(req.round, req.action, req.payload_for(1)), stage="mask",
                     arrays=srv.requests("mask")[1])
    assert again == ("ValidationError: device 1: secure aggregation stage 'mask' already "
                     f"answered in round {req.round}; refusing to answer it again")


def test_finding6_a_node_with_an_identity_refuses_a_plain_request():
    node = Node(_lloyd(), signed=True)
    req = node.first_request()
    assert req.action in node.protocol.summed_actions
    out = node.ask(2, req)
    assert out.startswith(f"PolicyRefusal: device 2: refuses a plain {req.action!r} request: "
                          "its policy requires secure aggregation (signed)")
    # a node with the same (default) policy and no identity answers it
    assert not isinstance(Node(_lloyd()).ask(2, req), str)


def test_finding6_no_server_chosen_noise_seed_no_collect_allowlist():
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=20.0, noise_seed=11)
    node = Node(DistributedLloydProtocol(2, max_rounds=2, init="candidates", privacy=dp,
                                         n_features=3))
    assert node.ask(0, node.first_request()).startswith(
        "PolicyRefusal: device 0: refuses a private protocol whose noise seed the server chose")
    node = Node(_lloyd(), policy=DevicePolicy(actions={"kfed": ["local"]}))
    assert node.ask(3, node.first_request()).startswith(
        "PolicyRefusal: device 3: refuses protocol 'distributed-lloyd': not in its policy's "
        "allowed protocols ['kfed']")


def test_finding6_refusals_are_named_in_the_servers_run_log():
    """A whole run on the Flower apps: device 2's node keeps its outputs and device 3's
    refuses the protocol; the server's log names both, the others carry on."""
    pols = {2: DevicePolicy(), 3: DevicePolicy(actions={"kfed": ["local"]}, allow_collect=True)}
    out = FlowerInMemoryTransport(policies=pols).run(_lloyd(), _devices(), 0)
    assert out.log.failed[3].startswith("device 3: PolicyRefusal: device 3: refuses protocol")
    assert "device 2" in out.log.failed[2] and "refuses to send per-point outputs" in \
        out.log.failed[2]
    assert out.log.failed[2] == ("device 2 (final message): PolicyRefusal: device 2: refuses "
                                 "to send per-point outputs: its policy has allow_collect off")
    assert sorted(out.device_outputs) == [0, 1] and 3 not in out.log.participants
    assert 2 in out.log.participants  # its sums are in the model; its labels stay home


def test_the_node_ledger_refuses_a_second_fit(tmp_path):
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=20.0)
    proto = DistributedLloydProtocol(2, max_rounds=2, tol=0.0, init="candidates", privacy=dp,
                                     n_features=3)
    pol = DevicePolicy(epsilon=1.2, ledger=str(tmp_path / "node-{device}.json"),
                       allow_collect=True)
    first = FlowerInMemoryTransport(policies=pol).run(proto, _devices(), 0)
    assert not first.log.failed
    entries = json.loads((tmp_path / "node-1.json").read_text())["entries"]
    assert len(entries) == 1
    with pytest.raises(Exception, match="device [0-9]: refuses .*past its budget 1.2"):
        FlowerInMemoryTransport(policies=pol).run(proto, _devices(), 1)


def test_a_node_budget_needs_a_ledger_file():
    from flwr.app import Context, RecordDict

    from fedclust.flower.apps import node_policy

    ctx = Context(run_id=1, node_id=7, node_config={"policy-epsilon": 2.0}, state=RecordDict(),
                  run_config={})
    with pytest.raises(ValidationError, match="SuperNode 7: node config policy-epsilon needs "
                                              "policy-ledger"):
        node_policy(ctx)
    ctx.node_config["policy-ledger"] = "/var/lib/fedclust/ledger.json"
    assert node_policy(ctx).ledger == "/var/lib/fedclust/ledger.json"


def test_the_node_refuses_a_private_round_past_the_declared_ones():
    """A server asking one Lloyd round more than the public config's max_rounds, under a
    new round id (or an answered round again): each message is a new ClientApp call, so
    the count lives in the node's state; the other nodes are untouched."""
    from fedclust.lloyd.messages import RadiusBroadcast

    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=20.0)
    node = Node(DistributedLloydProtocol(2, max_rounds=2, tol=0.0, init="candidates",
                                         privacy=dp, n_features=3))

    def lloyd(r):
        return Request(r, "lloyd", RadiusBroadcast(np.zeros((2, 3)), np.asarray(5.0)))

    for r in (2, 3):
        assert not isinstance(node.ask(0, lloyd(r)), str)
    assert node.ask(0, lloyd(2)) == (
        "PolicyRefusal: device 0: refuses a second 'lloyd' request for round 2 of private "
        "protocol 'distributed-lloyd': it answered that round already (a repeat is a release "
        "its ledger never charged)")
    assert node.ask(0, lloyd(4)) == (
        "PolicyRefusal: device 0: refuses 'lloyd' request 3 of private protocol "
        "'distributed-lloyd': the fit declares 2 'lloyd' round(s)")
    assert not isinstance(node.ask(1, lloyd(4)), str)   # device 1 answered none yet


def test_an_honest_private_flower_run_is_accepted_by_counting_nodes():
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=20.0)
    proto = DistributedLloydProtocol(2, max_rounds=3, tol=0.0, init="candidates", privacy=dp,
                                     n_features=3)
    out = FlowerInMemoryTransport(policies=DevicePolicy(allow_collect=True)).run(
        proto, _devices(), 0)
    assert not out.log.failed and sorted(out.log.participants) == list(range(N))
    assert out.meter.rounds == sum(proto.declared_rounds().values())
