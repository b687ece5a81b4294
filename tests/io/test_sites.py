"""load_sites: formats, globs, one-hot over the union of categories, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
import pandas as pd  # noqa: E402

from fedclust import ValidationError  # noqa: E402
from fedclust.datasets import load_sites, load_table_sites  # noqa: E402

from sitegen import write_sites  # noqa: E402


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_sites_read_as_the_files_say(tmp_path, fmt):
    paths, truth = write_sites(tmp_path, fmt=fmt)
    fed = load_sites(str(tmp_path / f"site*.{fmt}"), label="diagnosis", categorical=["smoker"],
                     id_columns=["pid"])
    assert fed.names == ["site0", "site1", "site2"]
    # site1 alone has "former": the union of the sites' category sets makes the columns
    assert fed.columns == ["age", "chol", "bp", "smoker=former", "smoker=no", "smoker=yes"]
    for X, y, df, ids in zip(fed.devices, fed.labels, truth["frames"], fed.ids):
        assert X.shape == (len(df), 6)
        np.testing.assert_array_equal(np.isnan(X[:, :3]), df[["age", "chol", "bp"]].isna())
        np.testing.assert_allclose(X[:, 1], df["chol"].to_numpy(), equal_nan=True)
        onehot = X[:, 3:]
        assert (onehot.sum(axis=1) == 1).all()
        cats = np.array(["former", "no", "yes"])[onehot.argmax(axis=1)]
        np.testing.assert_array_equal(cats, df["smoker"].to_numpy())
        np.testing.assert_array_equal(y, df["diagnosis"].to_numpy())
        np.testing.assert_array_equal(ids["pid"], df["pid"].to_numpy())
    assert fed.classes == ("healthy", "sick")


def test_npz_with_and_without_labels(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 3))
    np.savez(tmp_path / "a.npz", X=X, y=np.arange(20) % 2, feature_names=np.array(["u", "v", "w"]))
    np.savez(tmp_path / "b.npz", X=X[:7], feature_names=np.array(["u", "v", "w"]))
    fed = load_sites([tmp_path / "a.npz", tmp_path / "b.npz"])
    assert fed.columns == ["u", "v", "w"] and fed.labels is None
    np.testing.assert_array_equal(fed.devices[1], X[:7])
    with pytest.raises(ValidationError, match=r"b.npz: label column 'y' is missing"):
        load_sites([tmp_path / "a.npz", tmp_path / "b.npz"], label="y")


def test_table_split_by_site_column(tmp_path):
    df = pd.DataFrame({"hospital": ["h2", "h1", "h2", "h1", "h3"], "x": [1.0, 2, 3, 4, 5],
                       "y": ["a", "b", "a", "a", "b"]})
    df.to_csv(tmp_path / "all.csv", index=False)
    fed = load_table_sites("all.csv", "hospital", label="y", base_dir=tmp_path)
    assert fed.names == ["h2", "h1", "h3"]
    np.testing.assert_array_equal(fed.devices[0][:, 0], [1.0, 3.0])
    np.testing.assert_array_equal(fed.labels[1], ["b", "a"])


@pytest.mark.parametrize("case, pattern", [
    ("glob", r"glob '.*nothing\*\.csv' matches no file"),
    ("text", r"site1.csv: row 2, column 'chol': the value is not a number"),
    ("missing-column", r"site1.csv: column 'bp' is missing \(present at site0\)"),
    ("empty", r"site1.csv: the file has no rows"),
])
def test_bad_input_is_one_line_naming_file_row_column(tmp_path, case, pattern):
    paths, truth = write_sites(tmp_path, n_sites=2)
    df = truth["frames"][1]
    if case == "text":
        df["chol"] = df["chol"].astype(object)
        df.loc[2, "chol"] = "high"
    elif case == "missing-column":
        df = df.drop(columns=["bp"])
    elif case == "empty":
        df = df.iloc[:0]
    df.to_csv(paths[1], index=False)
    target = [tmp_path / "nothing*.csv"] if case == "glob" else paths
    with pytest.raises(ValidationError, match=pattern) as err:
        load_sites(target, label="diagnosis", categorical=["smoker"], id_columns=["pid"],
                   features=None if case != "missing-column" else None)
    assert "\n" not in str(err.value)


def test_preprocessing_a_site_federation_names_file_row_column(tmp_path):
    from fedclust.sites.preprocess import FederatedPreprocessor

    paths, truth = write_sites(tmp_path, n_sites=2)
    fed = load_sites(paths, label="diagnosis", categorical=["smoker"], id_columns=["pid"])
    Xs = FederatedPreprocessor().fit(fed).transform(fed)
    pooled, Z = np.vstack(fed.devices), np.vstack(Xs)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)   # pooled mean removed
    np.testing.assert_allclose(Z.std(axis=0), 1.0, rtol=1e-12)     # pooled scale
    assert (Z[np.isnan(pooled)] == 0.0).all()                      # imputed = the pooled mean
    i = int(np.flatnonzero(np.isnan(fed.devices[0]).any(axis=1))[0])
    j = int(np.flatnonzero(np.isnan(fed.devices[0][i]))[0])
    with pytest.raises(ValidationError, match=rf"site0: row {i}, column '{fed.columns[j]}' is "
                                              "missing and impute='none'"):
        FederatedPreprocessor(impute="none").fit(fed)
