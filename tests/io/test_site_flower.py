"""Site files on Flower's simulation engine: the nodes preprocess; labels equal the in-process run."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust.cli import main  # noqa: E402

from sitegen import write_sites  # noqa: E402

CFG = """
seed = 2
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
test_fraction = 0.25

[algorithm]
name = "{algo}"
{extra}
"""


def _labels(folder, names):
    out = {}
    for n in names:
        with open(folder / "labels" / f"{n}.csv", newline="") as fh:
            out[n] = list(csv.reader(fh))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algo, extra", [("gauss-classifier", "")])
def test_flower_simulation_gives_the_in_process_labels(tmp_path, algo, extra, capsys):
    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CFG.format(algo=algo, extra=extra))
    names = [p.stem for p in paths]
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-plot",
                 "--transport", "flower", "--progress"]) == 0
    # --progress: a bar over the rounds, read from the ServerApp as it runs
    assert f"{'preprocess'} rounds (flower)" in capsys.readouterr().err
    a = json.loads((tmp_path / "a" / "result.json").read_text())
    b = json.loads((tmp_path / "b" / "result.json").read_text())
    assert b["transport"] == "flower"
    assert _labels(tmp_path / "a", names) == _labels(tmp_path / "b", names)
    assert a["metrics"] == b["metrics"]
    # the preprocessing round ran on the nodes too, with the same bytes
    assert a["preprocess"]["communication"]["bytes_up"] == \
        b["preprocess"]["communication"]["bytes_up"]


DEPLOYED = """
seed = 4
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]

[algorithm]
name = "{algo}"
{extra}
"""


@pytest.mark.slow
@pytest.mark.parametrize("algo, extra", [("kfed", "n_clusters = 2\nn_local_clusters = 2"),
                                         ("gauss-classifier", "")])
def test_deployed_protocol_on_flower_simulation(tmp_path, algo, extra):
    """The deployed app's protocol (schema round, preprocessing round, the algorithm) on
    Flower's simulation engine and on the in-process simulator, over the same raw site
    tables: identical labels; the ServerApp's model.npz predicts the `fedclust run` labels."""
    import numpy as np

    from fedclust import load_model
    from fedclust.config import load_config
    from fedclust.flower_app import experiment_protocol
    from fedclust.flower.transport import FlowerSimulationTransport
    from fedclust.sim.transport import InProcessTransport
    from fedclust.sites import read_table

    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(DEPLOYED.format(algo=algo, extra=extra))
    protocol, _, seed = experiment_protocol(load_config(cfg_path))
    tables = {z: read_table(p) for z, p in enumerate(paths)}
    local = InProcessTransport().run(protocol, tables, seed)
    flower = FlowerSimulationTransport(keep_dir=str(tmp_path / "flwr")).run(protocol, tables,
                                                                             seed)
    assert set(local.device_outputs) == set(flower.device_outputs) == {0, 1, 2}
    for z in tables:
        for key, value in local.device_outputs[z].items():
            np.testing.assert_array_equal(flower.device_outputs[z][key], value)
    assert local.meter.summary()["bytes_up"] == flower.meter.summary()["bytes_up"]
    # model.npz of the deployed run = the in-process `fedclust run` model on every site file
    assert main(["run", str(cfg_path), "--out", str(tmp_path / "ref"), "--no-plot"]) == 0
    ref = load_model(tmp_path / "ref" / "model.npz")
    deployed = load_model(tmp_path / "flwr" / "result" / "model.npz")
    assert deployed.columns == ref.columns and deployed.sites == ref.sites
    for p in paths:
        got, _ = deployed.predict_file(p)
        want, _ = ref.predict_file(p)
        assert [str(v) for v in got] == [str(v) for v in want]
