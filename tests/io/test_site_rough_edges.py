"""What a new user meets with site files: the private preprocessing's bounds named by
column, a delimiter other than a comma, a file that is no model, a missing value in a file
to predict, DEPLOY.md of a site run."""

from __future__ import annotations

import numpy as np
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


LABELLED = """
seed = 1
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
id_columns = ["pid"]
categorical = ["smoker"]
test_fraction = 0.3
[algorithm]
name = "{algo}"
{extra}
"""


@pytest.mark.parametrize("algo,extra", [("fedavg", 'model = "logistic"\nrounds = 3'),
                                        ("gauss-classifier", "")])
def test_site_run_headline_accuracy_is_pooled_over_test_rows(tmp_path, capsys, algo, extra):
    import csv
    import json

    # sites of very different sizes: the mean over sites and the pooled accuracy differ
    paths, truth = write_sites(tmp_path, n_sites=3, sizes=(200, 12, 20), seed=4)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(LABELLED.format(algo=algo, extra=extra))
    out = tmp_path / "o"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    table = capsys.readouterr().out
    m = json.loads((out / "result.json").read_text())["metrics"]
    hits, sizes = [], []
    for path, df in zip(paths, truth["frames"]):  # independent: from the written labels
        with open(out / "labels" / f"{path.stem}.csv", newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r["split"] == "test"]
        by_pid = dict(zip(df["pid"], df["diagnosis"]))
        hits.append(sum(r["prediction"] == by_pid[r["pid"]] for r in rows))
        sizes.append(len(rows))
    assert m["test_accuracy"] == pytest.approx(sum(hits) / sum(sizes))
    assert m["test_accuracy"] == m["test_accuracy_pooled"]
    assert m["test_accuracy_device_mean"] == pytest.approx(
        np.mean([h / n for h, n in zip(hits, sizes)]))
    head, _, row = table.split("federation: ", 1)[1].splitlines()[1:4]
    assert "test accuracy" in head and "mean over devices" in head
    assert f"{100 * m['test_accuracy']:.2f}%" in row.split()
    assert f"{100 * m['test_accuracy_device_mean']:.2f}%" in row.split()


@pytest.mark.parametrize("sep", [";", "\t", "|", ","])
def test_a_site_file_with_another_delimiter_reads_as_with_commas(tmp_path, sep):
    import pandas as pd

    from fedclust.sites import read_table

    df = pd.DataFrame({"pid": ["a", "b", "c"], "age": [40.5, 61.0, None],
                       "note": ["x, y", "z", "w"], "smoker": ["no", "yes", "no"]})
    path = tmp_path / "site.csv"
    df.to_csv(path, sep=sep, index=False)
    table = read_table(path)
    assert list(table.columns) == ["pid", "age", "note", "smoker"]
    assert table.columns["note"].tolist() == ["x, y", "z", "w"]  # a quoted comma stays inside
    np.testing.assert_array_equal(table.columns["age"], [40.5, 61.0, np.nan])


def test_a_missing_column_error_says_what_header_was_read(tmp_path, capsys):
    (tmp_path / "site0.csv").write_text("pid,age,chol\na,40,180\nb,61,260\n")
    # one column only: nothing to tell the delimiter from, the header is read whole
    (tmp_path / "site1.csv").write_text("pid:age:chol\nc:45:190\n")
    cfg = tmp_path / "fed.toml"
    cfg.write_text('[data]\nsource = "files"\npaths = ["site*.csv"]\nid_columns = ["pid"]\n'
                   '[algorithm]\nname = "distributed-lloyd"\nn_clusters = 2\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("site1.csv: column 'age' is missing (present at site0); its header "
                        "was read as ['pid:age:chol']")


def test_semicolon_sites_run_end_to_end(tmp_path, capsys):
    import pandas as pd

    paths, truth = write_sites(tmp_path, n_sites=3)
    for p in paths:  # the same sites as Excel writes them where "," is the decimal mark
        pd.read_csv(p).to_csv(p, sep=";", index=False)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(SITES.format(ext="csv"))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    out = capsys.readouterr().out
    rows = sum(len(df) for df in truth["frames"])
    assert f"3 sites (site0, site1, site2; {rows} rows" in out


