"""Forgetting devices, or rows of a device, under the keyed weighted k-means++ server
(:mod:`fedclust.kfed.keyed`) without running its step again. After a row deletion the
device's old pieces leave as a leaving device's do and its new pieces enter their slots
(:mod:`fedclust.kfed.keyed_rows`; the seeds' certificate with both:
:mod:`fedclust.kfed.keyed_seeding`).

:func:`keyed_forget` follows the fit's trace (:mod:`fedclust.kfed.keyed_trace`) instead of
running the step again, start by start:

* seeds: a start keeps its seeds when no leaving row was a seed or a candidate and at
  every step the pick's potential stays below every other candidate's after the
  leaving rows' exact share is taken off, by more than a rounding slack;
* Lloyd: per iteration the cluster sums lose the leaving rows' share; a remaining row
  labelled a keeps its label while its margin to its runner-up r exceeds the shifts of
  a and r since the fit, and its margin to the third-nearest center exceeds a's shift
  plus the largest shift, each plus :data:`~fedclust.kfed.downdate.CERTIFY_SLACK`'s
  allowance; the others are assigned again and the sums corrected. Lloyd's stop rules
  (labels unchanged, shift at most ``tol`` times the variance, ``max_iter``) are decided
  again, each only with a margin over rounding. Where no remaining row changes label,
  :func:`_follow` checks every iteration at once from the smallest margins of each
  iteration (stacked at the trace), else :func:`_replay` goes iteration by iteration;
* a start whose trace cannot be followed (a leaving seed or farthest-first pick, a near
  tie, a stop rule within rounding, a run that goes on where the fit's stopped) is run
  again in full over the remaining rows, stacked as a fresh step stacks them, so it
  gives the fresh step's bits; it is traced as it runs, for the next forget;
* the lowest cost between starts by strict ``<``, only with a margin over rounding;
  the kept start's last update is computed again over the remaining rows in the fresh
  step's order (:func:`exact_means`), so the centers are the fresh step's bits.

The explanation warning is worked out from the stacked summaries
(:func:`fedclust.kfed.keyed_trace.forget_warning`): where the kept start's final cluster
sums certify it quiet whatever the splits (:func:`fedclust.kfed.explain.surely_quiet`), no
split is worked out; otherwise a final center keeps its split
(:func:`fedclust.kfed.explain.center_split`) from a reference while none of its rows left
or changed label since then, and the others are worked out again. A near tie between two
starts' costs (or a start that cannot be traced) returns None: the server's step then
runs in full.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .downdate import forget_result
from .keyed import SPARE, keyed_kmeans_plusplus, pick_start
from .keyed_result import center_labels as kept_center_labels
from .keyed_result import exact_means, partition_classes
from .keyed_trace import (KeyedTrace, RunTrace, run_inertia, labels_or_tie, stacked,
                          traced_lloyd, forget_warning)
from .keyed_remaining import Remaining, expand, remaining
from .keyed_rows import downdated as _downdated, enter_runs, entering, run_centers, write
from .keyed_seeding import seeds_stable as _seeds_stable
from .server import farthest_first, pick_first_device, weighted_starts

__all__ = ["keyed_forget", "exact_means"]

#: a row is assigned again at most this share of the rows per iteration; beyond, the
#: start runs again
_DOUBT_SHARE = 1.0

#: a center shift this close (relative) to ``tol`` times the variance decides Lloyd's stop
#: otherwise in a fresh run only by rounding
SHIFT_RTOL = 1e-12


def shift_stops(shifts: np.ndarray | float, abs_tol: float, tr: KeyedTrace, k: int,
                var_err: float) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's shift stop rule for the squared center shifts ``shifts`` (T,) of a run, or
    one shift (then two numpy booleans):
    ``(near (T,), stops (T,))``, where ``near`` marks a shift whose comparison with
    ``abs_tol`` (``tol`` times the downdated variance, known within ``tr.tol * var_err``)
    a fresh run could decide otherwise by rounding, and ``stops`` the shifts at most
    ``abs_tol``. Elementwise, so each shift's bits are those of the same expression on
    that shift alone."""
    err = 2.0 * np.sqrt(shifts) * 1e-10 * np.sqrt(tr.scale2 * k) + 1e-20 * tr.scale2 * k \
        + tr.tol * var_err + SHIFT_RTOL * np.maximum(shifts, abs_tol)
    return np.abs(shifts - abs_tol) <= err, shifts <= abs_tol


