"""The schema round of a deployed run on site files: what sites send, the server's union and
checks, the algorithm's protocol built for the schema, faults on the preprocessing rounds."""

from __future__ import annotations

import importlib.util
import json
import tomllib

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust.cli import main  # noqa: E402
from fedclust.config import load_config  # noqa: E402
from fedclust.core.exceptions import ValidationError  # noqa: E402
from fedclust.configured import label_kind  # noqa: E402
from fedclust.experiment import build_protocol  # noqa: E402
from fedclust.sites.algorithm import protocol_for_schema  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.sites import RawTable, load_sites  # noqa: E402
from fedclust.sites.schema_round import SchemaRequest, pool_schema, site_columns  # noqa: E402

from sitegen import write_sites  # noqa: E402
from test_every_algorithm_on_sites import ALGOS  # noqa: E402



@pytest.fixture(autouse=True)
def _result_root(tmp_path, monkeypatch):
    """The server host's FEDCLUST_RESULT_ROOT: a deployed ServerApp writes under tmp_path."""
    monkeypatch.setenv("FEDCLUST_RESULT_ROOT", str(tmp_path))

def _table(name, **cols):
    cols = {k: np.asarray(v, dtype=object if isinstance(v[0], str) or v[0] is None else None)
            for k, v in cols.items()}
    return RawTable(name, f"{name}.csv", cols, list(cols))


def test_union_is_sorted_and_the_same_as_reading_every_file():
    a = _table("a", age=[1.0, 2.0], sex=["m", None], y=["sick", "ok"])
    b = _table("b", age=[3.0, np.nan], sex=["f", "x"], y=["ok", "ok"])
    req = SchemaRequest(None, ("sex",), "y", (), "class")
    replies = {1: site_columns(b, req), 0: site_columns(a, req)}
    schema, names = pool_schema(replies, req)
    assert names == {0: "a", 1: "b"}
    assert schema.categories == {"sex": ("f", "m", "x")}
    assert schema.classes == ("ok", "sick")
    assert schema.columns == ["age", "sex=f", "sex=m", "sex=x"]
    # what a site sends: names and sets, no row (a's 'age' values are not in it)
    text = bytes(replies[0].text).decode()
    assert "1.0" not in text and json.loads(text)["categories"] == {"sex": ["m"]}
    # without the classifier's need, no label leaves the site
    quiet = site_columns(a, SchemaRequest(None, ("sex",), "y", (), "none"))
    assert json.loads(bytes(quiet.text).decode())["labels"] is None
    # a column missing at one site: one line naming the site, the column and who has it
    c = _table("c", age=[1.0], y=["ok"])
    with pytest.raises(ValidationError) as err:
        pool_schema({0: site_columns(a, req), 2: site_columns(c, req)}, req)
    assert str(err.value) == ("site 'c' (device 2): column 'sex' is missing (present at a)")
    # the classifier's label missing at a site
    d = _table("d", age=[1.0], sex=["m"])
    with pytest.raises(ValidationError, match="site 'd' \\(device 1\\): column 'y' is missing"):
        pool_schema({0: site_columns(a, req), 1: site_columns(d, req)}, req)


def test_every_registered_algorithm_is_checked_below():
    """A new algorithm must show that its protocol follows from the schema (add it to ALGOS)."""
    from fedclust.core.registry import ALGORITHMS

    assert set(ALGORITHMS) <= set(ALGOS)