def test_predict_with_a_file_that_is_no_model_says_so_in_one_line(tmp_path, capsys):
    site = tmp_path / "site.csv"
    site.write_text("age,chol\n40,180\n")
    np.save(tmp_path / "array.npy", np.arange(3))
    np.savez(tmp_path / "objects.npz", a=np.array([1, None], dtype=object))
    np.savez(tmp_path / "other.npz", weights=np.ones(3))
    for name, why in [("site.csv", "not an .npz archive"), ("array.npy", "not an .npz archive"),
                      ("objects.npz", "it holds object arrays, which fedclust never writes"),
                      ("other.npz", "an .npz archive without fedclust's header; it holds "
                                    "['weights']")]:
        assert main(["predict", str(tmp_path / name), str(site)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedclust: error: not a fedclust model file: {tmp_path / name} "
                              f"({why}")
        assert err.count("\n") == 1 and "allow_pickle" not in err and "pickle.load" not in err


def test_deploy_md_of_a_site_config_names_each_site_and_its_file(tmp_path):
    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(SITES.format(ext="csv"))
    assert main(["flower", "app", str(tmp_path / "app"), "--config", str(cfg),
                 "--no-wheel"]) == 0
    text = (tmp_path / "app" / "DEPLOY.md").read_text()
    assert "dev-<i>.npz" not in text and "dev-" not in text
    for z, p in enumerate(paths):  # device id = the file's position in [data] paths
        assert f"# site '{p.stem}' (device {z}), its file {p.name}" in text
        assert f"--node-config \"data-path='/data/{p.name}' device-id={z}\"" in text
        assert f"--auth-supernode-private-key node-{z} " in text


def test_deploy_md_of_a_pooled_config_keeps_the_device_files(tmp_path):
    cfg = tmp_path / "fed.toml"
    cfg.write_text('[data]\nsource = "gaussians"\nn_features = 2\nn_clusters = 2\n'
                   'n_local_clusters = 2\nm0 = 2\nn_per_component = 5\n'
                   '[algorithm]\nname = "kfed"\nn_clusters = 2\nn_local_clusters = 2\n')
    assert main(["flower", "app", str(tmp_path / "app"), "--config", str(cfg),
                 "--no-wheel"]) == 0
    assert "data-path='/data/dev-<i>.npz'" in (tmp_path / "app" / "DEPLOY.md").read_text()


def test_a_failed_site_node_is_named_by_its_site(tmp_path):
    pytest.importorskip("flwr")
    import tomllib

    from flwr.common.config import flatten_dict

    from fedclust.flower.apps import make_client_app, make_server_app
    from fedclust.flower.grid import LocalGrid, run_server_app
    from fedclust.flower.results import load_run_output

    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(SITES.format(ext="csv"))
    res = tmp_path / "res"
    assert main(["flower", "app", str(tmp_path / "app"), "--config", str(cfg), "--no-wheel",
                 "--result-dir", str(res)]) == 0
    project = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    rc = flatten_dict(project["tool"]["flwr"]["app"]["config"])

    class SilentAfterSchema(LocalGrid):
        """Node of device 1 answers the hello and the two schema rounds, then times out."""

        def push_messages(self, messages):
            messages = list(messages)
            node = self.node_ids[1]
            self.seen = getattr(self, "seen", 0) + sum(
                m.metadata.dst_node_id == node for m in messages)
            if self.seen > 3:
                self.unresponsive.add(node)
            return super().push_messages(messages)

    nodes = [{"data-path": str(p), "device-id": z} for z, p in enumerate(paths)]
    run_server_app(make_server_app(result_root=str(tmp_path)),
                   SilentAfterSchema(make_client_app(), nodes, run_config=rc), rc)
    out, extra = load_run_output(res)
    assert extra["sites"] == ["site0", "site1", "site2"]
    assert list(out.log.failed) == [1]
    assert out.log.failed[1].startswith("site 'site1' (device 1): no reply within")


ARRAYS = """
seed = 0
[data]
source = "gaussians"
n_features = 3
n_clusters = 4
n_local_clusters = 2
m0 = 3
n_per_component = 20
[algorithm]
name = "kfed"
n_clusters = 4
n_local_clusters = 2
"""


def test_predict_refuses_a_missing_or_infinite_value_by_row_and_column(tmp_path, capsys):
    from fedclust import ValidationError, load_model

    cfg = tmp_path / "fed.toml"
    cfg.write_text(ARRAYS)
    out = tmp_path / "o"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    capsys.readouterr()
    centers = np.load(out / "model.npz")["model/centers"]
    new = tmp_path / "new.csv"
    for body, where in [("a,b,c\n1,2,3\n4,nan,6\n", "row 1, column 'b' is nan"),
                        ("a,b,c\n1,2,3\n4,5\n", "row 1, column 'c' is nan"),   # a short row
                        ("a,b,c\n1,2,inf\n", "row 0, column 'c' is inf")]:
        new.write_text(body)
        assert main(["predict", str(out / "model.npz"), str(new)]) == 2
        err = capsys.readouterr().err
        assert err == (f"fedclust: error: {new}: {where}; the model takes finite numbers only "
                       "(impute or drop the row, or train with the preprocessing's impute "
                       "setting)\n")
    new.write_text("a,b,c\n1,2,3\n4,-1e300,6\n")   # finite, but its distances overflow
    assert main(["predict", str(out / "model.npz"), str(new)]) == 2
    assert capsys.readouterr().err.startswith(
        f"fedclust: error: {new}: row 1, column 'b' is -1e+300; squared distances overflow "
        "float64 beyond about 1.3e+150")
    model = load_model(out / "model.npz")
    with pytest.raises(ValidationError, match=r"X: row 0, column 'x2' is nan"):
        model.predict(np.array([[0.0, 1.0, np.nan]]))
    # finite rows still predict: the nearest saved center
    X = np.random.default_rng(0).normal(scale=20.0, size=(30, 3))
    d2 = ((X[:, None, :] - centers[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(model.predict(X), d2.argmin(axis=1))


def test_predict_on_site_files_imputes_their_missing_values_as_in_training(tmp_path, capsys):
    paths, _ = write_sites(tmp_path, n_sites=2, seed=5)   # numeric NaNs in every site
    cfg = tmp_path / "fed.toml"
    cfg.write_text(SITES.format(ext="csv"))
    out = tmp_path / "o"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    capsys.readouterr()
    assert main(["predict", str(out / "model.npz"), str(paths[0])]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    import pandas as pd

    frame = pd.read_csv(paths[0])
    assert frame[["age", "chol", "bp"]].isna().any(axis=1).sum() > 0
    assert len(rows) == 1 + len(frame)


def test_a_model_trained_on_arrays_with_imputation_fills_a_missing_value_in_a_file(tmp_path,
                                                                                 capsys):
    from fedclust import load_model

    cfg = tmp_path / "fed.toml"
    cfg.write_text(ARRAYS.replace("[algorithm]",
                                  '[preprocess]\nimpute = "mean"\nscale = "standard"\n'
                                  "[algorithm]"))
    out = tmp_path / "o"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    capsys.readouterr()
    mean = load_model(out / "model.npz").preprocessor.mean_
    rows = np.array([[1.0, np.nan, 3.0], [4.0, 5.0, np.nan]])
    filled = np.where(np.isnan(rows), mean, rows)   # what training's imputation gives
    for name, X in [("gaps", rows), ("filled", filled)]:
        np.savetxt(tmp_path / f"{name}.csv", X, delimiter=",", header="a,b,c", comments="")
    assert main(["predict", str(out / "model.npz"), str(tmp_path / "gaps.csv")]) == 0
    with_gaps = capsys.readouterr().out
    assert main(["predict", str(out / "model.npz"), str(tmp_path / "filled.csv")]) == 0
    assert with_gaps == capsys.readouterr().out
