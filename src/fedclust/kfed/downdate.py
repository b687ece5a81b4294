"""Forgetting devices under the paper's server without running it again: a downdate.

The paper's server (``server="farthest-lloyd1"``, ``first_device="widest"``) is a
farthest-first start over every device center followed by one weighted Lloyd
round. When devices leave:

* the start is unchanged if none of the leaving devices' centers was picked: the
  seed device (the widest one) stays the widest, and each farthest-first step
  picks the first row with the largest distance to the chosen set, which no
  removed row was;
* the Lloyd round's assignment to the start is per row, so the remaining rows
  keep theirs, and each cluster's weighted sum and weight lose exactly the leaving
  rows' share: the new centers are ``(sum - removed) / (weight - removed)``.

Only the last assignment (every remaining center to the new final centers, which
gives the devices' labels) runs over all rows. The centers equal a fresh run's up
to rounding (a subtraction instead of a sum over the remaining rows; within 1e-12
relative here, checked by ``verify``), not bit for bit; the record of the forget says
``path="downdate"``. Where a leaving device held the seed or a picked center, or a
cluster would be left empty, the server's step runs in full (``path="replay"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.kmeans import assign
from ..core.threads import one_blas_thread
from .server import PAPER_SERVER, pick_first_device, explanation_warning, farthest_first

__all__ = ["Lloyd1Trace", "lloyd1_trace", "downdate"]


@dataclass
class Lloyd1Trace:
    """What the paper's server step leaves for a downdate, over devices ``ids`` (sorted)."""

    ids: list[int]
    offsets: np.ndarray        # (Z + 1,) row ranges of each device in the stacked centers
    seed: int                  # the seed device's id
    picked: np.ndarray         # (k,) device id of every farthest-first pick
    start: np.ndarray          # (k, d) the farthest-first centers
    labels0: np.ndarray        # (N,) every row's cluster in the Lloyd round (nearest start)
    sums: np.ndarray           # (k, d) weighted sum of each cluster's rows
    weights: np.ndarray        # (k,) weight of each cluster


def applies(protocol: Any) -> bool:
    """The protocol's server is the one :func:`downdate` can follow."""
    from .protocol import KFedProtocol

    return (type(protocol) is KFedProtocol and protocol.server == PAPER_SERVER
            and getattr(protocol, "first_device", None) == "widest"
            and not getattr(protocol, "trim", 0) and getattr(protocol, "plan", None) is None
            and not getattr(protocol, "refine_rounds", 0))


def _stack(replies: dict[int, Any], ids: Sequence[int]):
    centers = [replies[z].centers for z in ids]
    if any(c.dtype != np.float64 for c in centers):
        return None
    return centers, [replies[z].counts for z in ids]


def lloyd1_trace(protocol: Any, replies: dict[int, Any]) -> Lloyd1Trace | None:
    """The trace of the server step over ``replies`` (device id -> LocalCenters), or None
    where a downdate cannot follow it (another server, float32, an emptied cluster)."""
    if not applies(protocol):
        return None
    ids = sorted(replies)
    stacked = _stack(replies, ids)
    if stacked is None:
        return None
    centers, counts = stacked
    k = protocol.n_clusters
    C = np.concatenate(centers, axis=0)
    if len(C) < k:
        return None
    w = np.concatenate(counts).astype(C.dtype) if protocol.weighted else np.ones(len(C))
    offsets = np.cumsum([0] + [len(c) for c in centers])
    with one_blas_thread():
        seed_pos = pick_first_device(centers, "widest", None)
        init = farthest_first(C, k, start=np.arange(offsets[seed_pos], offsets[seed_pos + 1]))
        labels0 = assign(C, C[init])[0]
    weights = np.bincount(labels0, weights=w, minlength=k)
    if (weights <= 0).any():   # the server relocated an empty cluster: no downdate
        return None
    sums = np.zeros((k, C.shape[1]))
    np.add.at(sums, labels0, C * w[:, None])
    owner = np.repeat(np.asarray(ids), np.diff(offsets))
    return Lloyd1Trace(list(ids), offsets, int(ids[seed_pos]), owner[init], C[init].copy(),
                       labels0, sums, weights)


def downdate(protocol: Any, trace: Lloyd1Trace, replies: dict[int, Any],
             drop: Sequence[int]) -> tuple[Any, Lloyd1Trace] | None:
    """``(KFedResult, new trace)`` of the server step without the devices ``drop``, or
    None where the full step must run (the seed device or a picked center leaves, a
    cluster empties). ``replies``: the kept replies of every device of the trace,
    the leaving ones included (their rows are subtracted)."""
    from ..core.protocol import RunLog
    from .protocol import KFedResult

    gone = {int(z) for z in drop}
    if not gone or trace.seed in gone or gone & set(trace.picked.tolist()):
        return None
    if not gone <= set(trace.ids) or sorted(replies) != trace.ids:
        return None
    stacked = _stack(replies, trace.ids)
    if stacked is None:
        return None
    k = len(trace.weights)
    keep = np.ones(int(trace.offsets[-1]), bool)
    sums, weights = trace.sums.copy(), trace.weights.copy()
    pos = {z: i for i, z in enumerate(trace.ids)}
    for z in sorted(gone):
        a, b = int(trace.offsets[pos[z]]), int(trace.offsets[pos[z] + 1])
        keep[a:b] = False
        rows = replies[z].centers.astype(np.float64)
        w = (replies[z].counts.astype(np.float64) if protocol.weighted
             else np.ones(len(rows)))
        lab = trace.labels0[a:b]
        np.subtract.at(sums, lab, rows * w[:, None])
        weights -= np.bincount(lab, weights=w, minlength=k)
    # a cluster that loses 99% of its weight or more: the full step (it relocates an
    # emptied cluster, and a subtraction of almost everything would cost digits)
    if (weights < 1e-2 * trace.weights).any():
        return None
    ids = [z for z in trace.ids if z not in gone]
    centers = [replies[z].centers for z in ids]
    counts = [replies[z].counts for z in ids]
    C = np.concatenate(centers, axis=0)
    final = sums / weights[:, None]
    with one_blas_thread():
        labels = assign(C, final)[0]
    offsets = np.cumsum([0] + [len(c) for c in centers])
    center_labels = {z: labels[offsets[i]:offsets[i + 1]].copy() for i, z in enumerate(ids)}
    log = RunLog(participants=list(ids))
    if protocol.summarise:
        warning = explanation_warning(centers, counts, [replies[z].scatter for z in ids], final,
                                      [center_labels[z] for z in ids], ids)
        if warning is not None:
            log.warnings.append(warning)
    result = KFedResult(centers=final, local_centers=dict(zip(ids, centers)),
                        local_counts=dict(zip(ids, counts)), center_labels=center_labels,
                        seed_device=trace.seed, n_iter=1, log=log)
    new = Lloyd1Trace(ids, offsets, trace.seed, trace.picked, trace.start,
                      trace.labels0[keep], sums, weights)
    return result, new
