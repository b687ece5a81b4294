"""A server that runs more rounds of a private fit than its protocol declares: every extra
round would be a release the device's ledger never charged. The device counts the data
requests it answers per fit and refuses, by name, one past the declared rounds or a
repeated (round, action) pair; honest and resumed runs are accepted."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.core.exceptions import ValidationError
from fedclust.core.policy import DevicePolicy, PolicyRefusal
from fedclust.core.protocol import Request
from fedclust.lloyd.protocol import DistributedLloydProtocol
from fedclust.privacy import DifferentialPrivacy
from fedclust.sim.transport import InProcessTransport

T = 2  # Lloyd rounds the public config declares


def _devices(n=5, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return {z: rng.normal(size=(40, d)) + (z % 3) * 3 for z in range(n)}


def _dp():
    return DifferentialPrivacy(1.0, 1e-6, data_bound=20.0)


class ExtraLloydRound(DistributedLloydProtocol):
    """A deviating server: the public config says ``max_rounds=T`` (what every device
    builds its protocol from), but it asks for one Lloyd round more, under a new round id."""

    def next_request(self, state):
        declared = self.max_rounds
        self.max_rounds = declared + 1
        try:
            return super().next_request(state)
        finally:
            self.max_rounds = declared


class RepeatedLloydRound(DistributedLloydProtocol):
    """A deviating server that asks every Lloyd round under the first Lloyd round's id
    (a device that keyed its answers by round alone would answer it twice)."""

    def next_request(self, state):
        req = super().next_request(state)
        if req is not None and req.action == "lloyd":
            return Request(self._first_lloyd, req.action, req.payload)
        return req


def _lloyd(cls=DistributedLloydProtocol, init="candidates"):
    return cls(3, max_rounds=T, tol=0.0, init=init, privacy=_dp(), n_features=3)


def test_the_protocols_declare_their_data_rounds():
    assert _lloyd().declared_rounds() == {"moments": 1, "candidates": 1, "lloyd": T}
    assert _lloyd(init="box").declared_rounds() == {"candidates": 1, "lloyd": T}
    # exactly the rounds an honest run asks
    proto = _lloyd()
    state = proto.start(list(range(3)), 0)
    asked = {}
    while (req := proto.next_request(state)) is not None:
        asked[req.action] = asked.get(req.action, 0) + 1
        state.round += 1
        if req.action == "lloyd":
            state.lloyd_rounds += 1
    assert asked == proto.declared_rounds()


@pytest.mark.parametrize("secure", [False, True])
def test_in_process_an_extra_lloyd_round_is_refused_by_name(secure):
    pol = DevicePolicy(allow_collect=True)
    kw = {"secure_aggregation": True} if secure else {}
    proto = _lloyd(ExtraLloydRound)
    with pytest.raises(PolicyRefusal, match=(
            r"^device 0: refuses 'lloyd' request 3 of private protocol 'distributed-lloyd': "
            r"the fit declares 2 'lloyd' round\(s\)$")):
        InProcessTransport(policies=pol, **kw).run(proto, _devices(), 0)
    # with on_client_error="drop" the server's round error names every refusing device
    drop = InProcessTransport(policies=DevicePolicy(allow_collect=True),
                              on_client_error="drop", **kw)
    with pytest.raises(ValidationError, match=(
            r"round 4: .*(devices 0, 1, 2, 3, 4|\(device 0): refuses 'lloyd' request 3 ")):
        drop.run(_lloyd(ExtraLloydRound), _devices(), 0)


def test_in_process_the_honest_run_is_accepted_and_the_same_run_twice_too():
    pol = DevicePolicy(allow_collect=True)
    out = InProcessTransport(policies=pol).run(_lloyd(), _devices(), 0)
    assert not out.log.failed and sorted(out.log.participants) == list(range(5))
    # a new run is a new fit for the devices (their counts do not leak across runs)
    assert not InProcessTransport(policies=pol).run(_lloyd(), _devices(), 1).log.failed


def test_in_process_a_repeated_round_id_is_refused():
    pol = DevicePolicy(allow_collect=True)
    with pytest.raises(PolicyRefusal, match=(
            r"^device 0: refuses a second 'lloyd' request for round 2 of private protocol "
            r"'distributed-lloyd': it answered that round already")):
        InProcessTransport(policies=pol).run(_lloyd(RepeatedLloydRound), _devices(), 0)


def test_a_refused_request_charges_nothing_and_counts_nothing():
    """The count is checked before the ledger is charged and recorded after: a refused
    extra round neither spends budget nor moves the count."""
    pol = DevicePolicy(epsilon=5.0)
    proto, state = _lloyd(), {}
    for r, action in [(0, "moments"), (1, "candidates"), (2, "lloyd"), (3, "lloyd")]:
        pol.check_request(proto, action, state, "device 4", secure=False, round_index=r)
    spent = pol.ledger_object("device 4").spent()
    assert len(pol.ledger_object("device 4").entries) == 1
    for _ in range(2):
        with pytest.raises(PolicyRefusal, match="'lloyd' request 3 of private protocol"):
            pol.check_request(proto, "lloyd", state, "device 4", secure=False, round_index=4)
    assert pol.ledger_object("device 4").spent() == spent
    with pytest.raises(PolicyRefusal, match="'moments' request 2 .*declares 1 'moments'"):
        pol.check_request(proto, "moments", state, "device 4", secure=False, round_index=9)
    # an action the fit never declares
    with pytest.raises(PolicyRefusal, match="'sample' request 1 .*declares 0 'sample'"):
        pol.check_request(proto, "sample", state, "device 4", secure=False, round_index=10)
    # a non-private fit has no cap (its rounds release nothing that needs accounting)
    plain, pstate = DistributedLloydProtocol(3, max_rounds=T), {}
    for r in range(10):
        DevicePolicy().check_request(plain, "lloyd", pstate, "device 4", secure=False,
                                     round_index=r)
    assert pstate == {}


def test_a_private_protocol_without_declared_rounds_is_capped_by_its_plan():
    class Undeclared(DistributedLloydProtocol):
        declared_rounds = None

    proto = Undeclared(3, max_rounds=T, tol=0.0, init="candidates", privacy=_dp(),
                       n_features=3)
    cap = sum(r.repeats for r in proto.plan.releases)
    assert cap == 5   # moments, candidates, a Lloyd round, the spread, the final round
    pol, state = DevicePolicy(), {}
    for r in range(cap):
        pol.check_request(proto, "lloyd", state, "device 1", secure=False, round_index=r)
    with pytest.raises(PolicyRefusal, match=r"^device 1: refuses 'lloyd' request 6 of private "
                                            r"protocol 'distributed-lloyd': its plan declares "
                                            r"5 release\(s\)$"):
        pol.check_request(proto, "lloyd", state, "device 1", secure=False, round_index=cap)
    with pytest.raises(PolicyRefusal, match="second 'lloyd' request for round 0"):
        DevicePolicy().check_request(proto, "lloyd", state, "device 1", secure=False,
                                     round_index=0)


def _families():
    from fedclust import DistributedLloyd, FedAvg, FedGaussClassifier, FedGaussClustering, KFed
    from fedclust.sites.preprocess import FederatedPreprocessor

    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=2.0)
    dpd = DifferentialPrivacy(1.0, 1e-6, unit="device", clip_norm=1.0)
    return {
        "lloyd": lambda X, y, t: DistributedLloyd(2, max_rounds=3, tol=0.0, init="candidates",
                                                  privacy=dp, random_state=0).fit(X, transport=t),
        "lloyd-secure": lambda X, y, t: DistributedLloyd(
            2, max_rounds=3, tol=0.0, init="candidates", privacy=dp, random_state=0,
            secure_aggregation=True).fit(X, transport=t),
        "kfed": lambda X, y, t: KFed(2, 2, privacy=dp, random_state=0).fit(X, transport=t),
        "gauss-classifier": lambda X, y, t: FedGaussClassifier(
            covariance="diag", privacy=dp, classes=[0, 1], random_state=0).fit(X, y,
                                                                               transport=t),
        "gauss-clustering": lambda X, y, t: FedGaussClustering(
            covariance="diag", privacy=dp, random_state=0).fit(X, transport=t),
        "preprocess": lambda X, y, t: FederatedPreprocessor(
            privacy=dp, bounds=[(-2.0, 2.0)] * 2).fit(X, transport=t),
        "dp-fedavg": lambda X, y, t: FedAvg("logistic", rounds=3, lr=0.5, privacy=dpd,
                                            random_state=0).fit(X, y, transport=t),
    }


class _Recording(InProcessTransport):
    """Keeps each run's protocol, to read what it declares."""

    def run(self, protocol, devices, seed, **kw):
        self.protocols = getattr(self, "protocols", []) + [protocol]
        return super().run(protocol, devices, seed, **kw)


