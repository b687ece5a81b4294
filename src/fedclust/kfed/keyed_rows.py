"""A device's new summary entering the keyed server's trace (:mod:`fedclust.kfed.keyed_trace`)
after a row deletion on that device, for :func:`fedclust.kfed.keyed_unlearn.keyed_forget`.

The device's new pieces take the slots of its old ones (same device id, same index on the
device: the same row keys, the same place in the stacked rows, so a start run again and
the exact final means sum the rows in the fresh step's order). Its old pieces leave as a
forgotten device's do; the new ones enter:

* seeds: each candidate's potential gains the new pieces' exact share; a new piece whose
  key comes before one of a step's first L candidates is put into that step's list, its
  potential measured, and the pick decided again
  (:func:`fedclust.kfed.keyed_seeding.insert_pieces`): the start goes on from that step
  only where the pick changes, or where the keys' order or the pick is within rounding
  (a new first seed is decided by its exact key);
* Lloyd: a new piece enters every iteration of every start labelled by the fit's
  centers there, its statistics added; it is assigned again at every iteration (it has
  no margin certificate: :attr:`KeyedTrace.extra`), so a label that differs at the
  downdated centers is corrected as any other row's.

A device whose new summary has more pieces than it has slots is not followed (the server's
step runs in full).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.kmeans import squared_distances
from .keyed_trace import TIE_RTOL, KeyedTrace, RunTrace

__all__ = ["Entering", "entering", "write", "refresh_rows", "enter_runs", "downdated",
           "run_centers"]


@dataclass
class Entering:
    """The rows a row deletion rewrites: ``old`` the device's current slots (their old
    values leave), ``new`` the slots its new pieces take (a prefix of its segment), with
    their values ``C`` (n, d), weights ``w``, squared norms ``c_sq``, weighted rows ``Cw``
    and scatters (None where the trace keeps none); ``centers``/``counts`` per device."""

    old: np.ndarray
    new: np.ndarray
    C: np.ndarray
    w: np.ndarray
    c_sq: np.ndarray
    Cw: np.ndarray
    scatter: np.ndarray | None
    centers: dict
    counts: dict


def entering(tr: KeyedTrace, enter: dict[int, Any]) -> Entering | None:
    """The slots and values of the devices' new replies ``enter`` {device: reply}; None
    where a device's new summary does not fit its slots or its dtype differs."""
    old, new, C, w, sc = [], [], [], [], []
    for z in sorted(enter):
        msg = enter[z]
        c = np.asarray(msg.centers)
        if c.dtype != np.float64 or c.ndim != 2 or c.shape[1] != tr.C.shape[1]:
            return None
        lo, hi = int(tr.offsets[tr.row_of[z]]), int(tr.offsets[tr.row_of[z] + 1])
        if len(c) > hi - lo or len(c) == 0:
            return None
        seg = np.arange(lo, hi)
        old.append(seg[tr.alive[seg]])
        new.append(seg[:len(c)])
        C.append(c)
        w.append(np.asarray(msg.counts).astype(np.float64))
        if tr.scatter is not None:
            s = getattr(msg, "scatter", None)
            if s is None or len(s) != len(c):
                return None
            sc.append(np.asarray(s, dtype=np.float64))
    C = np.concatenate(C)
    w = np.concatenate(w)
    return Entering(np.concatenate(old), np.concatenate(new), C, w, (C * C).sum(axis=1),
                    C * w[:, None], np.concatenate(sc) if tr.scatter is not None else None,
                    {z: enter[z].centers for z in enter}, {z: enter[z].counts for z in enter})


