"""The real Flower ServerApp / ClientApp, driven in-process (every message through protobuf).

Whatever runs here must give exactly what InProcessTransport gives for the same seed.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from conftest import make_structured_federation  # noqa: E402

from fedclust import KFed  # noqa: E402
from fedclust.baselines import DistributedLloyd  # noqa: E402
from fedclust.cli import main  # noqa: E402
from fedclust.config import check_config  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.flower.apps import ServerSpec  # noqa: E402
from fedclust.flower.grid import FlowerInMemoryTransport, LocalGrid, run_server_app  # noqa: E402
from fedclust.flower.results import load_run_output, save_run_output  # noqa: E402
from fedclust.kfed.protocol import KFedProtocol  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402


@pytest.fixture(scope="module")
def fed():
    devices, labels, _ = make_structured_federation(k=8, k_local=2, m0=3, d=6, n_per=15, seed=1)
    return devices  # 12 devices


def _same_fit(a, b):
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.cluster_centers_.dtype == b.cluster_centers_.dtype
    assert a.run_log_ == b.run_log_
    assert a.communication_ == b.communication_
    for x, y in zip(a.device_labels_, b.device_labels_):
        assert (x is None and y is None) or np.array_equal(x, y)


@pytest.mark.parametrize("faults", [{}, {"dropout": 0.2, "late": 0.2},
                                    {"dropped": [0], "late_devices": [5, 7]}])
def test_kfed_identical_to_inprocess(fed, faults):
    a = KFed(8, 2, random_state=5).fit(fed, transport=InProcessTransport(**faults))
    b = KFed(8, 2, random_state=5).fit(fed, transport=FlowerInMemoryTransport(**faults))
    _same_fit(a, b)
    if faults.get("late", 0) or faults.get("late_devices"):
        assert b.run_log_.late and all(b.device_labels_[z] is not None for z in b.run_log_.late)


def test_kfed_float32_and_per_device_k(fed):
    devs = [X.astype(np.float32) for X in fed]
    k_local = [2, 3] * 6
    a = KFed(8, k_local, random_state=1).fit(devs, device_ids=list(range(40, 52)))
    b = KFed(8, k_local, random_state=1).fit(devs, device_ids=list(range(40, 52)),
                                             transport=FlowerInMemoryTransport())
    _same_fit(a, b)
    assert b.cluster_centers_.dtype == np.float32


@pytest.mark.parametrize("faults", [{}, {"dropped": [0], "late_devices": [5, 7]}])
def test_refined_kfed_identical_to_inprocess(fed, faults):
    """k-FED's round then Lloyd rounds: one protocol object on both transports."""
    a = KFed(8, 2, random_state=3, refine_rounds=3, tol=0.0).fit(
        fed, transport=InProcessTransport(**faults))
    b = KFed(8, 2, random_state=3, refine_rounds=3, tol=0.0).fit(
        fed, transport=FlowerInMemoryTransport(**faults))
    _same_fit(a, b)
    assert b.refine_cost_history_ == a.refine_cost_history_
    assert b.communication_["rounds"] == 1 + b.communication_["refine"]["rounds"] > 1


def test_multi_round_lloyd_identical(fed):
    a = DistributedLloyd(8, random_state=2).fit(fed)
    b = DistributedLloyd(8, random_state=2).fit(fed, transport=FlowerInMemoryTransport())
    assert a.n_rounds_ == b.n_rounds_ > 2
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.communication_ == b.communication_ and a.cost_history_ == b.cost_history_
    assert all(np.array_equal(x, y) for x, y in zip(a.device_labels_, b.device_labels_))


def test_failing_client_is_dropped_and_named(fed):
    devs = list(fed)
    devs[4] = devs[4][:2]  # n_z <= k_z: the device's local step raises (KFed.fit would refuse)
    proto = KFedProtocol(8, 2)
    ref = InProcessTransport(on_client_error="drop").run(proto, dict(enumerate(devs)), 0)
    out = FlowerInMemoryTransport().run(proto, dict(enumerate(devs)), 0)
    assert list(out.log.failed) == [4] == list(ref.log.failed)
    assert "device 4" in out.log.failed[4] and "ValidationError" in out.log.failed[4]
    assert np.array_equal(out.result.centers, ref.result.centers)
    assert 4 not in out.log.participants