@pytest.mark.parametrize("family", list(_families()))
def test_an_honest_private_run_of_every_family_is_accepted(family):
    """Each device answers exactly the rounds its protocol declares, nothing is refused."""
    import json

    rng = np.random.default_rng(0)
    Xs = [np.clip(rng.normal(0, 1, (30, 2)), -2, 2) for _ in range(6)]
    ys = [(X[:, 0] > 0).astype(int) for X in Xs]
    transport = _Recording(policies=DevicePolicy(allow_collect=True),
                           secure_aggregation=family.endswith("-secure"))
    model = _families()[family](Xs, ys, transport)
    assert not model.run_log_.failed and not model.run_log_.rejected
    (proto,) = [p for p in transport.protocols if p.privacy is not None]
    declared = proto.declared_rounds()
    for z in range(6):
        (key,) = [k for k in transport._charged[z] if k.startswith("policy.answered.")]
        pairs = json.loads(np.asarray(transport._charged[z][key]).tobytes())
        asked = {}
        for _, action in pairs:
            asked[action] = asked.get(action, 0) + 1
        if family == "dp-fedavg":   # a device may sit a round out
            assert set(asked) <= set(declared) and all(
                asked[a] <= declared[a] for a in asked)
        else:
            assert asked == declared, (family, z)


