"""The weighted k-means++ server with removal-stable seeding, and its certified forget.

``server="weighted-kmeans++-keyed"`` is the default server's algorithm (farthest-first
start plus :data:`~fedclust.kfed.server.KMEANS_PP_INIT` weighted k-means++ starts,
weighted Lloyd to convergence from each, the lowest weighted cost kept by strict ``<``)
with one change: the k-means++ candidates are drawn so that removing a device moves
no other device's draw. At step t of start s, device center i (device z, center j)
gets the key ``-log(u) / p_i`` with ``u`` keyed by (run seed, z, j, s, t) and ``p_i``
its weight times its squared distance to the chosen seeds; the ``2 + log k`` smallest
keys are the candidates (sampling proportional to p without replacement) and the one
that lowers the potential most is the seed.

Forgetting devices (:func:`keyed_forget`) follows the fit's trace instead of running
the step again, start by start:

* seeds: a start keeps its seeds when no leaving row was a seed or a candidate and at
  every step the pick's potential stays below every other candidate's after the
  leaving rows' exact share is taken off, by more than a rounding slack;
* Lloyd: per iteration the cluster sums lose the leaving rows' share; a remaining row
  labelled a keeps its label while its margin to its runner-up r exceeds the shifts of
  a and r since the fit, and its margin to the third-nearest center exceeds a's shift
  plus the largest shift, each plus :data:`~fedclust.kfed.downdate.CERTIFY_SLACK`'s
  allowance; the others are assigned again and the sums corrected. Lloyd's stop rules
  (labels unchanged, shift at most ``tol`` times the variance, ``max_iter``) are decided
  again, each only with a margin over rounding;
* a start whose trace cannot be followed (a leaving seed or farthest-first pick, a near
  tie, a stop rule within rounding, a run that goes on where the fit's stopped) is run
  again in full over the remaining rows, stacked as a fresh step stacks them, so it
  gives the fresh step's bits; it is traced as it runs, for the next forget;
* the lowest cost between starts by strict ``<``, only with a margin over rounding.

The explanation warning is worked out from the stacked summaries: a device center's
flag (its final center farther than its RMS radius) is kept from a reference while its
gap to the threshold exceeds its center's shift since then. A near tie between two
starts' costs (or a start that cannot be traced) returns None: the server's step then
runs in full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..core.kmeans import BLOCK, lloyd, squared_distances, sum_by_label, update_centers
from ..core.random import key_uniforms, row_keys as _row_keys
from .downdate import CERTIFY_SLACK, forget_result, plain_step
from .server import (KEYED_SERVERS, KMEANS_PP_INIT, POORLY_EXPLAINED_SHARE, explanation_message,
                     farthest_first, pick_first_device)

__all__ = ["keyed_kmeans_plusplus", "keyed_weighted_kmeans", "KeyedTrace", "keyed_trace",
           "keyed_forget", "KEYED_SERVER"]

KEYED_SERVER = "weighted-kmeans++-keyed"
_KEY_BRANCH = np.uint64(0x6B657965645F7070)   # the seeding's own stream
#: a row is assigned again at most this share of the rows per iteration; beyond, full step
_DOUBT_SHARE = 1.0
#: candidates kept per k-means++ step beyond the L drawn: a leaving device's candidate is
#: replaced by the next key
SPARE = 4


#: candidates per k-means++ step: 1 is plain k-means++ (one draw proportional to
#: weight x D²), whose seeds change on a forget only where a leaving row was one; None
#: is scikit-learn's greedy ``2 + log k`` (the pick among candidates whose potentials
#: differ by less than one device's share moves on most forgets: measured 6 of 40 certified
#: at 1,000 devices, against 26 of 40 with 1)
TRIALS: int | None = 1


def n_trials(k: int) -> int:
    return 2 + int(np.log(k)) if TRIALS is None else int(TRIALS)


def row_keys(seed: int, owner: np.ndarray, local_index: np.ndarray) -> np.ndarray:
    """A uint64 key per device center from (run seed, device id, its index on the device),
    on the seeding's own stream."""
    return _row_keys(seed, owner, local_index, _KEY_BRANCH)


def _smallest(keys: np.ndarray, L: int) -> np.ndarray:
    """Rows of the L smallest finite keys, by (key, row): independent of removed rows."""
    finite = np.flatnonzero(np.isfinite(keys))
    if len(finite) <= L:
        sel = finite
    else:
        part = finite[np.argpartition(keys[finite], L - 1)[:L]]
        thr = keys[part].max()
        sel = np.flatnonzero(keys <= thr)
    sel = sel[np.lexsort((sel, keys[sel]))]
    return sel[:L]


def keyed_kmeans_plusplus(C, k, w, c_sq, keys, start, spare=0):
    """Greedy weighted k-means++ with keyed candidates. Returns ``(seeds (k,), cand (k, M),
    pots (k, M), pick (k,))`` with M = L + ``spare``: per step the M smallest keys in key
    order (-1 padded; row 0 holds the first seed), the potential after adding each, and
    the position of the pick (among the first L), or None where every row coincides with
    a seed before k are chosen."""
    L = n_trials(k)
    M = L + spare
    seeds = np.empty(k, dtype=np.int64)
    cand = np.full((k, M), -1, dtype=np.int64)
    pots = np.full((k, M), np.inf)
    pick = np.zeros(k, dtype=np.int64)
    with np.errstate(divide="ignore"):
        first = _smallest(-np.log(key_uniforms(keys, start, 0)) / w, 1)
    seeds[0] = cand[0, 0] = first[0]
    closest = squared_distances(C, C[first[:1]], c_sq)[:, 0]
    for t in range(1, k):
        p = closest * w
        if not (p > 0).any():
            return None
        with np.errstate(divide="ignore"):
            key = np.where(p > 0, -np.log(key_uniforms(keys, start, t)) / np.where(p > 0, p, 1.0),
                           np.inf)
        c = _smallest(key, M)
        d_cand = np.minimum(closest[:, None], squared_distances(C, C[c], c_sq))
        pt = w @ d_cand
        b = int(np.argmin(pt[:L]))
        cand[t, :len(c)], pots[t, :len(c)], pick[t] = c, pt, b
        seeds[t] = c[b]
        closest = d_cand[:, b]
    return seeds, cand, pots, pick


