"""The weighted k-means++ server with removal-stable seeding, and its certified forget.

The default server, ``server="weighted-kmeans++"`` (also named
``"weighted-kmeans++-keyed"``): :func:`~fedclust.kfed.server.weighted_starts` greedy
weighted k-means++ starts, weighted
Lloyd to convergence from each, the lowest weighted cost kept by strict ``<``; the
k-means++ candidates are drawn so that removing a device moves no other device's draw.
At step t of start s, device center i (device z, center j) gets the key ``-log(u) / p_i`` with ``u`` keyed by (run seed, z, j, s, t) and ``p_i``
its weight times its squared distance to the chosen seeds; the ``2 + log k`` smallest
keys (:data:`TRIALS`) are the candidates (sampling proportional to p without replacement) and the one
that lowers the potential most is the seed.

Forgetting devices follows the fit's trace instead of running the step again:
:mod:`fedclust.kfed.keyed_trace` records it, :mod:`fedclust.kfed.keyed_unlearn` follows it
(:func:`~fedclust.kfed.keyed_unlearn.keyed_forget`).

Above :data:`SAMPLED_ABOVE` device centers (cross-device federations) the starts run on a
keyed lightweight coreset of the device centers (:func:`keyed_coreset`, about
:func:`sample_size` of them) and weighted Lloyd runs on all device centers from the best
start only (:func:`sampled_weighted_kmeans`); a forget of such a fit runs the step again
from the kept summaries.
"""

from __future__ import annotations

import numpy as np

from ..core.kmeans import blocked_lloyd, lloyd, squared_distances
from ..core.random import key_uniforms, row_keys as _row_keys
from .server import (KEYED_SERVERS, LARGE_N, farthest_first, pick_first_device,
                     weighted_starts)

__all__ = ["keyed_kmeans_plusplus", "keyed_weighted_kmeans", "keyed_starts", "KEYED_SERVER",
           "KEYED_NAMES", "keyed_coreset", "StackedKeys", "sample_size", "sampled_weighted_kmeans",
           "SAMPLED_ABOVE"]

KEYED_SERVER = "weighted-kmeans++"
#: every name of this server
KEYED_NAMES = (KEYED_SERVER, "weighted-kmeans++-keyed")
_KEY_BRANCH = np.uint64(0x6B657965645F7070)   # the seeding's own stream
_SAMPLE_BRANCH = np.uint64(0x6B657965645F636F)   # the coreset's inclusion draws
#: candidates kept per k-means++ step beyond the L drawn: a leaving device's candidate is
#: replaced by the next key
SPARE = 4


#: candidates per k-means++ step: None is scikit-learn's greedy ``2 + log k``; 1 is plain
#: k-means++ (one draw proportional to weight x D²), whose seeds change on a forget only
#: where a leaving row was one, but whose starts found worse minima on the natural
#: federations (``docs/kfed.md``); with the greedy pick a forget runs a start again where
#: a leaving device's share changes which candidate lowers the potential most
TRIALS: int | None = None


#: whether the step adds the farthest-first start (from the widest device) to the keyed
#: k-means++ starts: off, it won 3 of 540 fits on the natural federations, each by 0.01 %,
#: and a forget followed its path (which moves on every forget) at 20-60 ms
FARTHEST_START: bool = False


#: above this many device centers the starts run on a keyed coreset of them
#: (:func:`sampled_weighted_kmeans`): there 10 starts over all of them cost several times
#: scikit-learn's k-means on the pooled rows, while below it every start runs on all of
#: them (the natural federations hold < 5,000 and the unlearning benchmark 19,000)
SAMPLED_ABOVE = 50_000
#: the coreset's expected size: this many device centers per final cluster ...
SAMPLE_PER_CLUSTER = 200
#: ... and never fewer than this
SAMPLE_MIN = 10_000


