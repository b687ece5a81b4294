"""Site files end to end through the CLI: labels files, model.npz, predict, one-line errors."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
import pandas as pd  # noqa: E402

from fedclust import load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402

from sitegen import write_sites  # noqa: E402

CFG = """
seed = 1
[data]
source = "files"
paths = ["sites/site*.{fmt}"]
label = "diagnosis"
id_columns = ["pid"]
{data_extra}

[preprocess]
impute = "{impute}"
scale = "standard"

[algorithm]
name = "{algo}"
{algo_extra}
"""


def _setup(tmp_path, fmt="csv", algo="distributed-lloyd", algo_extra="n_clusters = 2",
           data_extra='categorical = ["smoker"]', impute="mean", **gen):
    (tmp_path / "sites").mkdir()
    paths, truth = write_sites(tmp_path / "sites", fmt=fmt, **gen)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CFG.format(fmt=fmt, algo=algo, algo_extra=algo_extra, data_extra=data_extra,
                              impute=impute))
    return cfg, paths, truth


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_labels_one_row_per_input_row_and_predict_reproduces_them(tmp_path, fmt, capsys):
    # the config sits elsewhere than the cwd: paths are read from the config's folder
    # without the categorical column: its one-hot columns would weigh as much as the groups
    cfg, paths, truth = _setup(tmp_path, fmt, data_extra='features = ["age", "chol", "bp"]')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert [s["site"] for s in result["sites"]] == ["site0", "site1", "site2"]
    assert result["preprocess"]["communication"]["rounds"] == 1
    model = load_model(out / "model.npz")
    assert model.task == "clustering" and model.sites == ["site0", "site1", "site2"]
    for path, df in zip(paths, truth["frames"]):
        rows = _read(out / "labels" / f"{path.stem}.csv")
        assert len(rows) == len(df)  # nothing dropped, rows with NaN included
        assert [r["row"] for r in rows] == [str(i) for i in range(len(df))]
        assert [r["pid"] for r in rows] == df["pid"].tolist()  # input order
        # the saved model on the same file: same labels, no refit (CLI and Python)
        target = tmp_path / f"{path.stem}-again.csv"
        assert main(["predict", str(out / "model.npz"), str(path), "--out", str(target)]) == 0
        assert [r["cluster"] for r in _read(target)] == [r["cluster"] for r in rows]
        # a DataFrame without the label column is fine at prediction
        got = model.predict(df.drop(columns=["diagnosis"]), site=path.stem)
        assert [str(v) for v in got] == [r["cluster"] for r in rows]
    # the clusters are the two generated groups (age and cholesterol separate them)
    assert result["metrics"]["ari"] > 0.8


def test_classifier_with_string_labels_per_site_and_pooled_test_accuracy(tmp_path):
    cfg, paths, truth = _setup(tmp_path, algo="gauss-classifier", algo_extra="",
                               data_extra='categorical = ["smoker"]\ntest_fraction = 0.3',
                               n_sites=3)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    result = json.loads((out / "result.json").read_text())
    hits = n = 0
    for site, path, df in zip(result["sites"], paths, truth["frames"]):
        rows = _read(out / "labels" / f"{path.stem}.csv")
        assert len(rows) == len(df) and {r["prediction"] for r in rows} <= {"healthy", "sick"}
        test = [(r["prediction"], y) for r, y in zip(rows, df["diagnosis"]) if r["split"] == "test"]
        assert len(test) == site["n_test"] == round(0.3 * len(df))
        acc = np.mean([p == y for p, y in test])
        assert site["test_accuracy"] == pytest.approx(acc)
        hits += sum(p == y for p, y in test)
        n += len(test)
    assert result["metrics"]["test_accuracy_pooled"] == pytest.approx(hits / n)
    assert result["metrics"]["test_accuracy_pooled"] > 0.9  # two well-separated groups


def test_predict_errors_are_one_line_exit_2(tmp_path, capsys):
    cfg, paths, truth = _setup(tmp_path, algo="fedavg", algo_extra='model = "logistic"\nrounds = 5')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    capsys.readouterr()
    df = truth["frames"][0].copy()
    df.loc[3, "diagnosis"] = "unknown-disease"
    df.to_csv(tmp_path / "new1.csv", index=False)
    truth["frames"][0].drop(columns=["chol"]).to_csv(tmp_path / "new2.csv", index=False)
    df = truth["frames"][0].copy()
    df.loc[5, "smoker"] = "sometimes"
    df.to_csv(tmp_path / "new3.csv", index=False)
    for name, pattern in [("new1.csv", "row 3, column 'diagnosis': the label is "
                                        "not one of the classes"),
                          ("new2.csv", "column 'chol' is missing"),
                          ("new3.csv", "row 5, column 'smoker': the category is not one")]:
        assert main(["predict", str(out / "model.npz"), str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert pattern in err and name in err and err.count("\n") == 1
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert main(["predict", str(tmp_path / "junk.npz"), str(paths[0])]) == 2
    assert f"not a fedclust model file: {tmp_path / 'junk.npz'}" in capsys.readouterr().err


def test_run_errors_are_one_line_exit_2(tmp_path, capsys):
    cfg, paths, truth = _setup(tmp_path, impute="none")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    df = truth["frames"][0]
    i = int(np.flatnonzero(df[["age", "chol", "bp"]].isna().any(axis=1))[0])
    assert f"site0.csv: row {i}, column" in err and "impute='none'" in err
    cfg.write_text(cfg.read_text().replace("sites/site*", "sites/nothing*"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    assert "matches no file" in capsys.readouterr().err


def test_table_source_matches_files_source(tmp_path):
    cfg, paths, truth = _setup(tmp_path)
    pooled = pd.concat([df.assign(site=f"site{s}") for s, df in enumerate(truth["frames"])])
    pooled.to_csv(tmp_path / "sites" / "all.csv", index=False)
    text = cfg.read_text().replace('paths = ["sites/site*.csv"]',
                                   'path = "sites/all.csv"\nsite_column = "site"')
    (tmp_path / "table.toml").write_text(text.replace('source = "files"', 'source = "table"'))
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    assert main(["run", str(tmp_path / "table.toml"), "--out", str(tmp_path / "b"),
                 "--no-plot"]) == 0
    for s in range(3):
        assert _read(tmp_path / "a" / "labels" / f"site{s}.csv") == \
            _read(tmp_path / "b" / "labels" / f"site{s}.csv")


def test_a_node_reading_its_own_site_file_preprocesses_like_the_server(tmp_path):
    from fedclust.config import load_config
    from fedclust.experiment import build_protocol, build_federation, preprocess_federation
    from fedclust.flower.dataio import load_device_file

    cfg_path, paths, truth = _setup(tmp_path, algo="gauss-classifier", algo_extra="",
                                    data_extra='categorical = ["smoker"]\ntest_fraction = 0.2')
    cfg = load_config(cfg_path)
    protocol, devices, _ = build_protocol(cfg)
    # what a Flower client rebuilds from the run config, on a node holding only its CSV
    node = type(protocol).from_config(protocol.config())
    fed, pre = preprocess_federation(cfg, build_federation(cfg))
    sites = fed.extra["sites"]
    for z, path in enumerate(paths):
        table, _ = load_device_file(path)
        X, y = node.local_data(table)
        Xr, yr = node.local_data(devices[z])
        np.testing.assert_array_equal(X[sites.train[z]], Xr)
        np.testing.assert_array_equal(y[sites.train[z]], yr)
        np.testing.assert_array_equal(Xr, fed.devices[z])  # = the server-side preprocessing
        assert not np.isnan(X).any()