def write(tr: KeyedTrace, e: Entering) -> None:
    """The new pieces into their slots (the old values leave the trace)."""
    tr.C[e.new] = e.C
    tr.w[e.new] = e.w
    if tr.c_sq is not None:
        tr.c_sq[e.new] = e.c_sq
    if tr.Cw is not None:
        tr.Cw[e.new] = e.Cw
    if tr.scatter is not None:
        tr.scatter[e.new] = e.scatter
    if tr.cand_rows is not None:   # the candidates' gathered rows at the rewritten slots
        slots, Y, y_sq = tr.cand_rows
        flat = slots.ravel()
        refresh_rows(tr, Y, y_sq, flat, np.flatnonzero(np.isin(flat, e.new)))


def refresh_rows(tr: KeyedTrace, Y: np.ndarray, y_sq: np.ndarray, flat: np.ndarray,
                 idx: np.ndarray) -> None:
    """Gather the rows ``flat[idx]`` of the trace again into ``Y[idx]`` and their squared
    norms into ``y_sq[idx]`` (the bits of a gather of every slot)."""
    if len(idx):
        Y[idx] = tr.C[flat[idx]]
        y_sq[idx] = (Y[idx] * Y[idx]).sum(axis=1) if tr.c_sq is None else tr.c_sq[flat[idx]]


def enter_runs(runs: dict, e: Entering, k: int, stats: tuple) -> None:
    """Each followed run with the new pieces in their slots: labelled at every iteration
    by the fit's centers there (nearest, any rounding: they are assigned again anyway),
    their statistics added, the moved rows and certificates of the slots renewed (no
    margin: :attr:`KeyedTrace.extra` rows are assigned again at every iteration).
    ``stats``: :func:`downdated`'s ``(S, W, Q)`` buffers that the runs' statistics view
    (every run's iterations in turn): the pieces enter every run with one call each."""
    if not runs:
        return
    rs = list(runs.values())
    T1s = np.array([len(r.cs) for r in rs])
    cs = np.concatenate([r.cs for r in rs])   # (G, k, d): every run's iterations
    G = len(cs)
    D = (e.c_sq[None, :, None] - 2.0 * np.matmul(e.C[None], cs.transpose(0, 2, 1))
         + np.einsum("gkd,gkd->gk", cs, cs)[:, None, :])
    lab_all = D.argmin(axis=2)   # (G, n)
    S, W, Q = stats
    # each (iteration, cluster) gains the new pieces in their order, as run by run
    idx = (np.arange(G)[:, None] * k + lab_all).ravel()
    np.add.at(S, idx, np.tile(e.Cw, (G, 1)))
    W += np.bincount(idx, weights=np.tile(e.w, G), minlength=G * k)
    Q += np.bincount(idx, weights=np.tile(e.w * e.c_sq, G), minlength=G * k)
    is_slot = np.zeros(rs[0].A.shape[1], bool)
    is_slot[e.old] = is_slot[e.new] = True
    base = np.concatenate([[0], np.cumsum(T1s)])
    for run, b, T1 in zip(rs, base, T1s):
        lab = lab_all[b:b + T1]
        run.A[:, e.new] = lab
        if run.d0 is not None:   # each new piece's distance to its nearest seed
            run.d0[e.new] = np.maximum(D[b, np.arange(len(e.new)), lab[0]], 0.0)
        # the moved rows less the slots' old values, plus the new pieces that moved
        o, m, r2, m3, mv_rows, mv_t = run.stack
        keep = ~is_slot[mv_rows]
        ch_t, ch_i = np.nonzero(lab[1:] != lab[:-1])
        mv_t = np.concatenate([mv_t[keep], ch_t + 1])
        by = np.argsort(mv_t, kind="stable")
        mv_rows = np.concatenate([mv_rows[keep], e.new[ch_i]])[by]
        mv_t = mv_t[by]
        run.moved = np.split(mv_rows, np.cumsum(np.bincount(mv_t, minlength=T1))[:-1])
        r2[:, e.new] = 0
        m3[:, e.new] = -np.inf
        run.stack = (o, m, r2, m3, mv_rows, mv_t)


