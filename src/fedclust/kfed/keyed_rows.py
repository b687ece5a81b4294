"""A device's new summary entering the keyed server's trace (:mod:`fedclust.kfed.keyed_trace`)
after a row deletion on that device, for :func:`fedclust.kfed.keyed_unlearn.keyed_forget`.

The device's new pieces take the slots of its old ones (same device id, same index on the
device: the same row keys, the same place in the stacked rows, so a start run again and
the exact final means sum the rows in the fresh step's order). Its old pieces leave as a
forgotten device's do; the new ones enter:

* seeds: each candidate's potential gains the new pieces' exact share; a step whose
  candidates a new piece could join (its key within rounding of the last candidate's, or
  of the first seed's) counts as changed, and the start goes on from there;
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
from ..core.random import key_uniforms_steps
from .keyed import n_trials
from .keyed_trace import KeyedTrace, RunTrace

__all__ = ["Entering", "entering", "seed_entries", "enter_runs"]


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
    tr.cand_rows = None


def share(tr: KeyedTrace, X: np.ndarray, wX: np.ndarray, x_sq: np.ndarray, Y: np.ndarray,
          y_sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(share (S, k, M), before (n, S, k))``: the rows X's weighted share of each
    candidate's potential (their distance to the seeds before the step, or to the
    candidate where nearer), and each row's distance to the seeds before each step.
    ``Y``, ``y_sq``: the candidates' rows (S k M, d) and squared norms."""
    S, k, M = tr.cand.shape
    Dseed = squared_distances(X, tr.C[tr.seeds.ravel()], x_sq).reshape(len(X), S, k)
    before = np.minimum.accumulate(Dseed, axis=2)   # min over seeds 0..t
    before = np.concatenate([np.full((len(X), S, 1), np.inf), before[:, :, :-1]], axis=2)
    # a certificate: any rounding of the distances serves
    Dc = x_sq[:, None] - 2.0 * (X @ Y.T) + y_sq
    np.maximum(Dc, 0.0, out=Dc)
    Dc = Dc.reshape(len(X), S, k, M)
    return np.einsum("r,rskm->skm", wX, np.minimum(before[..., None], Dc)), before


#: keys closer than this share may order otherwise in a fresh step (the distances behind
#: them are rounded otherwise there)
KEY_RTOL = 1e-9


def seed_entries(tr: KeyedTrace, e: Entering, before: np.ndarray, left: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(joins (S, k), cut (S, k, M))``: the steps whose first L remaining candidates a
    new piece could join (or, at step 0, whose first seed it could be), given each new
    piece's distance to the seeds before each step ``before`` (n, S, k) and the kept
    candidates that remain ``left`` (S, k, M) bool; and, elsewhere, the kept candidates
    whose keys a new piece could precede (beyond the first L: the pick stays, but the kept
    list is cut there, so that it stays the smallest keys of the remaining rows, in order,
    as later forgets take the next candidates from it).

    Keys are bounded with the rounding of the distances behind them (``1e-12`` times the
    largest squared norm) and :data:`KEY_RTOL`: a new piece's from below, a candidate's
    from above."""
    S, k, M = tr.cand.shape
    L = n_trials(k)
    joins = np.zeros((S, k), bool)
    cut = np.zeros((S, k, M), bool)
    tol = 1e-12 * tr.scale2
    steps = np.arange(k)
    lower = np.tril(np.ones((k, k), bool), -1)   # lower[t, j]: seed j chosen before step t
    for s in range(S):
        seeds = tr.seeds[s]
        # step 0: the first seed is the smallest -log(u) / w
        e0 = -np.log(key_uniforms_steps(tr.keys[e.new], s, steps[:1])[0]) / e.w
        s0 = -np.log(key_uniforms_steps(tr.keys[seeds[:1]], s, steps[:1])[0, 0]) \
            / tr.w[seeds[0]]
        joins[s, 0] = bool((e0 <= s0 * (1 + KEY_RTOL)).any())
        cand = tr.cand[s]
        rows = np.where(cand >= 0, cand, 0)
        D = squared_distances(tr.C[rows.ravel()], tr.C[seeds]).reshape(k, M, k)
        lo = np.where(lower[:, None, :], D, np.inf).min(axis=2) - tol   # (k, M)
        m = left[s]
        # each step's candidates' uniforms at that step: the diagonal blocks
        u = key_uniforms_steps(tr.keys[rows.ravel()], s, steps).reshape(k, k, M)[steps, steps]
        with np.errstate(divide="ignore", invalid="ignore"):
            kc = np.where(m & (lo > 0), -np.log(u) / (np.maximum(lo, 1e-300) * tr.w[rows]),
                          np.inf)
        un = key_uniforms_steps(tr.keys[e.new], s, steps)   # (k, n)
        pn = before[:, s, :].T * e.w + tol * e.w
        with np.errstate(divide="ignore"):
            kn = (-np.log(un) / pn).min(axis=1)   # the smallest new key per step
        nl = m.sum(axis=1)
        bad = (m & (lo <= 0)).any(axis=1) | (nl < L)
        rank = np.cumsum(m, axis=1)
        Lth = np.where(m & (rank == L), kc, -np.inf).max(axis=1)
        j = bad | (kn <= Lth * (1 + KEY_RTOL))
        joins[s, 1:] = j[1:] & np.isfinite(kn[1:])
        # beyond the first L: the kept list cut from the first key a new piece could precede
        after = m & ~(kc < kn[:, None] * (1 - KEY_RTOL))
        c = np.logical_or.accumulate(after, axis=1)
        c[j | ~np.isfinite(kn)] = False
        cut[s, 1:] = c[1:]
    return joins, cut


def enter_runs(runs: dict, e: Entering, k: int) -> None:
    """Each followed run with the new pieces in their slots: labelled at every iteration
    by the fit's centers there (nearest, any rounding: they are assigned again anyway),
    their statistics added, the moved rows and certificates of the slots renewed (no
    margin: :attr:`KeyedTrace.extra` rows are assigned again at every iteration)."""
    slots = np.union1d(e.old, e.new)
    for run in runs.values():
        T1 = len(run.cs)
        lab = np.stack([squared_distances(e.C, c, e.c_sq).argmin(axis=1) for c in run.cs])
        run.A[:, e.new] = lab
        idx = (np.arange(T1)[:, None] * k + lab).ravel()
        d = run.S.shape[2]
        S = run.S.reshape(-1, d)
        np.add.at(S, idx, np.tile(e.Cw, (T1, 1)))
        run.W += np.bincount(idx, weights=np.tile(e.w, T1), minlength=T1 * k).reshape(T1, k)
        run.Q += np.bincount(idx, weights=np.tile(e.w * e.c_sq, T1),
                             minlength=T1 * k).reshape(T1, k)
        moved = [np.setdiff1d(m, slots, assume_unique=True) for m in run.moved]
        for t in range(1, T1):
            moved[t] = np.union1d(moved[t], e.new[lab[t] != lab[t - 1]])
        run.moved = moved
        o, m, r2, m3, _, _ = run.stack
        r2[:, e.new] = 0
        m3[:, e.new] = -np.inf
        mv_t = np.repeat(np.arange(T1), [len(x) for x in moved])
        run.stack = (o, m, r2, m3, np.concatenate(moved).astype(np.int64), mv_t)

