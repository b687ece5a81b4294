"""The trace of the keyed weighted k-means++ server's step (:mod:`fedclust.kfed.keyed`):
every start's seeds, candidates and potentials, and every weighted Lloyd iteration's
centers, labels, cluster statistics and each device center's margins, what
:mod:`fedclust.kfed.keyed_unlearn` follows to forget devices without running the step
again; and the model's explanation warning worked out from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.kmeans import BLOCK, sum_by_label, update_centers
from .downdate import CERTIFY_SLACK, plain_step
from .keyed import KEYED_NAMES, SPARE, keyed_starts, canonical, pick_start, row_keys
from .explain import (center_split, poor_answer, poor_answer_message, split_bound,
                      surely_quiet)

__all__ = ["KeyedTrace", "keyed_trace", "applies", "best_of", "stacked"]


@dataclass
class RunTrace:
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
    #: (order, margin_sorted, runner_up, margin3) as (T+1, N) arrays whose rows the lists
    #: above are (views: a scrub of the lists is seen here), and the moved rows flattened
    #: with their iteration: :func:`stacked`
    stack: tuple = None
    #: (N,) each row's squared distance to its nearest seed (its label A_0 under c_0, the
    #: start's seeds), any rounding: bounds a row's distance to the seeds before a
    #: k-means++ step that picked its nearest seed already (:func:`~fedclust.kfed.
    #: keyed_seeding.piece_potentials`)
    d0: np.ndarray = None


def stacked(run: RunTrace) -> tuple:
    """``(order, margin_sorted, runner_up, margin3, moved rows, their t)``: the run's per-t
    lists stacked once (the lists become rows of the stacks), for following every
    iteration of the run at once."""
    if run.stack is None:
        o, m, r, m3 = (np.stack(x) for x in (run.order, run.margin_sorted, run.runner_up,
                                              run.margin3))
        run.order, run.margin_sorted, run.runner_up, run.margin3 = list(o), list(m), list(r), \
            list(m3)
        mv_t = np.repeat(np.arange(len(run.moved)), [len(x) for x in run.moved])
        run.stack = (o, m, r, m3, np.concatenate(run.moved).astype(np.int64), mv_t)
    return run.stack


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
    runs: list[RunTrace]
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
    #: their trace could not be followed (run index: with ``ff_start``, 0 is the
    #: farthest-first start and s + 1 keyed start s; without, s is keyed start s)
    reruns: dict = None
    scatter: np.ndarray | None = None   # (N0,) each device center's scatter (its summary)
    expl: Any = None   # _Explained: the explanation warning's reference
    newly: np.ndarray | None = None   # rows the last forget removed (None: every dead row)
    Cw: np.ndarray | None = None      # (N0, d) each row times its weight (exact final means)
    #: whether runs[0] is the farthest-first start (keyed start s is then runs[s + 1])
    ff_start: bool = True
    c_sq: np.ndarray | None = None    # (N0,) each row's squared norm (a start run again)
    #: per run, ``(t, name, code)`` where the last forget kept its labels at iteration t
    #: unchanged: starts with one name partitioned the remaining rows alike, ``code`` (k,)
    #: maps the run's labels to its class's common labels (None: unknown)
    parts: list | None = None
    #: ``(labels, alive, centers)`` of the kept start's last update at the last forget
    #: (:func:`fedclust.kfed.keyed_unlearn.exact_means`)
    means_ref: tuple | None = None
    #: (N0,) the final labels at the last forget (``center_labels`` are slices of them)
    labels: np.ndarray | None = None
    #: ``(slots, rows, squared norms)``: the device centers at the candidates' slots
    #: ``slots`` (``cand`` with row 0 at its empty slots) (S * k * L, d), gathered once for
    #: the seeds' certificate and refreshed where a slot or its row changes
    cand_rows: tuple | None = None
    #: rows whose pieces entered after the runs were traced (a row deletion's new pieces,
    #: :mod:`fedclust.kfed.keyed_rows`): no margin certifies them, every forget assigns
    #: them again at every iteration
    extra: np.ndarray | None = None
    #: rows the last forget rewrote with a device's new pieces: their old margins are wiped
    rewritten: np.ndarray | None = None
    #: ``(start, step)`` where the last forget put a new piece among a k-means++ step's
    #: first candidates and the step's pick held (:func:`~fedclust.kfed.keyed_seeding.insert_pieces`)
    entered: list | None = None
    #: the last forget's result is the server's step's bits (its final means recomputed
    #: in the fresh step's order): the record's path ``"trace"``, else ``"downdate"``
    exact: bool = False

    def scrub(self) -> None:
        """Wipe what the trace held of the forgotten rows: their centers, weights, labels
        and margins (a margin becomes its sorted neighbour's, so the order stays sorted;
        those rows are never read again). Only the rows of the last forget are visited."""
        dead = ~self.alive
        gone = np.flatnonzero(dead) if self.newly is None else self.newly
        self.newly = np.empty(0, np.int64)
        new = np.empty(0, np.int64) if self.rewritten is None else self.rewritten
        self.rewritten = None
        if len(new):   # the old pieces' margins: the sorted arrays' lower neighbour
            wiped = dead.copy()
            wiped[new] = True
            for r in self.runs:
                if r.rank is None:
                    r.rank = [_rank(o) for o in r.order]
                for m, o, rank in zip(r.margin_sorted, r.order, r.rank):
                    _wipe_sorted(m, np.sort(rank[new]), o, wiped)
        if not len(gone):
            return
        self.C[gone] = 0.0
        self.w[gone] = 0.0
        if self.Cw is not None:
            self.Cw[gone] = 0.0
        if self.keys is not None:
            self.keys[gone] = 0
        if self.scatter is not None:
            self.scatter[gone] = 0.0
        if self.c_sq is not None:
            self.c_sq[gone] = 0.0
        for r in self.runs:
            r.A[:, gone] = 0
            if r.d0 is not None:
                r.d0[gone] = 0.0
            if r.rank is None:
                r.rank = [_rank(o) for o in r.order]
            for m, o, rank, r2, m3 in zip(r.margin_sorted, r.order, r.rank, r.runner_up,
                                          r.margin3):
                _wipe_sorted(m, np.sort(rank[gone]), o, dead)
                r2[gone] = 0
                m3[gone] = 0.0
        if self.expl is not None:
            self.expl.labels[gone] = 0
        if self.means_ref is not None:
            self.means_ref[0][gone] = 0
        if self.labels is not None:
            self.labels[gone] = 0
        if self.cand_rows is not None:
            dead_slot = dead[self.cand_rows[0].ravel()]
            self.cand_rows[1][dead_slot] = 0.0
            self.cand_rows[2][dead_slot] = 0.0


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
        # a run of wiped positions holds one value: where it already holds v, so does the rest
        while j < n and dead[order[j]] and m[j] != v:
            m[j] = v
            j += 1


#: two squared distances closer than this share of ``|x|^2 + max |c|^2`` may compare
#: otherwise in a fresh run (its rounding, and the downdated centers' 1e-13 or so)
TIE_RTOL = 1e-10


def labels_or_tie(X, centers) -> tuple[np.ndarray, bool]:
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
    nearest = np.empty(n)
    margin = np.full(n, np.inf)
    margin3 = np.full(n, np.inf)
    runner = np.zeros(n, dtype=np.int64)
    c_sq = (centers * centers).sum(axis=1)
    for start in range(0, n, BLOCK):
        D = x_sq[start:start + BLOCK][:, None] - 2.0 * (X[start:start + BLOCK] @ centers.T) \
            + c_sq[None, :]
        lab = D.argmin(axis=1)
        labels[start:start + BLOCK] = lab
        nearest[start:start + BLOCK] = np.maximum(D[np.arange(len(D)), lab], 0.0)
        if k > 1:
            # the nearest, second- and third-nearest clipped distances by masking the
            # nearest found so far (three argmin passes, cheaper than a partial sort); the
            # runner-up is the nearest center other than the label (on a tie for second
            # place either serves: the third-nearest certificate covers the other)
            np.maximum(D, 0.0, out=D)
            block = slice(start, start + len(D))
            at = np.arange(len(D))
            d0 = np.sqrt(D[at, lab])
            D[at, lab] = np.inf
            r = D.argmin(axis=1)
            runner[block] = r
            margin[block] = np.sqrt(D[at, r]) - d0
            if k > 2:
                D[at, r] = np.inf
                margin3[block] = np.sqrt(D.min(axis=1)) - d0
    return labels, margin, runner, margin3, nearest


def traced_lloyd(C, init, w, Cw, c_sq, c_var, max_iter, tol):
    """:func:`lloyd`'s loop (same kernels, same bits) keeping what a forget needs; None
    where it relocated an emptied cluster. ``c_var``: the rows' mean feature variance, or
    ``(estimate, error bound, exact)`` with ``exact()`` giving it: worked out only where a
    shift lies within ``tol`` times the bound of ``tol`` times the estimate (elsewhere
    the stop rule decides alike)."""
    k = len(init)
    centers = np.array(init, dtype=C.dtype, copy=True)
    hint = c_var if isinstance(c_var, tuple) else None
    abs_tol = None if hint else tol * c_var

    def stops(shift):
        nonlocal abs_tol
        if abs_tol is None:
            if abs(shift - tol * hint[0]) > tol * hint[1]:
                return shift <= tol * hint[0]
            abs_tol = tol * hint[2]()
        return shift <= abs_tol
    cs, A, mm, labels, reason = [centers], [], [], None, "max_iter"
    r2s, m3s, d0 = [], [], None
    for _ in range(max_iter):
        new_labels, margin, r2, m3, near = _assign_margin(C, centers, c_sq)
        if d0 is None:
            d0 = near
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
        if stops(shift):
            reason = "shift"
            break
    if reason != "labels":
        lab, margin, r2, m3, _ = _assign_margin(C, centers, c_sq)
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
    run = RunTrace(np.stack(cs), A.astype(np.int16), S, W, Q, W.copy(), moved, order,
               [m[o] for m, o in zip(mm, order)], reason, r2s, m3s, d0=d0)
    stacked(run)
    return run


def applies(protocol: Any) -> bool:
    """The protocol's server is the keyed one and nothing else changes its step."""
    return any(plain_step(protocol, name) for name in KEYED_NAMES)


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
    pos, ff, pp = keyed_starts(C, k, w, c_sq, centers, owner, local_index, seed, SPARE)
    if any(p is None for p in pp):
        return None
    Cw = C * w[:, None]
    runs = []
    for idx in ([] if ff is None else [ff]) + [p[0] for p in pp]:
        run = traced_lloyd(C, C[idx], w, Cw, c_sq, c_var, protocol.max_iter, protocol.tol)
        if run is None:
            return None
        runs.append(run)
    scale2 = float(c_sq.max())
    return KeyedTrace(
        list(ids), offsets, {z: i for i, z in enumerate(ids)}, owner, C, w,
        np.ones(len(C), bool), -1 if ff is None else int(ids[pos]),
        np.empty(0, np.int64) if ff is None else owner[ff],
        np.stack([p[0] for p in pp]), np.stack([p[1] for p in pp]),
        np.stack([p[2] for p in pp]), np.stack([p[3] for p in pp]), runs,
        C.sum(axis=0), (C * C).sum(axis=0), CERTIFY_SLACK * np.sqrt(C.shape[1] + 4.0)
        * np.sqrt(scale2), scale2, protocol.max_iter, protocol.tol,
        dict(zip(ids, centers)), dict(zip(ids, counts)), {}, seed=int(seed),
        keys=row_keys(seed, owner, local_index), reruns={},
        scatter=_stacked_scatter(replies, ids, len(C)), Cw=Cw, ff_start=ff is not None,
        c_sq=c_sq)