class _Full(Exception):
    """The forget cannot be certified: the server's step runs in full."""


#: the smallest margins of each iteration :func:`_follow` reads (besides the removed rows');
#: where more rows could be in doubt at an iteration, :func:`_replay` follows the run
PREFIX = 2048


def _follow(tr: KeyedTrace, run: RunTrace, var: float, var_err: float,
            n_alive: int | None = None, pre: tuple | None = None):
    """:func:`_replay` for its common case, every iteration at once: where no remaining row
    changes its label at any iteration up to the run's stop, the run's centers at every
    iteration are its downdated sums over its downdated weights. Returns :func:`_replay`'s
    tuple, or None where that case is not certified (:func:`_replay` then decides); the
    same certificates, stop rules and rounding allowances as :func:`_replay`. ``pre``: the
    run's :func:`~fedclust.kfed.keyed_rows.run_centers` with the labels of the rows
    ``tr.extra`` (worked out for every run at once; here where not given)."""
    order, msort, runner, m3, mv_rows, mv_t = stacked(run)
    alive = tr.alive
    if n_alive is None:
        n_alive = int(alive.sum())
    T = len(run.cs) - 1
    k = run.cs.shape[1]
    abs_tol = tr.tol * var
    ex = tr.extra if tr.extra is not None and len(tr.extra) else None
    if pre is None:
        d = run.cs.shape[2]
        pre = run_centers({0: run}, (run.S.reshape(-1, d), run.W.ravel(), None),
                          None if ex is None else tr.C[ex])[0]
    # every iteration's centers with every remaining row's labels those of the fit
    c, ex_lab, ex_tie = pre
    low = (run.W[:T] <= 1e-2 * run.W0[:T]).any(axis=1)
    shifts = ((c[1:] - c[:-1]) ** 2).reshape(T, -1).sum(axis=1)
    moved_alive = np.bincount(mv_t[alive[mv_rows]], minlength=T + 1).tolist()
    # Lloyd's stop rules as _replay decides them, for these centers (every iteration's at
    # once, read iteration by iteration)
    near, stops = (x.tolist() for x in shift_stops(shifts, abs_tol, tr, k, var_err))
    low = low.tolist()
    stop_now, t_f = False, -1
    for t in range(T + 1):
        if stop_now or (t >= 1 and moved_alive[t] == 0):
            t_f = t
            break
        if t == T or low[t] or near[t]:
            return None
        if t + 1 == T and run.reason == "shift" and not stops[t]:
            return None
        stop_now = stops[t] or t + 1 == tr.max_iter
    # labels at iterations 0..t_f: the margin certificates of _replay, on the smallest
    # margins of every iteration at once
    tt = t_f + 1
    diff = c[:tt] - run.cs[:tt]
    sj = np.sqrt(np.einsum("tkd,tkd->tk", diff, diff))
    s = sj.max(axis=1)
    thr = 2.0 * s + tr.slack
    # the removed rows' margins stay in the sorted arrays (a run traced again puts them
    # first): PREFIX margins of remaining rows at least
    P = min(PREFIX + len(alive) - n_alive, len(alive))
    pm = msort[:tt, :P]
    if P < len(alive) and (pm[:, -1] <= thr).any():
        return None
    ti, pi = np.nonzero(pm <= thr[:, None])
    rows = order[ti, pi].astype(np.int64)
    mg = pm[ti, pi]
    n_ex = 0
    if ex is not None:   # pieces with no margin: every iteration, their labels in ``pre``
        other = ~_mask(len(tr.alive), ex)[rows]
        ti, rows, mg = ti[other], rows[other], mg[other]
        ea = run.A[:tt, ex].astype(np.int64)
        keep_ex = np.repeat(alive[ex][None, :], tt, axis=0)
        # the runner-up certificate as for any row (a piece traced with its margins)
        pt, pc = np.nonzero(keep_ex & (m3[:tt, ex] > sj[np.arange(tt)[:, None], ea]
                                       + s[:, None] + tr.slack))
        if len(pt):
            X = tr.C[ex[pc]]
            da = np.sqrt(((X - c[pt, ea[pt, pc]]) ** 2).sum(axis=1))
            dr = np.sqrt(((X - c[pt, runner[pt, ex[pc]].astype(np.int64)]) ** 2).sum(axis=1))
            far = dr - da > tr.slack
            keep_ex[pt[far], pc[far]] = False
        n_ex = int(keep_ex.sum())
        if (keep_ex & (ex_tie[:tt] | (ex_lab[:tt] != ea))).any():
            return None
    a = run.A[ti, rows].astype(np.int64)
    r = runner[ti, rows].astype(np.int64)
    sa = sj[ti, a]
    third = m3[ti, rows] > sa + s[ti] + tr.slack
    sure = (mg > sa + sj[ti, r] + tr.slack) & third
    keep = ~sure & alive[rows]
    pair = np.flatnonzero(keep & third)
    if len(pair):   # only the runner-up in doubt: two distances instead of k
        X = tr.C[rows[pair]]
        da = np.sqrt(((X - c[ti[pair], a[pair]]) ** 2).sum(axis=1))
        dr = np.sqrt(((X - c[ti[pair], r[pair]]) ** 2).sum(axis=1))
        keep[pair[dr - da > tr.slack]] = False
    q = np.flatnonzero(keep)
    if len(q) + n_ex > _DOUBT_SHARE * n_alive * tt:
        return None
    bounds = np.searchsorted(ti[q], np.arange(tt + 1))
    for t in np.flatnonzero(np.diff(bounds)).tolist():   # the rest: every center
        sel = q[bounds[t]:bounds[t + 1]]
        lab, tie = labels_or_tie(tr.C[rows[sel]], c[t])
        if tie or (lab != a[sel]).any():
            return None
    none = np.empty(0, np.int64)
    return c[t_f].copy(), (none, none), t_f, (run.S, run.W, run.Q), len(q) + n_ex, (none, none)


