"""Checkpoint and resume on the in-process transport: a crash at any round boundary or
inside a round, then a resume, ends exactly where the uninterrupted run ends; the
privacy ledger counts a release lost to a crash."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from fedclust import DistributedLloyd
from fedclust.core.atomic import atomic_open, write_json_atomic
from fedclust.core.checkpoint import (CHECKPOINT_FILE, LEDGER_FILE, CheckpointError, from_plain,
                                      to_plain)
from fedclust.core.protocol import Request
from fedclust.lloyd.messages import CenterBroadcast
from fedclust.privacy import DifferentialPrivacy
from fedclust.sim.resume import ATTEMPT_SHIFT, RunCheckpoint
from fedclust.sim.transport import InProcessTransport


class Boom(RuntimeError):
    """The simulated crash (not a FedClustError: nothing in fedclust catches it)."""


@dataclass
class CrashingTransport(InProcessTransport):
    """Crashes at round number ``at`` (0-based count): before its server step (replies
    in), after it (state changed, not yet written) or after its checkpoint."""

    at: int = -1
    where: str = "boundary"
    _n: int = 0

    def _server_step(self, protocol, state, request, replies):
        n, self._n = self._n, self._n + 1
        if self.where == "before-step" and n == self.at:
            raise Boom(f"crash before the server step of round {n}")
        super()._server_step(protocol, state, request, replies)
        if self.where == "after-step" and n == self.at:
            raise Boom(f"crash after the server step of round {n}")

    def _checkpoint(self, ckpt, identity, state, log, meter, states, active):
        super()._checkpoint(ckpt, identity, state, log, meter, states, active)
        if self.where == "boundary" and meter.rounds - 1 == self.at:
            raise Boom(f"crash after the checkpoint of round {self.at}")


def _same(a, b, where="model"):
    """Bitwise equality of fitted attributes (NaN equals NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        _same(vars(a), vars(b), where)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    elif hasattr(a, "__dict__") and not callable(a):
        _same({k: v for k, v in vars(a).items() if k.endswith("_")},
              {k: v for k, v in vars(b).items() if k.endswith("_")}, where)
    else:
        assert a == b, where


def _fitted(model):
    return {k: v for k, v in vars(model).items() if k.endswith("_") and not k.startswith("_")}


def _devices(n=6, d=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=6.0, size=(3, d))
    return [centers[rng.integers(0, 3, 40)] + rng.normal(size=(40, d)) for _ in range(n)]


def _fl_data():
    from fedclust.fl import rotated_federation

    fed = rotated_federation(0, n_devices=6, n_local_clusters=2, n_train=20, n_test=5)
    return fed.devices, fed.labels


def _robust_data():
    from fedclust.robust.data import make_mixture_regression

    mr = make_mixture_regression(12, 20, 3, 2, alpha=0.0, noise=0.3, random_state=2)
    return mr.Xs, mr.ys


def _cases():
    from fedclust import ClusteredFedAvg, DistributedKMeans, FedAvg, IFCA
    from fedclust import FedGaussClustering, KFed, RobustClusteredRegression

    fl = dict(rounds=2, n_hidden=4, lr=0.1, random_state=3)
    return {
        "lloyd-sample": (lambda: DistributedLloyd(3, max_rounds=4, random_state=1), _devices, {}),
        "lloyd-candidates-secure": (
            lambda: DistributedLloyd(3, max_rounds=3, init="candidates", random_state=1,
                                     secure_aggregation=True),
            _devices, dict(secure_aggregation=True)),
        "coreset-pca": (lambda: DistributedKMeans(3, 40, n_components=2, random_state=0),
                        lambda: _devices(d=4), {}),
        "fedavg": (lambda: FedAvg("softmax", rounds=2, lr=0.1, random_state=3), _fl_data, {}),
        "ifca": (lambda: IFCA(n_clusters=2, rounds=2, lr=0.1, random_state=3), _fl_data, {}),
        "kfed+fedavg": (lambda: ClusteredFedAvg(n_clusters=2, n_local_clusters=2, **fl),
                        _fl_data, {}),
        "robust": (lambda: RobustClusteredRegression(2, rounds=3, random_state=0), _robust_data,
                   {}),
        "kfed": (lambda: KFed(3, n_local_clusters=2, random_state=0), _devices, {}),
        "gauss": (lambda: FedGaussClustering(random_state=0), _devices, {}),
    }


def _fit(make, data, transport):
    args = data()
    model = make()
    if isinstance(args, tuple):
        return model.fit(*args, transport=transport)
    return model.fit(args, transport=transport)


@pytest.mark.parametrize("name", list(_cases()))
def test_resume_after_a_crash_at_every_round_equals_the_uninterrupted_run(name, tmp_path):
    make, data, kw = _cases()[name]
    ref = _fit(make, data, InProcessTransport(checkpoint_dir=tmp_path / "ref", **kw))
    n_rounds = ref.communication_["rounds"]
    assert n_rounds >= 1
    assert (tmp_path / "ref" / CHECKPOINT_FILE).exists()
    plain = _fit(make, data, InProcessTransport(**kw))
    _same(_fitted(plain), _fitted(ref))   # checkpointing changes nothing
    points = [(r, "boundary") for r in range(n_rounds - 1)]
    points += [(r, w) for r in range(n_rounds) for w in ("before-step", "after-step")]
    for at, where in points:
        folder = tmp_path / f"{where}-{at}"
        with pytest.raises(Boom):
            _fit(make, data, CrashingTransport(checkpoint_dir=folder, at=at, where=where, **kw))
        again = CrashingTransport(checkpoint_dir=folder, resume=True, **kw)
        resumed = _fit(make, data, again)
        _same(_fitted(resumed), _fitted(ref), f"{name} crash {where} round {at}")
        # it continued: only the rounds after the last checkpoint ran again
        assert again._n == n_rounds - (at + 1 if where == "boundary" else at)


def _private(noise_devices=False, rounds=4):
    dp = DifferentialPrivacy(2.0, 1e-6, data_bound=20.0, noise_seed=11)
    return lambda: DistributedLloyd(3, max_rounds=rounds, init="candidates", privacy=dp,
                                    random_state=1, secure_aggregation=noise_devices)


def test_private_run_resumes_exactly_and_its_ledger_counts_lost_releases(tmp_path):
    make = _private()
    ref = _fit(make, _devices, InProcessTransport(checkpoint_dir=tmp_path / "ref"))
    plan_eps = ref.privacy_["epsilon_spent"]
    ledger = ref.run_log_.privacy_ledger
    # every round of the run is one release: moments, candidates, 4 Lloyd rounds
    assert ledger["rounds_released"] == 6 == ref.communication_["rounds"]
    assert ledger["lost_releases"] == []
    assert ledger["epsilon_spent"] == plan_eps <= 2.0
    for at in range(6):
        for where in ("boundary", "before-step", "after-step"):
            if where == "boundary" and at == 5:
                continue
            folder = tmp_path / f"{where}-{at}"
            with pytest.raises(Boom):
                _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, at=at,
                                                       where=where))
            # the round that crashed is on disk as spent before anything was released
            entries = json.loads((folder / LEDGER_FILE).read_text())["entries"]
            assert len(entries) == at + 1
            again = CrashingTransport(checkpoint_dir=folder, resume=True)
            resumed = _fit(make, _devices, again)
            assert again._n == 6 - (at + 1 if where == "boundary" else at)
            _same(resumed.cluster_centers_, ref.cluster_centers_)
            got = resumed.run_log_.privacy_ledger
            assert got["rounds_released"] == 6
            if where == "boundary":   # nothing was lost: the same ledger as without a crash
                assert got == ledger
            else:                     # the crashed round was released, then redone
                assert [e["round"] for e in got["lost_releases"]] == [entries[-1]["round"]]
                assert got["epsilon_spent"] > plan_eps


