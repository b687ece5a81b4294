"""The ServerApp checkpoints every round into its result folder; a ServerApp that dies
and is started again with ``resume=true`` continues after the last complete round and
ends where an uninterrupted run ends (real ServerApp / ClientApp, messages through
protobuf on an in-process grid)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.flower.apps import (ServerAppFailed, ServerSpec, make_client_app,  # noqa: E402
                                  make_server_app)
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402
from fedclust.lloyd.protocol import DistributedLloydProtocol  # noqa: E402
from fedclust.privacy import DifferentialPrivacy  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402


class SuperLinkLost(RuntimeError):
    pass


class CrashingGrid(LocalGrid):
    """Loses the connection on its ``at``-th exchange (0: the hello)."""

    def __init__(self, *args, at: int, **kw):
        super().__init__(*args, **kw)
        self.at, self.n = at, 0

    def send_and_receive(self, messages, *, timeout=None):
        n, self.n = self.n, self.n + 1
        if n == self.at:
            raise SuperLinkLost(f"connection lost in exchange {n}")
        return super().send_and_receive(messages, timeout=timeout)


def _devices():
    rng = np.random.default_rng(5)
    centers = rng.normal(scale=8.0, size=(3, 3))
    return [centers[rng.integers(0, 3, 30)] + rng.normal(size=(30, 3)) for _ in range(4)]


def _protocol(private):
    dp = DifferentialPrivacy(3.0, 1e-6, data_bound=40.0, noise_seed=2) if private else None
    return DistributedLloydProtocol(3, max_rounds=4, init="candidates", privacy=dp,
                                    n_features=3)


def _client(devices):
    # the nodes' owner runs the test: a noise seed (for a reproducible private run) and the
    # per-point outputs are allowed
    return make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                        devices[int(ctx.node_config["partition-id"])]),
                           policy=lambda ctx: DevicePolicy(allow_noise_seed=True,
                                                           allow_collect=True))


def _serve(spec, grid):
    box = {}
    run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(out=out)), grid)
    return box["out"]


@pytest.mark.parametrize("private,at", [(False, 3), (True, 4)])
def test_server_app_killed_and_resumed_ends_as_the_uninterrupted_run(tmp_path, private, at):
    devices = _devices()
    ref = InProcessTransport().run(_protocol(private), dict(enumerate(devices)), 7)
    kw = dict(min_nodes=4, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path))
    spec = ServerSpec.for_protocol(_protocol(private), 7, **kw)
    nodes = [{"partition-id": i} for i in range(4)]
    with pytest.raises(ServerAppFailed, match="connection lost"):
        _serve(spec, CrashingGrid(_client(devices), nodes, at=at))
    assert (tmp_path / "checkpoint" / "checkpoint.npz").exists()
    # started again: the nodes reconnect (other node ids), each with a fresh context
    again = ServerSpec.for_protocol(_protocol(private), 7, resume=True, **kw)
    assert again.to_run_config()["resume"] is True
    grid = CrashingGrid(_client(devices), nodes[::-1], run_id=4343, at=-1)
    out = _serve(again, grid)
    full = CrashingGrid(_client(devices), nodes, at=-1)
    _serve(ServerSpec.for_protocol(_protocol(private), 7, **{**kw, "result_dir": None}), full)
    assert grid.n == full.n - (at - 1)   # the at - 1 rounds done before the crash not redone
    assert np.array_equal(out.result.centers, ref.result.centers)
    assert out.meter.summary() == ref.meter.summary()
    assert out.log.participants == ref.log.participants
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["cluster_centers"] == ref.result.centers.tolist()
    if private:   # the exchange that failed was a round sent out: written ahead as spent
        lost = out.log.privacy_ledger["lost_releases"]
        assert [e["round"] for e in lost] == [at - 1]
        assert out.log.privacy_ledger["epsilon_spent"] > _protocol(True).plan.epsilon_spent
        assert saved["run_log"]["privacy_ledger"]["lost_releases"] == lost


def test_a_device_missing_at_the_resume_is_named_and_the_run_goes_on(tmp_path):
    devices = _devices()
    kw = dict(min_nodes=3, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path))
    nodes = [{"partition-id": i} for i in range(4)]
    with pytest.raises(ServerAppFailed):
        _serve(ServerSpec.for_protocol(_protocol(False), 7, **kw),
               CrashingGrid(_client(devices), nodes, at=3))
    out = _serve(ServerSpec.for_protocol(_protocol(False), 7, resume=True, **kw),
                 LocalGrid(_client(devices), nodes[:3]))
    assert out.log.failed == {3: "device 3: not connected when the run resumed"}
    assert out.log.participants == [0, 1, 2]


class LetInLater(LocalGrid):
    """Node ``node`` (listed, silent) misses the resumed run's hello; at the server's
    ``back_at``-th look at the nodes it is let in again under its old node id (a SuperNode
    killed with the SuperLink, started again by its supervisor, refused until Flower's record
    of its old activation lapsed). ``back_at=None``: it never comes back."""

    def __init__(self, *args, node, back_at, **kw):
        super().__init__(*args, unresponsive=[node], **kw)
        self.node, self.back_at, self.looks = node, back_at, 0
        self.hellos_to_node = 0

    def get_nodes(self):
        self.looks += 1
        if self.looks == self.back_at:
            self.restart(self.node, same_id=True)
        return super().get_nodes()

    def push_messages(self, messages):
        messages = list(messages)
        self.hellos_to_node += sum(m.metadata.dst_node_id == self.node
                                   and m.metadata.message_type.endswith("fedclust_hello")
                                   for m in messages)
        return super().push_messages(messages)


def _crashed_at_3(tmp_path, devices, nodes):
    kw = dict(min_nodes=4, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path))
    with pytest.raises(ServerAppFailed):
        _serve(ServerSpec.for_protocol(_protocol(False), 7, **kw),
               CrashingGrid(_client(devices), nodes, at=3))
    return kw


def test_a_device_let_in_after_the_resumed_hello_takes_part_from_the_first_round(tmp_path):
    devices = _devices()
    nodes = [{"partition-id": i} for i in range(4)]
    kw = _crashed_at_3(tmp_path, devices, nodes)
    grid = LetInLater(_client(devices), nodes, node=1051, back_at=2)
    box = {}
    spec = ServerSpec.for_protocol(_protocol(False), 7, resume=True,
                                   **{**kw, "node_wait_s": 30.0})
    run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(
        out=out, extra=extra)), grid)
    out, extra = box["out"], box["extra"]
    ref = InProcessTransport().run(_protocol(False), dict(enumerate(devices)), 7)
    assert grid.contexts[1051].node_config["partition-id"] == 3
    assert grid.hellos_to_node == 2   # the resumed run's hello, then one once it was back
    assert out.log.failed == {} and out.log.participants == [0, 1, 2, 3]
    assert extra["nodes"]["3"] == 1051 and extra["rejoined"] == []
    assert "1051" not in extra["nodes_failed"]
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.meter.summary() == ref.meter.summary()


def test_a_device_that_does_not_come_back_is_asked_once_and_the_resumed_run_goes_on(tmp_path):
    devices = _devices()
    nodes = [{"partition-id": i} for i in range(4)]
    kw = _crashed_at_3(tmp_path, devices, nodes)
    grid = LetInLater(_client(devices), nodes, node=1051, back_at=None)
    out = _serve(ServerSpec.for_protocol(_protocol(False), 7, resume=True,
                                         **{**kw, "node_wait_s": 1.5}), grid)
    assert grid.looks >= 2   # it looked again while it waited
    assert grid.hellos_to_node == 1   # listed but silent under the same activation: no new ask
    assert out.log.failed == {3: "device 3: not connected when the run resumed"}
    assert out.log.participants == [0, 1, 2]


def test_resume_with_another_configuration_is_refused(tmp_path):
    devices = _devices()
    kw = dict(min_nodes=4, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path))
    nodes = [{"partition-id": i} for i in range(4)]
    with pytest.raises(ServerAppFailed):
        _serve(ServerSpec.for_protocol(_protocol(False), 7, **kw),
               CrashingGrid(_client(devices), nodes, at=2))
    with pytest.raises(ServerAppFailed, match=r"checkpoint is of another run \(seed 7 in the checkpoint, 8 in"):
        _serve(ServerSpec.for_protocol(_protocol(False), 8, resume=True, **kw),
               LocalGrid(_client(devices), nodes))


def test_flower_run_passes_run_config_overrides_and_resume_to_flwr(tmp_path, capsys,
                                                                  monkeypatch):
    """`fedclust flower run APP LINK --run-config ... --resume` hands Flower's own
    `--run-config` the overrides plus resume=true."""
    import os
    import sys
    import textwrap

    from fedclust.cli import main

    seen = tmp_path / "argv.json"
    script = tmp_path / "flwr"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        if sys.argv[1] == "run":
            json.dump(sys.argv[1:], open({str(seen)!r}, "w"))
            print("Successfully started run 42")
        else:
            print(json.dumps({{"runs": [{{"run-id": "42", "status": "finished:completed"}}]}}))
        """))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert main(["flower", "run", "myapp", "link", "--run-config",
                 "round-timeout-s=60 min-nodes=2", "--resume"]) == 0
    argv = json.loads(seen.read_text())
    assert argv[:3] == ["run", "myapp", "link"]
    i = argv.index("--run-config")
    assert argv[i + 1] == "round-timeout-s=60 min-nodes=2 resume=true"
    # Flower's own parser reads the overrides as we mean them
    from flwr.common.config import parse_config_args

    assert parse_config_args([argv[i + 1]]) == {"round-timeout-s": 60, "min-nodes": 2,
                                                "resume": True}
    assert main(["flower", "run", "myapp", "link"]) == 0
    assert "--run-config" not in json.loads(seen.read_text())


def test_generated_apps_carry_the_resume_key(tmp_path):
    """Flower refuses run-config overrides of keys the app lacks: `resume` must be there."""
    from fedclust.config import check_config
    from fedclust.flower_app import app_run_config

    cfg = check_config({"seed": 1, "data": {"source": "gaussians", "n_features": 3,
                                            "n_clusters": 2, "n_local_clusters": 1, "m0": 1,
                                            "n_per_component": 10},
                        "algorithm": {"name": "distributed-lloyd", "n_clusters": 2}})
    rc = app_run_config(cfg, result_dir=tmp_path)
    assert rc["resume"] is False and ServerSpec.from_run_config(rc).resume is False
    assert ServerSpec.from_run_config({**rc, "resume": True}).resume is True
