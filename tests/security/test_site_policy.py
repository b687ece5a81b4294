"""A deployed site run (schema round, preprocessing round, the algorithm's rounds) under a
device's own policy: the policy sees the whole fit's privacy, charges the preprocessing's
and the algorithm's releases to the device's ledger once, refuses a fit its budget cannot
hold, and caps every action at the rounds the fit declares."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")

from fedclust.config import load_config  # noqa: E402
from fedclust.core.policy import DevicePolicy, PolicyRefusal  # noqa: E402
from fedclust.experiment import run_experiment  # noqa: E402
from fedclust.flower_app import experiment_protocol  # noqa: E402
from fedclust.privacy import composed_epsilon  # noqa: E402
from fedclust.sim.transport import InProcessTransport  # noqa: E402
from fedclust.sites import read_table  # noqa: E402
from fedclust.sites.deployed import SitePreprocessProtocol  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "io"))
from sitegen import write_sites  # noqa: E402
from test_round_count import ExtraLloydRound, RepeatedLloydRound  # noqa: E402

CONFIG = """
seed = 3
[data]
source = "files"
paths = ["site*.csv"]
categorical = ["smoker"]
categories = {smoker = ["former", "no", "yes"]}
id_columns = ["pid"]
features = ["age", "chol", "bp", "smoker"]
[algorithm]
name = "distributed-lloyd"
n_clusters = 2
max_rounds = 3
init = "candidates"
[preprocess]
bounds = [[0, 120], [0, 500], [50, 200], [0, 1], [0, 1], [0, 1]]
budget_share = 0.3
[privacy]
epsilon = 2.0
delta = 1e-6
data_bound = 6.0
"""


def _site_run(tmp_path, text=CONFIG, n_sites=3):
    paths, _ = write_sites(tmp_path, n_sites=n_sites)
    (tmp_path / "fed.toml").write_text(text)
    cfg = load_config(tmp_path / "fed.toml")
    protocol, _, seed = experiment_protocol(cfg)
    return cfg, protocol, {z: read_table(p) for z, p in enumerate(paths)}, seed


def test_a_private_site_run_is_charged_once_with_every_release(tmp_path):
    cfg, protocol, tables, seed = _site_run(tmp_path)
    pol = DevicePolicy(epsilon=2.0, delta=1e-6, allow_collect=True)
    out = InProcessTransport(policies=pol).run(protocol, tables, seed)
    assert not out.log.failed and sorted(out.log.participants) == sorted(tables)
    ref = run_experiment(cfg)  # `fedclust run`: the same releases, accounted in process
    accounted = ref.model.privacy_["epsilon_spent"]
    # each device's ledger: the preprocessing's and the algorithm's releases, composed once
    releases = ref.model.privacy_["releases"]
    assert releases[0]["what"].startswith("preprocess")
    events = [(float(r["noise_multiplier"]), int(r["repeats"])) for r in releases]
    expected = composed_epsilon(events, 1e-6)
    assert accounted == pytest.approx(expected, rel=1e-9)
    for z in tables:
        spent = pol.ledger_object(f"device {z}").spent()
        assert spent == pytest.approx(expected, rel=1e-9)
        assert 0 < spent <= 2.0
    # the ledger outlives the run: the same devices asked for a second fit are out of budget
    with pytest.raises(PolicyRefusal, match=r"past its budget 2 \(spent so far 2"):
        InProcessTransport(policies=pol).run(protocol, tables, seed + 1)
    assert pol.ledger_object("device 0").spent() == pytest.approx(expected, rel=1e-9)


def test_a_device_budget_below_the_run_refuses_it_before_any_release(tmp_path):
    _, protocol, tables, seed = _site_run(tmp_path)
    pol = DevicePolicy(epsilon=1.0, delta=1e-6, allow_collect=True)
    with pytest.raises(PolicyRefusal, match=r"^device 0: refuses site-preprocess \(fit [0-9a-f]+\)"
                                            r": its privacy ledger would reach"):
        InProcessTransport(policies=pol).run(protocol, tables, seed)
    assert pol.ledger_object("device 0").spent() == 0.0


def test_a_site_run_without_privacy_is_refused_by_a_device_with_a_budget(tmp_path):
    plain = CONFIG.split("[preprocess]")[0]
    _, protocol, tables, seed = _site_run(tmp_path, plain)
    pol = DevicePolicy(epsilon=2.0, delta=1e-6, allow_collect=True)
    with pytest.raises(PolicyRefusal, match=r"^device 0: refuses protocol 'site-preprocess' "
                                            r"without differential privacy"):
        InProcessTransport(policies=pol).run(protocol, tables, seed)


def test_a_server_chosen_noise_seed_is_refused_at_the_first_request(tmp_path):
    _, protocol, tables, seed = _site_run(tmp_path, CONFIG + "noise_seed = 11\n")
    seen = []
    step = type(protocol).client_step

    def spy(self, request, X, **kw):
        seen.append(request.action)
        return step(self, request, X, **kw)

    type(protocol).client_step = spy
    try:
        with pytest.raises(PolicyRefusal, match=r"noise seed the server chose"):
            InProcessTransport(policies=DevicePolicy(allow_collect=True)).run(
                protocol, tables, seed)
    finally:
        type(protocol).client_step = step
    assert seen == []  # not even the schema round was answered
    # allowed by the device's own config (tests only): the run completes
    out = InProcessTransport(policies=DevicePolicy(allow_noise_seed=True, allow_collect=True)
                             ).run(protocol, tables, seed)
    assert not out.log.failed


def _deviating(protocol, algorithm):
    class DeviatingSite(SitePreprocessProtocol):
        def _build_inner(self, schema, sizes):
            inner = super()._build_inner(schema, sizes)
            inner.__class__ = algorithm  # the server's own copy only
            return inner

    return DeviatingSite(**protocol.config())


@pytest.mark.parametrize("algorithm, message", [
    (ExtraLloydRound, r"^device 0: refuses 'lloyd' request 4 of private protocol "
                      r"'site-preprocess': the fit declares 3 'lloyd' round\(s\)$"),
    (RepeatedLloydRound, r"^device 0: refuses a second 'lloyd' request for round \d+ of "
                         r"private protocol 'site-preprocess'")])
def test_an_extra_or_repeated_algorithm_round_is_refused(tmp_path, algorithm, message):
    _, protocol, tables, seed = _site_run(tmp_path)
    pol = DevicePolicy(allow_collect=True)
    honest = InProcessTransport(policies=pol).run(protocol, tables, seed)
    assert not honest.log.failed
    with pytest.raises(PolicyRefusal, match=message):
        InProcessTransport(policies=DevicePolicy(allow_collect=True)).run(
            _deviating(protocol, algorithm), tables, seed)


def test_the_view_declares_the_rounds_an_honest_site_run_asks(tmp_path):
    _, protocol, tables, seed = _site_run(tmp_path)
    asked: dict[str, int] = {}
    step = SitePreprocessProtocol.client_step
    states = {}

    def spy(self, request, X, *, device_id, seed, state):
        if device_id == 0:
            asked[request.action] = asked.get(request.action, 0) + 1
            states[0] = state
        return step(self, request, X, device_id=device_id, seed=seed, state=state)

    SitePreprocessProtocol.client_step = spy
    try:
        InProcessTransport().run(protocol, tables, seed)
    finally:
        SitePreprocessProtocol.client_step = step
    before = protocol.policy_view({}, None)
    assert before.releases_pending and before.plan is None
    assert before.declared_rounds() == {"site_schema": 1, "schema_union": 1,
                                        "pooled_transform": 1}
    after = protocol.policy_view(states[0], None)
    assert not after.releases_pending
    assert after.declared_rounds() == asked
    assert after.config() == before.config() == protocol.config()  # one fit, one fingerprint


def test_on_flower_a_node_ledger_holds_the_site_run_and_refuses_a_second(tmp_path, monkeypatch):
    """The same policy as a SuperNode's node config (``policy-epsilon``, a ledger file that
    persists across runs on that node) on Flower's message API: the first site run is
    charged, a second one past the budget is refused by every node, named in the run log."""
    pytest.importorskip("flwr")
    from flwr.common.config import flatten_dict

    from fedclust.flower.apps import ServerAppFailed, make_client_app, make_server_app
    from fedclust.flower_app import app_run_config
    from fedclust.flower.grid import LocalGrid, run_server_app

    monkeypatch.setenv("FEDCLUST_RESULT_ROOT", str(tmp_path))
    cfg, _, tables, _ = _site_run(tmp_path)
    paths = sorted(tmp_path.glob("site*.csv"))
    nodes = [{"data-path": str(p), "device-id": z, "policy-epsilon": 2.0,
              "policy-delta": 1e-6, "policy-ledger": str(tmp_path / f"ledger-{z}.json")}
             for z, p in enumerate(paths)]

    def run(name):
        rc = flatten_dict(app_run_config(cfg, result_dir=tmp_path / name))
        run_server_app(make_server_app(), LocalGrid(make_client_app(), nodes, run_config=rc), rc)

    run("first")
    ref = run_experiment(cfg)
    for z in range(len(paths)):
        ledger = DevicePolicy.from_node_config(nodes[z]).ledger_object(f"device {z}")
        assert ledger.spent() == pytest.approx(ref.model.privacy_["epsilon_spent"], rel=1e-9)
    with pytest.raises(ServerAppFailed, match=r"device 0: PolicyRefusal: device 0: refuses "
                                              r"site-preprocess \(fit [0-9a-f]+\): its privacy "
                                              r"ledger would reach"):
        run("second")