def test_lost_release_costs_what_the_accountant_says(tmp_path):
    """The true ε of a run with one Lloyd round redone equals dp-accounting's composition of
    the plan's releases plus that release once more."""
    from fedclust.privacy.accounting import composed_epsilon

    make = _private(rounds=3)
    folder = tmp_path / "run"
    with pytest.raises(Boom):
        _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, at=2, where="after-step"))
    resumed = _fit(make, _devices, InProcessTransport(checkpoint_dir=folder, resume=True))
    plan = resumed.privacy_["releases"]
    z = [r["noise_multiplier"] for r in plan]
    reps = [r["repeats"] for r in plan]
    lost = resumed.run_log_.privacy_ledger["lost_releases"][0]["releases"]
    # the crashed round 2 is the first Lloyd round: its sums and the spread it also releases
    assert [r[1] for r in lost] == [z[2], z[3]]
    expected = composed_epsilon(list(zip(z, reps)) + [(r[1], 1) for r in lost], 1e-6)
    assert resumed.run_log_.privacy_ledger["epsilon_spent"] == pytest.approx(expected, rel=1e-9)


def test_a_second_crash_keeps_the_first_lost_release(tmp_path):
    make = _private(rounds=3)
    folder = tmp_path / "run"
    with pytest.raises(Boom):
        _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, at=2, where="after-step"))
    with pytest.raises(Boom):   # the resumed run crashes again inside its next round
        _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, resume=True, at=1,
                                               where="before-step"))
    done = _fit(make, _devices, InProcessTransport(checkpoint_dir=folder, resume=True))
    assert [e["round"] for e in done.run_log_.privacy_ledger["lost_releases"]] == [2, 3]


