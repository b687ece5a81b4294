"""Nodes with node config ``state-dir`` keep their device state on disk: a Flower run of a
family whose devices carry state between rounds, killed and resumed (a new Flower run,
fresh node contexts), ends exactly as the uninterrupted run; a round the node answered
before the crash is answered again only with the same request, with the same reply; a
state file that is missing, changed or for another data file is refused by name (real
ServerApp / ClientApp, messages through protobuf on an in-process grid)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fedclust.core.exceptions import ValidationError  # noqa: E402
from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.flower import apps  # noqa: E402
from fedclust.flower.apps import ServerSpec, make_client_app, make_server_app  # noqa: E402
from fedclust.flower.codec import PAYLOAD, REQUEST  # noqa: E402
from fedclust.flower.grid import FlowerInMemoryTransport, LocalGrid, run_server_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sim"))
from test_checkpoint_resume import _cases, _fit, _fitted, _same  # noqa: E402


class SuperLinkLost(RuntimeError):
    pass


class CrashingGrid(LocalGrid):
    """Loses the connection at exchange ``at`` (0: the hello): before its messages go out,
    or (``after``) once the nodes have answered, before the server sees the replies."""

    def __init__(self, *args, at: int = -1, after: bool = False, **kw):
        super().__init__(*args, **kw)
        self.at, self.after, self.n = at, after, 0

    def send_and_receive(self, messages, *, timeout=None):
        n, self.n = self.n, self.n + 1
        if n == self.at and not self.after:
            raise SuperLinkLost(f"connection lost before exchange {n}")
        replies = super().send_and_receive(messages, timeout=timeout)
        if n == self.at and self.after:
            raise SuperLinkLost(f"connection lost after exchange {n}")
        return replies


class Crashing(FlowerInMemoryTransport):
    def __init__(self, at=-1, after=False, on_push=None, **kw):
        super().__init__(**kw)
        self.at, self.after, self.on_push = at, after, on_push

    def _grid(self, client_app, configs):
        self.grid_ = CrashingGrid(client_app, configs, run_id=self.run_id, at=self.at,
                                  after=self.after, on_push=self.on_push)
        return self.grid_


@pytest.fixture
def steps(monkeypatch):
    """Counts the client steps the nodes compute (a replayed round computes none)."""
    box = {"n": 0}
    real = apps._client_step

    def counting(*args, **kw):
        box["n"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(apps, "_client_step", counting)
    return box


def _crash_and_resume(make, data, folder, at, after, *, state=True, run_id=77, **kw):
    with pytest.raises(SuperLinkLost):
        _fit(make, data, Crashing(at=at, after=after, result_dir=str(folder),
                                  state_dir=str(folder / "nodes") if state else None, **kw))
    again = Crashing(result_dir=str(folder), resume=True, run_id=run_id,
                     state_dir=str(folder / "nodes") if state else None, **kw)
    return _fit(make, data, again), again


_SLOW = pytest.mark.slow


def _gauss_rounds():
    from fedclust import FedGaussClustering
    from test_checkpoint_resume import _devices as devices

    return lambda: FedGaussClustering(n_rounds=3, random_state=0), devices, {}


@pytest.mark.parametrize("name,every", [
    ("coreset-pca", True), ("fedavg", True), ("gauss", True), ("gauss-rounds", True),
    ("robust", False), ("kfed+fedavg", False),
    pytest.param("robust", True, marks=_SLOW), pytest.param("kfed+fedavg", True, marks=_SLOW)])
def test_a_killed_run_resumes_on_flower_as_the_uninterrupted_run(name, every, tmp_path, steps):
    make, data, _ = _gauss_rounds() if name == "gauss-rounds" else _cases()[name]
    ref = _fit(make, data, FlowerInMemoryTransport())
    n_rounds = ref.communication_["rounds"]
    per_run = steps["n"]
    # exchange 1..n_rounds are the rounds: killed before one goes out, or after the nodes
    # answered it but before the server saw the replies (its checkpoint a round behind);
    # every round, or (fast) the last one, which reads what the devices kept
    for at in range(1, n_rounds + 1) if every else [n_rounds]:
        for after in (False, True):
            steps["n"] = 0
            folder = tmp_path / f"{at}-{after}"
            got, _ = _crash_and_resume(make, data, folder, at, after)
            where = f"{name}: killed {'after' if after else 'before'} exchange {at}"
            _same(_fitted(got), _fitted(ref), where)
            assert got.communication_ == ref.communication_, where
            # the round answered before the crash was not computed again: its stored
            # reply went back (the same release)
            assert steps["n"] == per_run, where


def test_devices_first_sampled_after_the_resume_take_part(tmp_path):
    """FedAvg asking 2 of 6 devices a round: a device the rounds before the crash never
    asked has nothing to resume and answers (the server says it was not asked)."""
    from fedclust import FedAvg

    _, data, _ = _cases()["fedavg"]
    make = lambda: FedAvg("softmax", rounds=4, lr=0.1, random_state=3,  # noqa: E731
                          clients_per_round=2)
    ref = _fit(make, data, FlowerInMemoryTransport())
    for after in (False, True):
        got, _ = _crash_and_resume(make, data, tmp_path / str(after), 2, after)
        _same(_fitted(got), _fitted(ref))
        assert got.communication_ == ref.communication_


@pytest.mark.parametrize("name", ["coreset-pca", "kfed+fedavg"])
def test_without_state_dir_a_round_that_needs_kept_state_is_refused_by_name(name, tmp_path):
    make, data, _ = _cases()[name]
    ref = _fit(make, data, FlowerInMemoryTransport())
    at = ref.communication_["rounds"]   # the last round reads what the devices kept
    with pytest.raises(ValidationError, match=r"device 0: cannot answer '\w+' round \d+ of the "
                       r"resumed run of protocol .* the node keeps no state across Flower runs "
                       r"\(set node config state-dir\)"):
        _crash_and_resume(make, data, tmp_path, at, False, state=False)


@pytest.mark.parametrize("name", ["fedavg", "robust"])
def test_without_state_dir_a_family_whose_rounds_keep_nothing_resumes_exactly(name, tmp_path):
    # FedAvg's and the robust pipeline's rounds read only the broadcast model and the rows
    # (their actions are rejoin actions): a resume needs no state file on the nodes
    make, data, _ = _cases()[name]
    ref = _fit(make, data, FlowerInMemoryTransport())
    at = ref.communication_["rounds"]
    for after in (False, True):
        got, _ = _crash_and_resume(make, data, tmp_path / str(after), at, after, state=False)
        _same(_fitted(got), _fitted(ref), f"{name}, killed {'after' if after else 'before'}")
        assert got.communication_ == ref.communication_


def _coreset():
    make, data, _ = _cases()["coreset-pca"]
    return make, data


def _state_file(folder, node=0):
    (path,) = (folder / "nodes" / f"node-{node}").glob("fedclust-state-*-device-*.npz")
    return path


def _killed_coreset(folder, at=3, after=False):
    make, data = _coreset()
    with pytest.raises(SuperLinkLost):
        _fit(make, data, Crashing(at=at, after=after, result_dir=str(folder),
                                  state_dir=str(folder / "nodes")))
    return make, data


def _resume(make, data, folder, **kw):
    t = Crashing(result_dir=str(folder), resume=True, run_id=78,
                 state_dir=str(folder / "nodes"), **kw)
    return _fit(make, data, t), t


def test_a_missing_state_file_is_refused_by_name(tmp_path):
    make, data = _killed_coreset(tmp_path)
    path = _state_file(tmp_path)
    path.unlink()
    got, t = _resume(make, data, tmp_path)
    failed = got.run_log_.failed if hasattr(got, "run_log_") else t.last_extra_
    assert "it has no state file for this fit" in failed[0] and str(path) in failed[0]
    assert sorted(failed) == [0]


def test_a_changed_state_file_is_refused_by_name(tmp_path):
    make, data = _killed_coreset(tmp_path)
    path = _state_file(tmp_path, node=1)
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    key = next(k for k, a in arrays.items() if a.dtype == np.float64 and a.size > 1)
    arrays[key] = arrays[key] + 1e-9   # one number of the kept state, digest left as it was
    np.savez(path, **arrays)
    got, _ = _resume(make, data, tmp_path)
    assert "was changed since the node wrote it" in got.run_log_.failed[1]
    assert sorted(got.run_log_.failed) == [1]


def test_a_state_file_of_another_data_file_is_refused_by_name(tmp_path):
    make, data = _killed_coreset(tmp_path)
    changed = data()
    changed[2] = changed[2].copy()
    changed[2][0, 0] += 1.0
    got, _ = _resume(make, lambda: changed, tmp_path)
    assert "was written for another data file" in got.run_log_.failed[2]
    assert sorted(got.run_log_.failed) == [2]


def _dishonest(change):
    """``on_push``: the resumed server's first round, rewritten by ``change(content)``."""
    seen = {"done": False}

    def on_push(grid, messages):
        if seen["done"] or not messages or messages[0].metadata.group_id == "hello":
            return
        seen["done"] = True
        for m in messages:
            change(m.content)
    return on_push


