"""The device's own policy, in process: refusals by name, the ledger across runs."""

from __future__ import annotations

import json
import math
import os
import stat

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.policy import DevicePolicy, PolicyRefusal, PrivacyLedger, group_threshold
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy, composed_epsilon
from fedclust.sim.transport import InProcessTransport


def _devices(n=5, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return {z: rng.normal(size=(40, d)) + (z % 3) * 3 for z in range(n)}


def _private(eps=1.0, noise_seed=None):
    dp = DifferentialPrivacy(eps, 1e-6, data_bound=20.0, noise_seed=noise_seed)
    return DistributedLloydProtocol(3, max_rounds=2, tol=0.0, init="candidates", privacy=dp,
                                    n_features=3)


def test_group_rule_and_minimum():
    assert [group_threshold(g) for g in (2, 3, 4, 6, 9, 10)] == [2, 2, 3, 4, 6, 7]
    assert all(2 * group_threshold(g) > g for g in range(2, 200))
    pol = DevicePolicy(min_group=3, max_colluders=4)
    # t(g) > 4 first at g = 6 (t = 4 at g = 6? no: 6 - 2 = 4), so 7 (t = 5)
    assert pol.min_group_size() == 7 == min(g for g in range(3, 50) if group_threshold(g) > 4)
    with pytest.raises(PolicyRefusal, match=r"device 3: refuses a secure-aggregation group of 6"):
        pol.check_group(6, "device 3")
    assert pol.check_group(7, "device 3") == 5


def test_the_ledger_refuses_a_fit_past_the_budget_and_persists(tmp_path):
    path = tmp_path / "ledger-0.json"
    pattern = str(tmp_path / "ledger-{device}.json")
    proto = _private(1.0)
    one = composed_epsilon([(r.noise_multiplier, r.repeats) for r in proto.plan.releases], 1e-6)
    assert 0.9 < one <= 1.0
    pol = DevicePolicy(epsilon=1.2, ledger=pattern, allow_collect=True)
    devs = _devices()
    out = InProcessTransport(policies=pol).run(proto, devs, 0)
    assert not out.log.failed
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"ledger-{z}.json" for z in range(5)]
    data = json.loads(path.read_text())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(data["entries"]) == 1  # one fit, charged once although it has several rounds
    # the ledger's ε is dp-accounting's composition of what the protocol declares
    assert PrivacyLedger(1.2, 1e-6, str(path)).spent() == pytest.approx(one, rel=1e-9)
    # a second run on the same node (a fresh policy object reading the same file)
    again = DevicePolicy(epsilon=1.2, ledger=pattern, allow_collect=True)
    with pytest.raises(PolicyRefusal, match=r"device 0: refuses .*privacy ledger would reach "
                                            r"epsilon=1\.[0-9]+ .*past its budget 1\.2"):
        InProcessTransport(policies=again).run(proto, devs, 1)
    # composition: two fits cost less than 2 x one (dp-accounting, not a sum)
    two = composed_epsilon([(r.noise_multiplier, 2 * r.repeats) for r in proto.plan.releases],
                           1e-6)
    assert one < two < 2 * one
    ok = DevicePolicy(epsilon=two * 1.001, ledger=pattern, allow_collect=True)
    assert not InProcessTransport(policies=ok).run(proto, devs, 1).log.failed
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_a_budget_refuses_a_protocol_without_privacy():
    proto = DistributedLloydProtocol(3, max_rounds=2, points_per_device=5)
    out = InProcessTransport(policies={2: DevicePolicy(epsilon=1.0, allow_collect=True)},
                             on_client_error="drop").run(proto, _devices(), 0)
    assert list(out.log.failed) == [2]
    assert out.log.failed[2].startswith("device 2: refuses protocol 'distributed-lloyd' without "
                                        "differential privacy")


def test_a_server_chosen_noise_seed_is_refused():
    with pytest.raises(PolicyRefusal, match="device 0: refuses a private protocol whose noise "
                                            "seed the server chose"):
        InProcessTransport(policies=DevicePolicy(allow_collect=True)).run(
            _private(noise_seed=3), _devices(), 0)
    out = InProcessTransport(policies=DevicePolicy(allow_noise_seed=True, allow_collect=True)).run(
        _private(noise_seed=3), _devices(), 0)
    assert not out.log.failed


