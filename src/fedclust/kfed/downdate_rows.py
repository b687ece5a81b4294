"""A row deletion under the paper's server (``server="farthest-lloyd1"``) without its step
in full: the device's new summary enters the downdate trace
(:class:`~fedclust.kfed.downdate.Lloyd1Trace`; ``tr`` below) in the slots of its old one, for
:func:`fedclust.kfed.downdate.downdate`.

The new pieces take the old pieces' slots (the same place among the stacked centers, so
the farthest-first order and the row order of every tie stay a fresh step's). The step
holds without running again when:

* the device is not the seed device, held no farthest-first pick, sends as many
  pieces as before, and its new centers are narrower than the seed device's (the
  widest stays the widest): no pick leaves;
* at every farthest-first step each new piece's distance to the centers chosen
  before it stays below that step's largest distance (the pick's), by more than a
  rounding allowance: no new piece would be picked, so every step picks as before;
* each new piece's nearest start center wins by more than rounding: the Lloyd
  round's sums and weights lose the old pieces' share and gain the new ones'.

The final centers then equal a fresh step's within rounding (a subtraction and an
addition instead of a sum over the rows: ``path="downdate"``, checked within 1e-12);
every label is certified by its margin as after a device forget, the new pieces with
margins measured against the reference centers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.kmeans import assign, squared_distances

__all__ = ["Entering", "entering", "write", "margins"]

#: a farthest-first distance or a nearest-center margin within this share (plus
#: ``1e-12`` times the largest squared norm) of another could order otherwise in a
#: fresh step
RTOL = 1e-9


@dataclass
class Entering:
    """The slots ``rows`` a row deletion rewrites and the new pieces' values ``C``,
    weights ``w`` and nearest start centers ``labels0``."""

    rows: np.ndarray
    C: np.ndarray
    w: np.ndarray
    labels0: np.ndarray


def _width(c: np.ndarray) -> float:
    """The smallest squared distance between two of a device's centers (the widest
    device's measure, :func:`~fedclust.kfed.server.pick_first_device`)."""
    if len(c) < 2:
        return -np.inf
    D = squared_distances(c, c)
    D[np.arange(len(c)), np.arange(len(c))] = np.inf
    return float(D.min())


def entering(tr: Any, enter: dict[int, Any], gone: set, weighted: bool = True
             ) -> Entering | None:
    """The new pieces of the devices ``enter`` {device: new reply} with their certificates,
    or None where the paper's step must run in full (see the module)."""
    if gone or tr.init is None:
        return None
    tol2 = 1e-12 * float(np.max((tr.C * tr.C).sum(axis=1), initial=0.0))
    seed_width = _width(np.asarray(tr.local_centers[tr.seed]))
    picked = set(tr.picked.tolist())
    rows, Cs, ws = [], [], []
    for z in sorted(enter):
        c = np.asarray(enter[z].centers)
        if z == tr.seed or z in picked or z not in tr.row_of:
            return None
        lo, hi = int(tr.offsets[tr.row_of[z]]), int(tr.offsets[tr.row_of[z] + 1])
        if c.dtype != np.float64 or c.shape != (hi - lo, tr.C.shape[1]):
            return None
        if not tr.alive[lo:hi].all():
            return None
        # the widest device stays the widest
        if _width(c) >= seed_width * (1 - RTOL) - tol2:
            return None
        rows.append(np.arange(lo, hi))
        Cs.append(c)
        counts = np.asarray(enter[z].counts)
        ws.append(counts.astype(np.float64) if weighted else np.ones(len(c)))
    rows, C, w = np.concatenate(rows), np.concatenate(Cs), np.concatenate(ws)
    # farthest-first: below every step's largest distance
    mind = np.minimum.accumulate(squared_distances(C, tr.C[tr.init]), axis=1)
    steps = np.flatnonzero(np.isfinite(tr.ff_max))
    if len(steps):
        top = tr.ff_max[steps]
        if (mind[:, steps - 1] >= top * (1 - RTOL) - tol2).any():
            return None
    # the Lloyd round's assignment to the start
    D0 = squared_distances(C, tr.start)
    lab = D0.argmin(axis=1)
    first = D0[np.arange(len(C)), lab]
    D0[np.arange(len(C)), lab] = np.inf
    if (D0.min(axis=1) - first <= RTOL * first + tol2).any():
        return None
    return Entering(rows, C, w, lab)


def margins(C: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, margin)``: nearest center of each row (as :func:`assign` picks it) and
    the distance to the second-nearest minus the nearest (non-squared)."""
    k = len(centers)
    labels = assign(C, centers)[0]
    if k == 1:
        return labels, np.full(len(C), np.inf)
    D = ((C * C).sum(axis=1)[:, None] - 2.0 * (C @ centers.T)
         + (centers * centers).sum(axis=1)[None, :])
    np.maximum(D, 0.0, out=D)
    near = np.sqrt(D[np.arange(len(C)), labels])
    D[np.arange(len(C)), labels] = np.inf
    return labels, np.sqrt(D.min(axis=1)) - near


def write(tr: Any, e: Entering) -> tuple:
    """The new pieces into their slots of ``tr`` (its stacked rows, shared with the new
    trace): ``(labels0, ref_labels, order, margin_sorted, rank)`` with the slots' start
    labels, their labels and margins at the reference centers in the sorted order."""
    tr.C[e.rows] = e.C
    tr.w[e.rows] = e.w
    labels0 = tr.labels0.copy()
    labels0[e.rows] = e.labels0
    lab, mg = margins(e.C, tr.ref)
    ref_labels = tr.ref_labels.copy()
    ref_labels[e.rows] = lab
    keep = np.ones(len(tr.order), bool)
    keep[tr.rank[e.rows]] = False
    order, ms = tr.order[keep], tr.margin_sorted[keep]
    by = np.argsort(mg, kind="stable")
    pos = np.searchsorted(ms, mg[by], side="right")
    order = np.insert(order, pos, e.rows[by])
    margin_sorted = np.insert(ms, pos, mg[by])
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return labels0, ref_labels, order, margin_sorted, rank
