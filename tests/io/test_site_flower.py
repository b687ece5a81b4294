"""Site files on Flower's simulation engine: the nodes preprocess; labels equal the in-process run."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from fedclust.cli import main  # noqa: E402

from sitegen import write_sites  # noqa: E402

CFG = """
seed = 2
[data]
source = "files"
paths = ["site*.csv"]
label = "diagnosis"
categorical = ["smoker"]
id_columns = ["pid"]
test_fraction = 0.25

[algorithm]
name = "{algo}"
{extra}
"""


def _labels(folder, names):
    out = {}
    for n in names:
        with open(folder / "labels" / f"{n}.csv", newline="") as fh:
            out[n] = list(csv.reader(fh))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algo, extra", [("gauss-classifier", "")])
def test_flower_simulation_gives_the_in_process_labels(tmp_path, algo, extra, capsys):
    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CFG.format(algo=algo, extra=extra))
    names = [p.stem for p in paths]
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-plot"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-plot",
                 "--transport", "flower", "--progress"]) == 0
    # --progress: a bar over the rounds, read from the ServerApp as it runs
    assert f"{'preprocess'} rounds (flower)" in capsys.readouterr().err
    a = json.loads((tmp_path / "a" / "result.json").read_text())
    b = json.loads((tmp_path / "b" / "result.json").read_text())
    assert b["transport"] == "flower"
    assert _labels(tmp_path / "a", names) == _labels(tmp_path / "b", names)
    assert a["metrics"] == b["metrics"]
    # the preprocessing round ran on the nodes too, with the same bytes
    assert a["preprocess"]["communication"]["bytes_up"] == \
        b["preprocess"]["communication"]["bytes_up"]
