"""One final-centers message to many devices labels their rows in stacked chunks
(:meth:`~fedclust.kfed.protocol.KFedProtocol.client_finish_shared`): the labels of one
nearest-center call per device, for devices small and large, and the fit's device labels
those of ``predict``."""

from __future__ import annotations

import numpy as np

from fedclust import KFed
from fedclust.kfed import protocol as kp, stacked_steps
from fedclust.kfed.messages import FinalCenters


def test_shared_finish_equals_one_call_per_device(monkeypatch):
    monkeypatch.setattr(stacked_steps, "SHARED_FINISH_CHUNK", 50)   # several chunks
    rng = np.random.default_rng(3)
    sizes = [int(n) for n in rng.integers(0, 40, size=300)] + [300, 1000, 7]
    devices = [rng.normal(size=(n, 6)) for n in sizes]
    states = [{"local_labels": np.zeros(n, int)} for n in sizes]
    states[4] = {}                           # a device with nothing to label
    states[9]["n_clipped"] = np.int64(2)     # a private device's count passes through
    C = rng.normal(size=(7, 6))
    proto = kp.KFedProtocol(7, 2)
    got = proto.client_finish_shared(FinalCenters(centers=C), devices, states)
    assert len(got) == len(devices) and got[4] == {} and got[9]["n_clipped"] == 2
    for X, s, out in zip(devices, states, got):
        if "local_labels" not in s:
            continue
        want = ((X[:, None, :] - C[None]) ** 2).sum(-1).argmin(1)   # brute force
        assert np.array_equal(out["labels"], want)
        assert np.array_equal(out["labels"], proto.client_finish(FinalCenters(centers=C), X, s)
                              ["labels"])


def test_fit_labels_every_device_as_predict():
    rng = np.random.default_rng(11)
    means = rng.normal(size=(4, 3)) * 5
    Xs = [means[rng.integers(4, size=int(n))] + rng.normal(size=(int(n), 3))
          for n in rng.integers(10, 400, size=80)]
    model = KFed(4, 2, random_state=0).fit(Xs)
    for X, lab in zip(Xs, model.device_labels_):
        assert np.array_equal(lab, model.predict(X))