def test_crashing_client_and_timeout_are_named(fed):
    def tamper(z, rnd, arrays):
        if z == 2:
            raise RuntimeError("disk on fire")
        return arrays

    proto = KFedProtocol(8, 2)
    tr = FlowerInMemoryTransport(tamper=tamper, unresponsive=[9])
    out = tr.run(proto, dict(enumerate(fed)), 3)
    assert sorted(out.log.failed) == [2, 9]
    assert "disk on fire" in out.log.failed[2] and "client error" in out.log.failed[2]
    assert "timed out" in out.log.failed[9]
    ref = InProcessTransport(dropped=[2, 9]).run(proto, dict(enumerate(fed)), 3)
    assert np.array_equal(out.result.centers, ref.result.centers)


@pytest.mark.parametrize("bad", ["shape", "dtype", "nan", "fields"])
def test_malformed_replies_rejected_before_server_maths(fed, bad):
    def tamper(z, rnd, arrays):
        if z not in (1, 6):
            return arrays
        arrays = dict(arrays)
        if bad == "shape":
            arrays["counts"] = arrays["counts"][:1]
        elif bad == "dtype":
            arrays["centers"] = arrays["centers"].astype(np.int64)
        elif bad == "nan":
            arrays["centers"] = np.full_like(arrays["centers"], np.nan)
        else:
            arrays["extra"] = np.zeros(1)
        return arrays

    proto = KFedProtocol(8, 2)
    ref = InProcessTransport(tamper=tamper).run(proto, dict(enumerate(fed)), 4)
    out = FlowerInMemoryTransport(tamper=tamper).run(proto, dict(enumerate(fed)), 4)
    assert sorted(out.log.rejected) == [1, 6]
    assert out.log.rejected == ref.log.rejected
    assert np.array_equal(out.result.centers, ref.result.centers)
    assert out.meter.summary() == ref.meter.summary()


def test_grid_really_serialises(fed):
    tr = FlowerInMemoryTransport()
    KFed(8, 2, random_state=0).fit(fed, transport=tr)
    # hello + round + finish, both ways; every local-centers reply is >= k_z (d + 1) 8 bytes
    assert tr.last_grid_.bytes_up > 12 * 2 * 7 * 8 and tr.last_grid_.bytes_down > 0


def test_server_spec_run_config_round_trip():
    proto = KFedProtocol(6, {0: 2, 1: 3, 2: 2}, first_device=1)
    spec = ServerSpec.for_protocol(proto, 9, dropout=0.1, dropped=[2], min_nodes=3,
                                   result_dir="/x", collect_outputs=True)
    rc = spec.to_run_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in rc.values())
    back = ServerSpec.from_run_config(rc)
    assert back == spec


def test_result_files_round_trip(tmp_path, fed):
    out = InProcessTransport(late=0.2).run(KFedProtocol(8, 2), dict(enumerate(fed)), 1)
    save_run_output(out, "kfed", tmp_path, extra={"x": 1})
    back, extra = load_run_output(tmp_path)
    assert extra == {"x": 1}
    assert np.array_equal(back.result.centers, out.result.centers)
    assert back.log == out.log and back.meter.summary() == out.meter.summary()
    for z in out.result.local_centers:
        assert np.array_equal(back.result.local_centers[z], out.result.local_centers[z])
        assert np.array_equal(back.result.center_labels[z], out.result.center_labels[z])
    assert back.device_outputs.keys() == out.device_outputs.keys()
    assert json.loads((tmp_path / "result.json").read_text())["cluster_centers"] == \
        out.result.centers.tolist()


CONFIG = """
seed = 3
[data]
source = "gaussians"
n_features = 8
n_clusters = 6
n_local_clusters = 2
m0 = 2
separation = 40.0
n_per_component = 30
[algorithm]
name = "kfed"
n_clusters = 6
n_local_clusters = 2
[simulation]
dropout = 0.0
late = 0.2
[baselines]
centralized = false
distributed_lloyd = false
"""


