"""A deployed app on site files: the preprocessing round runs on the nodes, not at app writing."""

from __future__ import annotations

import importlib.util
import tomllib

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust.cli import main  # noqa: E402
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
def test_deployed_app_preprocesses_on_the_nodes(tmp_path, algo, extra):
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
    # the app holds the schema, no pooled statistic
    assert not any(k.endswith((".mean", ".scale", ".var")) for k in run_config)

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
    # the deployed result carries the preprocessing fitted on the nodes: the in-process one
    pre = extra["preprocess"]
    assert pre["columns"] == list(ref.preprocessor.feature_names_in_)
    np.testing.assert_allclose(pre["mean"], ref.preprocessor.mean_, rtol=1e-12)
    np.testing.assert_allclose(pre["scale_"], ref.preprocessor.scale_, rtol=1e-12)
    n_rows = sum(len(X) for X in ref.federation.devices)
    assert pre["n_rows"] == ref.preprocessor.n_rows_ == n_rows
    # counted: moments 24 d + 8 up, transform 16 d down and 8 up, per site, before the
    # algorithm's own rounds
    d = len(pre["columns"])
    assert out.meter.rounds == ref.model.communication_["rounds"] + 2
    extra_up = out.meter.summary()["bytes_up"] - ref.model.communication_["bytes_up"]
    assert extra_up == 3 * (24 * d + 8 + 8)
    assert ref.preprocessor.communication_["bytes_up"] == 3 * (24 * d + 8)