def test_actions_allowlist_and_collect():
    proto = DistributedLloydProtocol(3, max_rounds=2, points_per_device=5)
    first = proto.next_request(proto.start(list(range(5)), 0)).action
    only = DevicePolicy(actions={proto.name: {"lloyd"}}, allow_collect=True)
    out = InProcessTransport(policies={1: only}, on_client_error="drop").run(
        proto, _devices(), 0)
    assert out.log.failed[1] == (f"device 1: refuses action {first!r} of protocol "
                                 "'distributed-lloyd': its policy allows ['lloyd']")
    other = DevicePolicy(actions={"kfed": {"local"}})
    with pytest.raises(PolicyRefusal, match=r"device 0: refuses protocol 'distributed-lloyd': not in its "
                                            r"policy's allowed protocols \['kfed'\]"):
        InProcessTransport(policies=other).run(proto, _devices(), 0)
    keep = InProcessTransport(policies={3: DevicePolicy()}).run(proto, _devices(), 0)
    assert 3 not in keep.device_outputs and 0 in keep.device_outputs
    assert keep.log.failed[3] == ("device 3: refuses to send per-point outputs: its policy has "
                                  "allow_collect off")


def test_required_secure_aggregation_refuses_plain_summed_rounds():
    proto = DistributedLloydProtocol(3, max_rounds=2, points_per_device=5, init="candidates")
    pol = DevicePolicy(secure_aggregation="required", allow_collect=True)
    with pytest.raises(PolicyRefusal, match=r"device 0: refuses a plain 'moments' request: "
                                            r"its policy requires secure aggregation \(required\)"):
        InProcessTransport(policies=pol).run(proto, _devices(), 0)
    secure = InProcessTransport(policies=pol, secure_aggregation=True).run(proto, _devices(), 0)
    plain = InProcessTransport(secure_aggregation=True).run(proto, _devices(), 0)
    np.testing.assert_array_equal(secure.result.centers, plain.result.centers)


def test_policy_node_config_round_trip_and_bad_values():
    pol = DevicePolicy(secure_aggregation="signed", min_group=4, max_colluders=1,
                       allow_collect=True, actions={"kfed": ["local"]}, epsilon=3.0,
                       delta=1e-7, ledger="/var/lib/fedclust/ledger.json")
    nc = pol.to_node_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in nc.values())
    assert DevicePolicy.from_node_config(nc) == pol
    # strings, as `flower-supernode --node-config` may give them
    assert DevicePolicy.from_node_config({k: str(v).lower() if isinstance(v, bool) else v
                                          for k, v in nc.items()}) == pol
    for bad in ({"secure_aggregation": "sometimes"}, {"min_group": 1}, {"epsilon": -1.0},
                {"delta": 2.0}, {"max_colluders": -1}):
        with pytest.raises(ValidationError, match="policy: "):
            DevicePolicy(**bad)


def test_devices_do_not_share_one_ledger_file(tmp_path):
    pol = DevicePolicy(epsilon=5.0, ledger=str(tmp_path / "ledger.json"))
    with pytest.raises(ValidationError, match=r"share the ledger file .*\{device\}"):
        InProcessTransport(policies=pol).run(_private(1.0), _devices(), 0)


def test_an_unreadable_ledger_is_refused_not_reset(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text("not json")
    with pytest.raises(ValidationError, match="cannot be read .*refusing to guess"):
        PrivacyLedger(1.0, 1e-6, str(path))
    assert math.isfinite(PrivacyLedger(1.0, 1e-6, str(tmp_path / "new.json")).spent())


def test_the_security_pages_example_runs_and_a_second_fit_is_refused():
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "security.md"
    (code,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    ns: dict = {}
    exec(compile(code, "security.md", "exec"), ns)  # noqa: S102 (our own docs)
    assert ns["model"].cluster_centers_.shape == (3, 2)
    with pytest.raises(PolicyRefusal, match=r"device 0: refuses distributed-lloyd .*past its "
                                            r"budget 2\.5"):
        ns["DistributedLloyd"](3, init="candidates", privacy=ns["dp"], secure_aggregation=True,
                               random_state=1).fit(ns["devices"], transport=ns["transport"])