def test_generated_app_runs_and_matches_fedclust_run(tmp_path, capsys):
    """`fedclust flower app` + `split`: the generated module's apps, with node-config data paths."""
    import tomllib

    from flwr.common.config import flatten_dict, validate_config

    cfg_path = tmp_path / "run.toml"
    cfg_path.write_text(CONFIG)
    app_dir, data_dir, res_dir = tmp_path / "app", tmp_path / "data", tmp_path / "res"
    assert main(["flower", "app", str(app_dir), "--config", str(cfg_path),
                 "--result-dir", str(res_dir), "--no-wheel"]) == 0
    assert "--enable-supernode-auth" in (app_dir / "DEPLOY.md").read_text()
    assert "--insecure" not in (app_dir / "DEPLOY.md").read_text()
    assert main(["flower", "split", str(cfg_path), "--out", str(data_dir)]) == 0
    project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(project, check_module=False)
    assert ok, errors
    run_config = flatten_dict(project["tool"]["flwr"]["app"]["config"])

    spec = importlib.util.spec_from_file_location("fedclust_app_under_test",
                                                  app_dir / "fedclust_app" / "apps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = sorted(data_dir.glob("dev-*.npz"))
    assert len(files) == 6
    grid = LocalGrid(module.client_app, [{"data-path": str(f)} for f in files[::-1]],
                     run_config=run_config)
    run_server_app(module.server_app, grid, run_config)

    ref = run_experiment(check_config(tomllib.loads(CONFIG)))
    ref_json = tmp_path / "ref.json"
    ref_json.write_text(json.dumps(ref.result, default=lambda o: o.tolist()))
    capsys.readouterr()
    assert main(["flower", "result", str(res_dir), "--compare", str(ref_json)]) == 0
    assert "IDENTICAL" in capsys.readouterr().out
    out, _ = load_run_output(res_dir)
    assert out.log.late == ref.model.run_log_.late != []
    assert out.device_outputs == {}  # collect-outputs defaults to false in a deployment


def test_missing_data_path_names_the_node(tmp_path):
    from fedclust.flower.apps import make_client_app, make_server_app

    spec = ServerSpec.for_protocol(KFedProtocol(2, 2), 0, min_nodes=2, node_wait_s=0.0,
                                   round_timeout_s=None, result_dir=str(tmp_path))
    grid = LocalGrid(make_client_app(), [{}, {}])
    with pytest.raises(Exception, match="no device replied|none of the|nothing to run"):
        run_server_app(make_server_app(spec), grid)
    err = json.loads((tmp_path / "error.json").read_text())
    assert err["type"] == "ValidationError"



def test_node_that_never_answers_is_reported(fed):
    from fedclust.flower.apps import make_client_app, make_server_app

    data = dict(enumerate(fed[:4]))
    spec = ServerSpec.for_protocol(KFedProtocol(4, 2), 0, min_nodes=4, node_wait_s=0.0,
                                   round_timeout_s=None)
    box = {}
    app = make_server_app(spec, on_result=lambda out, extra: box.update(out=out, extra=extra))
    client = make_client_app(lambda ctx: (int(ctx.node_config["partition-id"]),
                                          data[int(ctx.node_config["partition-id"])]))
    grid = LocalGrid(client, [{"partition-id": i} for i in range(4)])
    grid.unresponsive = {grid.node_ids[3]}
    run_server_app(app, grid)
    assert list(box["extra"]["nodes_failed"]) == [str(grid.node_ids[3])]
    assert box["out"].log.participants == [0, 1, 2]


def test_two_nodes_claiming_one_device_are_both_left_out(fed):
    from fedclust.flower.apps import make_client_app, make_server_app

    data = dict(enumerate(fed[:5]))
    spec = ServerSpec.for_protocol(KFedProtocol(4, 2), 0, min_nodes=5, node_wait_s=0.0,
                                   round_timeout_s=None)
    box = {}
    app = make_server_app(spec, on_result=lambda out, extra: box.update(out=out, extra=extra))
    client = make_client_app(lambda ctx: (min(int(ctx.node_config["partition-id"]), 3),
                                          data[int(ctx.node_config["partition-id"])]))
    grid = LocalGrid(client, [{"partition-id": i} for i in range(5)])
    run_server_app(app, grid)
    assert sorted(box["extra"]["nodes_failed"]) == sorted(str(n) for n in grid.node_ids[3:])
    assert box["out"].log.participants == [0, 1, 2]


def test_timed_out_node_is_not_sent_the_final_message(fed):
    """A node that let a round time out is not waited for again at the end."""
    from fedclust.lloyd.protocol import DistributedLloydProtocol

    proto = DistributedLloydProtocol(4, points_per_device=5, max_rounds=2)
    out = FlowerInMemoryTransport(unresponsive=[3]).run(proto, dict(enumerate(fed[:6])), 2)
    assert "timed out" in out.log.failed[3] and 3 not in out.device_outputs
    assert out.meter.down[3] == 0          # asked for its sample only (no payload), nothing after
    final = 4 * fed[0].shape[1] * 8        # the centers every other device receives at the end
    assert out.meter.down[0] >= final and 0 in out.device_outputs