def _mask(n: int, rows: np.ndarray) -> np.ndarray:
    out = np.zeros(n, bool)
    out[rows] = True
    return out


def _replay(tr: KeyedTrace, run: RunTrace, var: float, var_err: float):
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
        mg = run.margin_sorted[t][:cut]
        if tr.extra is not None and len(tr.extra):   # pieces with no margin: always
            other = ~_mask(len(tr.alive), tr.extra)[doubt]
            doubt = np.concatenate([doubt[other], tr.extra])
            mg = np.concatenate([mg[other], np.full(len(tr.extra), -np.inf)])
        a = run.A[t, doubt].astype(np.int64)
        r = run.runner_up[t][doubt].astype(np.int64)
        third = run.margin3[t][doubt] > sj[a] + s + tr.slack
        sure = (mg > sj[a] + sj[r] + tr.slack) & third
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
            lab, tie = labels_or_tie(Cd, c_t)
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
            return c_t, (ov_rows, ov_lab), t, (newS, newW, newQ), rechecked, \
                (prev_rows, prev_lab)
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
                return c_t, (ov_rows, ov_lab), t, (newS, newW, newQ), rechecked, \
                (prev_rows, prev_lab)
            if t == T:
                raise _Full("the fit's run stopped with its labels, this one goes on")
        if t == T:
            raise _Full       # (not reached: the fit's stops set stop_now below)
        if (Wx <= 1e-2 * run.W0[t]).any():
            raise _Full("the fit's run ended here")
        c_next = Sx / Wx[:, None]
        shift = float(((c_next - c_t) ** 2).sum())
        near, new_stop = shift_stops(shift, abs_tol, tr, k, var_err)
        if near:
            raise _Full("a center shift within rounding of tol x variance")
        old_stop = t + 1 == T and run.reason == "shift"
        if old_stop and not new_stop:
            raise _Full("the fit's run stopped by its shift, this one goes on")
        stop_now = new_stop or t + 1 == tr.max_iter
        prev_rows, prev_lab = ov_rows, ov_lab
        c_t = c_next
    raise _Full("the fit's run ended")