class _Crash(RuntimeError):
    pass


class _CrashAfterStep(InProcessTransport):
    """Crashes once, after the server step of its round ``at`` (replies in, released)."""

    def __init__(self, at, **kw):
        super().__init__(**kw)
        self.at, self.n = at, 0

    def _server_step(self, protocol, state, request, replies):
        n, self.n = self.n, self.n + 1
        super()._server_step(protocol, state, request, replies)
        if n == self.at:
            raise _Crash(f"crash after round {n}")


def test_a_resumed_private_run_is_accepted_and_charged_again(tmp_path):
    """The resumed run redoes the crashed Lloyd round (same round and action, new secure
    round id). In process the devices' memory ends with the crashed run, so the resumed run
    is a new fit for them: they answer the redone round, their own ledger charges the fit a
    second time (the safe side) and the run's write-ahead ledger names the lost release."""
    from fedclust import DistributedLloyd

    rng = np.random.default_rng(1)
    Xs = [np.clip(rng.normal(0, 1, (30, 3)), -2, 2) + (z % 2) for z in range(5)]
    dp = DifferentialPrivacy(1.0, 1e-6, data_bound=4.0, noise_seed=5)
    pol = DevicePolicy(allow_collect=True, allow_noise_seed=True, epsilon=10.0)

    def fit(transport):
        return DistributedLloyd(2, max_rounds=3, tol=0.0, init="candidates", privacy=dp,
                                random_state=0, secure_aggregation=True).fit(
                                    Xs, transport=transport)

    folder = tmp_path / "run"
    with pytest.raises(_Crash):   # round 2 is the first Lloyd round
        fit(_CrashAfterStep(2, checkpoint_dir=folder, policies=pol, secure_aggregation=True))
    resumed = fit(InProcessTransport(checkpoint_dir=folder, resume=True, policies=pol,
                                     secure_aggregation=True))
    assert not resumed.run_log_.failed
    assert [e["round"] for e in resumed.run_log_.privacy_ledger["lost_releases"]] == [2]
    assert all(len(pol.ledger_object(f"device {z}").entries) == 2 for z in range(5))
    ref = fit(InProcessTransport(policies=DevicePolicy(allow_collect=True,
                                                       allow_noise_seed=True),
                                 secure_aggregation=True))
    np.testing.assert_array_equal(resumed.cluster_centers_, ref.cluster_centers_)
