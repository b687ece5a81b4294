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
  rows' share: the new centers are ``(sum - removed) / (weight - removed)``;
* every remaining center's label is its nearest new center. A center whose
  *margin* (distance to its second-nearest minus its nearest reference center)
  exceeds twice the largest shift of a center since the reference, plus a slack
  that covers rounding (:data:`CERTIFY_SLACK`), keeps its reference label by the
  triangle inequality; only the others (a prefix of the centers sorted by margin)
  are assigned again. When that prefix grows past :data:`REFRESH_SHARE` of the
  rows, every label and margin is computed again against the current centers,
  which become the reference.

The centers equal a fresh run's up to rounding (a subtraction instead of a sum over
the remaining rows; within 1e-12 relative here, checked by ``verify``), not bit for
bit; the labels are those a fresh run's assignment gives (the slack exceeds that
assignment's rounding). The record of the forget says ``path="downdate"`` and how
many centers were assigned again (``rechecked``). Where a leaving device held the
seed or a picked center, or a cluster would be left (almost) empty, the server's
step runs in full (``path="replay"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core.kmeans import assign, sum_by_label
from ..core.threads import one_blas_thread
from .downdate_rows import entering, margins, write
from .server import PAPER_SERVER, pick_first_device, explanation_warning, farthest_first

__all__ = ["Lloyd1Trace", "lloyd1_trace", "downdate", "CERTIFY_SLACK", "REFRESH_SHARE"]

#: rounding allowance of a label certificate, times ``sqrt(d + 4)`` times the largest
#: norm of a device center: an assignment's squared distances ``|x|^2 - 2 x.c + |c|^2``
#: carry an error of at most about ``(d + 4) eps max|x|^2``, so a margin below
#: ``sqrt`` of that could flip; this allowance is about 30 times larger
CERTIFY_SLACK = 1e-6
#: assign every row again (and take the current centers as the reference) when more
#: than this share of the remaining rows would need it
REFRESH_SHARE = 0.125


@dataclass
class Lloyd1Trace:
    """What the paper's server step leaves for a downdate, over devices ``ids`` (sorted).

    Rows are those of the stacked centers when the trace was made (``N0`` of them);
    ``alive`` marks the ones whose device remains."""

    ids: list[int]
    offsets: np.ndarray        # (Z0 + 1,) row ranges of each traced device
    row_of: dict[int, int]     # device id -> its position in ``offsets``
    owner: np.ndarray          # (N0,) device id of every row
    C: np.ndarray              # (N0, d) the stacked device centers
    w: np.ndarray              # (N0,) their Lloyd weights
    alive: np.ndarray          # (N0,) bool
    seed: int                  # the seed device's id
    picked: np.ndarray         # (k,) device id of every farthest-first pick
    start: np.ndarray          # (k, d) the farthest-first centers
    labels0: np.ndarray        # (N0,) every row's cluster in the Lloyd round (nearest start)
    sums: np.ndarray           # (k, d) weighted sum of each cluster's remaining rows
    weights: np.ndarray        # (k,) weight of each cluster
    ref: np.ndarray            # (k, d) the centers the margins were measured against
    ref_labels: np.ndarray     # (N0,) nearest reference center of every row
    order: np.ndarray          # (N0,) rows by increasing margin
    margin_sorted: np.ndarray  # (N0,) the margins in that order
    rank: np.ndarray           # (N0,) each row's position in ``order``
    labels: np.ndarray         # (N0,) every row's label under the current centers
    slack: float               # CERTIFY_SLACK * sqrt(d + 4) * max |row|
    local_centers: dict[int, np.ndarray]
    local_counts: dict[int, np.ndarray]
    center_labels: dict[int, np.ndarray]
    #: rows assigned again by the last downdate (certificate failures, or all on a refresh)
    rechecked: int = 0
    #: row ranges of the devices the last downdate removed, wiped by :meth:`scrub`
    pending: list[tuple[int, int]] = field(default_factory=list)
    #: (k,) the farthest-first rows, and (k,) each step's largest distance to the rows
    #: chosen before it (the pick's; -inf for the seed device's rows): a row deletion's
    #: new pieces leave the start as it was while theirs stay below (:mod:`.downdate_rows`)
    init: np.ndarray | None = None
    ff_max: np.ndarray | None = None

    def scrub(self) -> None:
        """Wipe the removed devices' centers and weights (once this trace is the model's:
        the stacked rows are shared with the trace it was made from)."""
        for a, b in self.pending:
            self.C[a:b] = 0.0
            self.w[a:b] = 0.0
        self.pending = []


def plain_step(protocol: Any, server: str) -> bool:
    """The protocol is k-FED's with server ``server`` and nothing else changes its step
    (no trimming, no privacy, no refinement rounds): what a forget can follow."""
    from .protocol import KFedProtocol

    return (type(protocol) is KFedProtocol and protocol.server == server
            and not getattr(protocol, "trim", 0) and getattr(protocol, "plan", None) is None
            and not getattr(protocol, "refine_rounds", 0))


def applies(protocol: Any) -> bool:
    """The protocol's server is the one :func:`downdate` can follow."""
    return (plain_step(protocol, PAPER_SERVER)
            and getattr(protocol, "first_device", None) == "widest")


def forget_result(protocol: Any, replies: dict[int, Any], ids: list[int], centers: np.ndarray,
                  local_centers: dict, local_counts: dict, center_labels: dict,
                  seed_device: int | None, n_iter: int, warning: Any = False) -> Any:
    """The :class:`~fedclust.kfed.protocol.KFedResult` a forget leaves, with the explanation
    warning a fit over the remaining devices ``ids`` would give (``warning``: that warning
    worked out by the caller, None for none; False: work it out here)."""
    from ..core.protocol import RunLog
    from .protocol import KFedResult

    log = RunLog(participants=list(ids))
    if protocol.summarise and warning is not False:
        if warning is not None:
            log.warnings.append(warning)
    elif protocol.summarise:
        warning = explanation_warning([local_centers[z] for z in ids],
                                      [local_counts[z] for z in ids],
                                      [replies[z].scatter for z in ids], centers,
                                      [center_labels[z] for z in ids], ids)
        if warning is not None:
            log.warnings.append(warning)
    return KFedResult(centers=centers, local_centers=local_centers, local_counts=local_counts,
                      center_labels=center_labels, seed_device=seed_device, n_iter=n_iter,
                      log=log)


def lloyd1_trace(protocol: Any, replies: dict[int, Any]) -> Lloyd1Trace | None:
    """The trace of the server step over ``replies`` (device id -> LocalCenters), or None
    where a downdate cannot follow it (another server, float32, an emptied cluster)."""
    if not applies(protocol):
        return None
    ids = sorted(replies)
    centers = [replies[z].centers for z in ids]
    if any(c.dtype != np.float64 for c in centers):
        return None
    counts = [replies[z].counts for z in ids]
    k = protocol.n_clusters
    C = np.concatenate(centers, axis=0)
    if len(C) < k:
        return None
    w = np.concatenate(counts).astype(C.dtype) if protocol.weighted else np.ones(len(C))
    offsets = np.cumsum([0] + [len(c) for c in centers])
    with one_blas_thread():
        seed_pos = pick_first_device(centers, "widest", None, stacked=C)
        init = farthest_first(C, k, start=np.arange(offsets[seed_pos], offsets[seed_pos + 1]))
        labels0 = assign(C, C[init])[0]
    weights = np.bincount(labels0, weights=w, minlength=k)
    if (weights <= 0).any():   # the server relocated an empty cluster: no downdate
        return None
    sums = sum_by_label(C * w[:, None], labels0, k, np.zeros((k, C.shape[1])))
    final = sums / weights[:, None]
    with one_blas_thread():
        labels, margin = margins(C, final)
    order = np.argsort(margin, kind="stable")
    owner = np.repeat(np.asarray(ids), np.diff(offsets))
    scale = float(np.sqrt((C * C).sum(axis=1).max()))
    return _with_start(Lloyd1Trace(
        list(ids), offsets, {z: i for i, z in enumerate(ids)}, owner, C, w,
        np.ones(len(C), bool), int(ids[seed_pos]), owner[init], C[init].copy(), labels0, sums,
        weights, final, labels, order, margin[order], np.argsort(order), labels.copy(),
        CERTIFY_SLACK * np.sqrt(C.shape[1] + 4.0) * scale,
        dict(zip(ids, centers)), dict(zip(ids, counts)),
        {z: labels[offsets[i]:offsets[i + 1]] for i, z in enumerate(ids)}),
        init, offsets[seed_pos + 1] - offsets[seed_pos])


def _with_start(tr: Lloyd1Trace, init: np.ndarray, n_seed: int) -> Lloyd1Trace:
    """``tr`` with its farthest-first rows and each step's largest distance (the pick's
    distance to the rows chosen before it, up to rounding)."""
    from ..core.kmeans import squared_distances

    D = np.minimum.accumulate(squared_distances(tr.C, tr.C[init]), axis=1)
    tr.init = np.asarray(init, np.int64)
    tr.ff_max = np.full(len(init), -np.inf)
    for t in range(min(int(n_seed), len(init)), len(init)):
        tr.ff_max[t] = D[init[t], t - 1]
    return tr


def downdate(protocol: Any, trace: Lloyd1Trace, replies: dict[int, Any],
             drop: Sequence[int], enter: dict[int, Any] | None = None
             ) -> tuple[Any, Lloyd1Trace] | None:
    """``(KFedResult, new trace)`` of the server step without the devices ``drop``, or
    None where the full step must run (the seed device or a picked center leaves, a
    cluster empties). ``replies``: the kept replies of every device of the trace,
    the leaving ones included (their rows are subtracted). ``enter``: {device: its new
    reply} after a row deletion there (:mod:`fedclust.kfed.downdate_rows`): its old
    pieces leave and the new ones take their slots."""
    gone = {int(z) for z in drop}
    if not gone and not enter or trace.seed in gone or gone & set(trace.picked.tolist()):
        return None
    if replies.keys() != trace.local_centers.keys():
        return None
    k = len(trace.weights)
    sums, weights, alive = trace.sums.copy(), trace.weights.copy(), trace.alive.copy()
    e = None
    if enter:
        e = entering(trace, enter, gone, protocol.weighted)
        if e is None:
            return None
        np.subtract.at(sums, trace.labels0[e.rows], trace.C[e.rows] * trace.w[e.rows, None])
        weights -= np.bincount(trace.labels0[e.rows], weights=trace.w[e.rows], minlength=k)
        np.add.at(sums, e.labels0, e.C * e.w[:, None])
        weights += np.bincount(e.labels0, weights=e.w, minlength=k)
    for z in sorted(gone):
        i = trace.row_of[z]
        a, b = int(trace.offsets[i]), int(trace.offsets[i + 1])
        alive[a:b] = False
        lab, w = trace.labels0[a:b], trace.w[a:b]
        np.subtract.at(sums, lab, trace.C[a:b] * w[:, None])
        weights -= np.bincount(lab, weights=w, minlength=k)
    # a cluster that loses 99% of its weight or more: the full step (it relocates an
    # emptied cluster, and a subtraction of almost everything would cost digits)
    if (weights < 1e-2 * trace.weights).any():
        return None
    ref, ref_labels, order, margin_sorted, rank = (trace.ref, trace.ref_labels, trace.order,
                                                   trace.margin_sorted, trace.rank)
    labels0, C, w = trace.labels0, trace.C, trace.w
    if e is not None:   # the new pieces into their slots, with their margins at ref
        labels0, ref_labels, order, margin_sorted, rank = write(trace, e)
    final = sums / weights[:, None]
    # labels: certified by margin > 2 x the largest shift since the reference (+ slack)
    shift = float(np.sqrt(((final - trace.ref) ** 2).sum(axis=1).max()))
    cut = int(np.searchsorted(margin_sorted, 2.0 * shift + trace.slack, side="right"))
    doubt = order[:cut]
    doubt = doubt[alive[doubt]]
    if len(doubt) > REFRESH_SHARE * alive.sum():   # the reference is stale: renew it
        rows = np.flatnonzero(alive)
        with one_blas_thread():
            lab, margin = margins(trace.C[rows], final)
        ref, ref_labels = final, ref_labels.copy()
        ref_labels[rows] = lab
        full_margin = np.full(len(alive), np.inf)   # gone rows are never in doubt
        full_margin[rows] = margin
        order = np.argsort(full_margin, kind="stable")
        margin_sorted = full_margin[order]
        labels, rechecked = ref_labels.copy(), len(rows)
    else:   # a few rows: one small product, no thread-pool switch
        labels = ref_labels.copy()
        labels[doubt] = assign(trace.C[doubt], final)[0] if len(doubt) else labels[doubt]
        rechecked = len(doubt)
    ids = [z for z in trace.ids if z not in gone]
    tables = [dict(trace.local_centers), dict(trace.local_counts), dict(trace.center_labels)]
    for table in tables:   # a copy less the leaving devices: no pass over every device
        for z in gone:
            del table[z]
    local_centers, local_counts, center_labels = tables
    if ref is trace.ref:
        # the leaving rows' margins: the neighbour's (the order stays sorted; those rows
        # are never read again), so that nothing of the leaving devices stays here
        margin_sorted = margin_sorted.copy()
        for p in np.sort(rank[~alive & trace.alive]):
            margin_sorted[p] = margin_sorted[p - 1] if p else -np.inf
    else:
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
    # only the devices whose centers changed label (or their values) get new arrays
    moved = set(np.unique(trace.owner[(labels != trace.labels) & alive]).tolist())
    if e is not None:
        moved |= set(enter)
        local_centers.update({z: enter[z].centers for z in enter})
        local_counts.update({z: enter[z].counts for z in enter})
    for z in sorted(moved):
        i = trace.row_of[z]
        lo, hi = trace.offsets[i], trace.offsets[i + 1]
        center_labels[z] = labels[lo:hi][alive[lo:hi]]
    result = forget_result(protocol, replies, ids, final, local_centers, local_counts,
                           center_labels, trace.seed, 1)
    new = Lloyd1Trace(ids, trace.offsets, trace.row_of, trace.owner, trace.C, trace.w, alive,
                      trace.seed, trace.picked, trace.start, labels0, sums, weights, ref,
                      ref_labels, order, margin_sorted, rank, labels, trace.slack,
                      local_centers, local_counts, center_labels, rechecked,
                      [(int(trace.offsets[trace.row_of[z]]),
                        int(trace.offsets[trace.row_of[z] + 1])) for z in gone],
                      trace.init, trace.ff_max)
    return result, new