def test_distributed_noise_under_secure_aggregation_resumes_exactly(tmp_path):
    make = _private(noise_devices=True, rounds=2)
    ref = _fit(make, _devices, InProcessTransport(secure_aggregation=True))
    folder = tmp_path / "run"
    with pytest.raises(Boom):   # inside a secure round: replies summed, server step not run
        _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, at=2, where="before-step",
                                               secure_aggregation=True))
    resumed = _fit(make, _devices, InProcessTransport(checkpoint_dir=folder, resume=True,
                                                      secure_aggregation=True))
    _same(resumed.cluster_centers_, ref.cluster_centers_)
    assert len(resumed.run_log_.privacy_ledger["lost_releases"]) == 1


def test_a_redone_secure_round_gets_a_new_round_id(tmp_path):
    make = lambda: DistributedLloyd(3, max_rounds=2, init="candidates", random_state=1,  # noqa
                                    secure_aggregation=True)
    folder = tmp_path / "run"
    with pytest.raises(Boom):
        _fit(make, _devices, CrashingTransport(checkpoint_dir=folder, at=1, where="before-step",
                                               secure_aggregation=True))
    ck = RunCheckpoint.open(folder, resume=True)
    ck.restore(ck.meta["identity"])
    assert ck.attempt == 1
    assert ck.secure_round_id(1) == (1 << ATTEMPT_SHIFT) + 1 != 1


def test_resume_refuses_another_run(tmp_path):
    folder = tmp_path / "run"
    with pytest.raises(Boom):
        _fit(lambda: DistributedLloyd(3, max_rounds=3, random_state=1), _devices,
             CrashingTransport(checkpoint_dir=folder, at=1))
    with pytest.raises(CheckpointError, match=r"another run \(config .*max_rounds\": 3.* in the checkpoint"):
        _fit(lambda: DistributedLloyd(3, max_rounds=5, random_state=1), _devices,
             InProcessTransport(checkpoint_dir=folder, resume=True))
    with pytest.raises(CheckpointError, match=r"seed 1 in the checkpoint, 2 in this run"):
        _fit(lambda: DistributedLloyd(3, max_rounds=3, random_state=2), _devices,
             InProcessTransport(checkpoint_dir=folder, resume=True))


def test_resume_without_a_checkpoint_starts_afresh_and_resume_needs_a_folder(tmp_path):
    ref = _fit(lambda: DistributedLloyd(3, max_rounds=3, random_state=1), _devices, None)
    got = _fit(lambda: DistributedLloyd(3, max_rounds=3, random_state=1), _devices,
               InProcessTransport(checkpoint_dir=tmp_path / "empty", resume=True))
    _same(got.cluster_centers_, ref.cluster_centers_)
    with pytest.raises(Exception, match="resume=True needs checkpoint_dir"):
        _fit(lambda: DistributedLloyd(3, random_state=1), _devices,
             InProcessTransport(resume=True))


