"""The nodes' preprocessing round of a site-file run under secure aggregation (two rounds of
secure sums) and under ``[privacy]`` (the release ``FederatedPreprocessor`` makes in process,
composed with the algorithm's)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("flwr")

from flwr.common.config import flatten_dict  # noqa: E402

from fedclust.config import load_config  # noqa: E402
from fedclust.core.exceptions import ConfigError  # noqa: E402
from fedclust.core.secure_sum import SUMMED  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.flower.apps import make_client_app, make_server_app  # noqa: E402
from fedclust.flower_app import app_run_config, experiment_protocol  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402
from fedclust.flower.results import load_run_output  # noqa: E402
from fedclust.sites.preprocess import ACTION, SQUARES, SUMS, PreprocessProtocol  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402
from fedclust.sites.algorithm import model_from_run  # noqa: E402
from fedclust.sites import read_table  # noqa: E402

from sitegen import write_sites  # noqa: E402


@pytest.fixture(autouse=True)
def _result_root(tmp_path, monkeypatch):
    """The server host's FEDCLUST_RESULT_ROOT: a deployed ServerApp writes under tmp_path."""
    monkeypatch.setenv("FEDCLUST_RESULT_ROOT", str(tmp_path))


BASE = """
seed = 3
[data]
source = "files"
paths = ["site*.csv"]
categorical = ["smoker"]
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[algorithm]
name = "distributed-lloyd"
n_clusters = 2
max_rounds = 4
# named: under privacy the automatic start reads the federation's size, which a deployed
# private run does not release (its server sees placeholder row counts)
init = "candidates"
"""
SECURE = "[simulation]\nsecure_aggregation = true\n"
# public ranges of the six encoded columns: age, chol, bp, smoker = former / no / yes
PRIVATE = """[preprocess]
bounds = [[0, 120], [0, 500], [50, 200], [0, 1], [0, 1], [0, 1]]
budget_share = 0.3
[privacy]
epsilon = 2.0
delta = 1e-6
unit = "{unit}"
data_bound = 6.0
noise_seed = 11
"""


PUBLIC = 'categorical = ["smoker"]\ncategories = {smoker = ["former", "no", "yes"]}\n'


def _cfg(tmp_path, text, name="fed.toml", public=True):
    base = BASE.replace('categorical = ["smoker"]\n', PUBLIC) if public and "[privacy]" in text \
        else BASE
    (tmp_path / name).write_text(base + text)
    return load_config(tmp_path / name)


def _spy(monkeypatch):
    """What PreprocessProtocol's server code receives per round, and the pooled results."""
    seen, pooled = [], []
    step, finish = PreprocessProtocol.server_step, PreprocessProtocol.finish

    def server_step(self, state, request, replies):
        seen.append((request.action, sorted(replies, key=str),
                     {z: r.to_arrays() for z, r in replies.items()}))
        return step(self, state, request, replies)

    def fin(self, state, log):
        res = finish(self, state, log)
        pooled.append(res)
        return res

    monkeypatch.setattr(PreprocessProtocol, "server_step", server_step)
    monkeypatch.setattr(PreprocessProtocol, "finish", fin)
    return seen, pooled


def _grid_run(cfg, paths, res):
    rc = flatten_dict(app_run_config(cfg, result_dir=res, collect_outputs=True))
    # the noise_seed makes the three paths comparable; a node allows it only in tests
    nodes = [{"data-path": str(p), "device-id": z, "policy-allow-collect": True,
              "policy-allow-noise-seed": True}
             for z, p in enumerate(paths)]
    run_server_app(make_server_app(), LocalGrid(make_client_app(), nodes, run_config=rc), rc)
    return load_run_output(res)