def test_a_dishonest_server_cannot_ask_an_answered_round_with_another_payload(tmp_path):
    # killed after the nodes answered the 'costs' round: the resumed server asks it again
    make, data = _killed_coreset(tmp_path, at=3, after=True)

    def other_components(content):
        rec = content.array_records[PAYLOAD]
        arrays = {k: v.numpy() for k, v in rec.items()}
        from flwr.app import Array

        for k, a in arrays.items():
            if a.dtype.kind == "f" and a.size > 1:
                rec[k] = Array(np.ascontiguousarray(a * 1.001))
    with pytest.raises(ValidationError, match="device 0: refuses 'costs' round 2 again with "
                       "another request than the one it answered"):
        _resume(make, data, tmp_path, on_push=_dishonest(other_components))


def test_a_dishonest_server_cannot_ask_a_resumed_round_under_another_seed(tmp_path):
    make, data = _killed_coreset(tmp_path, at=4, after=True)

    def other_seed(content):
        content.config_records[REQUEST]["seed"] = int(content.config_records[REQUEST]["seed"]) + 1
    # under another seed it is another fit, of which the node kept nothing
    with pytest.raises(ValidationError, match="device 0: cannot answer 'coreset' round 3 of the "
                       "resumed run .* it has no state file for this fit"):
        _resume(make, data, tmp_path, on_push=_dishonest(other_seed))