def test_plain_values_round_trip_with_their_types():
    msg = CenterBroadcast(np.arange(6.0).reshape(2, 3))
    value = {"ids": (1, 2), 3: {4, 5}, "f": [math.nan, math.inf, -0.0, 0.1],
             "x": np.float32(1.5), "n": np.int64(7), "none": None, "ok": True,
             "req": Request(2, "lloyd", msg, devices=(0, 1)), "s": frozenset({"a"})}
    arrays: dict = {}
    plain = json.loads(json.dumps(to_plain(value, arrays)))
    back = from_plain(plain, arrays)
    assert back["ids"] == (1, 2) and back[3] == {4, 5} and back["s"] == frozenset({"a"})
    assert math.isnan(back["f"][0]) and back["f"][1] == math.inf
    assert math.copysign(1.0, back["f"][2]) == -1.0 and back["f"][3] == 0.1
    assert type(back["x"]) is np.float32 and back["x"] == 1.5 and type(back["n"]) is np.int64
    assert back["req"] == Request(2, "lloyd", back["req"].payload, devices=(0, 1))
    assert np.array_equal(back["req"].payload.centers, msg.centers)
    assert back["none"] is None and back["ok"] is True
    # a composite protocol's state holds its inner protocol: kept as its config
    from fedclust.lloyd.protocol import DistributedLloydProtocol

    inner = DistributedLloydProtocol(3, max_rounds=2, init="candidates")
    arrays = {}
    got = from_plain(json.loads(json.dumps(to_plain({"p": inner}, arrays))), arrays)["p"]
    assert type(got) is DistributedLloydProtocol and got.config() == inner.config()


def test_a_state_that_cannot_be_written_warns_and_the_run_goes_on(tmp_path, monkeypatch):
    import fedclust.sim.resume as resume

    def refuse(*args, **kw):
        raise CheckpointError("state.g: a Generator cannot be checkpointed")

    monkeypatch.setattr(resume, "save_checkpoint", refuse)
    make = lambda: DistributedLloyd(3, max_rounds=3, random_state=1)  # noqa: E731
    with pytest.warns(RuntimeWarning, match="cannot be resumed .*Generator") as caught:
        got = _fit(make, _devices, InProcessTransport(checkpoint_dir=tmp_path))
    assert len(caught) == 1   # once, not every round
    _same(got.cluster_centers_, _fit(make, _devices, None).cluster_centers_)


def test_plain_values_refuse_what_needs_pickle():
    with pytest.raises(CheckpointError, match=r"state\.g: a numpy.random._generator.Generator"):
        to_plain(_Holder(np.random.default_rng(0)), {}, "state")
    with pytest.raises(CheckpointError, match="outside fedclust"):
        from_plain({"__dc__": "os:system", "attrs": {}}, {})


def test_a_checkpoint_naming_a_class_by_its_former_module_still_loads():
    # the evolving Gaussians' classifier and preprocessing's messages moved to modules of
    # their own; a checkpoint written before names them by the old module
    from fedclust.gauss import GaussClassifierProtocol
    from fedclust.sites.preprocess_messages import ColumnMoments

    proto = GaussClassifierProtocol(classes=[0, 1], n_features=2)
    plain = {"__protocol__": "fedclust.gauss.protocol:GaussClassifierProtocol",
             "config": to_plain(proto.config(), {}, "p")}
    back = from_plain(plain, {})
    assert type(back) is GaussClassifierProtocol and back.config() == proto.config()
    msg = ColumnMoments(count=np.array([2]), total=np.array([3.0]), m2=np.array([0.5]),
                        n_rows=np.array(2))
    arrays: dict = {}
    plain = to_plain(msg, arrays, "m")
    plain["__dc__"] = "fedclust.sites.preprocess:ColumnMoments"
    again = from_plain(plain, arrays)
    assert type(again) is ColumnMoments and again.m2.tolist() == [0.5]


@dataclass
class _Holder:
    g: object


_Holder.__module__ = "fedclust.tests_holder"


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"run": 1})
    with pytest.raises(Boom):
        with atomic_open(path, "w") as fh:
            fh.write('{"run": 2, "half')
            raise Boom("killed while writing")
    assert json.loads(path.read_text()) == {"run": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]