def sample_size(n_centers: int, k: int) -> int | None:
    """The coreset's expected size m on ``n_centers`` device centers, or None where every
    start runs on all of them: ``m = max(SAMPLE_MIN, SAMPLE_PER_CLUSTER k)``, sampled only
    above :data:`SAMPLED_ABOVE` centers and where they are more than ``2 m``."""
    m = max(SAMPLE_MIN, SAMPLE_PER_CLUSTER * int(k))
    return m if n_centers > max(SAMPLED_ABOVE, 2 * m) else None


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


def keyed_kmeans_plusplus(C, k, w, c_sq, keys, start, spare=0, known=None):
    """Greedy weighted k-means++ with keyed candidates. Returns ``(seeds (k,), cand (k, M),
    pots (k, M), pick (k,))`` with M = L + ``spare``: per step the M smallest keys in key
    order (-1 padded; row 0 holds the first seed), the potential after adding each, and
    the position of the pick (among the first L), or None where every row coincides with
    a seed before k are chosen.

    ``known`` (j,), j >= 1: the first j seeds, already known to be this run's (a forget
    that certified those picks): the run goes on from step j, its distances to them
    measured as the steps measure them (:func:`_to_seed`); rows ``1..j-1`` of cand, pots
    and pick are left unset for the caller."""
    L = n_trials(k)
    M = L + spare
    seeds = np.empty(k, dtype=np.int64)
    cand = np.full((k, M), -1, dtype=np.int64)
    pots = np.full((k, M), np.inf)
    pick = np.zeros(k, dtype=np.int64)
    if known is None or len(known) == 0:
        with np.errstate(divide="ignore"):
            first = _smallest(-np.log(key_uniforms(keys, start, 0)) / w, 1)
        known = first[:1]
    j = len(known)
    seeds[:j] = known
    cand[0, 0] = known[0]
    closest = _to_seed(C, known[0], c_sq)
    for r in known[1:]:
        closest = np.minimum(closest, _to_seed(C, r, c_sq))
    for t in range(j, k):
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
        closest = np.minimum(closest, _to_seed(C, c[b], c_sq))
    return seeds, cand, pots, pick


def _to_seed(C, row, c_sq):
    """Every row's squared distance to the row ``row`` alone: a product's bits can depend
    on how many columns it has and where the column sits, so each seed's distances come
    from a product of their own, the same wherever the seeding runs from."""
    return squared_distances(C, C[row:row + 1], c_sq)[:, 0]


def keyed_starts(C, k, w, c_sq, centers, owner, local_index, seed, spare=0):
    """``(seed device position, farthest-first rows, keyed starts)``; the first two None
    where :data:`FARTHEST_START` is off."""
    pos = ff = None
    if FARTHEST_START:
        pos = pick_first_device(centers, "widest", None, stacked=C)
        offsets = np.cumsum([0] + [len(c) for c in centers])
        ff = farthest_first(C, k, start=np.arange(offsets[pos], offsets[pos + 1]))
    keys = row_keys(seed, owner, local_index)
    pp = [keyed_kmeans_plusplus(C, k, w, c_sq, keys, s, spare)
          for s in range(weighted_starts(len(C), k))]
    return pos, ff, pp


