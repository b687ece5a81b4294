"""A deployed app on site files: the preprocessing round runs on the nodes, not at app writing."""

from __future__ import annotations

import importlib.util
import tomllib

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust import load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402
from fedclust.core.exceptions import ValidationError  # noqa: E402
from fedclust.config import load_config  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402
from fedclust.flower.results import load_run_output  # noqa: E402

from sitegen import write_sites  # noqa: E402

CFG = """
seed = 3
[data]
source = "files"
paths = ["site*.csv"]
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]

[algorithm]
name = "{algo}"
{extra}
"""


@pytest.mark.parametrize("algo, extra", [("kfed", "n_clusters = 2\nn_local_clusters = 2"),
                                         ("distributed-lloyd", "n_clusters = 2")])
def test_deployed_app_preprocesses_on_the_nodes(tmp_path, algo, extra, capsys):
    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(CFG.format(algo=algo, extra=extra))
    app_dir, res_dir = tmp_path / "app", tmp_path / "res"
    assert main(["flower", "app", str(app_dir), "--config", str(cfg_path),
                 "--result-dir", str(res_dir), "--no-wheel"]) == 0
    project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    from flwr.common.config import flatten_dict

    run_config = flatten_dict(project["tool"]["flwr"]["app"]["config"])
    assert run_config["algorithm"] == "site-preprocess"
    # the app holds what the config declares: no statistic, no category or label of a site
    assert not any(k.endswith((".mean", ".scale", ".var")) for k in run_config)
    text = (app_dir / "pyproject.toml").read_text()
    for value in ("former", "yes", "healthy", "sick", "smoker="):
        assert value not in text

    ref = run_experiment(load_config(cfg_path), source=str(cfg_path))
    spec = importlib.util.spec_from_file_location("fedclust_site_app",
                                                  app_dir / "fedclust_app" / "apps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # each node holds only its own CSV file (raw rows, NaN, strings)
    nodes = [{"data-path": str(p), "device-id": z} for z, p in enumerate(paths)][::-1]
    run_server_app(module.server_app, LocalGrid(module.client_app, nodes, run_config=run_config),
                   run_config)
    out, extra = load_run_output(res_dir)
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
    # the schema the sites sent: the in-process one (one-hot over the union of categories)
    assert extra["schema"]["categories"] == {"smoker": ["former", "no", "yes"]}
    assert extra["sites"] == [p.stem for p in paths]
    # the deployed result carries the preprocessing fitted on the nodes: the in-process one
    pre = extra["preprocess"]
    assert pre["columns"] == list(ref.preprocessor.feature_names_in_)
    np.testing.assert_allclose(pre["mean"], ref.preprocessor.mean_, rtol=1e-12)
    np.testing.assert_allclose(pre["scale_"], ref.preprocessor.scale_, rtol=1e-12)
    n_rows = sum(len(X) for X in ref.federation.devices)
    assert pre["n_rows"] == ref.preprocessor.n_rows_ == n_rows
    # counted: schema up (JSON + 8), schema ack 8, moments 24 d + 8, transform ack 8 per site,
    # before the algorithm's own rounds
    d = len(pre["columns"])
    assert out.meter.rounds == ref.model.communication_["rounds"] + 4
    extra_up = out.meter.summary()["bytes_up"] - ref.model.communication_["bytes_up"]
    schema_up = extra_up - 3 * (8 + 8 + 24 * d + 8 + 8)
    assert 3 * 60 < schema_up < 3 * 400  # names and three categories, no row
    assert ref.preprocessor.communication_["bytes_up"] == 3 * (24 * d + 8)
    # the deployed run wrote model.npz: `fedclust predict` on a site file = the in-process model
    capsys.readouterr()
    assert main(["flower", "result", str(res_dir)]) == 0
    assert f"model: {res_dir / 'model.npz'}" in capsys.readouterr().out
    ref_model = load_model(ref_out(tmp_path, cfg_path))
    for p in paths:
        assert main(["predict", str(res_dir / "model.npz"), str(p), "--out",
                     str(tmp_path / f"{p.stem}.labels.csv")]) == 0
        got = np.loadtxt(tmp_path / f"{p.stem}.labels.csv", delimiter=",", skiprows=1,
                         usecols=-1, dtype=str)
        want, _ = ref_model.predict_file(p)
        assert [str(v) for v in want] == got.tolist()


def ref_out(tmp_path, cfg_path):
    out = tmp_path / "ref"
    assert main(["run", str(cfg_path), "--out", str(out), "--no-plot"]) == 0
    return out / "model.npz"


def test_same_protocol_object_in_process(tmp_path):
    """The deployed protocol, run by the in-process simulator over the raw site tables, gives
    the labels of `fedclust run`; a column missing at one site is one line naming it."""
    from fedclust.flower_app import experiment_protocol
    from fedclust.sim.transport import InProcessTransport
    from fedclust.sites import read_table

    paths, _ = write_sites(tmp_path, n_sites=4)
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(CFG.format(algo="kfed", extra="n_clusters = 2\nn_local_clusters = 2"))
    cfg = load_config(cfg_path)
    protocol, devices, seed = experiment_protocol(cfg)
    assert sorted(devices) == [0, 1, 2, 3]
    # `fedclust flower split`: each node gets its own site file under its own name
    from fedclust.flower_app import split_devices

    split = split_devices(cfg, tmp_path / "data")
    assert [(z, p.name) for z, p in split] == [(z, p.name) for z, p in enumerate(paths)]
    assert (tmp_path / "data" / paths[1].name).read_bytes() == paths[1].read_bytes()
    tables = {z: read_table(p) for z, p in split}
    out = InProcessTransport().run(protocol, tables, seed)
    ref = run_experiment(cfg, source=str(cfg_path))
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
    for z in tables:
        np.testing.assert_array_equal(out.device_outputs[z]["labels"], ref.model.device_labels_[z])
    # a site without column 'bp'
    import pandas as pd

    df = pd.read_csv(paths[2]).drop(columns=["bp"])
    df.to_csv(paths[2], index=False)
    tables[2] = read_table(paths[2])  # (the original file, now without 'bp')
    with pytest.raises(ValidationError) as err:
        InProcessTransport().run(protocol, tables, seed)
    msg = str(err.value)
    assert "\n" not in msg and "'site2' (device 2)" in msg and "column 'bp' is missing" in msg
