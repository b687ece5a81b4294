"""Every private estimator reports the run's true ε in ``privacy_``: a release lost to a
crash and redone on resume is counted there, as the run's ledger counts it."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.gauss import FedGaussClassifier, FedGaussClustering
from fedclust.preprocess import FederatedPreprocessor
from fedclust.privacy import DifferentialPrivacy
from fedclust.privacy.accounting import composed_epsilon
from fedclust.sim.transport import InProcessTransport

from test_checkpoint_resume import Boom, CrashingTransport  # noqa: E402


def _data(labels=False, seed=0):
    rng = np.random.default_rng(seed)
    centers = np.array([[-3.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    Xs, ys = [], []
    for _ in range(4):
        y = rng.integers(0, 3, 60)
        Xs.append(centers[y] + rng.normal(scale=0.6, size=(60, 2)))
        ys.append(y)
    return (Xs, ys) if labels else Xs


def _dp():
    return DifferentialPrivacy(2.0, 1e-6, data_bound=8.0, noise_seed=5)


CASES = {
    "clustering": (lambda: FedGaussClustering(privacy=_dp(), random_state=0), _data),
    "classifier": (lambda: FedGaussClassifier(privacy=_dp(), classes=[0, 1, 2], random_state=0),
                   lambda: _data(labels=True)),
    "preprocess": (lambda: FederatedPreprocessor(
        privacy=_dp(), bounds=[[-8.0, 8.0], [-8.0, 8.0]]), _data),
}


def _fit(make, data, transport):
    args = data()
    model = make()
    return model.fit(*args, transport=transport) if isinstance(args, tuple) else \
        model.fit(args, transport=transport)


@pytest.mark.parametrize("name", list(CASES))
def test_a_lost_release_is_in_privacy_(tmp_path, name):
    make, data = CASES[name]
    ref = _fit(make, data, InProcessTransport(checkpoint_dir=tmp_path / "ref"))
    planned = ref.privacy_["epsilon_spent"]
    assert ref.run_log_.privacy_ledger["epsilon_spent"] == pytest.approx(planned, rel=1e-12)
    assert "lost_releases" not in ref.privacy_
    folder = tmp_path / "crash"
    with pytest.raises(Boom):  # the first round released, then the server died
        _fit(make, data, CrashingTransport(checkpoint_dir=folder, at=0, where="after-step"))
    resumed = _fit(make, data, InProcessTransport(checkpoint_dir=folder, resume=True))
    ledger = resumed.run_log_.privacy_ledger
    assert [e["round"] for e in ledger["lost_releases"]] == [0]
    assert resumed.privacy_["lost_releases"] == ledger["lost_releases"]
    assert resumed.privacy_["epsilon_spent"] == ledger["epsilon_spent"] > planned
    # the true ε: the plan's releases and the lost one again, composed by dp-accounting
    plan = [(r["noise_multiplier"], r["repeats"]) for r in resumed.privacy_["releases"]]
    lost = [(r[1], 1) for e in ledger["lost_releases"] for r in e["releases"]]
    assert resumed.privacy_["epsilon_spent"] == pytest.approx(
        composed_epsilon(plan + lost, 1e-6), rel=1e-9)