def _rerun(protocol: Any, tr: KeyedTrace, rem: Remaining, start: int, ids: list[int],
           first: int = 0, pots: np.ndarray | None = None):
    """Run ``start`` (the trace's run index, see ``KeyedTrace.reruns``) run again in full
    over the remaining rows, as a fresh step runs it: ``(run, seeding)`` with seeding None
    for the farthest-first start, else (seeds, cand, pots, pick) in the trace's rows. The
    k-means++ steps before ``first`` (certified unchanged by :func:`_seeds_stable`, whose
    downdated potentials ``pots`` they keep) are not drawn again; or
    raises _Full where no trace can follow it (an emptied cluster, too few rows); the
    farthest-first start also gives (its seed device, the owners of its picks)."""
    k = tr.runs[0].cs.shape[1]
    F = int(tr.ff_start)
    if F and start == 0:
        centers = [tr.local_centers[z] for z in ids]
        pos = pick_first_device(centers, "widest", None, stacked=rem.C)
        offsets = np.cumsum([0] + [len(c) for c in centers])
        idx = farthest_first(rem.C, k, start=np.arange(offsets[pos], offsets[pos + 1]))
        seeding = None
    else:
        s = start - F
        if first >= k:   # every pick certified: the seeds are the fit's
            idx = np.searchsorted(rem.rows, tr.seeds[s])
            seeding = (tr.seeds[s], tr.cand[s], pots[s], tr.pick[s])
        else:
            known = np.searchsorted(rem.rows, tr.seeds[s, :first]) if first else None
            pp = keyed_kmeans_plusplus(rem.C, k, rem.w, rem.c_sq, tr.keys[rem.rows], s,
                                       SPARE, known=known)
            if pp is None:
                raise _Full("fewer distinct rows than k")
            idx = pp[0]
            cand = np.where(pp[1] >= 0, rem.rows[np.maximum(pp[1], 0)], -1)
            pp_pots, pick = pp[2], pp[3]
            if first > 1:   # the kept steps' candidates as the trace holds them
                cand[1:first], pp_pots[1:first] = tr.cand[s, 1:first], pots[s, 1:first]
                pick[1:first] = tr.pick[s, 1:first]
            seeding = (rem.rows[pp[0]], cand, pp_pots, pick)
    run = traced_lloyd(rem.C, rem.C[idx], rem.w, rem.Cw, rem.c_sq, rem.c_var, tr.max_iter,
                        tr.tol)
    if run is None:
        raise _Full("a start run again emptied a cluster")
    ff = (int(ids[pos]), tr.owner[rem.rows[idx]]) if F and start == 0 else None
    return expand(run, rem.rows, len(tr.C)), seeding, ff


#: run the whole step again (every start) rather than follow the trace when more than this
#: share of the starts cannot be followed
MAX_RERUN_SHARE = 1.0