def center_keys(device_ids, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each stacked device center's key parts: its device's id and its index on that
    device, ``(owner (N,), local_index (N,))`` for devices of ``sizes`` (Z,) centers."""
    owner = np.repeat(np.asarray(device_ids, dtype=np.int64), sizes)
    return owner, np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)


class StackedKeys:
    """:func:`center_keys` of stacked device centers, made for the rows asked only.

    Device z (id ``device_ids[z]``) holds rows ``offsets[z]:offsets[z + 1]``; ``keys[rows]``
    (a slice or an index array) is ``(owner, local_index)`` of those rows, so tens of
    millions of centers need no (N,) key arrays (16 B a center)."""

    def __init__(self, device_ids, offsets: np.ndarray):
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.ids = (None if isinstance(device_ids, range) and device_ids.start == 0
                    and device_ids.step == 1 else np.asarray(device_ids, dtype=np.int64))

    def __getitem__(self, rows) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(rows, slice):
            rows = np.arange(*rows.indices(int(self.offsets[-1])))
        pos = np.searchsorted(self.offsets, rows, side="right") - 1
        owner = pos if self.ids is None else self.ids[pos]
        return owner.astype(np.int64, copy=False), rows - self.offsets[pos]


def _key_parts(owner, local_index, rows) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, local_index)`` at ``rows``: from the arrays, or from a :class:`StackedKeys`
    given as ``owner`` (``local_index`` None)."""
    if isinstance(owner, StackedKeys):
        return owner[rows]
    return owner[rows], local_index[rows]


def keyed_weighted_kmeans(C, k, w, centers, device_ids, seed, *, max_iter, tol):
    """The server's step: the best of the keyed k-means++ starts (and the farthest-first
    start where :data:`FARTHEST_START` is on)."""
    owner, local_index = center_keys(
        device_ids, np.fromiter(map(len, centers), dtype=np.int64, count=len(centers)))
    m = sample_size(len(C), k)
    if m is not None:
        res = sampled_weighted_kmeans(C, k, w, owner, local_index, seed, m, max_iter=max_iter,
                                      tol=tol)
        if res is not None:
            return res
    c_sq = (C * C).sum(axis=1)
    c_var = C.var(axis=0).mean() if C.shape[0] > 1 else 0.0
    _, ff, pp = keyed_starts(C, k, w, c_sq, centers, owner, local_index, seed)
    best, seen = None, []
    starts = [ff] if FARTHEST_START else []
    for idx in starts + [p[0] if p is not None else None for p in pp]:
        if idx is None:   # fewer distinct rows than k: that start is not run
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


def keyed_coreset(C, w, c_sq, owner, local_index, seed, m):
    """Rows and weights of a lightweight coreset of the weighted device centers, drawn by
    keys: ``(rows (n_s,), weights (n_s,))``.

    Bachem, Lucic & Krause (KDD 2018): center i (weight w_i) has the importance
    ``q_i = ½ w_i / W + ½ w_i ‖c_i − μ‖² / Σ_j w_j ‖c_j − μ‖²`` (μ the weighted mean,
    W = Σ w). Each center is kept on its own with probability ``π_i = min(1, m q_i)``,
    by a uniform keyed by (run seed, device id, center index) — Poisson sampling, so
    whether a device's center is in does not depend on its position or on the other
    devices' draws — and weighted ``w_i / π_i``. About m centers are kept (their number
    is a sum of independent draws: m ± 2√m).

    Guarantee (the paper's, for m independent draws by q): with
    ``m ≥ c (d k log k + log 1/δ) / ε²``, with probability ≥ 1 − δ every set Q of k
    centers costs on the coreset within ``ε/2 cost(Q) + ε/2 cost({μ})`` of its weighted
    cost on all centers. Poisson sampling keeps what that rests on: for every Q the
    coreset's cost is an unbiased sum of independent terms, each center's term at most
    its term under the paper's draws (``π_i ≥`` its draw rate ``m q_i`` or it is always
    kept, contributing no variance).

    ``owner`` may be a :class:`StackedKeys` (``local_index`` None) and ``c_sq`` None
    (each row's squared norm made in its block): then beside C and w only one (N,)
    array is held, the weighted squared distances to μ, whose sum needs them all.
    """
    W = float(w.sum())
    mu = (w @ C) / W
    mu_sq = float(mu @ mu)
    n = len(C)
    # row by row in blocks (each row's value is the same bits in any block), so their
    # temporaries stay small beside tens of millions of centers
    wd = np.empty(n, dtype=np.float64)
    for s in range(0, n, _KEY_BLOCK):
        e = min(s + _KEY_BLOCK, n)
        Cb = C[s:e]
        sq = np.einsum("ij,ij->i", Cb, Cb) if c_sq is None else c_sq[s:e]
        np.multiply(w[s:e], np.maximum(sq - 2.0 * (Cb @ mu) + mu_sq, 0.0), out=wd[s:e])
    total = float(wd.sum())
    rows, ws = [], []
    for s in range(0, n, _KEY_BLOCK):
        e = min(s + _KEY_BLOCK, n)
        wb = w[s:e]
        q = 0.5 * wb / W + (0.5 * wd[s:e] / total if total > 0 else 0.5 * wb / W)
        pi = np.minimum(1.0, m * q)
        u = key_uniforms(_row_keys(seed, *_key_parts(owner, local_index, slice(s, e)),
                                   _SAMPLE_BRANCH), 0, 0)
        hit = np.flatnonzero(u < pi)
        rows.append(hit + s)
        ws.append(wb[hit] / pi[hit])
    del wd
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate(rows), np.concatenate(ws)


#: rows per block of :func:`keyed_coreset`'s keyed uniforms
_KEY_BLOCK = 1 << 18


def sampled_weighted_kmeans(C, k, w, owner, local_index, seed, m, *, max_iter, tol):
    """The server's step on many device centers: keyed greedy k-means++ starts
    (:func:`keyed_kmeans_plusplus`, :func:`~fedclust.kfed.server.weighted_starts` of
    them for the coreset's size) and weighted Lloyd on a keyed coreset of about ``m``
    centers (:func:`keyed_coreset`), the lowest coreset cost kept by strict ``<``, then
    weighted Lloyd on all centers from its centers. None where no start could run
    (fewer distinct sampled centers than k).

    ``w`` (N,): the weights, float or integer counts (the same bits: integer counts are
    exact in float64); ``owner`` may be a :class:`StackedKeys` (``local_index`` None).

    Time: O(N d) for the coreset, the starts as on m centers, then O(N k d) per round
    of the final Lloyd. Lloyd never raises the cost, so the result costs at most what
    the best coreset solution costs on all centers. Above
    :data:`~fedclust.kfed.server.LARGE_N` centers the coreset's row norms are made per
    block and the final Lloyd runs in row blocks
    (:func:`~fedclust.core.kmeans.blocked_lloyd`, on integer counts as given): no (N,)
    array beyond the counts outlives the coreset, so millions of streamed devices'
    centers fit in memory."""
    large = len(C) > LARGE_N
    wf = w if w.dtype.kind == "f" else w.astype(C.dtype)
    c_sq = None if large else np.einsum("ij,ij->i", C, C)   # no (N, d) temporary
    rows, ws = keyed_coreset(C, wf, c_sq, owner, local_index, seed, m)
    if len(rows) < k:
        return None
    S = C[rows]
    s_sq = np.einsum("ij,ij->i", S, S) if c_sq is None else c_sq[rows]
    s_var = S.var(axis=0).mean() if len(rows) > 1 else 0.0
    keys = row_keys(seed, *_key_parts(owner, local_index, rows))   # the all-centers keys
    best = None
    for s in range(weighted_starts(len(rows), k)):
        pp = keyed_kmeans_plusplus(S, k, ws, s_sq, keys, s)
        if pp is None:
            continue
        res = lloyd(S, S[pp[0]], weights=ws, max_iter=max_iter, tol=tol, x_sq=s_sq,
                    x_var=s_var)
        if best is None or res.inertia < best.inertia:
            best = res
    if best is None:
        return None
    if large:
        del wf, S   # the blocked Lloyd converts the counts per block
        res = blocked_lloyd(C, best.centers, weights=w, max_iter=max_iter, tol=tol)
        res.centers = res.centers.astype(C.dtype, copy=False)   # float32 devices: float32
        return res
    return lloyd(C, best.centers, weights=wf, max_iter=max_iter, tol=tol, x_sq=c_sq,
                 x_var=C.var(axis=0).mean())


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


for _name in KEYED_NAMES:
    KEYED_SERVERS[_name] = keyed_weighted_kmeans

