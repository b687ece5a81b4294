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
from fedclust.core.random import named_device_id  # noqa: E402
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
site_ids = "name"
[algorithm]
name = "kfed"
n_clusters = 2
n_local_clusters = 3
"""


def _run(tmp_path, preprocess: str, paths=None):
    if paths is None:
        paths, _ = write_sites(tmp_path, n_sites=4, seed=3, missing=0.0)
    cfg = tmp_path / "fed.toml"
    cfg.write_text(CONFIG + preprocess)
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 0
    return paths, cfg, out / "model.npz"


NO_POOLING = '[preprocess]\nimpute = "none"\nscale = "none"\n'


def _fresh_run(tmp_path, name: str, paths, keep) -> Path:
    """``fedclust run`` of the same configuration on a folder holding only the ``keep`` files."""
    folder = tmp_path / name
    folder.mkdir()
    for i in keep:
        (folder / paths[i].name).write_bytes(paths[i].read_bytes())
    _, _, model = _run(folder, NO_POOLING, paths=[folder / paths[i].name for i in keep])
    return model


def test_forget_a_site_from_the_saved_model(tmp_path, capsys):
    paths, cfg, model_path = _run(tmp_path, NO_POOLING)
    with np.load(model_path, allow_pickle=False) as data:   # no pickle anywhere
        kept = [k for k in data.files if k.startswith("forget/")]
        header = json.loads(bytes(data["__header__"]).decode())
    assert len(kept) == 4 * 3   # 4 sites x (centers, counts, scatter)
    # a site's device id is the hash of its name, not its place in the list
    ids = {f"site{i}": named_device_id(f"site{i}") for i in range(4)}
    assert header["unlearning"]["names"] == ids
    assert len(set(ids.values())) == 4 and all(0 <= z < 2**31 for z in ids.values())
    new = tmp_path / "new.npz"
    assert main(["forget", str(model_path), "--site", "site1", "--out", str(new)]) == 0
    assert "no device computed again" in capsys.readouterr().out
    saved = load_model(new)
    assert saved.sites == ["site0", "site2", "site3"]
    with np.load(new, allow_pickle=False) as data:
        assert not any(k.startswith(f"forget/0/{ids['site1']}/") for k in data.files)
        header = json.loads(bytes(data["__header__"]).decode())
    assert header["unlearning"]["records"][0]["devices"] == [ids["site1"]]
    # the same model as a fresh `fedclust run` on the three remaining site files
    fresh = load_model(_fresh_run(tmp_path, "without1", paths, (0, 2, 3)))
    assert fresh.sites == saved.sites
    np.testing.assert_array_equal(saved.exported.arrays["centers"],
                                  fresh.exported.arrays["centers"])
    for i in (0, 2, 3):
        np.testing.assert_array_equal(saved.predict_file(paths[i])[0],
                                      fresh.predict_file(paths[i])[0])
    # ... and as k-FED fitted in Python on those sites under their named ids
    exp = run_experiment(load_config(cfg), source=str(cfg))
    devs = exp.federation.devices
    assert exp.federation.device_ids == [ids[f"site{i}"] for i in range(4)]
    fit = KFed(2, 3, random_state=exp.model.seed_).fit(
        [devs[i] for i in (0, 2, 3)], device_ids=[ids[f"site{i}"] for i in (0, 2, 3)])
    np.testing.assert_array_equal(saved.exported.arrays["centers"], fit.cluster_centers_)
    # forgetting again from the new file: its summaries still describe the remaining sites
    # (site3 still holds every category, so the fresh run has the original's columns)
    assert main(["forget", str(new), "--site", "site0"]) == 0
    again = load_model(new)
    fresh = load_model(_fresh_run(tmp_path, "without01", paths, (2, 3)))
    np.testing.assert_array_equal(again.exported.arrays["centers"],
                                  fresh.exported.arrays["centers"])


def test_site_streams_do_not_depend_on_the_other_sites(tmp_path):
    """A site's device id (its stream key) is its name's: listing the sites in another order
    or with another site added keeps every site's id, and the in-process model of one order
    equals the model of the other."""
    paths, _ = write_sites(tmp_path, n_sites=4, seed=5, missing=0.0)
    held_out = CONFIG.replace('site_ids = "name"', 'site_ids = "name"\ntest_fraction = 0.25')
    cfg = load_config_text(tmp_path, held_out.replace('paths = ["site*.csv"]',
                                                     'paths = ["site3.csv", "site0.csv", '
                                                     '"site2.csv", "site1.csv"]') + NO_POOLING)
    shuffled = run_experiment(load_config(cfg), source=str(cfg))
    cfg2 = load_config_text(tmp_path, held_out + NO_POOLING, "sorted.toml")
    ordered = run_experiment(load_config(cfg2), source=str(cfg2))
    by_name = dict(zip(shuffled.federation.extra["sites"].names, shuffled.federation.device_ids))
    assert by_name == {f"site{i}": named_device_id(f"site{i}") for i in range(4)}
    np.testing.assert_array_equal(shuffled.model.cluster_centers_, ordered.model.cluster_centers_)
    # each site's held-out rows follow its name too, not its place in the list
    test_rows = {}
    for exp in (shuffled, ordered):
        sites = exp.federation.extra["sites"]
        for name, rows in zip(sites.names, sites.test):
            assert len(rows) > 0
            if name in test_rows:
                np.testing.assert_array_equal(test_rows[name], rows)
            test_rows[name] = rows


def load_config_text(folder: Path, text: str, name: str = "fed.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_forget_refuses_pooled_preprocessing_and_unknown_sites(tmp_path, capsys):
    _, _, model_path = _run(tmp_path, "")
    assert main(["forget", str(model_path), "--site", "site1"]) == 2
    assert "pooled preprocessing" in capsys.readouterr().err
    (tmp_path / "b").mkdir()
    _, _, model_path = _run(tmp_path / "b", NO_POOLING)
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


def test_site_ids_other_than_position_or_name_is_refused(tmp_path, capsys):
    write_sites(tmp_path, n_sites=3, seed=1, missing=0.0)
    cfg = load_config_text(tmp_path, CONFIG.replace('site_ids = "name"', 'site_ids = "names"')
                           + NO_POOLING)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert "site_ids" in err and "'names'" in err and len(err.strip().splitlines()) == 1
