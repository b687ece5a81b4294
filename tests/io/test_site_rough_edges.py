"""What a new user meets with site files: the private preprocessing's bounds named by
column, a delimiter other than a comma, a file that is no model, DEPLOY.md of a site run."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")

from fedclust.cli import main  # noqa: E402

from sitegen import write_sites  # noqa: E402

SITES = """
seed = 3
[data]
source = "files"
paths = ["site*.{ext}"]
categorical = ["smoker"]
categories = {{smoker = ["former", "no", "yes"]}}
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[algorithm]
name = "distributed-lloyd"
n_clusters = 2
max_rounds = 4
init = "candidates"
"""


def test_private_bounds_of_the_wrong_count_name_the_encoded_columns_in_order(tmp_path, capsys):
    write_sites(tmp_path, n_sites=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(SITES.format(ext="csv") + "[preprocess]\n"
                   "bounds = [[0, 120], [0, 500], [50, 200], [0, 1], [0, 1]]\n"
                   "[privacy]\nepsilon = 2.0\ndelta = 1e-6\ndata_bound = 6.0\n")
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    # the categorical column's one-hot columns stand in its place, categories sorted
    assert err.strip().endswith("must be (6, 2): (low, high) per column, in this order: "
                                "age, chol, bp, smoker=former, smoker=no, smoker=yes")