def test_a_dishonest_server_cannot_go_back_to_an_earlier_round(tmp_path):
    make, data = _killed_coreset(tmp_path, at=4, after=False)

    def earlier_step(content):   # the coreset round, claimed to be the step of 'spectrum'
        content.config_records[REQUEST]["step"] = 1
    with pytest.raises(ValidationError, match="device 0: refuses 'coreset' round 3 again with "
                       "another request than the one it answered"):
        _resume(make, data, tmp_path, on_push=_dishonest(earlier_step))


def test_a_node_never_answers_a_step_before_the_last_it_answered(tmp_path):
    from fedclust.core.policy import PolicyRefusal
    from fedclust.coreset.protocol import CoresetProtocol
    from fedclust.flower.node_state import NodeStateStore

    store = NodeStateStore(tmp_path, CoresetProtocol(3, 30), 5, 0, "d" * 64, "device 0")
    store.record = store.new_record(1)
    store.answer(0, "a" * 64, {"x": np.ones(2)}, {}, {"r": np.zeros(1)})
    store.answer(3, "b" * 64, {"x": np.ones(3)}, {}, {"r": np.ones(1)})
    assert store.replay(3, "b" * 64, 3, "coreset")["state"]["x"].shape == (3,)
    assert store.replay(4, "c" * 64, 4, "coreset") is None   # a new step
    with pytest.raises(PolicyRefusal, match=r"device 0: refuses 'costs' round 2 \(step 2\): it "
                       "already answered step 3 of this fit and does not go back"):
        store.replay(2, "c" * 64, 2, "costs")
    # what was written reads back, and names the data it was written for
    loaded = NodeStateStore(tmp_path, CoresetProtocol(3, 30), 5, 0, "d" * 64, "device 0").load()
    assert sorted(loaded["answered"]) == [0, 3]
    assert [s["step"] for s in loaded["snapshots"]] == [0, 3]
    with pytest.raises(ValidationError, match="written for another data file"):
        NodeStateStore(tmp_path, CoresetProtocol(3, 30), 5, 0, "e" * 64, "device 0").load()
    # a third round: the oldest snapshot goes, its request digest stays
    store.answer(4, "c" * 64, {"x": np.ones(4)}, {}, {"r": np.full(1, 2.0)})
    assert [s["step"] for s in store.record["snapshots"]] == [3, 4]
    assert sorted(store.record["answered"]) == [0, 3, 4]
    with pytest.raises(PolicyRefusal, match="device 0: refuses 'means' round 0 again: it "
                       "answered it, and .* keeps only the last 2 replies"):
        store.replay(0, "a" * 64, 0, "means")
    with pytest.raises(PolicyRefusal, match="another request than the one it answered"):
        store.replay(0, "f" * 64, 0, "means")



