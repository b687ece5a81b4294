"""The remaining rows of a keyed forget (:mod:`fedclust.kfed.keyed_unlearn`) stacked as a
fresh step stacks them, for a start run again over them, and such a run's trace expanded
to the trace's rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .keyed_trace import KeyedTrace, RunTrace, stacked

__all__ = ["Remaining", "remaining", "expand"]


@dataclass
class Remaining:
    """The remaining rows stacked as a fresh step stacks them (same values, same order):
    a start run again over them gives the fresh step's bits."""

    rows: np.ndarray
    C: np.ndarray
    w: np.ndarray
    c_sq: np.ndarray
    c_var: tuple   # (estimate, error bound, exact()): see traced_lloyd
    Cw: np.ndarray


def remaining(tr: KeyedTrace, alive: np.ndarray, var: float, var_err: float) -> Remaining:
    rows = np.flatnonzero(alive)
    C = tr.C[rows]
    w = tr.w[rows]
    # squared norms and weighted rows are per row: the trace's are the fresh step's bits
    c_sq = (C * C).sum(axis=1) if tr.c_sq is None else tr.c_sq[rows]
    Cw = C * w[:, None] if tr.Cw is None else tr.Cw[rows]
    # the fresh step's variance (its bits) is worked out only where a stop rule needs it;
    # elsewhere the downdated one decides alike (traced_lloyd)
    exact = {}

    def c_var() -> float:
        if "v" not in exact:
            exact["v"] = C.var(axis=0).mean() if C.shape[0] > 1 else 0.0
        return exact["v"]

    return Remaining(rows, C, w, c_sq, (var, var_err, c_var), Cw)


def expand(run: RunTrace, rows: np.ndarray, n0: int) -> RunTrace:
    """A run traced over the remaining rows, indexed by the trace's rows (the others:
    label 0, margin -inf, never read)."""
    T1 = len(run.cs)
    A = np.zeros((T1, n0), dtype=run.A.dtype)
    A[:, rows] = run.A
    # the other rows (margin -inf) first in index order, then the remaining rows in their
    # order (a stable sort of their margins, ``rows`` increasing): the stable sort of the
    # full margins, without sorting again
    other = np.ones(n0, bool)
    other[rows] = False
    other = np.flatnonzero(other)
    head = np.full(len(other), -np.inf)
    order = [np.concatenate([other, rows[o]]).astype(np.int32) for o in run.order]
    margin_sorted = [np.concatenate([head, m]) for m in run.margin_sorted]
    r2s, m3s = [], []
    for r2, m3 in zip(run.runner_up, run.margin3):
        a, b = np.zeros(n0, dtype=r2.dtype), np.zeros(n0)
        a[rows], b[rows] = r2, m3
        r2s.append(a)
        m3s.append(b)
    d0 = np.zeros(n0)
    d0[rows] = run.d0
    out = RunTrace(run.cs, A, run.S, run.W, run.Q, run.W0, [rows[m] for m in run.moved], order,
                   margin_sorted, run.reason, r2s, m3s, d0=d0)
    stacked(out)
    return out