def test_secure_site_preprocessing_sends_sums_only(tmp_path, monkeypatch):
    """Under secure aggregation, `fedclust run` and the deployed protocol (in-process
    simulator and Flower's message API) run the preprocessing as two secure sums: the
    server's code gets one SUMMED reply per round, never a site's; the transform is the
    plain one within the fixed-point precision and the same on every path."""
    paths, _ = write_sites(tmp_path, n_sites=4)
    plain_cfg = _cfg(tmp_path, "", "plain.toml")
    cfg = _cfg(tmp_path, SECURE)
    seen, pooled = _spy(monkeypatch)
    plain = run_experiment(plain_cfg)
    assert [a for a, _, _ in seen] == [ACTION] and seen[0][1] == [0, 1, 2, 3]  # site by site
    seen.clear()

    ref = run_experiment(cfg)  # `fedclust run`, in process
    assert ref.preprocessor.communication_["secure_exchanges"] == 6  # 3 per summed round
    protocol, _, seed = experiment_protocol(cfg)
    tables = {z: read_table(p) for z, p in enumerate(paths)}
    local = InProcessTransport(secure_aggregation=True).run(protocol, tables, seed)
    grid, extra = _grid_run(cfg, paths, tmp_path / "res")
    # three runs x two rounds, each a single summed reply
    assert [a for a, _, _ in seen] == [SUMS, SQUARES] * 3
    assert all(keys == [SUMMED] for _, keys, _ in seen)
    # the sum the server decoded is the sites' total (to the fixed-point step)
    n = np.array([len(t.columns["age"]) for t in tables.values()]).sum()
    assert all(int(r[SUMMED]["n_rows"]) == n for _, _, r in seen)

    means = [p.mean for p in pooled[1:]] + [np.asarray(extra["preprocess"]["mean"])]
    scales = [p.scale for p in pooled[1:]] + [np.asarray(extra["preprocess"]["scale_"])]
    for m, s in zip(means, scales):
        np.testing.assert_array_equal(m, ref.preprocessor.mean_)
        np.testing.assert_array_equal(s, ref.preprocessor.scale_)
    count = ref.preprocessor.n_samples_seen_
    step = 4 * 2.0 ** -20  # four sites' rounding of each fixed-point sum
    np.testing.assert_array_less(np.abs(ref.preprocessor.mean_ - plain.preprocessor.mean_),
                                 step / count + 1e-12)
    np.testing.assert_allclose(ref.preprocessor.scale_, plain.preprocessor.scale_, rtol=1e-6)
    # the algorithm on top: the same centers on all three paths
    np.testing.assert_array_equal(local.result.centers, ref.model.cluster_centers_)
    np.testing.assert_array_equal(grid.result.centers, ref.model.cluster_centers_)
    assert grid.meter.secure_exchanges == local.meter.secure_exchanges > 0


def _device(text):
    return text.replace("budget_share", "site_rows = 40\nbudget_share").replace(
        "noise_seed", "clip_norm = 5.0\nnoise_seed")