@pytest.mark.parametrize("algo", list(ALGOS))
def test_protocol_for_schema_is_what_the_estimator_builds(tmp_path, algo):
    """A protocol depends on the data's shape and classes, not on its values: the one built
    from the schema alone equals the one the estimator builds on the real rows."""
    write_sites(tmp_path, n_sites=3, missing=0.0)
    label = "chol" if algo == "robust-regression" else "diagnosis"
    (tmp_path / "fed.toml").write_text(f"""
seed = 5
[data]
source = "files"
paths = ["site*.csv"]
label = "{label}"
features = ["age", "bp", "smoker"]
categorical = ["smoker"]
id_columns = ["pid"]
[algorithm]
name = "{algo}"
{ALGOS[algo]}
""")
    cfg = load_config(tmp_path / "fed.toml")
    real, _, _ = build_protocol(cfg)
    fed = load_sites(sorted(tmp_path.glob("site*.csv")), label, ["age", "bp", "smoker"],
                     ["smoker"], ["pid"])
    kind = label_kind(cfg)
    exp = {"algorithm": dict(cfg["algorithm"]), "seed": cfg["seed"]}
    built = protocol_for_schema(exp, len(fed.columns), [len(X) for X in fed.devices],
                                None if kind == "value" else fed.classes, kind)
    assert built.name == real.inner_name
    assert json.loads(json.dumps(built.config())) == json.loads(real.inner_config)


CFG = """
seed = 1
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[simulation]
dropout = 0.25
late = 0.25
[algorithm]
name = "kfed"
n_clusters = 2
n_local_clusters = 2
"""


def _deploy(tmp_path, cfg_path, paths):
    from flwr.common.config import flatten_dict

    from fedclust.flower.grid import LocalGrid, run_server_app
    from fedclust.flower.results import load_run_output

    app_dir, res_dir = tmp_path / "app", tmp_path / "res"
    assert main(["flower", "app", str(app_dir), "--config", str(cfg_path),
                 "--result-dir", str(res_dir), "--no-wheel"]) == 0
    project = tomllib.loads((app_dir / "pyproject.toml").read_text())
    run_config = flatten_dict(project["tool"]["flwr"]["app"]["config"])
    run_config["collect-outputs"] = True
    spec = importlib.util.spec_from_file_location("fedclust_site_app2",
                                                  app_dir / "fedclust_app" / "apps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    nodes = [{"data-path": str(p), "device-id": z, "policy-allow-collect": True}
             for z, p in enumerate(paths)]
    run_server_app(module.server_app, LocalGrid(module.client_app, nodes, run_config=run_config),
                   run_config)
    return load_run_output(res_dir)


