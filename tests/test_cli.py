"""The command line: demo, run, configs, one-line errors."""

import json
from pathlib import Path

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
    # 9 devices, k'=2; the default server: each device sends max(k', min(2k, n_z // 5))
    # centers with counts and scatter, (d + 2) 8 bytes each
    sizes = [len(X) for X in fed.devices]
    assert res["communication"]["bytes_up"] == sum(
        max(2, min(12, n // 5)) * (20 + 2) * 8 for n in sizes)
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


def _help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_demo_help_lists_every_registered_demo_with_its_description(capsys):
    from fedclust.core.registry import DEMO_DESCRIPTIONS, DEMOS

    out = _help(["demo", "--help"], capsys)
    assert len(DEMOS) >= 6 and "robust-classification" in DEMOS
    listed = out.split("demos:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == list(DEMOS)
    for name, line in zip(DEMOS, listed):
        assert DEMO_DESCRIPTIONS[name] and line.split(None, 1)[1] == DEMO_DESCRIPTIONS[name]


def test_run_help_documents_every_table_and_registered_name(capsys):
    from fedclust.config import algorithm_keys
    from fedclust.core.registry import ALGORITHMS, DATA_SOURCES

    out = _help(["run", "--help"], capsys)
    for table in ("[data]", "[partition]", "[algorithm]", "[simulation]", "[baselines]"):
        assert table in out
    for name in (*ALGORITHMS, *DATA_SOURCES, "byzantine", "attack_scale", "dirichlet"):
        assert f"{name}" in out
    # the keys come from the estimator's signature, required ones marked
    flat = " ".join(out.split())
    assert "n_clusters*" in flat and "trim" in flat
    # n_local_clusters defaults to "auto": listed, not required
    assert "n_local_clusters" in flat and "n_local_clusters*" not in flat
    assert "coreset_size" in flat and "coreset_size" in algorithm_keys("coreset")


def test_parameter_error_names_file_table_and_key(tmp_path, capsys):
    cfg = _write(tmp_path, extra="n_local_clusters = 2").read_text()
    path = tmp_path / "myfed.toml"
    path.write_text(cfg.replace('name = "kfed"\nn_clusters = 6', 'name = "kfed"\nn_clusters = "two"'))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"fedclust: error: {path}: [algorithm] n_clusters='two' must be an integer\n"


def test_data_error_names_the_data_table(tmp_path, capsys):
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("n_features = 20", "n_features = 0"))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedclust: error: {path}: [data] n_features=0") and err.count("\n") == 1


@pytest.mark.parametrize("line,needle", [
    ("byzantine = 0.5", "[simulation] byzantine=0.5 must be >= 0 and < 0.5"),
    ("dropout = 1.5", "[simulation] dropout=1.5 must be a fraction"),
    ("byzantine = 0.1\nattack = 'teleport'", "[simulation] attack='teleport' is not supported"),
    ("attack_scale = 3.0", "attack/attack_scale need byzantine"),
])
def test_simulation_errors_speak_the_config_words(tmp_path, capsys, line, needle):
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("late = 0.0", line))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {needle}" in err or needle in err
    assert str(path) in err and "alpha" not in err and err.count("\n") == 1


def test_fl_report_explains_transport_rounds(tmp_path, capsys):
    assert main(["demo", "fl", "--out", str(tmp_path), "--no-plot"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "result.json").read_text())
    k, rounds = res["config"]["algorithm"]["n_clusters"], res["config"]["algorithm"]["rounds"]
    assert res["communication"]["rounds"] == 1 + rounds * k
    line = (f"rounds: 1 k-FED round + {rounds} training rounds × {k} clusters = "
            f"{1 + rounds * k} transport rounds")
    assert line in out and res["rounds_note"] == line.removeprefix("rounds: ")


def test_robust_report_explains_transport_rounds(tmp_path, capsys):
    assert main(["demo", "robust", "--out", str(tmp_path), "--no-plot"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "result.json").read_text())
    rounds = res["config"]["algorithm"]["rounds"]
    assert res["communication"]["rounds"] == 1 + rounds
    assert (f"rounds: 1 local-ERM round + {rounds} stage-3 rounds = {1 + rounds} "
            "transport rounds") in out


def test_clustering_report_has_no_rounds_note(tmp_path, capsys):
    assert main(["run", str(_write(tmp_path)), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    assert "\nrounds:" not in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "result.json").read_text())["rounds_note"] is None


STAR = Path(__file__).resolve().parents[1] / "examples" / "coreset_star.toml"


@pytest.mark.parametrize("old,new,needle", [
    ("n_points = 3000", "n_points = -5", "[data] n_points=-5 must be >= 1"),
    ("n_points = 3000", "n_points = 3000\nn_samples = 0", "[data] n_samples=0 must be >= 1"),
    ("n_devices = 8", 'n_devices = "x"', "[partition] n_devices='x' must be an integer"),
    ("coreset_size = 500", "coreset_size = 2.5", "[algorithm] coreset_size=2.5 must be an integer"),
])
def test_value_errors_name_file_table_and_key_in_the_config_words(tmp_path, capsys, old, new,
                                                                  needle):
    path = tmp_path / "star.toml"
    path.write_text(STAR.read_text().replace(old, new, 1))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert capsys.readouterr().err == f"fedclust: error: {path}: {needle}\n"
