"""When distributed Lloyd stops: after the first round whose pooled cost improved by at
most ``tol`` times the previous cost (the full cost history computed first, tol = 0)."""

from __future__ import annotations

import numpy as np

from fedclust.lloyd.messages import PointSample
from fedclust.lloyd.protocol import DistributedLloydProtocol


def _history(devices, start, tol, max_rounds=200):
    proto = DistributedLloydProtocol(len(start), max_rounds=max_rounds, tol=tol)
    state = proto.start(list(range(len(devices))), seed=0)
    req = proto.next_request(state)
    proto.server_step(state, req, {0: PointSample(points=np.asarray(start, float),
                                                  n_points=np.asarray(len(start)))})
    while (req := proto.next_request(state)) is not None:
        proto.server_step(state, req, {z: proto.client_step(req, X, device_id=z, seed=0, state={})
                                       for z, X in enumerate(devices)})
    res = proto.finish(state, None)
    return res.cost_history, res.converged


def _data(seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((300, 2)) * [3.0, 1.0]          # one elongated blob: slow Lloyd
    return np.array_split(X, 3), X[:5]


def test_tol_zero_stops_once_the_cost_repeats():
    devices, start = _data()
    h, converged = _history(devices, start, 0.0)
    assert converged and len(h) > 5 and len(h) < 200
    assert h[-1] == h[-2] and all(a > b for a, b in zip(h[:-2], h[1:-1]))


def test_stops_after_the_first_round_improving_at_most_tol():
    devices, start = _data()
    full, _ = _history(devices, start, 0.0)
    rel = [(a - b) / a for a, b in zip(full[:-1], full[1:])]
    # a tol that stops the run at a round which still improved (not at the fixed point)
    tol = sorted(x for x in rel if x > 0)[len(rel) // 3]
    stop = next(t for t, x in enumerate(rel) if x <= tol) + 1
    assert rel[stop - 1] > 0 and stop < len(full) - 1
    h, converged = _history(devices, start, tol)
    assert converged and h == full[:stop + 1]
    # one round short of its limit, it stops there unconverged
    h, converged = _history(devices, start, tol, max_rounds=stop)
    assert not converged and h == full[:stop]
