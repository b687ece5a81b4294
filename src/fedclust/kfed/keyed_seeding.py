"""The seeding's certificate of a forget under the keyed server
(:func:`fedclust.kfed.keyed_unlearn.keyed_forget`): which k-means++ picks of each start
hold once the leaving rows' exact share of every candidate's potential is taken off and
a row deletion's new pieces' share is added; which steps a new piece joins, and whether
their picks hold with it among the candidates."""

from __future__ import annotations

import numpy as np

from ..core.kmeans import squared_distances
from ..core.random import key_uniforms_at, key_uniforms_steps
from .keyed import n_trials
from .keyed_rows import Entering, refresh_rows
from .keyed_trace import KeyedTrace

__all__ = ["seeds_stable", "candidate_rows", "seed_entries", "share", "insert_pieces",
           "piece_potentials", "KEY_RTOL"]


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
#: the first seed's keys ``-log(u) / w`` differ from a fresh step's by the logarithm's
#: rounding at most
FIRST_RTOL = 1e-12


def seed_entries(tr: KeyedTrace, e: Entering, before: np.ndarray, left: np.ndarray,
                 Y: np.ndarray, y_sq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(joins (S, k), cut (S, k, M), first_new (S,))``: the steps whose first L remaining candidates a
    new piece could join (or, at step 0, whose first seed it could be), given each new
    piece's distance to the seeds before each step ``before`` (n, S, k) and the kept
    candidates that remain ``left`` (S, k, M) bool (``Y``, ``y_sq``: the candidates' rows
    and squared norms, as :func:`share`); and, elsewhere, the kept candidates
    whose keys a new piece could precede (beyond the first L: the pick stays, but the kept
    list is cut there, so that it stays the smallest keys of the remaining rows, in order,
    as later forgets take the next candidates from it); and the starts whose first seed a
    new piece is for sure (its key below the seed's beyond :data:`FIRST_RTOL`).

    Keys are bounded with the rounding of the distances behind them (``1e-12`` times the
    largest squared norm) and :data:`KEY_RTOL`: a new piece's from below, a candidate's
    from above."""
    S, k, M = tr.cand.shape
    L = n_trials(k)
    tol = 1e-12 * tr.scale2
    steps = np.arange(k)
    rows = np.where(tr.cand >= 0, tr.cand, 0)   # (S, k, M)
    # every start's candidates keyed at their own step, the new pieces at every step and
    # the first seeds at step 0: one draw each for all starts
    starts = np.arange(S)
    u = key_uniforms_at(tr.keys[rows], starts[:, None, None], steps[None, :, None])  # (S, k, M)
    un = key_uniforms_at(tr.keys[e.new][None, None, :], starts[:, None, None],
                         steps[None, :, None])   # (S, k, n)
    # step 0: the first seed is the smallest -log(u) / w; no distance behind the keys,
    # only the logarithm's rounding
    with np.errstate(divide="ignore"):
        e0 = -np.log(un[:, 0, :]) / e.w
    s0 = (-np.log(key_uniforms_at(tr.keys[tr.seeds[:, 0]], starts, 0))
          / tr.w[tr.seeds[:, 0]])[:, None]
    joins = np.zeros((S, k), bool)
    joins[:, 0] = (e0 <= s0 * (1 + FIRST_RTOL)).any(axis=1)
    first_new = (e0 < s0 * (1 - FIRST_RTOL)).any(axis=1)
    # each candidate's distance to the seeds before its step (any rounding within tol)
    Y, y_sq = Y.reshape(S, k * M, -1), y_sq.reshape(S, k * M)
    Z = tr.C[tr.seeds]   # (S, k, d)
    D = y_sq[:, :, None] - 2.0 * (Y @ Z.transpose(0, 2, 1)) + (Z * Z).sum(axis=2)[:, None, :]
    D = np.maximum(D, 0.0).reshape(S, k, M, k)
    lower = np.tril(np.ones((k, k), bool), -1)   # lower[t, j]: seed j chosen before step t
    lo = np.where(lower[None, :, None, :], D, np.inf).min(axis=3) - tol   # (S, k, M)
    m = left
    with np.errstate(divide="ignore", invalid="ignore"):
        kc = np.where(m & (lo > 0), -np.log(u) / (np.maximum(lo, 1e-300) * tr.w[rows]),
                      np.inf)
        pn = before.transpose(1, 2, 0) * e.w + tol * e.w   # (S, k, n)
        kn = (-np.log(un) / pn).min(axis=2)   # the smallest new key per step
    bad = (m & (lo <= 0)).any(axis=2) | (m.sum(axis=2) < L)
    rank = np.cumsum(m, axis=2)
    Lth = np.where(m & (rank == L), kc, -np.inf).max(axis=2)
    j = bad | (kn <= Lth * (1 + KEY_RTOL))
    joins[:, 1:] = (j & np.isfinite(kn))[:, 1:]
    # beyond the first L: the kept list cut from the first key a new piece could precede
    after = m & ~(kc < kn[:, :, None] * (1 - KEY_RTOL))
    cut = np.logical_or.accumulate(after, axis=2)
    cut[j | ~np.isfinite(kn)] = False
    cut[:, 0] = False
    return joins, cut, first_new


def _key_bounds(u: np.ndarray, dist: np.ndarray, w: np.ndarray, tol: float):
    """Lower and upper bounds of keyed k-means++ keys ``-log(u) / (w dist)`` whose
    distances ``dist`` are known within ``tol`` (and the keys within :data:`KEY_RTOL`)."""
    with np.errstate(divide="ignore"):
        g = -np.log(u) / w
        lo = g / (dist + tol) / (1 + KEY_RTOL)
        hi = np.where(dist > tol, g / np.maximum(dist - tol, 1e-300), np.inf) * (1 + KEY_RTOL)
    return lo, hi


def insert_pieces(tr: KeyedTrace, e: Entering, s: int, t: int, before_st: np.ndarray,
                  m: np.ndarray, pots_st: np.ndarray, base: float | None, slack: float):
    """Step ``t`` of start ``s`` with the new pieces put into its kept candidate list:
    ``(cand (M,), pots (M,), pick, entered)`` where the step's pick holds (``entered``:
    whether a new piece is among the first L candidates), ``"same"`` where every new
    piece comes after the kept list (list and pick stand), ``"pick"`` where a new piece
    changes the pick for sure (a fresh step picks otherwise too), None where the new list
    or the pick is not certain (the start then runs again from ``t``).

    ``before_st`` (n,): each new piece's distance to the seeds before the step; ``m``
    (M,): the kept candidates that remain; ``pots_st`` (M,): their potentials less the
    leaving rows' share, plus the new pieces'; ``base``: the potential before the step
    (:func:`piece_potentials`). The pick is decided by the same rounding slack as a kept
    pick (:func:`seeds_stable`)."""
    M = tr.cand.shape[2]
    L = n_trials(tr.cand.shape[1])
    tol = 1e-12 * tr.scale2
    cols = np.flatnonzero(m)
    rows = tr.cand[s, t, cols]
    seeds = tr.seeds[s, :t]
    u = key_uniforms_steps(tr.keys[rows], s, np.array([t]))[0]
    D = squared_distances(tr.C[rows], tr.C[seeds]).min(axis=1)
    kc_lo, kc_hi = _key_bounds(u, D, tr.w[rows], tol)
    un = key_uniforms_steps(tr.keys[e.new], s, np.array([t]))[0]
    kn_lo, kn_hi = _key_bounds(un, before_st, e.w, tol)
    full = tr.cand[s, t, -1] != -1
    # each new piece's place among the kept candidates (in key order), where certain
    n_before = (kc_hi[None, :] < kn_lo[:, None]).sum(axis=1)
    n_after = (kc_lo[None, :] > kn_hi[:, None]).sum(axis=1)
    if (n_before + n_after != len(cols)).any():
        return None
    inside = n_before < len(cols) if full else np.ones(len(e.new), bool)
    if not full and ((n_before == len(cols)) & (before_st <= tol)).any():
        return None   # beyond a list that holds every row: its key could be infinite
    pieces = np.flatnonzero(inside)
    if len(pieces) == 0:
        return "same"   # every new piece after a full list: the list and pick stand
    by = np.lexsort((kn_lo[pieces], n_before[pieces]))
    pieces = pieces[by]
    pos = n_before[pieces]
    same = pos[1:] == pos[:-1]
    if (same & (kn_hi[pieces[:-1]] >= kn_lo[pieces[1:]])).any():
        return None   # two new pieces in one place, their order not certain
    pp = piece_potentials(tr, s, t, e.C[pieces], e.c_sq[pieces], base, e.new)
    if pp is None:
        return None
    merged = np.insert(rows, pos, e.new[pieces])
    mpots = np.insert(pots_st[cols], pos, pp)
    first = mpots[:L]
    b = int(np.argmin(first))
    rest = np.delete(first, b)
    if not np.isfinite(first).all() or (rest <= first[b] + slack).any():
        return None
    if merged[b] != tr.seeds[s, t]:
        return "pick"
    cand = np.full(M, -1, np.int64)
    pots = np.full(M, np.inf)
    n = min(M, len(merged))
    cand[:n], pots[:n] = merged[:n], mpots[:n]
    if full and n < M:
        cand[-1] = -2   # a list that may miss rows
    return cand, pots, b, bool((np.isin(merged[:L], e.new)).any())


def candidate_rows(tr: KeyedTrace, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Y (S k M, d), y_sq (S k M,))``: the device centers at the candidates' slots
    ``cand`` (``tr.cand`` with row 0 at its empty slots) and their squared norms, kept in
    ``tr.cand_rows``: gathered once per trace, then only the slots whose candidate changed
    are gathered again (a rewritten row's slots are refreshed as it is written:
    :func:`~fedclust.kfed.keyed_rows.write`)."""
    flat = cand.ravel()
    got = tr.cand_rows
    if got is None or got[0].shape != cand.shape:
        Y = tr.C[flat]
        y_sq = (Y * Y).sum(axis=1) if tr.c_sq is None else tr.c_sq[flat]
    else:
        Y, y_sq = got[1], got[2]
        refresh_rows(tr, Y, y_sq, flat, np.flatnonzero(got[0].ravel() != flat))
    tr.cand_rows = (cand.copy(), Y, y_sq)
    return Y, y_sq


def seeds_stable(tr: KeyedTrace, R: np.ndarray, alive: np.ndarray,
                  old: tuple | None = None, e: Entering | None = None):
    """The keyed starts' potentials less the rows ``R``'s exact share, per start why its
    seeds could change (None where they cannot), and per start its first step whose pick
    could change (k where none; a start run again goes on from there, its earlier seeds
    kept). ``alive``: the rows that remain. ``old``: R's values ``(C, w, squared norms)``
    where the trace holds new ones (a row deletion's slots); ``e``: the pieces entering
    them, whose share each potential gains."""
    S, k, M = tr.cand.shape
    L = n_trials(k)
    if old is None:
        old = (tr.C[R], tr.w[R], None if tr.c_sq is None else tr.c_sq[R])
    CR, wR, x_sq = old
    valid = tr.cand >= 0
    cand = np.where(valid, tr.cand, 0)
    Y, y_sq = candidate_rows(tr, cand)
    if x_sq is None:
        x_sq = (CR * CR).sum(axis=1)
    out_share, _ = share(tr, CR, wR, x_sq, Y, y_sq)
    pots = tr.pots - out_share
    gone = ~alive
    if e is not None:
        in_share, before = share(tr, e.C, e.w, e.c_sq, Y, y_sq)
        pots = pots + in_share
        gone = gone.copy()
        gone[e.old] = True   # a rewritten slot's old value leaves the candidates and seeds
    pots = np.where(valid, pots, np.inf)
    # the new candidates: the first L remaining of the kept key order
    left = valid & ~gone[cand]
    rank = np.cumsum(left, axis=2)
    inset = left & (rank <= L)
    # a full list (its last slot taken, or cut short by a new piece: -2) may miss rows
    short = ((left.sum(axis=2) < L) & (tr.cand[:, :, -1] != -1))[:, 1:].any(axis=1)
    cmp = np.where(inset, pots, np.inf)[:, 1:]
    b = np.take_along_axis(cmp, tr.pick[:, 1:, None], axis=2)[..., 0]
    np.put_along_axis(cmp, tr.pick[:, 1:, None], np.inf, axis=2)
    slack = 1e-9 * np.abs(np.where(valid, tr.pots, 0.0)[:, 1:]).max(initial=0.0) \
        + 1e-13 * (tr.C.shape[1] + 4) * tr.scale2 * float(tr.w.sum())
    near_t = cmp.min(axis=2) <= b + slack
    near = near_t.any(axis=1)
    held_t = gone[tr.seeds]
    held = held_t.any(axis=1)
    # a step with a single candidate measured its distances alone (another product):
    # a start goes on from there at the latest
    changed = held_t.copy()
    changed[:, 1:] |= near_t | (left.sum(axis=2) < L)[:, 1:] | (tr.cand[:, 1:, 1] < 0)
    cand_out, pick_out, entered = tr.cand, tr.pick, []
    joins = np.zeros_like(changed)
    flips = np.zeros(S, bool)
    if e is not None:   # a step whose candidates a new piece could join
        joins, cut, flips = seed_entries(tr, e, before, left, Y, y_sq)
        # a rewritten slot's old value leaves the kept lists for good (its new piece is
        # checked as a new piece); -2: a list that may miss rows
        cut |= valid & gone[cand] & alive[cand]
        cand_out = np.where(cut, -2, tr.cand)
        pick_out = tr.pick.copy()
        slack_pick = slack
        for s in np.flatnonzero(joins[:, 1:].any(axis=1)):
            ch = changed[s] | (np.arange(k) == 0) & joins[s]
            start_at = int(ch.argmax()) if ch.any() else k
            got = None
            for t in np.flatnonzero(joins[s, 1:]) + 1:
                if t >= start_at:
                    break
                base = pots[s, t - 1, pick_out[s, t - 1]] if t >= 2 else None
                got = insert_pieces(tr, e, s, int(t), before[:, s, t], left[s, t], pots[s, t],
                                    base, slack_pick)
                if got == "same":
                    joins[s, t] = False
                    continue
                if got is None or isinstance(got, str):
                    flips[s] |= got == "pick"
                    break
                cand_out[s, t], pots[s, t], pick_out[s, t] = got[0], got[1], got[2]
                if got[3]:
                    entered.append((int(s), int(t)))
                joins[s, t] = False
        changed |= joins
    first = np.where(changed.any(axis=1), changed.argmax(axis=1), k)
    why = [("a leaving device holds a k-means++ seed" if held[s] else
            "a leaving candidate and no spare key left" if short[s] else
            "a leaving device's share changes or nearly changes a k-means++ pick" if near[s]
            else "a new piece changes a k-means++ pick" if flips[s]
            else "a new piece could join a k-means++ step's candidates" if joins[s].any()
            else None) for s in range(S)]
    if e is not None:   # and the kept candidate lists with the new pieces in them
        return pots, why, first, (cand_out, pick_out, entered)
    return pots, why, first


def piece_potentials(tr: KeyedTrace, s: int, t: int, X: np.ndarray, x_sq: np.ndarray,
                     base: float | None, stale: np.ndarray | None = None) -> np.ndarray | None:
    """The potential of start ``s`` after step ``t`` picks each row of X (n, d) in turn,
    over the remaining rows: ``base`` (the potential before the step, that is after step
    t - 1's pick; None at t = 1, where it is measured) less what each row lowers. A
    remaining row i can come nearer to a piece p than to its nearest seed only where
    it is nearer to p than to the seed q nearest to p, and, where the seed it is labelled
    with at the start's first assignment (``RunTrace.d0``) was picked before step t,
    nearer to p than to that seed; one product of every row with the pieces and their
    q's finds the few rows whose distances to the seeds are measured. ``stale``: rows
    whose values changed since the run was traced (their ``d0`` is not read). None where
    ``base`` is not finite."""
    n = len(X)
    tol = 1e-12 * tr.scale2
    seeds = tr.seeds[s, :t]
    q = seeds[squared_distances(X, tr.C[seeds], x_sq).argmin(axis=1)]
    alive = tr.alive
    D = squared_distances(tr.C, np.vstack([X, tr.C[q]]), tr.c_sq)
    Dp, Dq = D[:, :n], D[:, n:]
    wa = np.where(alive, tr.w, 0.0)
    if t == 1:   # one seed: every row's distance to it is Dq
        return wa @ np.minimum(Dq, Dp)
    if base is None or not np.isfinite(base):
        return None
    near = (Dp < Dq + 2 * tol) & alive[:, None]
    run = tr.runs[s + int(tr.ff_start)]
    if run.d0 is not None:   # the rows whose labelled seed is nearer than p: no gain
        picked = run.A[0] < t
        if stale is not None:
            picked[stale] = False
        near &= ~(picked[:, None] & (Dp >= run.d0[:, None] + 2 * tol))
    rows = np.flatnonzero(near.any(axis=1))
    cl = squared_distances(tr.C[rows], tr.C[seeds],
                           None if tr.c_sq is None else tr.c_sq[rows]).min(axis=1)
    gain = np.where(near[rows], np.maximum(cl[:, None] - Dp[rows], 0.0), 0.0)
    return base - tr.w[rows] @ gain