# -- a private run: the node's own ledger --------------------------------------------
def _devices():
    rng = np.random.default_rng(5)
    centers = rng.normal(scale=8.0, size=(3, 3))
    return [centers[rng.integers(0, 3, 30)] + rng.normal(size=(30, 3)) for _ in range(4)]


def _private_lloyd():
    from fedclust.lloyd.protocol import DistributedLloydProtocol
    from fedclust.privacy import DifferentialPrivacy

    dp = DifferentialPrivacy(3.0, 1e-6, data_bound=40.0, noise_seed=2)
    return DistributedLloydProtocol(3, max_rounds=4, init="candidates", privacy=dp,
                                    n_features=3)


def _private_nodes(devices, ledgers):
    def policy(ctx):
        z = int(ctx.node_config["partition-id"])
        return DevicePolicy(allow_noise_seed=True, allow_collect=True, epsilon=50.0,
                            delta=1e-5, ledger=str(ledgers / f"ledger-{z}.json"))
    return make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                        devices[int(ctx.node_config["partition-id"])]),
                           policy=policy)


def _serve(spec, grid):
    box = {}
    run_server_app(make_server_app(spec, on_result=lambda out, extra: box.update(
        out=out, extra=extra)), grid)
    return box["out"], box["extra"]


@pytest.mark.parametrize("state", [True, False])
def test_a_resumed_private_round_is_not_charged_twice_by_the_node(tmp_path, state):
    devices = _devices()
    nodes = [{"partition-id": i, **({"state-dir": str(tmp_path / f"node-{i}")} if state
                                    else {})} for i in range(4)]
    kw = dict(min_nodes=4, node_wait_s=0.0, round_timeout_s=None,
              result_dir=str(tmp_path / "out"), collect_outputs=True)
    ref, _ = _serve(ServerSpec.for_protocol(_private_lloyd(), 7, **{**kw, "result_dir": None}),
                    LocalGrid(_private_nodes(devices, tmp_path / "ref"),
                              [{"partition-id": i} for i in range(4)]))
    with pytest.raises(apps.ServerAppFailed):   # killed after the nodes answered round 2
        _serve(ServerSpec.for_protocol(_private_lloyd(), 7, **kw),
               CrashingGrid(_private_nodes(devices, tmp_path), nodes, at=3, after=True))
    out, _ = _serve(ServerSpec.for_protocol(_private_lloyd(), 7, resume=True, **kw),
                    LocalGrid(_private_nodes(devices, tmp_path), nodes[::-1], run_id=99))
    np.testing.assert_array_equal(out.result.centers, ref.result.centers)
    assert out.meter.summary() == ref.meter.summary()
    for z in range(4):
        np.testing.assert_array_equal(out.device_outputs[z]["labels"],
                                      ref.device_outputs[z]["labels"])
        entries = json.loads((tmp_path / f"ledger-{z}.json").read_text())["entries"]
        # with its state on disk the node knows it charged this fit; without, the resumed
        # Flower run is a fit it charges again (never fewer charges than releases)
        assert len(entries) == (1 if state else 2)
    # the server's write-ahead ledger counts the round redone as a lost release either way
    # (it cannot tell that the nodes sent the very same release)
    assert [e["round"] for e in out.log.privacy_ledger["lost_releases"]] == [2]


