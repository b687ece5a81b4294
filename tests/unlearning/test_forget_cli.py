"""``fedclust forget model.npz --site NAME``: the saved summaries (npz + JSON, no pickle)
are enough to forget a site that is not online, and the new model equals a fit of the
remaining sites (same seed, same device ids)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")

from fedclust import KFed, load_model  # noqa: E402
from fedclust.cli import main  # noqa: E402
from fedclust.config import load_config  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.unlearning import SummaryStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io"))
from sitegen import write_sites  # noqa: E402

CONFIG = """
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
"""


def _run(tmp_path, preprocess: str):
    paths, _ = write_sites(tmp_path, n_sites=4, seed=3, missing=0.0)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CONFIG + preprocess)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    return paths, cfg, out / "model.npz"


def test_forget_a_site_from_the_saved_model(tmp_path, capsys):
    paths, cfg, model_path = _run(tmp_path, '[preprocess]\nimpute = "none"\nscale = "none"\n')
    with np.load(model_path, allow_pickle=False) as data:   # no pickle anywhere
        kept = [k for k in data.files if k.startswith("forget/")]
        header = json.loads(bytes(data["__header__"]).decode())
    assert len(kept) == 4 * 3   # 4 sites x (centers, counts, scatter)
    assert header["unlearning"]["names"] == {"site0": 0, "site1": 1, "site2": 2, "site3": 3}
    new = tmp_path / "new.npz"
    assert main(["forget", str(model_path), "--site", "site1", "--out", str(new)]) == 0
    assert "no device computed again" in capsys.readouterr().out
    saved = load_model(new)
    assert saved.sites == ["site0", "site2", "site3"]
    with np.load(new, allow_pickle=False) as data:
        assert not any(k.startswith("forget/0/1/") for k in data.files)   # site1's summary gone
        header = json.loads(bytes(data["__header__"]).decode())
    assert header["unlearning"]["records"][0]["devices"] == [1]
    # the same model as k-FED fitted on the three remaining sites, with their device ids
    exp = run_experiment(load_config(cfg), source=str(cfg))
    devs = exp.federation.devices
    fresh = KFed(2, 3, random_state=exp.model.seed_).fit([devs[i] for i in (0, 2, 3)],
                                                         device_ids=[0, 2, 3])
    np.testing.assert_array_equal(saved.exported.arrays["centers"], fresh.cluster_centers_)
    got, _ = saved.predict_file(paths[2])
    np.testing.assert_array_equal(got, fresh.device_labels_[1])
    # forgetting again from the new file: its summaries still describe the remaining sites
    assert main(["forget", str(new), "--site", "site3"]) == 0
    again = load_model(new)
    fresh = KFed(2, 3, random_state=exp.model.seed_).fit([devs[0], devs[2]], device_ids=[0, 2])
    np.testing.assert_array_equal(again.exported.arrays["centers"], fresh.cluster_centers_)


def test_forget_refuses_pooled_preprocessing_and_unknown_sites(tmp_path, capsys):
    _, _, model_path = _run(tmp_path, "")
    assert main(["forget", str(model_path), "--site", "site1"]) == 2
    assert "pooled preprocessing" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    _, _, model_path = _run(tmp_path / "b", '[preprocess]\nimpute = "none"\nscale = "none"\n')
    assert main(["forget", str(model_path), "--site", "nowhere"]) == 2
    assert "no training site named 'nowhere'" in capsys.readouterr().err


def test_store_survives_npz_round_trip_bit_for_bit(tmp_path):
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(30, 3)) + 5 * (z % 2) for z in range(5)]
    model = KFed(2, 2, random_state=0).fit(Xs, device_ids=[7, 3, 9, 1, 4])
    store = model._unlearning_.store
    arrays, meta = store.to_arrays("forget/")
    np.savez(tmp_path / "s.npz", **arrays)
    with np.load(tmp_path / "s.npz", allow_pickle=False) as data:
        back = SummaryStore.from_arrays({k: data[k] for k in data.files},
                                        json.loads(json.dumps(meta)), "forget/")
    assert back.digest() == store.digest()
    assert back.device_ids == [1, 3, 4, 7, 9]


def test_forget_a_site_of_a_multi_round_model_is_refused_in_one_line(tmp_path, capsys):
    paths, _ = write_sites(tmp_path, n_sites=4, seed=3, missing=0.0)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CONFIG.replace('name = "kfed"', 'name = "coreset"')
                   .replace("n_local_clusters = 3\n", "")
                   + '[preprocess]\nimpute = "none"\nscale = "none"\n')
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    assert main(["forget", str(out / "model.npz"), "--site", "site2"]) == 2
    err = capsys.readouterr().err
    assert "every site must compute again" in err and len(err.strip().splitlines()) == 1
