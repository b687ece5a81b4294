"""The command line: demo, run, configs, one-line errors."""

import json

import numpy as np
import pytest

from fedclust.cli import main
from fedclust.config import check_config
from fedclust import ConfigError
from fedclust.metrics import kmeans_cost

SMALL = """
seed = 3
[data]
source = "gaussians"
n_features = 20
n_clusters = 6
n_local_clusters = 2
m0 = 3
separation = 60.0
n_per_component = 30

[algorithm]
name = "{algo}"
n_clusters = 6
{extra}

[simulation]
late = {late}

[baselines]
centralized = true
"""


def _write(tmp_path, algo="kfed", extra="n_local_clusters = 2", late=0.0):
    path = tmp_path / "cfg.toml"
    path.write_text(SMALL.format(algo=algo, extra=extra, late=late))
    return path


def test_run_writes_result_with_centers_and_metrics(tmp_path, capsys):
    cfg = _write(tmp_path)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-plot"]) == 0
    res = json.loads((tmp_path / "out" / "result.json").read_text())
    centers = np.asarray(res["cluster_centers"])
    assert centers.shape == (6, 20)
    assert res["metrics"]["accuracy"] == 1.0
    # the reported cost is the cost of the reported centers on the federation
    from fedclust.experiment import build_federation
    fed = build_federation(check_config(res["config"]))
    assert res["metrics"]["kmeans_cost"] == pytest.approx(
        kmeans_cost(np.concatenate(fed.devices), centers), rel=1e-12)
    assert res["communication"]["bytes_up"] == 9 * 2 * (20 + 1) * 8  # 9 devices, k'=2
    out = capsys.readouterr().out
    assert "cost / centralized" in out and "kfed" in out


def test_same_seed_same_centers_and_seed_override_changes_them(tmp_path):
    cfg = _write(tmp_path)
    for name, extra in [("a", []), ("b", []), ("c", ["--seed", "4"])]:
        assert main(["run", str(cfg), "--out", str(tmp_path / name), "--no-plot", *extra]) == 0
    a, b, c = (json.loads((tmp_path / n / "result.json").read_text())["cluster_centers"]
               for n in "abc")
    assert a == b
    assert a != c


def test_late_devices_are_labelled_afterwards(tmp_path):
    cfg = _write(tmp_path, late=0.34)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    assert len(res["run_log"]["late"]) == 3
    assert res["metrics"]["labelled_fraction"] == 1.0
    assert res["metrics"]["accuracy"] == 1.0


def test_distributed_lloyd_config(tmp_path):
    cfg = _write(tmp_path, algo="distributed-lloyd", extra="max_rounds = 20")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    assert res["communication"]["rounds"] >= 2
    assert res["metrics"]["cost_ratio_vs_centralized"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("text,needle", [
    ("seed = 0\n[data]\nsource='gaussians'\n[algorithm]\nname='kfed'\nn_clusters=4\n"
     "n_local_clusters=2\nbogus=1\n", "unknown keys ['bogus']"),
    ("[data]\nsource='nope'\n[algorithm]\nn_clusters=2\nn_local_clusters=1\n", "source='nope'"),
    ("[data]\nsource='gaussians'\n[algorithm]\nname='kfed'\n", "needs n_clusters"),
    ("[data]\nsource='mnist'\n[algorithm]\nname='kfed'\nn_clusters=2\nn_local_clusters=1\n",
     "needs a [partition] table"),
    ("seed = -1\n[data]\nsource='gaussians'\n", "seed=-1"),
    ("this is not toml", "not valid TOML"),
])
def test_bad_configs_one_line_error(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.startswith("fedclust: error:") and err.count("\n") == 1  # no traceback


def test_bad_parameter_value_is_a_one_line_error(tmp_path, capsys):
    cfg = _write(tmp_path, extra="n_local_clusters = 0")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "n_local_clusters=0 must be >= 1" in err and "Traceback" not in err


def test_missing_config_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.toml"), "--out", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_check_config_rejects_partition_for_gaussians():
    with pytest.raises(ConfigError, match="federated by construction"):
        check_config({"data": {"source": "gaussians"}, "partition": {"kind": "iid"},
                      "algorithm": {"name": "kfed", "n_clusters": 2, "n_local_clusters": 1}})


def test_demo_runs_and_recovers_the_mixture(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--no-plot"]) == 0
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["metrics"]["accuracy"] == 1.0
    assert res["communication"]["rounds"] == 1
    # one shot costs far fewer bytes than distributed Lloyd on the same federation
    dl = res["baselines"]["distributed_lloyd"]
    assert res["communication"]["bytes_up"] < dl["bytes_up"] / 5


def test_run_writes_png_figure(tmp_path):
    cfg = _write(tmp_path)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 0  # dev extra has matplotlib
    png = (tmp_path / "o" / "result.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