def test_a_restarted_private_node_with_a_state_dir_is_not_charged_again(tmp_path):
    """The same Flower run: the node's SuperNode restarts (empty context) and rejoins."""
    devices = _devices()
    nodes = [{"partition-id": i, "state-dir": str(tmp_path / f"node-{i}")} for i in range(4)]
    seen = {}

    def on_push(grid, messages):
        group = messages[0].metadata.group_id if messages else ""
        if group == "3" and "node" not in seen:
            seen["node"] = grid.node_ids[2]
            grid.stop(seen["node"])
        elif group == "4" and "back" not in seen:
            seen["back"] = grid.restart(seen["node"], same_id=True)
    spec = ServerSpec.for_protocol(_private_lloyd(), 7, min_nodes=4, node_wait_s=0.0,
                                   round_timeout_s=None, collect_outputs=True)
    out, extra = _serve(spec, LocalGrid(_private_nodes(devices, tmp_path), nodes,
                                        on_push=on_push))
    assert [(e["device"], e["round"]) for e in extra["rejoined"]] == [(2, 5)]
    entries = json.loads((tmp_path / "ledger-2.json").read_text())["entries"]
    assert len(entries) == 1


def test_rejoins_before_a_crash_are_reported_by_the_resumed_run(tmp_path):
    from fedclust.lloyd.protocol import DistributedLloydProtocol

    rng = np.random.default_rng(11)
    centers = rng.normal(scale=6.0, size=(3, 3))
    devices = [centers[rng.integers(0, 3, 40)] + rng.normal(size=(40, 3)) for _ in range(4)]
    proto = lambda: DistributedLloydProtocol(3, max_rounds=6, tol=1e-12, init="sample")  # noqa
    client = make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                          devices[int(ctx.node_config["partition-id"])]),
                             policy=lambda ctx: DevicePolicy(allow_collect=True))
    nodes = [{"partition-id": i} for i in range(4)]
    seen = {}

    def on_push(grid, messages):
        group = messages[0].metadata.group_id if messages else ""
        if group == "2" and "node" not in seen:
            seen["node"] = grid.node_ids[1]
            grid.stop(seen["node"])
        elif group == "3" and "back" not in seen:
            seen["back"] = grid.restart(seen["node"])
    kw = dict(min_nodes=4, node_wait_s=0.0, round_timeout_s=None, result_dir=str(tmp_path))
    _, full = _serve(ServerSpec.for_protocol(proto(), 3, **{**kw, "result_dir": None}),
                     LocalGrid(client, nodes, on_push=on_push))
    seen.clear()
    # exchanges: hello, rounds 0-3, the returned node's hello, round 4, then round 5: killed
    # before round 5 goes out, after the checkpoint of round 4 (the rejoin in it)
    with pytest.raises(apps.ServerAppFailed):
        _serve(ServerSpec.for_protocol(proto(), 3, **kw),
               CrashingGrid(client, nodes, at=7, on_push=on_push))
    _, extra = _serve(ServerSpec.for_protocol(proto(), 3, resume=True, **kw),
                      LocalGrid(client, nodes, run_id=99))
    assert [(e["device"], e["round"]) for e in full["rejoined"]] == [(1, 4)]
    assert [(e["device"], e["round"], e["missed"]) for e in extra["rejoined"]] == \
        [(e["device"], e["round"], e["missed"]) for e in full["rejoined"]]
    saved = json.loads((tmp_path / "result.json").read_text())
    assert [(e["device"], e["round"]) for e in saved["extra"]["rejoined"]] == [(1, 4)]