def test_dropped_and_late_sites_on_the_preprocessing_rounds(tmp_path):
    """Dropped: absent from every round, the preprocessing included; late: gets the schema and
    the pooled transform with its late request and is labelled. Same rule in process."""
    paths, truth = write_sites(tmp_path, n_sites=4)
    for p, df in zip(paths, truth["frames"]):  # first: no category only a late site holds
        df.assign(smoker=df["smoker"].replace("former", "no")).to_csv(p, index=False)
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(CFG)
    out, extra = _deploy(tmp_path, cfg_path, paths)
    ref = run_experiment(load_config(cfg_path), source=str(cfg_path))
    log = ref.model.run_log_
    assert len(log.dropped) == 1 and len(log.late) == 1
    assert out.log.dropped == log.dropped and out.log.late == log.late
    assert not out.log.failed and not log.failed
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
    # pooled statistics over the two sites that took part, as scikit-learn on their rows
    present = [z for z in range(4) if z not in log.dropped + log.late]
    sf = load_sites(paths, "diagnosis", ["age", "chol", "bp", "smoker"], ["smoker"], ["pid"])
    rows = np.concatenate([sf.devices[z] for z in present])
    np.testing.assert_allclose(extra["preprocess"]["mean"], np.nanmean(rows, axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(ref.preprocessor.mean_, np.nanmean(rows, axis=0), rtol=1e-12)
    assert extra["preprocess"]["n_rows"] == len(rows)
    # the late site is labelled in process as on the deployment (not reported failed)
    late = log.late[0]
    assert ref.model.device_labels_[late] is not None
    assert len(ref.model.device_labels_[late]) == len(truth["frames"][late])
    np.testing.assert_array_equal(out.device_outputs[late]["labels"],
                                  ref.model.device_labels_[late])
    assert 3 not in out.device_outputs  # dropped: no output
    # a category only the late site holds ('former', site 1): it missed the schema round,
    # reads it as a missing value and is still labelled
    assert late == 1 and log.dropped == [3]
    truth["frames"][1].to_csv(paths[1], index=False)
    again = tmp_path / "again"
    again.mkdir()
    out2, extra2 = _deploy(again, cfg_path, paths)
    assert not out2.log.failed and out2.log.late == [1]
    assert extra2["schema"]["categories"] == {"smoker": ["no", "yes"]}
    assert len(out2.device_outputs[1]["labels"]) == len(truth["frames"][1])


@pytest.mark.parametrize("algo", ["fedavg", "ifca"])
def test_linear_model_refuses_text_labels_and_fits_numbers(tmp_path, capsys, algo):
    """model = "linear" regresses: a text label is one line naming file, row and column; a
    numeric label is fitted as a number (not as class indices)."""
    paths, truth = write_sites(tmp_path, n_sites=3, missing=0.0)
    extra = "n_clusters = 2\n" if algo == "ifca" else ""
    cfg = tmp_path / "fed.toml"
    for label, feats in (("diagnosis", '["age", "bp"]'), ("chol", '["age", "bp"]')):
        cfg.write_text(f"""
seed = 0
[data]
source = "files"
paths = ["site*.csv"]
label = "{label}"
features = {feats}
test_fraction = 0.25
[algorithm]
name = "{algo}"
model = "linear"
rounds = 5
{extra}""")
        code = main(["run", str(cfg), "--out", str(tmp_path / label), "--no-plot"])
        err = capsys.readouterr().err.strip()
        if label == "diagnosis":
            assert code == 2 and len(err.splitlines()) == 1
            assert "site0.csv: row 0, column 'diagnosis'" in err and "not a number" in err
        else:
            assert code == 0, err
            result = json.loads((tmp_path / label / "result.json").read_text())
            assert "test_mse_pooled" in result["metrics"]
            assert "test_accuracy_pooled" not in result["metrics"]


def test_node_files_npz_parquet_csv_with_or_without_label(tmp_path):
    """A node's own .npz (X + feature_names, categorical codes, text labels), Parquet and a
    CSV without the label column: encoded by the schema like CSV; the same centers as
    `fedclust run` in process on those files."""
    import pandas as pd

    paths, truth = write_sites(tmp_path, n_sites=3)
    frames = truth["frames"]
    codes = {"no": 0, "yes": 1, "former": 2}
    for df in frames:
        df["smoker"] = df["smoker"].map(codes)
    paths[0].unlink()
    paths[0] = tmp_path / "site0.npz"
    df = frames[0]
    np.savez(paths[0], X=df[["age", "chol", "bp", "smoker"]].to_numpy(np.float64),
             feature_names=np.array(["age", "chol", "bp", "smoker"]),
             diagnosis=df["diagnosis"].to_numpy(str), pid=df["pid"].to_numpy(str))
    paths[1].unlink()
    paths[1] = tmp_path / "site1.parquet"
    frames[1].to_parquet(paths[1], index=False)
    frames[2].drop(columns=["diagnosis"]).to_csv(paths[2], index=False)
    body = """
seed = 2
[data]
source = "files"
paths = ["site0.npz", "site1.parquet", "site2.csv"]
{label}
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[algorithm]
name = "kfed"
n_clusters = 2
n_local_clusters = 2
"""
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(body.format(label='label = "diagnosis"'))
    out, extra = _deploy(tmp_path, cfg_path, paths)
    assert extra["schema"]["categories"] == {"smoker": ["0", "1", "2"]}
    assert extra["schema"]["label"] is None  # k-FED takes no label: none is asked for
    ref_cfg = tmp_path / "ref.toml"
    ref_cfg.write_text(body.format(label=""))
    ref = run_experiment(load_config(ref_cfg), source=str(ref_cfg))
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
    for z in range(3):
        np.testing.assert_array_equal(out.device_outputs[z]["labels"], ref.model.device_labels_[z])
    assert pd.read_parquet(paths[1]).shape[0] == len(out.device_outputs[1]["labels"])


BAD = """
seed = 0
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[preprocess]
impute = "{impute}"
[algorithm]
name = "gauss-classifier"
"""


@pytest.mark.parametrize("case, impute, pattern", [
    ("text", "mean", "site1.csv: row 4, column 'bp': the value is not a number"),
    ("empty", "mean", "site1.csv: the file has no rows"),
    ("nan", "none", "site1.csv: row 2, column 'age' is missing and impute='none'"),
    ("nolabel", "mean", "site1.csv: row 3, column 'diagnosis': the label is missing"),
])
def test_bad_site_data_stops_the_deployed_run_in_one_line(tmp_path, case, impute, pattern):
    """A site's bad rows stop a deployed run with the site's own line (file, row, column):
    on the in-process simulator and on a Flower grid (the ServerApp's one-line cause)."""
    from flwr.common.config import flatten_dict

    from fedclust.flower.apps import ServerAppFailed
    from fedclust.flower_app import app_run_config
    from fedclust.flower.grid import LocalGrid, run_server_app
    from fedclust.flower.apps import make_client_app, make_server_app
    from fedclust.flower_app import experiment_protocol
    from fedclust.sim.transport import InProcessTransport
    from fedclust.sites import read_table

    paths, truth = write_sites(tmp_path, n_sites=3, missing=0.0)
    df = truth["frames"][1].copy()
    if case == "text":
        df = df.astype({"bp": object})
        df.loc[4, "bp"] = "high"
    elif case == "empty":
        df = df.iloc[:0]
    elif case == "nan":
        df.loc[2, "age"] = np.nan
    else:
        df.loc[3, "diagnosis"] = None
    df.to_csv(paths[1], index=False)
    cfg_path = tmp_path / "fed.toml"
    cfg_path.write_text(BAD.format(impute=impute))
    cfg = load_config(cfg_path)
    protocol, _, seed = experiment_protocol(cfg)
    tables = {z: read_table(p) for z, p in enumerate(paths)}
    with pytest.raises(ValidationError) as err:
        InProcessTransport().run(protocol, tables, seed)
    assert pattern in str(err.value) and "\n" not in str(err.value)
    # the same on a Flower grid, each node holding its own file
    run_config = flatten_dict(app_run_config(cfg, result_dir=tmp_path / "res"))
    nodes = [{"data-path": str(p), "device-id": z, "policy-allow-collect": True}
             for z, p in enumerate(paths)]
    with pytest.raises(ServerAppFailed) as err:
        run_server_app(make_server_app(), LocalGrid(make_client_app(), nodes,
                                                    run_config=run_config), run_config)
    assert pattern in str(err.value) and "\n" not in str(err.value)


def test_secure_aggregation_after_the_site_rounds(tmp_path):
    """The algorithm's summed rounds stay secure sums behind the schema and preprocessing
    rounds: the deployed centers equal the in-process secure run."""
    from flwr.common.config import flatten_dict

    from fedclust.flower.apps import make_client_app, make_server_app
    from fedclust.flower_app import app_run_config
    from fedclust.flower.grid import LocalGrid, run_server_app
    from fedclust.flower.results import load_run_output

    paths, _ = write_sites(tmp_path, n_sites=4)
    (tmp_path / "fed.toml").write_text("""
seed = 3
[data]
source = "files"
paths = ["site*.csv"]
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[simulation]
secure_aggregation = true
[algorithm]
name = "distributed-lloyd"
n_clusters = 2
""")
    cfg = load_config(tmp_path / "fed.toml")
    rc = flatten_dict(app_run_config(cfg, result_dir=tmp_path / "res"))
    assert rc["secure-aggregation"] is True and json.loads(rc["params.summed"]) == [
        "candidates", "column_squares", "column_sums", "lloyd", "moments"]
    nodes = [{"data-path": str(p), "device-id": z, "policy-allow-collect": True}
             for z, p in enumerate(paths)]
    run_server_app(make_server_app(), LocalGrid(make_client_app(), nodes, run_config=rc), rc)
    out, _ = load_run_output(tmp_path / "res")
    ref = run_experiment(cfg)
    assert out.meter.secure_exchanges > 0
    np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