def _starts(C, k, w, c_sq, centers, owner, local_index, seed, spare=0):
    pos = pick_first_device(centers, "widest", None, stacked=C)
    offsets = np.cumsum([0] + [len(c) for c in centers])
    ff = farthest_first(C, k, start=np.arange(offsets[pos], offsets[pos + 1]))
    keys = row_keys(seed, owner, local_index)
    pp = [keyed_kmeans_plusplus(C, k, w, c_sq, keys, s, spare) for s in range(KMEANS_PP_INIT)]
    return pos, ff, pp


def keyed_weighted_kmeans(C, k, w, centers, device_ids, seed, *, max_iter, tol):
    """The server's step: the best of the farthest-first and keyed k-means++ starts."""
    owner = np.repeat(np.asarray(device_ids, dtype=np.int64), [len(c) for c in centers])
    local_index = np.concatenate([np.arange(len(c)) for c in centers])
    c_sq = (C * C).sum(axis=1)
    c_var = C.var(axis=0).mean() if C.shape[0] > 1 else 0.0
    _, ff, pp = _starts(C, k, w, c_sq, centers, owner, local_index, seed)
    best, seen = None, []
    for idx in [ff] + [p[0] if p is not None else None for p in pp]:
        if idx is None:   # fewer distinct rows than k: the farthest-first start alone
            continue
        res = lloyd(C, C[idx], weights=w, max_iter=max_iter, tol=tol, x_sq=c_sq, x_var=c_var)
        # a start that ends in an earlier start's partition (its clusters numbered
        # otherwise) is that start again: only the first of them competes
        part = canonical(res.labels)
        if any(np.array_equal(part, q) for q in seen):
            continue
        seen.append(part)
        if best is None or res.inertia < best.inertia:
            best = res
    return best