def test_a_checkpoint_without_rejoins_resumes_with_none(tmp_path):
    from fedclust.flower.recovery import ServerRecovery
    from fedclust.lloyd.protocol import DistributedLloydProtocol
    from fedclust.core.protocol import RunLog
    from fedclust.sim.meter import CommunicationMeter

    proto = DistributedLloydProtocol(3, max_rounds=2)
    rec = ServerRecovery(proto, 1, str(tmp_path), False, False)
    rec.begin([0, 1], [0, 1], RunLog(), CommunicationMeter())
    rec.after_round(proto.start([0, 1], 1), RunLog(), CommunicationMeter(), [0, 1])
    again = ServerRecovery(proto, 1, str(tmp_path), True, False)
    again.begin([0, 1], [0, 1], RunLog(), CommunicationMeter())
    assert again.rejoined == [] and again.resumed_rounds == 0


@pytest.mark.parametrize("at,after", [(2, True), (5, False), (5, True), (7, True)])
def test_a_private_secure_run_resumes_exactly_inside_its_secure_rounds(tmp_path, at, after):
    """Distributed noise under secure aggregation: four exchanges a round (killed at one of
    them); the node's stored reply is masked afresh under the redone round's new keys."""
    from test_checkpoint_resume import _devices as devices
    from test_checkpoint_resume import _private

    make, kw = _private(noise_devices=True, rounds=2), dict(secure_aggregation=True)
    ref = _fit(make, devices, FlowerInMemoryTransport(**kw))
    got, _ = _crash_and_resume(make, devices, tmp_path, at, after, **kw)
    _same(got.cluster_centers_, ref.cluster_centers_)
    assert got.communication_["rounds"] == ref.communication_["rounds"]


def test_the_data_digest_is_the_data_files_and_changes_with_it(tmp_path):
    import hashlib

    from fedclust.flower.node_state import data_digest

    path = tmp_path / "dev0.npz"
    np.savez(path, X=np.arange(6.0).reshape(3, 2))
    first = data_digest(None, {"data-path": str(path)}, "device 0")
    assert first == hashlib.sha256(path.read_bytes()).hexdigest()
    np.savez(path, X=np.arange(6.0).reshape(3, 2) + 1)
    assert data_digest(None, {"data-path": str(path)}, "device 0") != first
    X = np.arange(6.0).reshape(3, 2)
    assert data_digest(X, {}, "device 0") == data_digest(X.copy(), {}, "device 0")
    assert data_digest(X, {}, "device 0") != data_digest(X.T.copy(), {}, "device 0")
    with pytest.raises(ValidationError, match="device 0: node config state-dir needs data"):
        data_digest(np.array([object()]), {}, "device 0")


@pytest.mark.parametrize("after", [False, True])
def test_private_gaussians_resume_exactly_and_each_node_charges_its_fit_once(tmp_path, after):
    from fedclust import FedGaussClustering
    from fedclust.privacy import DifferentialPrivacy
    from test_checkpoint_resume import _devices as devices

    def make():
        dp = DifferentialPrivacy(3.0, 1e-6, data_bound=20.0, noise_seed=4)
        return FedGaussClustering(privacy=dp, random_state=0)

    def policy(folder):
        return DevicePolicy(allow_noise_seed=True, allow_collect=True, epsilon=50.0,
                            delta=1e-5, ledger=str(folder / "ledger-{device}.json"))
    ref = _fit(make, devices, FlowerInMemoryTransport(policies=policy(tmp_path / "ref")))
    n_rounds = ref.communication_["rounds"]
    assert n_rounds >= 3
    got, _ = _crash_and_resume(make, devices, tmp_path, n_rounds - 1, after,
                               policies=policy(tmp_path))
    public = lambda m: {k: v for k, v in _fitted(m).items()  # noqa: E731
                        if k not in ("run_log_", "privacy_")}
    _same(public(got), public(ref))
    for z in range(6):
        entries = json.loads((tmp_path / f"ledger-{z}.json").read_text())["entries"]
        assert len(entries) == 1
    # the server's write-ahead ledger: the round it sent out before dying, as a lost release
    assert len(got.run_log_.privacy_ledger["lost_releases"]) == 1
