"""Every algorithm of the house runs on a site federation from a config, and its saved model
reproduces the run's labels (the export hook of each family)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

pytest.importorskip("pandas")

from fedclust import load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402

from sitegen import write_sites  # noqa: E402

ALGOS = {
    "kfed": "n_clusters = 2\nn_local_clusters = 2",
    "coreset": "n_clusters = 2",
    "distributed-lloyd": "n_clusters = 2",
    "gauss": "",
    "gauss-classifier": "",
    "fedavg": 'model = "logistic"\nrounds = 10',
    "ifca": 'n_clusters = 2\nmodel = "logistic"\nrounds = 10',
    "clustered-fedavg": 'n_clusters = 2\nmodel = "logistic"\nrounds = 10',
    "robust-classification": "n_clusters = 1\nrounds = 10",
    "robust-regression": "n_clusters = 1\nrounds = 10",
}
SUPERVISED = {"gauss-classifier", "fedavg", "ifca", "clustered-fedavg", "robust-classification"}


@pytest.mark.parametrize("algo", list(ALGOS))
def test_algorithm_on_site_files(tmp_path, algo):
    # a regression target must not be missing: no missing values for it
    paths, truth = write_sites(tmp_path, n_sites=4,
                               missing=0.0 if algo == "robust-regression" else 0.15)
    if algo == "robust-regression":  # an integer target is still a value to fit, not a class
        for path, df in zip(paths, truth["frames"]):
            df["chol"] = df["chol"].round().astype(int)
            df.to_csv(path, index=False)
    label = "chol" if algo == "robust-regression" else "diagnosis"
    feats = '["age", "bp"]' if algo == "robust-regression" else '["age", "chol", "bp", "smoker"]'
    (tmp_path / "fed.toml").write_text(f"""
seed = 0
[data]
source = "files"
paths = ["site*.csv"]
label = "{label}"
features = {feats}
{'categorical = ["smoker"]' if algo != "robust-regression" else ""}
id_columns = ["pid"]
test_fraction = 0.25
[algorithm]
name = "{algo}"
{ALGOS[algo]}
""")
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "fed.toml"), "--out", str(out), "--no-plot"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert [s["n_rows"] for s in result["sites"]] == [len(df) for df in truth["frames"]]
    model = load_model(out / "model.npz")
    for z, (path, df) in enumerate(zip(paths, truth["frames"])):
        with open(out / "labels" / f"{path.stem}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert [r["pid"] for r in rows] == df["pid"].tolist()
        col = "cluster" if model.task == "clustering" else "prediction"
        got = model.predict(df, site=path.stem)
        if model.task == "regression":
            np.testing.assert_allclose(got, [float(r[col]) for r in rows], rtol=1e-12)
        else:
            assert [str(v) for v in got] == [r[col] for r in rows]
    if algo in SUPERVISED:
        m = result["metrics"]
        n_test = sum(s["n_test"] for s in result["sites"])
        pooled = sum(s["test_accuracy"] * s["n_test"] for s in result["sites"]) / n_test
        assert m["test_accuracy_pooled"] == pytest.approx(pooled)
        assert m["test_accuracy"] is not None
    if algo == "robust-regression":
        assert model.task == "regression" and model.classes is None
        # age explains chol (both follow the group): the fit beats predicting the mean
        chol = np.concatenate([df["chol"].to_numpy(float) for df in truth["frames"]])
        assert 0 < result["metrics"]["test_mse_pooled"] < 0.5 * chol.var()