def canonical(labels: np.ndarray) -> np.ndarray:
    """The partition of ``labels`` with clusters numbered by first appearance."""
    n = len(labels)
    k = int(labels.max()) + 1 if n else 0
    present = np.bincount(labels, minlength=k) > 0
    first = np.full(k, n)
    head = 0
    while head < n:   # the first appearances usually lie in a short head of the rows
        size = max(4 * k, 2 * head, 256)
        block = labels[head:head + size]
        hit = block[:, None] == np.arange(k)
        found = hit.any(axis=0) & (first == n)
        first[found] = head + hit.argmax(axis=0)[found]
        if (first < n)[present].all():
            break
        head += size
    rank = np.empty(k, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(k)
    return rank[labels]


def pick_start(parts, inertia, err=0.0) -> int | None:
    """The start the server keeps: the lowest inertia among the first start of each
    partition by strict ``<``; None where two partitions' inertias are within ``err``."""
    reps = []
    for s, part in enumerate(parts):
        if not any(np.array_equal(part, parts[r]) for r in reps):
            reps.append(s)
    b = min(reps, key=lambda r: (inertia[r], r))
    if any(r != b and inertia[r] <= inertia[b] + err for r in reps):
        return None
    return b


# --------------------------------------------------------------------------- the trace
@dataclass
class _Run:
    """One start's weighted Lloyd: centers c_t (T+1, k, d), labels A_t = nearest c_t
    (T+1, N), the sums/weights/squared norms of A_t's clusters (less the forgotten rows),
    rows that moved between A_{t-1} and A_t, each row's margin under c_t (sorted, per t)."""

    cs: np.ndarray
    A: np.ndarray
    S: np.ndarray
    W: np.ndarray
    Q: np.ndarray
    W0: np.ndarray
    moved: list
    order: list
    margin_sorted: list
    reason: str
    runner_up: list = None   # per t (N,) int16: each row's second-nearest center under c_t
    margin3: list = None     # per t (N,): third-nearest minus nearest distance (inf: k < 3)
    rank: list = None        # per t (N,) int32: each row's position in ``order`` (for scrub)


@dataclass
class KeyedTrace:
    ids: list[int]
    offsets: np.ndarray
    row_of: dict[int, int]
    owner: np.ndarray
    C: np.ndarray
    w: np.ndarray
    alive: np.ndarray
    seed_device: int
    ff_owners: np.ndarray
    seeds: np.ndarray      # (S, k) rows of the keyed starts' seeds
    cand: np.ndarray       # (S, k, L)
    pots: np.ndarray       # (S, k, L) potentials less the forgotten rows' shares
    pick: np.ndarray       # (S, k)
    runs: list[_Run]
    xsum: np.ndarray       # (d,) and (d,): per-feature sums over the remaining rows
    xsq: np.ndarray
    slack: float
    scale2: float
    max_iter: int
    tol: float
    local_centers: dict
    local_counts: dict
    center_labels: dict
    rechecked: int = 0
    #: why the last forget ran the step in full (None after a certified one)
    fallback: str | None = None
    seed: int = 0
    keys: np.ndarray | None = None   # (N0,) uint64 row keys of the keyed draws
    #: starts the last forget ran again in full over the remaining rows, with the reason
    #: their trace could not be followed (0: the farthest-first start, s + 1: keyed start s)
    reruns: dict = None
    scatter: np.ndarray | None = None   # (N0,) each device center's scatter (its summary)
    expl: Any = None   # _Explained: the explanation warning's reference
    newly: np.ndarray | None = None   # rows the last forget removed (None: every dead row)

    def scrub(self) -> None:
        """Wipe what the trace held of the forgotten rows: their centers, weights, labels
        and margins (a margin becomes its sorted neighbour's, so the order stays sorted;
        those rows are never read again). Only the rows of the last forget are visited."""
        dead = ~self.alive
        gone = np.flatnonzero(dead) if self.newly is None else self.newly
        self.newly = np.empty(0, np.int64)
        if not len(gone):
            return
        self.C[gone] = 0.0
        self.w[gone] = 0.0
        if self.keys is not None:
            self.keys[gone] = 0
        if self.scatter is not None:
            self.scatter[gone] = 0.0
        for r in self.runs:
            r.A[:, gone] = 0
            if r.rank is None:
                r.rank = [_rank(o) for o in r.order]
            for m, o, rank, r2, m3 in zip(r.margin_sorted, r.order, r.rank, r.runner_up,
                                          r.margin3):
                _wipe_sorted(m, np.sort(rank[gone]), o, dead)
                r2[gone] = 0
                m3[gone] = 0.0
        ex = self.expl
        if ex is not None:
            ex.labels[gone] = 0
            ex.bad[gone] = False
            if ex.rank is None:
                ex.rank = _rank(ex.order)
            _wipe_sorted(ex.gap_sorted, np.sort(ex.rank[gone]), ex.order, dead)


def _rank(order: np.ndarray) -> np.ndarray:
    """Each row's position in ``order``."""
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return rank


def _wipe_sorted(m: np.ndarray, pos: np.ndarray, order: np.ndarray, dead: np.ndarray) -> None:
    """Give the sorted positions ``pos`` (increasing), and the earlier wiped positions
    just above them, the value of the nearest lower remaining row (-inf at the head): the
    array stays sorted and holds nothing of the removed rows."""
    n = len(m)
    for p in pos.tolist():
        v = m[p - 1] if p else -np.inf
        m[p] = v
        j = p + 1
        while j < n and dead[order[j]]:
            m[j] = v
            j += 1


#: two squared distances closer than this share of ``|x|^2 + max |c|^2`` may compare
#: otherwise in a fresh run (its rounding, and the downdated centers' 1e-13 or so)
TIE_RTOL = 1e-10


#: a center shift this close (relative) to ``tol`` times the variance decides Lloyd's stop
#: otherwise in a fresh run only by rounding
SHIFT_RTOL = 1e-12


def _labels_or_tie(X, centers) -> tuple[np.ndarray, bool]:
    """Nearest center of each row, and whether some row's nearest and second-nearest
    squared distances are within rounding (a fresh run might pick the other)."""
    x_sq = np.einsum("ij,ij->i", X, X)
    D = x_sq[:, None] - 2.0 * (X @ centers.T) + np.einsum("ij,ij->i", centers, centers)
    if D.shape[1] == 1:
        return np.zeros(len(X), dtype=np.int64), False
    two = np.partition(D, 1, axis=1)[:, :2]
    scale = x_sq + np.einsum("ij,ij->i", centers, centers).max()
    return D.argmin(axis=1), bool((two[:, 1] - two[:, 0] <= TIE_RTOL * scale).any())


def _assign_margin(X, centers, x_sq):
    """:func:`assign`'s labels (the same blocks and expression, so the same bits), each
    row's margin (second-nearest minus nearest distance), its second-nearest center and
    the third-nearest minus nearest distance, from the same distances."""
    n, k = len(X), len(centers)
    labels = np.empty(n, dtype=np.int64)
    margin = np.full(n, np.inf)
    margin3 = np.full(n, np.inf)
    runner = np.zeros(n, dtype=np.int64)
    c_sq = (centers * centers).sum(axis=1)
    for start in range(0, n, BLOCK):
        D = x_sq[start:start + BLOCK][:, None] - 2.0 * (X[start:start + BLOCK] @ centers.T) \
            + c_sq[None, :]
        lab = D.argmin(axis=1)
        labels[start:start + BLOCK] = lab
        if k > 1:
            np.maximum(D, 0.0, out=D)
            m = min(k, 3)
            idx = np.argpartition(D, m - 1, axis=1)[:, :m]
            val = np.take_along_axis(D, idx, axis=1)
            o = np.argsort(val, axis=1, kind="stable")
            idx = np.take_along_axis(idx, o, axis=1)
            val = np.sqrt(np.take_along_axis(val, o, axis=1))
            block = slice(start, start + len(D))
            margin[block] = val[:, 1] - val[:, 0]
            # the runner-up: the nearer of the two first that is not the label (with a
            # tie for nearest the margin is 0 and the row is always assigned again)
            runner[block] = np.where(idx[:, 0] == lab, idx[:, 1], idx[:, 0])
            if m == 3:
                margin3[block] = val[:, 2] - val[:, 0]
    return labels, margin, runner, margin3


def _traced_lloyd(C, init, w, Cw, c_sq, c_var, max_iter, tol):
    """:func:`lloyd`'s loop (same kernels, same bits) keeping what a forget needs; None
    where it relocated an emptied cluster."""
    k = len(init)
    centers = np.array(init, dtype=C.dtype, copy=True)
    abs_tol = tol * c_var
    cs, A, mm, labels, reason = [centers], [], [], None, "max_iter"
    r2s, m3s = [], []
    for _ in range(max_iter):
        new_labels, margin, r2, m3 = _assign_margin(C, centers, c_sq)
        A.append(new_labels)
        mm.append(margin)
        r2s.append(r2.astype(np.int16))
        m3s.append(m3)
        if labels is not None and np.array_equal(new_labels, labels):
            reason = "labels"
            break
        labels = new_labels
        new_centers, counts = update_centers(C, labels, k, w, centers, Cw)
        if (counts == 0).any():
            return None
        shift = ((new_centers - centers) ** 2).sum()
        centers = new_centers
        cs.append(centers)
        if shift <= abs_tol:
            reason = "shift"
            break
    if reason != "labels":
        lab, margin, r2, m3 = _assign_margin(C, centers, c_sq)
        A.append(lab)
        mm.append(margin)
        r2s.append(r2.astype(np.int16))
        m3s.append(m3)
    A = np.stack(A)
    T1, d = len(cs), C.shape[1]
    S, W, Q = np.zeros((T1, k, d)), np.zeros((T1, k)), np.zeros((T1, k))
    wq = w * c_sq
    for t in range(T1):
        sum_by_label(Cw, A[t], k, S[t])
        W[t] = np.bincount(A[t], weights=w, minlength=k)
        Q[t] = np.bincount(A[t], weights=wq, minlength=k)
    moved = [np.empty(0, np.int64)] + [np.flatnonzero(A[t] != A[t - 1]) for t in range(1, T1)]
    order = [np.argsort(m, kind="stable").astype(np.int32) for m in mm]
    run = _Run(np.stack(cs), A.astype(np.int16), S, W, Q, W.copy(), moved, order,
               [m[o] for m, o in zip(mm, order)], reason, r2s, m3s)
    return run


def applies(protocol: Any) -> bool:
    """The protocol's server is the keyed one and nothing else changes its step."""
    return plain_step(protocol, KEYED_SERVER)


def keyed_trace(protocol: Any, replies: dict[int, Any], seed: int) -> KeyedTrace | None:
    """The trace of the keyed server's step over ``replies``, or None where no forget can
    follow it (float32, an emptied cluster, fewer distinct rows than k)."""
    if not applies(protocol):
        return None
    ids = sorted(replies)
    centers = [replies[z].centers for z in ids]
    if any(c.dtype != np.float64 for c in centers) or protocol.n_clusters > 32000:
        return None
    counts = [replies[z].counts for z in ids]
    k = protocol.n_clusters
    C = np.concatenate(centers, axis=0)
    w = np.concatenate(counts).astype(np.float64)
    offsets = np.cumsum([0] + [len(c) for c in centers])
    owner = np.repeat(np.asarray(ids, dtype=np.int64), np.diff(offsets))
    local_index = np.concatenate([np.arange(len(c)) for c in centers])
    c_sq = (C * C).sum(axis=1)
    c_var = C.var(axis=0).mean() if C.shape[0] > 1 else 0.0
    pos, ff, pp = _starts(C, k, w, c_sq, centers, owner, local_index, seed, SPARE)
    if any(p is None for p in pp):
        return None
    Cw = C * w[:, None]
    runs = []
    for idx in [ff] + [p[0] for p in pp]:
        run = _traced_lloyd(C, C[idx], w, Cw, c_sq, c_var, protocol.max_iter, protocol.tol)
        if run is None:
            return None
        runs.append(run)
    scale2 = float(c_sq.max())
    return KeyedTrace(
        list(ids), offsets, {z: i for i, z in enumerate(ids)}, owner, C, w,
        np.ones(len(C), bool), int(ids[pos]), owner[ff],
        np.stack([p[0] for p in pp]), np.stack([p[1] for p in pp]),
        np.stack([p[2] for p in pp]), np.stack([p[3] for p in pp]), runs,
        C.sum(axis=0), (C * C).sum(axis=0), CERTIFY_SLACK * np.sqrt(C.shape[1] + 4.0)
        * np.sqrt(scale2), scale2, protocol.max_iter, protocol.tol,
        dict(zip(ids, centers)), dict(zip(ids, counts)), {}, seed=int(seed),
        keys=row_keys(seed, owner, local_index), reruns={},
        scatter=_stacked_scatter(replies, ids, len(C)))


def _stacked_scatter(replies: dict[int, Any], ids: list[int], n: int) -> np.ndarray | None:
    sc = [getattr(replies[z], "scatter", None) for z in ids]
    if any(x is None for x in sc):
        return None
    out = np.concatenate([np.asarray(x, dtype=np.float64) for x in sc])
    return out if len(out) == n else None


@dataclass
class _Explained:
    """Which device centers their final center explained poorly at a reference (centers
    ``ref``, labels ``labels``), with each row's gap ``sqrt(delta2) - sqrt(r2)`` sorted by
    size: a row whose label stays keeps its flag while ``|gap|`` exceeds its center's shift
    since the reference plus the rounding slack."""

    ref: np.ndarray
    labels: np.ndarray
    bad: np.ndarray
    order: np.ndarray
    gap_sorted: np.ndarray
    rank: np.ndarray | None = None


def _poorly(tr: KeyedTrace, rows: np.ndarray, r2: np.ndarray, final: np.ndarray,
            labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~fedclust.kfed.server.poorly_explained`'s flag (the same per-row arithmetic)
    and the gap of the rows ``rows``."""
    delta2 = ((tr.C[rows] - final[labels[rows]]) ** 2).sum(axis=1)
    return delta2 > r2, np.sqrt(delta2) - np.sqrt(r2)


def _warning(tr: KeyedTrace, alive: np.ndarray, final: np.ndarray, labels: np.ndarray):
    """``(warning, reference)``: :func:`~fedclust.kfed.server.explanation_warning` over the
    remaining rows, from the stacked summaries (its sums are of integer counts, exact in any
    order), the flags of rows far from the threshold kept from the reference; warning False
    where the trace lacks the scatter."""
    if tr.scatter is None:
        return False, None
    n = tr.w
    multi = n > 1
    r2 = np.maximum(tr.scatter, 0.0) / np.where(n > 0, n, 1.0)
    spread = alive & multi
    single = np.flatnonzero(alive & ~multi)
    if len(single) and spread.any():   # the median of the others' r2 stands in for theirs
        r2 = np.where(multi, r2, np.median(r2[spread]))
    ex = tr.expl
    if ex is None:   # the reference: every row once (a single's gap -inf: always again)
        rows = np.flatnonzero(alive)
        bad_rows, gap = _poorly(tr, rows, r2[rows], final, labels)
        bad = np.zeros(len(alive), bool)
        bad[rows] = bad_rows
        full = np.full(len(alive), -np.inf)
        full[rows] = np.where(multi[rows], np.abs(gap), -np.inf)
        order = np.argsort(full, kind="stable")
        ex = _Explained(final.copy(), labels.copy(), bad, order, full[order])
    else:
        shift = np.sqrt(((final - ex.ref) ** 2).sum(axis=1))
        cut = int(np.searchsorted(ex.gap_sorted, float(shift.max()) + tr.slack, side="right"))
        rows = np.union1d(np.union1d(ex.order[:cut], np.flatnonzero(labels != ex.labels)),
                          single)
        rows = rows[alive[rows]]
        bad = ex.bad.copy()
        bad[rows] = _poorly(tr, rows, r2[rows], final, labels)[0]
    keep = bad & alive
    n_bad, n_all = float(n[keep].sum()), float(n[alive].sum())
    if n_all <= 0 or n_bad <= POORLY_EXPLAINED_SHARE * n_all:
        return None, ex
    devs = np.unique(tr.owner[keep])   # ids are sorted: the fit's device order
    return explanation_message(n_bad, n_all, devs.tolist(), len(final)), ex


def best_of(runs) -> int | None:
    inert = [_inertia(r.cs[-1], r.S[-1], r.W[-1], r.Q[-1]) for r in runs]
    err = 1e-10 * max(float(sum(r.Q[-1].sum() for r in runs)), 1e-300)
    return pick_start([canonical(r.A[-1]) for r in runs], inert, err)


def _inertia(c, S, W, Q):
    return float(Q.sum() - 2.0 * np.einsum("kd,kd->", c, S) + W @ (c * c).sum(axis=1))


class _Full(Exception):
    """The forget cannot be certified: the server's step runs in full."""


def _seeds_stable(tr: KeyedTrace, R: np.ndarray, alive: np.ndarray):
    """The keyed starts' potentials less the rows ``R``'s exact share, and per start why
    its seeds could change (None where they cannot). ``alive``: the rows that remain."""
    S, k, M = tr.cand.shape
    L = n_trials(k)
    CR, wR = tr.C[R], tr.w[R]
    Dseed = squared_distances(CR, tr.C[tr.seeds.ravel()]).reshape(len(R), S, k)
    before = np.minimum.accumulate(Dseed, axis=2)   # min over seeds 0..t
    before = np.concatenate([np.full((len(R), S, 1), np.inf), before[:, :, :-1]], axis=2)
    valid = tr.cand >= 0
    cand = np.where(valid, tr.cand, 0)
    Dc = squared_distances(CR, tr.C[cand.ravel()]).reshape(len(R), S, k, M)
    share = np.einsum("r,rskm->skm", wR, np.minimum(before[..., None], Dc))
    pots = np.where(valid, tr.pots - share, np.inf)
    # the new candidates: the first L remaining of the kept key order
    left = valid & alive[cand]
    rank = np.cumsum(left, axis=2)
    inset = left & (rank <= L)
    short = ((left.sum(axis=2) < L) & (valid.sum(axis=2) == M))[:, 1:].any(axis=1)
    cmp = np.where(inset, pots, np.inf)[:, 1:]
    b = np.take_along_axis(cmp, tr.pick[:, 1:, None], axis=2)[..., 0]
    np.put_along_axis(cmp, tr.pick[:, 1:, None], np.inf, axis=2)
    slack = 1e-9 * np.abs(np.where(valid, tr.pots, 0.0)[:, 1:]).max(initial=0.0) \
        + 1e-13 * (tr.C.shape[1] + 4) * tr.scale2 * float(tr.w.sum())
    near = (cmp.min(axis=2) <= b + slack).any(axis=1)
    held = ~alive[tr.seeds].all(axis=1)
    why = [("a leaving device holds a k-means++ seed" if held[s] else
            "a leaving candidate and no spare key left" if short[s] else
            "a leaving device's share changes or nearly changes a k-means++ pick" if near[s]
            else None) for s in range(S)]
    return pots, why


def _replay(tr: KeyedTrace, run: _Run, var: float, var_err: float):
    """The start's Lloyd without the forgotten rows: ``(centers, (rows, labels) whose label
    differs from the fit's, t_final, (S, W, Q) per t, rechecked)``; raises _Full where not
    certified. ``run``: the fit's run with its statistics less the forgotten rows
    (:func:`_downdated`)."""
    alive = tr.alive
    T = len(run.cs) - 1
    k = run.cs.shape[1]
    abs_tol = tr.tol * var
    n_alive = int(alive.sum())
    c_t = run.cs[0]
    none = np.empty(0, np.int64)
    prev_rows, prev_lab = none, none
    stop_now = False
    newS, newW, newQ = [], [], []
    rechecked = 0
    for t in range(T + 1):
        # per-center shifts s_j: a row labelled a keeps its label when its margin to the
        # runner-up r exceeds s_a + s_r and its margin to the third exceeds s_a + max s
        # (triangle inequality), plus the rounding slack; the sorted margins give the rows
        # that could fail the coarser 2 max s first
        sj = np.sqrt(((c_t - run.cs[t]) ** 2).sum(axis=1))
        s = float(sj.max())
        cut = int(np.searchsorted(run.margin_sorted[t], 2.0 * s + tr.slack, side="right"))
        doubt = run.order[t][:cut].astype(np.int64)
        a = run.A[t, doubt].astype(np.int64)
        r = run.runner_up[t][doubt].astype(np.int64)
        third = run.margin3[t][doubt] > sj[a] + s + tr.slack
        sure = (run.margin_sorted[t][:cut] > sj[a] + sj[r] + tr.slack) & third
        keep = ~sure & alive[doubt]
        # where only the runner-up is in doubt, its distance and the label's are measured
        # at the current centers (two distances instead of k)
        pair = keep & third
        if pair.any():
            rows = doubt[pair]
            X = tr.C[rows]
            da = np.sqrt(((X - c_t[a[pair]]) ** 2).sum(axis=1))
            dr = np.sqrt(((X - c_t[r[pair]]) ** 2).sum(axis=1))
            keep[np.flatnonzero(pair)[dr - da > tr.slack]] = False
        doubt, a = doubt[keep], a[keep]
        if len(doubt) > _DOUBT_SHARE * n_alive:
            raise _Full("too many rows to assign again")
        rechecked += len(doubt)
        ov_rows, ov_lab = none, none
        Sx, Wx, Qx = run.S[t], run.W[t], run.Q[t]
        if len(doubt):
            Cd = tr.C[doubt]
            lab, tie = _labels_or_tie(Cd, c_t)
            if tie:
                raise _Full("a reassigned row's nearest centers tie within rounding")
            chg = lab != a
            if chg.any():
                ov_rows, ov_lab, old = doubt[chg], lab[chg], a[chg]
                # the cluster statistics of the new labels A'_t
                wv = tr.w[ov_rows]
                cw = Cd[chg] * wv[:, None]
                q = wv * (Cd[chg] ** 2).sum(axis=1)
                to = np.concatenate([ov_lab, old])
                Sx = Sx.copy()
                np.add.at(Sx, to, np.concatenate([cw, -cw]))
                Wx = Wx + np.bincount(to, weights=np.concatenate([wv, -wv]), minlength=k)
                Qx = Qx + np.bincount(to, weights=np.concatenate([q, -q]), minlength=k)
        newS.append(Sx), newW.append(Wx), newQ.append(Qx)
        if stop_now:
            return c_t, (ov_rows, ov_lab), t, (newS, newW, newQ), rechecked
        if t >= 1:   # Lloyd's first stop rule: labels unchanged
            mv = run.moved[t]
            mv = mv[alive[mv]]
            if len(ov_rows) or len(prev_rows):
                touched = np.union1d(ov_rows, prev_rows)
                moved_new = len(np.setdiff1d(mv, touched, assume_unique=True)) > 0
                if not moved_new:
                    cur = run.A[t, touched].astype(np.int64)
                    cur[np.searchsorted(touched, ov_rows)] = ov_lab
                    before = run.A[t - 1, touched].astype(np.int64)
                    before[np.searchsorted(touched, prev_rows)] = prev_lab
                    moved_new = bool((cur != before).any())
            else:
                moved_new = len(mv) > 0
            if not moved_new:
                return c_t, (ov_rows, ov_lab), t, (newS, newW, newQ), rechecked
            if t == T:
                raise _Full("the fit's run stopped with its labels, this one goes on")
        if t == T:
            raise _Full       # (not reached: the fit's stops set stop_now below)
        if (Wx <= 1e-2 * run.W0[t]).any():
            raise _Full("the fit's run ended here")
        c_next = Sx / Wx[:, None]
        shift = float(((c_next - c_t) ** 2).sum())
        err = 2.0 * np.sqrt(shift) * 1e-10 * np.sqrt(tr.scale2 * k) + 1e-20 * tr.scale2 * k \
            + tr.tol * var_err + SHIFT_RTOL * max(shift, abs_tol)
        if abs(shift - abs_tol) <= err:
            raise _Full("a center shift within rounding of tol x variance")
        new_stop = shift <= abs_tol
        old_stop = t + 1 == T and run.reason == "shift"
        if old_stop and not new_stop:
            raise _Full("the fit's run stopped by its shift, this one goes on")
        stop_now = new_stop or t + 1 == tr.max_iter
        prev_rows, prev_lab = ov_rows, ov_lab
        c_t = c_next
    raise _Full("the fit's run ended")


@dataclass
class _Remaining:
    """The remaining rows stacked as a fresh step stacks them (same values, same order):
    a start run again over them gives the fresh step's bits."""

    rows: np.ndarray
    C: np.ndarray
    w: np.ndarray
    c_sq: np.ndarray
    c_var: float
    Cw: np.ndarray


def _remaining(tr: KeyedTrace, alive: np.ndarray) -> _Remaining:
    rows = np.flatnonzero(alive)
    C = tr.C[rows]
    w = tr.w[rows]
    return _Remaining(rows, C, w, (C * C).sum(axis=1),
                      C.var(axis=0).mean() if C.shape[0] > 1 else 0.0, C * w[:, None])


def _expand(run: _Run, rows: np.ndarray, n0: int) -> _Run:
    """A run traced over the remaining rows, indexed by the trace's rows (the others:
    label 0, margin -inf, never read)."""
    T1 = len(run.cs)
    A = np.zeros((T1, n0), dtype=run.A.dtype)
    A[:, rows] = run.A
    order, margin_sorted = [], []
    for o, m in zip(run.order, run.margin_sorted):
        full = np.full(n0, -np.inf)
        full[rows[o]] = m
        oo = np.argsort(full, kind="stable").astype(np.int32)
        order.append(oo)
        margin_sorted.append(full[oo])
    r2s, m3s = [], []
    for r2, m3 in zip(run.runner_up, run.margin3):
        a, b = np.zeros(n0, dtype=r2.dtype), np.zeros(n0)
        a[rows], b[rows] = r2, m3
        r2s.append(a)
        m3s.append(b)
    return _Run(run.cs, A, run.S, run.W, run.Q, run.W0, [rows[m] for m in run.moved], order,
                margin_sorted, run.reason, r2s, m3s)


def _rerun(protocol: Any, tr: KeyedTrace, rem: _Remaining, start: int, ids: list[int]):
    """Start ``start`` (0: farthest-first, s + 1: keyed k-means++ start s) run again in full
    over the remaining rows, as a fresh step runs it: ``(run, seeding)`` with seeding None
    for the farthest-first start, else (seeds, cand, pots, pick) in the trace's rows; or
    raises _Full where no trace can follow it (an emptied cluster, too few rows); the
    farthest-first start also gives (its seed device, the owners of its picks)."""
    k = tr.runs[0].cs.shape[1]
    if start == 0:
        centers = [tr.local_centers[z] for z in ids]
        pos = pick_first_device(centers, "widest", None, stacked=rem.C)
        offsets = np.cumsum([0] + [len(c) for c in centers])
        idx = farthest_first(rem.C, k, start=np.arange(offsets[pos], offsets[pos + 1]))
        seeding = None
    else:
        pp = keyed_kmeans_plusplus(rem.C, k, rem.w, rem.c_sq, tr.keys[rem.rows], start - 1,
                                   SPARE)
        if pp is None:
            raise _Full("fewer distinct rows than k")
        idx = pp[0]
        seeding = (rem.rows[pp[0]], np.where(pp[1] >= 0, rem.rows[np.maximum(pp[1], 0)], -1),
                   pp[2], pp[3])
    run = _traced_lloyd(rem.C, rem.C[idx], rem.w, rem.Cw, rem.c_sq, rem.c_var, tr.max_iter,
                        tr.tol)
    if run is None:
        raise _Full("a start run again emptied a cluster")
    ff = (int(ids[pos]), tr.owner[rem.rows[idx]]) if start == 0 else None
    return _expand(run, rem.rows, len(tr.C)), seeding, ff


#: run the whole step again (every start) rather than follow the trace when more than this
#: many starts cannot be followed
MAX_RERUNS = KMEANS_PP_INIT + 1


def _downdated(run: _Run, R: np.ndarray, CwR: np.ndarray, wR: np.ndarray, qR: np.ndarray,
               k: int) -> _Run:
    """The run's statistics at every iteration less the rows R (their labels unchanged)."""
    T1, d = len(run.cs), run.S.shape[2]
    idx = (np.arange(T1)[:, None] * k + run.A[:, R].astype(np.int64)).ravel()
    S = run.S.reshape(T1 * k, d).copy()
    np.subtract.at(S, idx, np.tile(CwR, (T1, 1)))
    W = run.W.ravel() - np.bincount(idx, weights=np.tile(wR, T1), minlength=T1 * k)
    Q = run.Q.ravel() - np.bincount(idx, weights=np.tile(qR, T1), minlength=T1 * k)
    return _Run(run.cs, run.A, S.reshape(T1, k, d), W.reshape(T1, k), Q.reshape(T1, k),
                run.W0, run.moved, run.order, run.margin_sorted, run.reason, run.runner_up,
                run.margin3, run.rank)


def keyed_forget(protocol: Any, trace: KeyedTrace, replies: dict[int, Any],
                 drop: Sequence[int]):
    """``(KFedResult, new trace)`` of the keyed server without the devices ``drop``, or
    None where the step must run in full.

    Each start follows its trace where it can be certified; a start that cannot (a leaving
    seed or farthest-first pick, a run that goes on where the fit's stopped, a near tie) is
    run again in full over the remaining rows, exactly as a fresh step runs it, and traced
    for the next forget (``new.reruns``)."""
    gone = {int(z) for z in drop}
    trace.fallback = None
    if not gone:
        return None
    if replies.keys() != trace.local_centers.keys() or not gone <= set(trace.ids):
        return None
    if trace.keys is None:
        return None
    R = np.concatenate([np.arange(trace.offsets[trace.row_of[z]],
                                  trace.offsets[trace.row_of[z] + 1]) for z in sorted(gone)])
    alive = trace.alive.copy()
    alive[R] = False
    n = int(alive.sum())
    k = trace.runs[0].cs.shape[1]
    if n < k:
        return None
    ids = [z for z in trace.ids if z not in gone]
    old_alive = trace.alive
    trace.alive = alive
    reruns: dict[int, str] = {}
    try:
        if trace.seed_device in gone or gone & set(trace.ff_owners.tolist()):
            reruns[0] = "a leaving device holds the farthest-first start's seed or a pick"
        pots, why = _seeds_stable(trace, R, alive)
        reruns.update({s + 1: y for s, y in enumerate(why) if y is not None})
        xsum = trace.xsum - trace.C[R].sum(axis=0)
        xsq = trace.xsq - (trace.C[R] ** 2).sum(axis=0)
        var = float(np.mean(np.maximum(xsq / n - (xsum / n) ** 2, 0.0))) if n > 1 else 0.0
        var_err = 1e-10 * float(np.mean(np.abs(xsq))) / n
        outs: dict[int, tuple] = {}
        CwR = trace.C[R] * trace.w[R][:, None]
        qR = trace.w[R] * (trace.C[R] ** 2).sum(axis=1)
        based: dict[int, _Run] = {}
        for s, run in enumerate(trace.runs):
            if s in reruns:
                continue
            based[s] = _downdated(run, R, CwR, trace.w[R], qR, k)
            try:
                outs[s] = _replay(trace, based[s], var, var_err)
            except _Full as exc:
                reruns[s] = exc.args[0] if exc.args else "uncertified"
        if len(reruns) > MAX_RERUNS:
            raise _Full(f"{len(reruns)} starts cannot be followed")
        rem = _remaining(trace, alive) if reruns else None
        new_runs: dict[int, tuple] = {}
        for s in sorted(reruns):
            new_runs[s] = _rerun(protocol, trace, rem, s, ids)
            run = new_runs[s][0]
            T = len(run.cs) - 1
            outs[s] = (run.cs[-1], (np.empty(0, np.int64),) * 2, T, (run.S, run.W, run.Q),
                       n * (T + 1))
        order = range(len(trace.runs))
        inert = [_inertia(outs[s][0], outs[s][3][0][outs[s][2]], outs[s][3][1][outs[s][2]],
                          outs[s][3][2][outs[s][2]]) for s in order]
        err = 1e-10 * max(float(sum(outs[s][3][2][outs[s][2]].sum() for s in order)), 1e-300)
        finals = []
        for s in order:
            _, over, t, _, _ = outs[s]
            run = new_runs[s][0] if s in new_runs else trace.runs[s]
            lab = run.A[t].astype(np.int64)
            lab[over[0]] = over[1]
            finals.append(lab)
        # two runs can end in one partition only with the same cluster weights (sums of
        # integer counts: exact in any order); only those are numbered and compared
        sizes = [tuple(np.sort(outs[s][3][1][outs[s][2]]).tolist()) for s in order]
        parts = [canonical(f[alive]) if sizes.count(sizes[s]) > 1 else np.array([-1 - s])
                 for s, f in enumerate(finals)]
        b = pick_start(parts, inert, err)
        if b is None:
            raise _Full("two starts' costs within rounding")
    except _Full as exc:
        trace.fallback = exc.args[0] if exc.args else "uncertified"
        return None
    finally:
        trace.alive = old_alive
    centers, _, t_f, _, _ = outs[b]
    labels = finals[b]
    local_centers = {z: trace.local_centers[z] for z in ids}
    local_counts = {z: trace.local_counts[z] for z in ids}
    center_labels = {z: labels[trace.offsets[trace.row_of[z]]:trace.offsets[trace.row_of[z] + 1]]
                     for z in ids}
    seed_device, ff_owners = trace.seed_device, trace.ff_owners
    if 0 in new_runs:
        seed_device, ff_owners = new_runs[0][2]
    warning, expl = _warning(trace, alive, centers, labels) if protocol.summarise \
        else (False, None)
    if trace.expl is None:   # the reference serves any later forget of this trace too
        trace.expl = expl
    result = forget_result(protocol, replies, ids, centers.copy(), local_centers, local_counts,
                           center_labels, None, max(t_f, 1), warning)
    # the new trace: the fit's trajectory less every forgotten row (cumulative), and the
    # starts run again as they ran now
    runs = [new_runs[s][0] if s in new_runs else based[s] for s in range(len(trace.runs))]
    seeds, cand, pick = trace.seeds, trace.cand, trace.pick
    if any(s > 0 for s in new_runs):
        seeds, cand, pots, pick = seeds.copy(), cand.copy(), pots.copy(), pick.copy()
        for s, (_, seeding, _) in new_runs.items():
            if s > 0:
                seeds[s - 1], cand[s - 1], pots[s - 1], pick[s - 1] = seeding
    new = KeyedTrace(ids, trace.offsets, trace.row_of, trace.owner, trace.C, trace.w, alive,
                     seed_device, ff_owners, seeds, cand, pots, pick, runs, xsum, xsq,
                     trace.slack, trace.scale2, trace.max_iter, trace.tol, local_centers,
                     local_counts, center_labels, sum(o[4] for o in outs.values()),
                     seed=trace.seed, keys=trace.keys, reruns=reruns, scatter=trace.scatter,
                     expl=expl, newly=R)
    return result, new


KEYED_SERVERS[KEYED_SERVER] = keyed_weighted_kmeans