def keyed_forget(protocol: Any, trace: KeyedTrace, replies: dict[int, Any],
                 drop: Sequence[int], enter: dict[int, Any] | None = None):
    """``(KFedResult, new trace)`` of the keyed server without the devices ``drop``, or
    None where the step must run in full. ``enter``: {device: its new reply} after a row
    deletion there (:mod:`fedclust.kfed.keyed_rows`; ``replies`` holds the new replies):
    its old pieces leave and the new ones take their slots. A forget with ``enter``
    writes the new pieces into ``trace`` whatever comes of it: where it returns None the
    caller drops the trace.

    Each start follows its trace where it can be certified; a start that cannot (a leaving
    seed or farthest-first pick, a run that goes on where the fit's stopped, a near tie) is
    run again in full over the remaining rows, exactly as a fresh step runs it, and traced
    for the next forget (``new.reruns``)."""
    gone = {int(z) for z in drop}
    enter = enter or {}
    trace.fallback = None
    if not gone and not enter:
        return None
    if replies.keys() != trace.local_centers.keys() or not gone | set(enter) <= set(trace.ids):
        return None
    if trace.keys is None or (enter and (gone or trace.ff_start)):
        return None
    R = np.concatenate([np.empty(0, np.int64)] + [
        np.arange(trace.offsets[trace.row_of[z]], trace.offsets[trace.row_of[z] + 1])
        for z in sorted(gone)])
    R = R[trace.alive[R]]
    e = entering(trace, enter) if enter else None
    if enter and e is None:
        trace.fallback = "a device's new summary does not fit its slots"
        return None
    if e is not None:
        R = e.old
    old = (trace.C[R].copy(), trace.w[R].copy(), None if trace.c_sq is None
           else trace.c_sq[R].copy())
    alive = trace.alive.copy()
    alive[R] = False
    extra = trace.extra
    if e is not None:
        alive[e.new] = True
        extra = np.union1d(e.new, np.empty(0, np.int64) if extra is None
                           else extra[alive[extra]])
        write(trace, e)
    n = int(alive.sum())
    k = trace.runs[0].cs.shape[1]
    if n < k:
        return None
    F = int(trace.ff_start)
    if weighted_starts(n, k) != len(trace.runs) - F:
        # fewer device centers, more starts (a step of weighted_starts): the fresh step
        # draws starts the trace lacks
        trace.fallback = "the start count changes"
        return None
    ids = [z for z in trace.ids if z not in gone] if gone else list(trace.ids)
    old_alive, old_extra = trace.alive, trace.extra
    trace.alive, trace.extra = alive, extra
    reruns: dict[int, str] = {}
    try:
        if F and (trace.seed_device in gone or gone & set(trace.ff_owners.tolist())):
            reruns[0] = "a leaving device holds the farthest-first start's seed or a pick"
        got = _seeds_stable(trace, R, alive, old, e)
        pots, why, first = got[:3]
        entered = []
        if e is not None:
            trace.cand, trace.pick, entered = got[3]
        reruns.update({s + F: y for s, y in enumerate(why) if y is not None})
        CR, wR, _ = old
        xsum = trace.xsum - CR.sum(axis=0)
        xsq = trace.xsq - (CR ** 2).sum(axis=0)
        if e is not None:
            xsum, xsq = xsum + e.C.sum(axis=0), xsq + (e.C ** 2).sum(axis=0)
        var = float(np.mean(np.maximum(xsq / n - (xsum / n) ** 2, 0.0))) if n > 1 else 0.0
        var_err = 1e-10 * float(np.mean(np.abs(xsq))) / n
        outs: dict[int, tuple] = {}
        CwR = CR * wR[:, None]
        qR = wR * (CR ** 2).sum(axis=1)
        based, stats = _downdated({s: run for s, run in enumerate(trace.runs)
                                   if s not in reruns}, R, CwR, wR, qR, k)
        if e is not None:
            enter_runs(based, e, k, stats)
        pre = run_centers(based, stats, None if extra is None or not len(extra)
                          else trace.C[extra]) if based else {}
        for s in based:
            try:
                outs[s] = _follow(trace, based[s], var, var_err, n, pre[s])
                if outs[s] is None:
                    outs[s] = _replay(trace, based[s], var, var_err)
            except _Full as exc:
                reruns[s] = exc.args[0] if exc.args else "uncertified"
        if len(reruns) > MAX_RERUN_SHARE * len(trace.runs):
            raise _Full(f"{len(reruns)} starts cannot be followed")
        rem = remaining(trace, alive, var, var_err) if reruns else None
        new_runs: dict[int, tuple] = {}
        for s in sorted(reruns):
            new_runs[s] = _rerun(protocol, trace, rem, s, ids,
                                 int(first[s - F]) if s >= F else 0, pots)
            run = new_runs[s][0]
            T = len(run.cs) - 1
            outs[s] = (run.cs[-1], (np.empty(0, np.int64),) * 2, T, (run.S, run.W, run.Q),
                       n * (T + 1), (np.empty(0, np.int64),) * 2)
        order = range(len(trace.runs))
        inert = [run_inertia(outs[s][0], outs[s][3][0][outs[s][2]], outs[s][3][1][outs[s][2]],
                          outs[s][3][2][outs[s][2]]) for s in order]
        err = 1e-10 * max(float(sum(outs[s][3][2][outs[s][2]].sum() for s in order)), 1e-300)
        finals = []
        for s in order:
            _, over, t, _, _, _ = outs[s]
            run = new_runs[s][0] if s in new_runs else trace.runs[s]
            lab = run.A[t]
            if len(over[0]):
                lab = lab.copy()
                lab[over[0]] = over[1]
            finals.append(lab)
        # two runs can end in one partition only with the same cluster weights (sums of
        # integer counts: exact in any order); only those are compared
        sizes = [tuple(np.sort(outs[s][3][1][outs[s][2]]).tolist()) for s in order]
        # a start followed with its labels as at the last forget (no label changed, the
        # same final iteration) keeps its partition there, less the leaving rows; after a
        # row deletion only the new pieces' labels are compared, through the codes
        known = [None if trace.parts is None or s in new_runs or len(outs[s][1][0])
                 or trace.parts[s] is None or trace.parts[s][0] != outs[s][2]
                 else trace.parts[s][1:] for s in order]
        names, codes = partition_classes(finals, sizes, alive, k, known,
                                         None if e is None else e.new)
        b = pick_start([np.array([z]) for z in names], inert, err)
        if b is None:
            raise _Full("two starts' costs within rounding")
    except _Full as exc:
        trace.fallback = exc.args[0] if exc.args else "uncertified"
        return None
    finally:
        trace.alive, trace.extra = old_alive, old_extra
    # each start's partition name, where its final labels are its run's at t (no change)
    parts = [None if len(outs[s][1][0]) else (outs[s][2], names[s], codes[s]) for s in order]
    centers, _, t_f, _, _, prev = outs[b]
    labels = finals[b].astype(np.int64)
    if t_f >= 1 and trace.Cw is not None:   # the fresh step's bits: its last update again
        run = new_runs[b][0] if b in new_runs else trace.runs[b]
        lab = run.A[t_f - 1].astype(np.int64)
        lab[prev[0]] = prev[1]
        centers = exact_means(trace.Cw, trace.w, lab, alive, k, trace.means_ref,
                              None if e is None else e.new)
        means_ref = (lab, alive, centers)
    else:
        means_ref = None
    if gone:
        local_centers = {z: trace.local_centers[z] for z in ids}
        local_counts = {z: trace.local_counts[z] for z in ids}
    else:   # a row deletion: every device stays
        local_centers, local_counts = dict(trace.local_centers), dict(trace.local_counts)
    if e is not None:
        local_centers.update(e.centers)
        local_counts.update(e.counts)
    center_labels = kept_center_labels(trace, ids, labels, alive, set(enter))
    seed_device, ff_owners = trace.seed_device, trace.ff_owners
    if F and 0 in new_runs:
        seed_device, ff_owners = new_runs[0][2]
    Sb, Wb, Qb = (x[t_f] for x in outs[b][3])
    warning, expl = forget_warning(trace, alive, centers, labels, (Sb, Wb, Qb),
                                   None if e is None else e.new) \
        if protocol.summarise else (False, None)
    if trace.expl is None:   # the reference serves any later forget of this trace too
        trace.expl = expl
    result = forget_result(protocol, replies, ids, centers.copy(), local_centers, local_counts,
                           center_labels, None, max(t_f, 1), warning)
    # the new trace: the fit's trajectory less every forgotten row (cumulative), and the
    # starts run again as they ran now
    runs = [new_runs[s][0] if s in new_runs else based[s] for s in range(len(trace.runs))]
    seeds, cand, pick = trace.seeds, trace.cand, trace.pick
    if any(s >= F for s in new_runs):
        seeds, cand, pots, pick = seeds.copy(), cand.copy(), pots.copy(), pick.copy()
        for s, (_, seeding, _) in new_runs.items():
            if s >= F:
                seeds[s - F], cand[s - F], pots[s - F], pick[s - F] = seeding
    new = KeyedTrace(ids, trace.offsets, trace.row_of, trace.owner, trace.C, trace.w, alive,
                     seed_device, ff_owners, seeds, cand, pots, pick, runs, xsum, xsq,
                     trace.slack, trace.scale2, trace.max_iter, trace.tol, local_centers,
                     local_counts, center_labels, sum(o[4] for o in outs.values()),
                     seed=trace.seed, keys=trace.keys, reruns=reruns, scatter=trace.scatter,
                     expl=expl, newly=R[~alive[R]], Cw=trace.Cw, ff_start=trace.ff_start,
                     c_sq=trace.c_sq, parts=parts, means_ref=means_ref, labels=labels,
                     cand_rows=trace.cand_rows,
                     extra=extra, rewritten=None if e is None else e.new, entered=entered,
                     exact=means_ref is not None)
    return result, new