def downdated(runs: dict, R: np.ndarray, CwR: np.ndarray, wR: np.ndarray, qR: np.ndarray,
               k: int) -> tuple[dict, tuple | None]:
    """Each run's statistics at every iteration less the rows R (their labels unchanged),
    for all the runs ``{start: run}`` at once: each (run, iteration, cluster) loses its
    rows of R in R's order, as run by run. Also the buffers ``(S (G k, d), W (G k,),
    Q (G k,))`` that the new runs' statistics view (None where no run)."""
    if not runs:
        return {}, None
    d = next(iter(runs.values())).S.shape[2]
    T1s = [len(r.cs) for r in runs.values()]
    base = np.cumsum([0] + [t * k for t in T1s])
    idx = np.concatenate([(b + np.arange(t)[:, None] * k + r.A[:, R].astype(np.int64)).ravel()
                          for b, t, r in zip(base, T1s, runs.values())])
    S = np.concatenate([r.S.reshape(-1, d) for r in runs.values()])
    np.subtract.at(S, idx, np.tile(CwR, (sum(T1s), 1)))
    W = np.concatenate([r.W.ravel() for r in runs.values()]) \
        - np.bincount(idx, weights=np.tile(wR, sum(T1s)), minlength=len(S))
    Q = np.concatenate([r.Q.ravel() for r in runs.values()]) \
        - np.bincount(idx, weights=np.tile(qR, sum(T1s)), minlength=len(S))
    out = {}
    for (s, run), b, t in zip(runs.items(), base, T1s):
        part = slice(b, b + t * k)
        out[s] = RunTrace(run.cs, run.A, S[part].reshape(t, k, d), W[part].reshape(t, k),
                          Q[part].reshape(t, k), run.W0, run.moved, run.order,
                          run.margin_sorted, run.reason, run.runner_up, run.margin3, run.rank,
                          run.stack, run.d0)
    return out, (S, W, Q)


def run_centers(runs: dict, stats: tuple, X: np.ndarray | None = None) -> dict:
    """``{start: (c, labels, tie)}`` for every run at once: its centers at every iteration
    with the labels of the fit (c_0 the fit's, c_t its downdated sums over weights at
    t - 1: (T+1, k, d), the bits of the same division run by run), and the rows X's nearest
    of those centers (T+1, n) with whether the two nearest tie within rounding (T+1, n),
    as :func:`~fedclust.kfed.keyed_trace.labels_or_tie` decides them (None without X).
    ``stats``: :func:`downdated`'s buffers that the runs' statistics view."""
    rs = list(runs.values())
    k, d = rs[0].cs.shape[1:]
    T1s = np.array([len(r.cs) for r in rs])
    base = np.concatenate([[0], np.cumsum(T1s)])
    S, W, _ = stats
    with np.errstate(divide="ignore", invalid="ignore"):
        SW = S.reshape(-1, k, d) / W.reshape(-1, k)[:, :, None]
    # run by run, c_t for t >= 1 is the quotient at t - 1; c_0 the fit's
    c = SW[np.maximum(np.arange(base[-1]) - 1, 0)]
    c[base[:-1]] = np.stack([r.cs[0] for r in rs])
    lab = tie = None
    if X is not None and len(X):
        x_sq = np.einsum("ij,ij->i", X, X)
        c_sq = np.einsum("gkd,gkd->gk", c, c)
        with np.errstate(invalid="ignore", over="ignore"):
            D = x_sq[None, :, None] - 2.0 * np.matmul(X[None], c.transpose(0, 2, 1)) \
                + c_sq[:, None, :]
            lab = D.argmin(axis=2)
            if k > 1:
                two = np.partition(D, 1, axis=2)[..., :2]
                scale = x_sq[None, :] + c_sq.max(axis=1)[:, None]
                tie = two[..., 1] - two[..., 0] <= TIE_RTOL * scale
            else:
                tie = np.zeros(lab.shape, bool)
    return {s: (c[b:e], None if lab is None else lab[b:e], None if tie is None else tie[b:e])
            for s, b, e in zip(runs, base[:-1], base[1:])}