@pytest.mark.parametrize("secure, unit", [(False, "point"), (True, "point"), (False, "device")])
def test_private_site_preprocessing_deployed_equals_fedclust_run(tmp_path, monkeypatch, secure,
                                                                 unit):
    """[privacy] on site files: the deployed protocol's preprocessing round releases what
    `fedclust run` releases (same clipping, share of ε and noise with a noise_seed), the
    algorithm's budget is composed after it; in-process simulator, Flower's message API and
    `fedclust run` give identical transforms, centers and labels (with secure aggregation
    too: summed preprocessing, the algorithm's noise added on the devices)."""
    paths, _ = write_sites(tmp_path, n_sites=3)
    text = PRIVATE.format(unit=unit)
    cfg = _cfg(tmp_path, (SECURE if secure else "") + (_device(text) if unit == "device" else text))
    plain = run_experiment(_cfg(tmp_path, "", "plain.toml"))
    seen, pooled = _spy(monkeypatch)
    ref = run_experiment(cfg)
    protocol, _, seed = experiment_protocol(cfg)
    tables = {z: read_table(p) for z, p in enumerate(paths)}
    local = InProcessTransport(secure_aggregation=secure).run(protocol, tables, seed)
    grid, extra = _grid_run(cfg, paths, tmp_path / "res")
    assert len(pooled) == 3
    assert {a for a, _, _ in seen} == ({SUMS, SQUARES} if secure else {ACTION})
    assert (tmp_path / "res" / "model.npz").exists()
    for p in pooled[1:]:
        np.testing.assert_array_equal(p.mean, ref.preprocessor.mean_)
        np.testing.assert_array_equal(p.scale, ref.preprocessor.scale_)
    np.testing.assert_array_equal(extra["preprocess"]["mean"], ref.preprocessor.mean_)
    # noise was added: not the exact pooled statistics
    assert np.abs(ref.preprocessor.mean_ - plain.preprocessor.mean_).max() > 1e-6
    for out in (local, grid):
        np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
        for z in tables:
            np.testing.assert_array_equal(out.device_outputs[z]["labels"],
                                          ref.model.device_labels_[z])
    # the values clipped to the public ranges are counted on each site and kept there
    assert "clipped" not in ref.preprocessor.privacy_
    assert [int(grid.device_outputs[z]["preprocess_n_clipped"]) for z in tables] == \
        [int(local.device_outputs[z]["preprocess_n_clipped"]) for z in tables]
    # every release is listed and composed within the one epsilon
    rec = extra["privacy"]
    assert rec["preprocess"]["releases"] == ref.preprocessor.privacy_["releases"]
    assert rec["preprocess"]["budget_share"] == 0.3
    assert rec["algorithm"]["releases"] == ref.model.privacy_["releases"]
    assert rec["algorithm"]["releases"][0] == rec["preprocess"]["releases"][0]
    assert rec["algorithm"]["epsilon_spent"] == pytest.approx(ref.model.privacy_["epsilon_spent"])
    assert ref.model.privacy_["epsilon_spent"] <= 2.0
    # the model rebuilt from the deployed run carries the same record
    e = extra
    model, _ = model_from_run(e["experiment"], grid, e["inner_config"], len(e["preprocess"]["columns"]),
                              e["site_rows"], None, e["labels"])
    assert model.privacy_["releases"] == ref.model.privacy_["releases"]
    np.testing.assert_array_equal(model.cluster_centers_, ref.model.cluster_centers_)


def test_private_site_preprocessing_refusals_name_what_is_missing(tmp_path):
    write_sites(tmp_path, n_sites=3)
    text = PRIVATE.format(unit="point")
    no_bounds = text.replace("bounds = [[0, 120], [0, 500], [50, 200], [0, 1], [0, 1], [0, 1]]\n",
                             "")
    with pytest.raises(ConfigError, match=r"\[preprocess\] needs bounds"):
        experiment_protocol(_cfg(tmp_path, no_bounds, "a.toml"))
    with pytest.raises(ConfigError, match=r"\[preprocess\] needs site_rows"):
        experiment_protocol(_cfg(tmp_path, PRIVATE.format(unit="device"), "b.toml"))
    device = _device(PRIVATE.format(unit="device"))
    with pytest.raises(ConfigError) as err:
        experiment_protocol(_cfg(tmp_path, SECURE + device, "c.toml"))
    assert "secure aggregation hides" in str(err.value) and "\n" not in str(err.value)
    # a device-level run without secure aggregation is accepted (site_rows given)
    protocol, _, _ = experiment_protocol(_cfg(tmp_path, device, "d.toml"))
    assert protocol.name == "site-preprocess"


def test_private_schema_round_sends_no_category_or_label_set(tmp_path):
    from dataclasses import replace

    from fedclust.sites.schema_round import array_text, pool_schema, site_columns

    paths, _ = write_sites(tmp_path, n_sites=3)
    text = PRIVATE.format(unit="point")
    with pytest.raises(ConfigError, match=r"categories needs the public values of categorical "
                                          r"column 'smoker'") as err:
        experiment_protocol(_cfg(tmp_path, text, "a.toml", public=False))
    assert "\n" not in str(err.value)
    protocol, _, _ = experiment_protocol(_cfg(tmp_path, text, "b.toml"))
    request = protocol._request
    assert request.private and dict(request.categories) == {"smoker": ("former", "no", "yes")}
    replies = {z: site_columns(read_table(p), request) for z, p in enumerate(paths)}
    for r in replies.values():
        sent = array_text(r.text)
        assert sent["categories"] == {} and sent["labels"] is None and "error" not in sent
        assert int(r.n_rows) == 1      # the row count stays on the site too
    schema, _ = pool_schema(replies, request)
    assert schema.categories == {"smoker": ("former", "no", "yes")}
    # the same sites without privacy send their sets, and the union is the same here
    plain = {z: site_columns(read_table(p), replace(request, private=False))
             for z, p in enumerate(paths)}
    assert any(array_text(r.text)["categories"] for r in plain.values())
    assert pool_schema(plain, replace(request, private=False))[0].categories == schema.categories
    # a site value outside the public set is refused on the site, without the value
    narrow = replace(request, categories=(("smoker", ("no", "yes")),))
    errors = [array_text(site_columns(read_table(p), narrow).text).get("error") for p in paths]
    assert any(e and "outside [data] categories" in e for e in errors)
    assert not any(e and "former" in e for e in errors)