def _stacked_scatter(replies: dict[int, Any], ids: list[int], n: int) -> np.ndarray | None:
    sc = [getattr(replies[z], "scatter", None) for z in ids]
    if any(x is None for x in sc):
        return None
    out = np.concatenate([np.asarray(x, dtype=np.float64) for x in sc])
    return out if len(out) == n else None


#: a split not worked out since its center's rows changed (:func:`forget_warning`)
STALE = "stale"


@dataclass
class _Explained:
    """The explanation warning's reference: each row's final label and liveness at the
    last forget, and each final center's :class:`~fedclust.kfed.explain.CenterSplit` over
    those rows (None: no row; :data:`STALE`: not worked out since its rows changed). A
    center whose rows are the same again keeps its split: the same rows in the same order
    give the same bits."""

    labels: np.ndarray
    alive: np.ndarray
    splits: list
    #: per center :func:`~fedclust.kfed.explain.split_bound` over those rows (STALE: not
    #: worked out since its rows changed)
    bounds: list = None


def forget_warning(tr: KeyedTrace, alive: np.ndarray, final: np.ndarray, labels: np.ndarray,
                   stats: tuple | None = None, rewritten: np.ndarray | None = None):
    """``(warning, reference)``: :func:`~fedclust.kfed.explain.explanation_warning` over the
    remaining rows, bit for bit; warning False where the trace lacks the scatter.
    ``rewritten``: rows whose values changed since the reference (a row deletion's new
    pieces).

    ``stats``: the final clusters' weighted sums (k, d), weights (k,) and weighted squared
    norms (k,) over the remaining rows. Where they certify the warning quiet whatever the
    splits (:func:`~fedclust.kfed.explain.surely_quiet`), no split is worked out: the
    centers whose rows changed are marked stale. Where they do not, each center's
    :func:`~fedclust.kfed.explain.split_bound` (kept while its rows stay the same) may
    certify it; otherwise every stale split, and every split of a center a row of which
    left or changed label since the reference, is worked out again over its remaining
    rows."""
    if tr.scatter is None:
        return False, None
    k = len(final)
    ex = tr.expl
    if ex is None or len(ex.splits) != k or ex.bounds is None:
        splits, bounds = [STALE] * k, [STALE] * k
    else:
        changed = (labels != ex.labels) | (alive != ex.alive)
        if rewritten is not None:
            changed[rewritten] = True
        touched = np.union1d(labels[changed & alive], ex.labels[changed & ex.alive])
        splits, bounds = list(ex.splits), list(ex.bounds)
        for j in touched.tolist():
            splits[j] = bounds[j] = STALE
    ex = _Explained(labels.copy(), alive.copy(), splits, bounds)
    rows_of = {}

    def rows(j):
        if j not in rows_of:
            rows_of[j] = np.flatnonzero(alive & (labels == j))
        return rows_of[j]

    if stats is not None:
        sums, n, sq = stats
        scatter = np.bincount(labels[alive], weights=np.maximum(tr.scatter[alive], 0.0),
                              minlength=k)
        if surely_quiet(n, sums, sq, scatter, final):
            return None, ex
        for j in range(k):
            if bounds[j] is STALE:
                r = rows(j)
                bounds[j] = split_bound(tr.C[r], tr.w[r])
        if surely_quiet(n, sums, sq, scatter, final, np.array(bounds)):
            return None, ex
    for j in range(k):
        if splits[j] is STALE:
            r = rows(j)
            splits[j] = center_split(tr.C[r], tr.w[r], tr.scatter[r]) if len(r) else None
    verdict = poor_answer(splits, final)
    if verdict is None:
        return None, ex
    kind, j, value = verdict
    devs = np.unique(tr.owner[alive & (labels == j)])   # ids are sorted: the fit's order
    return poor_answer_message(kind, j, value, devs.tolist(), k), ex


def best_of(runs) -> int | None:
    inert = [run_inertia(r.cs[-1], r.S[-1], r.W[-1], r.Q[-1]) for r in runs]
    err = 1e-10 * max(float(sum(r.Q[-1].sum() for r in runs)), 1e-300)
    return pick_start([canonical(r.A[-1]) for r in runs], inert, err)


def run_inertia(c, S, W, Q):
    return float(Q.sum() - 2.0 * np.einsum("kd,kd->", c, S) + W @ (c * c).sum(axis=1))
