"""The streamed k-FED curve of ``speed.py``: time and peak memory from 10^3 to 10^7 devices.

Devices come from a generator (20 points, d = 20, k = 50, k' = 2): device z
belongs to group ``z mod ⌈k/k'⌉`` and holds ``n/k'`` points of each of its
group's k' components (unit-variance Gaussians around means drawn N(0, 10² I),
so the components are ≈ 63 σ apart). Nothing but the current chunk of rows
exists at any time: ``KFed(k, k', server="kmeans++").fit(generator)`` (or, with
``server="default"``, ``KFed(k).fit(generator)``: the default server, each device
sending its summary ladder's centers) keeps only device centers and counts
(:mod:`fedclust.kfed.stream`). The cost of the
final centers is compared with the cost of the generating means on the same
rows (a second, regenerated pass over the first ``COST_DEVICES`` devices,
which hold every component).
"""

from __future__ import annotations

import math
import time

import numpy as np

from fedclust import KFed
from fedclust.core.kmeans import assign

K, K_LOCAL, N_PER, D = 50, 2, 20, 20
_CHUNK = 8192
COST_DEVICES = 1_000_000


def _means(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 1]).normal(scale=10.0, size=(K, D))


def devices(n_devices: int, seed: int):
    """Yield ``n_devices`` arrays (N_PER, D), made chunk by chunk (reproducible)."""
    means = _means(seed)
    groups = math.ceil(K / K_LOCAL)
    for s in range(0, n_devices, _CHUNK):
        b = min(_CHUNK, n_devices - s)
        rng = np.random.default_rng([seed, 2, s])
        g = (np.arange(s, s + b) % groups)[:, None]
        comp = np.minimum(g * K_LOCAL + np.arange(K_LOCAL)[None, :], K - 1)   # (b, k')
        lab = np.repeat(comp, N_PER // K_LOCAL, axis=1)                        # (b, n)
        X = means[lab] + rng.standard_normal((b, N_PER, D))
        yield from X


def costs(n_devices: int, seed: int, centers: np.ndarray) -> tuple[float, float]:
    """(cost of ``centers``, cost of the generating means) over the regenerated rows."""
    means = _means(seed)
    got = ref = 0.0
    batch = []
    for X in devices(n_devices, seed):
        batch.append(X)
        if len(batch) == _CHUNK:
            R = np.concatenate(batch)
            got += float(assign(R, centers)[1].sum())
            ref += float(assign(R, means)[1].sum())
            batch = []
    if batch:
        R = np.concatenate(batch)
        got += float(assign(R, centers)[1].sum())
        ref += float(assign(R, means)[1].sum())
    return got, ref


def run_point(n_devices: int, seed: int, phase, server: str = "kmeans++") -> dict:
    """One point of the curve; ``server="default"``: ``KFed(K)`` as a user writes it (the
    default server, each device's summary sized by the ladder)."""
    with phase() as ph:
        model = (KFed(K, random_state=seed) if server == "default" else
                 KFed(K, K_LOCAL, server=server, random_state=seed)).fit(
            devices(n_devices, seed))
    t0 = time.perf_counter()
    got, ref = costs(min(n_devices, COST_DEVICES), seed, model.cluster_centers_)
    return {"n_devices": n_devices, "n_points": n_devices * N_PER, "fit_s": ph.time,
            "fit_cpu_s": ph.cpu, "peak_rss_mib": getattr(ph, "hwm", None),
            "server": server, "device_centers": len(model.local_centers_.data),
            "peak_extra_mib": ph.mem, "centers_mib": model.local_centers_.data.nbytes / 2**20,
            "cost_over_generating_means": got / ref,
            "cost_devices": min(n_devices, COST_DEVICES), "cost_check_s": time.perf_counter() - t0}


def points(max_devices: int, min_devices: int = 1000) -> list[int]:
    """Powers of ten from ``min_devices`` to ``max_devices`` devices."""
    out, z = [], 1000
    while z <= max_devices:
        if z < min_devices:
            z *= 10
            continue
        out.append(z)
        z *= 10
    return out