@pytest.mark.slow
@pytest.mark.parametrize("secure, private", [(True, True)])
def test_site_preprocessing_on_flower_simulation(tmp_path, monkeypatch, secure, private):
    """The deployed protocol with secure aggregation and/or [privacy] on Flower's simulation
    engine: (with a noise_seed) the transform, centers and labels of the in-process
    simulator and of `fedclust run`."""
    from fedclust.flower.transport import FlowerSimulationTransport

    paths, _ = write_sites(tmp_path, n_sites=3)
    cfg = _cfg(tmp_path, (SECURE if secure else "")
               + (PRIVATE.format(unit="point") if private else ""))
    seen, pooled = _spy(monkeypatch)
    ref = run_experiment(cfg)
    protocol, _, seed = experiment_protocol(cfg)
    tables = {z: read_table(p) for z, p in enumerate(paths)}
    local = InProcessTransport(secure_aggregation=secure).run(protocol, tables, seed)
    flower = FlowerSimulationTransport(keep_dir=str(tmp_path / "flwr"),
                                       secure_aggregation=secure).run(protocol, tables, seed)
    _, extra = load_run_output(tmp_path / "flwr" / "result")
    np.testing.assert_array_equal(pooled[1].mean, ref.preprocessor.mean_)
    np.testing.assert_array_equal(extra["preprocess"]["mean"], ref.preprocessor.mean_)
    np.testing.assert_array_equal(extra["preprocess"]["scale_"], ref.preprocessor.scale_)
    assert {a for a, _, _ in seen} == ({SUMS, SQUARES} if secure else {ACTION})
    if private:
        assert extra["privacy"]["algorithm"]["releases"] == ref.model.privacy_["releases"]
    for out in (local, flower):
        np.testing.assert_array_equal(out.result.centers, ref.model.cluster_centers_)
        for z in tables:
            np.testing.assert_array_equal(out.device_outputs[z]["labels"],
                                          ref.model.device_labels_[z])
    assert local.meter.summary()["bytes_up"] == flower.meter.summary()["bytes_up"]


@pytest.mark.slow
@pytest.mark.parametrize("algo, extra", [("gauss-classifier", "label = \"diagnosis\"\n")])
def test_fedclust_run_on_flower_with_secure_site_preprocessing(tmp_path, algo, extra):
    """`fedclust run --transport flower` on site files under secure aggregation: the
    preprocessing round runs as secure sums on Flower too, then the algorithm's secure
    rounds on the raw rows; the transform and the result equal the in-process run."""
    write_sites(tmp_path, n_sites=3)
    text = BASE[:BASE.index('name = "distributed-lloyd"')] + f'name = "{algo}"\n' + (
        "n_clusters = 2\n" if not extra else "")
    text = text.replace("[algorithm]", extra + SECURE + "[algorithm]")
    (tmp_path / "fed.toml").write_text(text)
    cfg = load_config(tmp_path / "fed.toml")
    a = run_experiment(cfg)
    b = run_experiment(cfg, transport="flower")
    assert b.preprocessor.communication_["secure_exchanges"] == 6
    assert b.model.communication_["secure_exchanges"] > 0
    np.testing.assert_array_equal(a.preprocessor.mean_, b.preprocessor.mean_)
    np.testing.assert_array_equal(a.preprocessor.scale_, b.preprocessor.scale_)
    assert a.result["metrics"] == b.result["metrics"]
    for pa, pb in zip(a.site_predictions, b.site_predictions):
        np.testing.assert_array_equal(pa, pb)
