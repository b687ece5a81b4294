"""A malicious server: drives real devices (in process or the Flower ClientApp) stage by
stage and lies where a deviating server can (its requests are all it controls)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from fedclust.core.secure_sum import SecureAggregation, SecureSumServer
from fedclust.core.secure_sum_device import secure_sum_client

Lie = Callable[[str, int, dict], dict]


def values(n: int, seed: int = 0) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {z: {"sums": rng.normal(scale=20.0, size=(2, 3)),
                "counts": rng.integers(0, 50, size=2).astype(np.int64)} for z in range(n)}


def drive(vals: Mapping[int, Mapping[str, np.ndarray]], settings: SecureAggregation, *,
          identities: Mapping[int, Any] | None = None, lie: Lie | None = None,
          policies: Mapping[int, Any] | None = None, round_id: int = 5,
          states: dict | None = None, stages=None) -> tuple[SecureSumServer, dict]:
    """Every stage over the devices of ``vals``; ``lie(stage, z, inbound) -> inbound``."""
    ids = sorted(vals)
    srv = SecureSumServer(ids, round_id=round_id, settings=settings, seed=1)
    states = states if states is not None else {z: {} for z in ids}
    for stage in stages or srv.stages:
        replies = {}
        for z, inbound in srv.requests(stage).items():
            if lie is not None:
                inbound = lie(stage, z, dict(inbound))
            replies[z] = secure_sum_client(
                stage, inbound, states[z], device_id=z,
                reply=vals[z] if stage == "mask" else None,
                identity=(identities or {}).get(z), policy=(policies or {}).get(z))
        srv.take(stage, replies)
    return srv, states


