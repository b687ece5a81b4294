"""k-FED on site files: labels/<site>.csv are k-FED's own induced labels (those scored in
result.json), and `fedclust predict` on a training file reproduces them."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

pytest.importorskip("pandas")

from fedclust import load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402
from fedclust.config import load_config  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.kfed.export import KFedPredictor, kfed_export  # noqa: E402

from sitegen import write_sites  # noqa: E402


def test_induced_labels_in_files_and_predict(tmp_path):
    # close groups and 3 local clusters for 2 global ones: the nearest global center and
    # k-FED's induced label disagree on some points
    paths, truth = write_sites(tmp_path, n_sites=4, seed=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text("""
seed = 0
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
[algorithm]
name = "kfed"
n_clusters = 2
n_local_clusters = 3
""")
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    exp = run_experiment(load_config(cfg), source=str(cfg))
    result = json.loads((out / "result.json").read_text())
    assert result["metrics"]["ari"] == pytest.approx(result["metrics"]["ari_pooled"])
    model = load_model(out / "model.npz")
    for z, p in enumerate(paths):
        with open(out / "labels" / f"{p.stem}.csv", newline="") as fh:
            written = [int(r["cluster"]) for r in csv.DictReader(fh)]
        np.testing.assert_array_equal(written, exp.model.device_labels_[z])
        got, _ = model.predict_file(p)
        np.testing.assert_array_equal(got, written)


def test_predictor_rule_by_hand():
    class M:  # a fitted k-FED: two sites, site 1 absent
        cluster_centers_ = np.array([[0.0, 0.0], [10.0, 0.0]])
        local_centers_ = [np.array([[4.0, 0.0], [9.0, 0.0]]), None]
        center_labels_ = [np.array([0, 1]), None]

    p = KFedPredictor.load(kfed_export(M(), None).arrays, {})
    X = np.array([[5.9, 0.0], [7.0, 0.0]])
    # site 0: nearest local center (4 -> cluster 0, 9 -> cluster 1)
    np.testing.assert_array_equal(p.predict(X, site=0), [0, 1])
    # a new site (or one absent from the run): nearest global center
    np.testing.assert_array_equal(p.predict(X, site=1), [1, 1])
    np.testing.assert_array_equal(p.predict(X), [1, 1])
