"""A deployed app on site files under ``[data] site_ids = "name"``: each SuperNode's site is
known by its name (its id the hash of the name, derived on the node), the protocol's slots
are keyed by those ids, and ``fedclust forget --site NAME`` on the deployed run's model
equals a fresh deployed run (and a fresh ``fedclust run``) without that site."""

from __future__ import annotations

import importlib.util
import shutil
import tomllib

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust import KFed, load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402
from fedclust.config import load_config  # noqa: E402
from fedclust.core.random import named_device_id  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402
from fedclust.flower.results import load_run_output  # noqa: E402

from sitegen import write_sites  # noqa: E402

CONFIG = """
seed = 0
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
site_ids = "name"
[algorithm]
name = "kfed"
n_clusters = {k}
n_local_clusters = 3
[preprocess]
impute = "none"
scale = "none"
"""


def _deploy(folder, nodes_config=lambda p: {}, k=2):
    """Write the app for the site files in ``folder`` and run it on an in-process grid,
    one node per file (listed in reverse); returns the result folder."""
    cfg = folder / "fed.toml"
    cfg.write_text(CONFIG.format(k=k))
    app_dir, res_dir = folder / "app", folder / "res"
    assert main(["flower", "app", str(app_dir), "--config", str(cfg),
                 "--result-dir", str(res_dir), "--no-wheel"]) == 0
    from flwr.common.config import flatten_dict

    run_config = flatten_dict(tomllib.loads((app_dir / "pyproject.toml").read_text())
                              ["tool"]["flwr"]["app"]["config"])
    spec = importlib.util.spec_from_file_location(f"fedclust_site_app_{folder.name}",
                                                  app_dir / "fedclust_app" / "apps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = sorted(folder.glob("site*.csv"))
    nodes = [{"data-path": str(p), **nodes_config(p)} for p in paths][::-1]
    run_server_app(module.server_app, LocalGrid(module.client_app, nodes,
                                                run_config=run_config), run_config)
    return res_dir


def _copy(paths, folder, keep):
    folder.mkdir()
    for i in keep:
        shutil.copy2(paths[i], folder / paths[i].name)
    return folder


def test_deployed_sites_by_name_and_forget_a_site(tmp_path, capsys):
    paths, _ = write_sites(tmp_path, n_sites=4, seed=3, missing=0.0)
    ids = {p.stem: named_device_id(p.stem) for p in paths}
    # the nodes' device-id (by position here, a different order) is not what numbers them
    res = _deploy(tmp_path, lambda p: {"device-id": 3 - int(p.stem[-1])})
    out, extra = load_run_output(res)
    assert extra["device_ids"] == sorted(ids.values())
    assert dict(zip(extra["sites"], extra["device_ids"])) == ids
    assert sorted(out.log.participants) == sorted(ids.values())
    # the deployed model is the in-process `fedclust run` under the same named ids
    ref = run_experiment(load_config(tmp_path / "fed.toml"), source="fed.toml")
    assert ref.federation.device_ids == [ids[p.stem] for p in paths]
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)

    model = res / "model.npz"
    new = tmp_path / "forgot1.npz"
    capsys.readouterr()
    assert main(["forget", str(model), "--site", "site1", "--out", str(new)]) == 0
    assert "no device computed again" in capsys.readouterr().out
    forgot = load_model(new)
    # a deployed model lists its sites in id order (the server never sees the file list)
    assert forgot.sites == sorted(["site0", "site2", "site3"], key=ids.get)
    # a fresh deployed run on the three remaining sites: the same model, bit for bit
    fresh_res = _deploy(_copy(paths, tmp_path / "without1", (0, 2, 3)))
    fresh = load_model(fresh_res / "model.npz")
    assert fresh.sites == forgot.sites
    np.testing.assert_array_equal(forgot.exported.arrays["centers"],
                                  fresh.exported.arrays["centers"])
    for i in (0, 2, 3):
        np.testing.assert_array_equal(forgot.predict_file(paths[i])[0],
                                      fresh.predict_file(paths[i])[0])
    # ... and k-FED fitted here on those sites' rows under their named ids
    devs = ref.federation.devices
    fit = KFed(2, 3, random_state=ref.model.seed_).fit(
        [devs[i] for i in (0, 2, 3)], device_ids=[ids[f"site{i}"] for i in (0, 2, 3)])
    np.testing.assert_array_equal(forgot.exported.arrays["centers"], fit.cluster_centers_)
    # the model with site 1 forgotten differs from the four-site one (site 1 mattered)
    assert not np.array_equal(forgot.exported.arrays["centers"], out.result.centers)


def test_a_node_without_device_id_is_known_by_its_site_name(tmp_path):
    paths, _ = write_sites(tmp_path, n_sites=3, seed=1, missing=0.0)
    out, extra = load_run_output(_deploy(tmp_path))     # data-path only, no device-id
    assert extra["sites"] == [p.stem for p in sorted(paths, key=lambda p: named_device_id(
        p.stem))]
    assert extra["nodes"].keys() == {str(named_device_id(p.stem)) for p in paths}


def test_kfed_warning_names_the_sites_not_their_hashed_ids(tmp_path):
    """One cluster for two groups: k-FED's explanation warning fires; in a site run it
    lists the sites by name, in process and on the deployed app."""
    paths, _ = write_sites(tmp_path, n_sites=3, seed=1, missing=0.0)
    res = _deploy(tmp_path, k=1)
    out, _ = load_run_output(res)
    ref = run_experiment(load_config(tmp_path / "fed.toml"), source="fed.toml")
    for log in (out.log, ref.model.run_log_):
        [warning] = [w for w in log.warnings if w.startswith("k-FED")]
        assert "sites 'site0', 'site1', 'site2'" in warning or \
            all(f"'{p.stem}'" in warning for p in paths)
        assert not any(str(named_device_id(p.stem)) in warning for p in paths)
