"""Dense k-means kernels shared by the client and server maths.

Distances use ``‖x‖² − 2x·c + ‖c‖²`` through BLAS, in row blocks so memory
stays O(block · k). Lloyd's algorithm and k-means++ are written here rather
than taken from scikit-learn because (a) they must draw from a numpy
``Generator`` (one seed scheme for the whole federation), (b) the server needs
weighted Lloyd with an explicit initialisation and a fixed number of rounds,
and (c) k-FED calls them once per device, where scikit-learn's per-call
validation dominates for small devices. ``tests/test_kmeans_kernels.py`` checks
both against scikit-learn.
"""

from __future__ import annotations

import numpy as np

__all__ = ["squared_distances", "assign", "lloyd", "kmeans_plusplus", "LloydResult", "update_centers",
           "sum_by_label", "relocate_empty_centers", "BLOCK", "lightweight_coreset",
           "blocked_lloyd", "weighted_kmeans"]

# Rows per block: 4096 rows x k centers x 8 bytes stays in the low MB for k <= 1000.
BLOCK = 4096


def squared_distances(X: np.ndarray, C: np.ndarray, x_sq: np.ndarray | None = None
                      ) -> np.ndarray:
    """All squared Euclidean distances between rows of X (n, d) and C (k, d).

    Returns an (n, k) array, clipped at 0 (the expansion can round below 0).
    ``x_sq`` (n,): ``(X * X).sum(axis=1)`` when the caller already has it (same bits).
    """
    if x_sq is None:
        x_sq = (X * X).sum(axis=1)
    D = x_sq[:, None] - 2.0 * (X @ C.T) + (C * C).sum(axis=1)[None, :]
    np.maximum(D, 0.0, out=D)
    return D


def assign(X: np.ndarray, C: np.ndarray, x_sq: np.ndarray | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    """Nearest center of every row of X, blockwise.

    Returns ``(labels, min_sq_dist)``: int64 (n,) and float (n,). Ties go to the
    lowest center index. ``x_sq`` (n,): the rows' squared norms, if already at hand.
    """
    n = X.shape[0]
    labels = np.empty(n, dtype=np.int64)
    mind = np.empty(n, dtype=np.result_type(X.dtype, C.dtype))
    c_sq = (C * C).sum(axis=1)
    for start in range(0, n, BLOCK):
        Xb = X[start:start + BLOCK]
        xb_sq = (Xb * Xb).sum(axis=1) if x_sq is None else x_sq[start:start + BLOCK]
        # ‖x‖² − 2x·c + ‖c‖² in place, in that order (the same bits as three temporaries)
        D = Xb @ C.T
        if D.dtype == np.result_type(D, xb_sq, c_sq):
            D *= -2.0
            D += xb_sq[:, None]
            D += c_sq[None, :]
        else:   # a wider norm's dtype: the result takes it
            D = xb_sq[:, None] - 2.0 * D + c_sq[None, :]
        lab = D.argmin(axis=1)
        labels[start:start + BLOCK] = lab
        mind[start:start + BLOCK] = D[np.arange(len(lab)), lab]
    np.maximum(mind, 0.0, out=mind)
    return labels, mind


class LloydResult:
    """Centers, labels, per-center weight, inertia and iteration count of a Lloyd run."""

    __slots__ = ("centers", "labels", "counts", "inertia", "n_iter", "_converged")

    def __init__(self, centers, labels, counts, inertia, n_iter, converged):
        self.centers = centers
        self.labels = labels
        self.counts = counts
        self.inertia = inertia
        self.n_iter = n_iter
        self._converged = converged   # a bool, or a zero-argument callable giving it

    @property
    def converged(self) -> bool:
        """Whether the run stopped by its own rules (not cut off by ``max_iter``)."""
        if callable(self._converged):   # worked out at the first read
            self._converged = bool(self._converged())
        return self._converged


def update_centers(X, labels, k, weights, old_centers, Xw=None):
    """Weighted means per label; empty clusters keep their previous center
    (``Xw``: ``X * weights[:, None]``, if already at hand)."""
    if weights is None:
        counts = np.bincount(labels, minlength=k).astype(X.dtype)
        sums = np.zeros((k, X.shape[1]), dtype=X.dtype)
        if X.shape[0] < 64:
            np.add.at(sums, labels, X)
        else:
            sum_by_label(X, labels, k, sums)
    else:
        counts = np.bincount(labels, weights=weights, minlength=k).astype(X.dtype)
        sums = np.zeros((k, X.shape[1]), dtype=X.dtype)
        sum_by_label(X * weights[:, None] if Xw is None else Xw, labels, k, sums)
    centers = old_centers.copy()
    nonempty = counts > 0
    centers[nonempty] = sums[nonempty] / counts[nonempty, None]
    return centers, counts


def sum_by_label(X, labels, k, out):
    # A sparse one-hot product is BLAS-backed and far faster than np.add.at.
    from scipy.sparse import csr_matrix

    onehot = csr_matrix((np.ones(len(labels), dtype=X.dtype), (labels, np.arange(len(labels)))),
                        shape=(k, len(labels)))
    out[:] = onehot @ X
    return out


def lloyd(X: np.ndarray, init: np.ndarray, *, weights: np.ndarray | None = None,
          max_iter: int = 300, tol: float = 1e-4, relocate_empty: bool = True,
          x_sq: np.ndarray | None = None, x_var: float | None = None) -> LloydResult:
    """Lloyd's algorithm from ``init`` until labels stop changing.

    Stops when labels are unchanged, when the total squared center shift is at
    most ``tol`` times the mean per-feature variance of X (scikit-learn's
    relative tolerance), or after ``max_iter`` rounds. ``max_iter=1`` gives
    exactly one assignment + update round (k-FED's server step).

    With ``relocate_empty`` an emptied cluster is moved to the point farthest
    from its center among clusters that keep another point (as scikit-learn
    does; :func:`relocate_empty_centers`). When X has at least k *distinct*
    points and the run stops because its labels stay the same, every
    returned center has weight > 0. With fewer distinct points duplicates tie
    to one center and some centers stay empty (X = [0, 0, 10], k = 3 ends with
    weights (2, 1, 0)); a run cut off by ``max_iter`` returns the nearest-center
    labels of its last centers, where a cluster may be empty as in
    scikit-learn.

    ``x_sq`` (the rows' squared norms) and ``x_var`` (``X.var(axis=0).mean()``) may
    be given by a caller that runs Lloyd several times on the same X: same bits.
    """
    k = init.shape[0]
    centers = np.array(init, dtype=X.dtype, copy=True)
    Xw = None
    if weights is not None:
        weights = np.asarray(weights, dtype=X.dtype)
        Xw = X * weights[:, None]   # the same every iteration
    if x_sq is None:
        x_sq = (X * X).sum(axis=1)
    # one round (k-FED's server step): the variance only feeds the ``converged`` flag, which
    # callers seldom read; it is worked out when read (a full pass over X saved otherwise)
    lazy_tol = x_var is None and max_iter == 1

    def feature_var() -> float:
        return x_var if x_var is not None else X.var(axis=0).mean() if X.shape[0] > 1 else 0.0

    abs_tol = None if lazy_tol else tol * feature_var()
    labels = None
    converged = False
    final = None   # (labels, mind) of the current centers, when already computed
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        new_labels, mind = assign(X, centers, x_sq)
        if labels is not None and np.array_equal(new_labels, labels):
            converged = True
            n_iter -= 1  # this pass only confirmed the previous update
            final = (new_labels, mind)
            break
        labels = new_labels
        new_centers, counts = update_centers(X, labels, k, weights, centers, Xw)
        if relocate_empty and (counts == 0).any() and X.shape[0] >= k:
            new_centers, labels, counts = relocate_empty_centers(X, labels, new_centers, counts, mind, weights)
        shift = ((new_centers - centers) ** 2).sum()
        centers = new_centers
        if lazy_tol:   # the only round
            converged = lambda shift=shift: bool(shift <= tol * feature_var())  # noqa: E731
        elif shift <= abs_tol:
            converged = True
            break
    labels, mind = assign(X, centers, x_sq) if final is None else final
    w = np.ones(X.shape[0], dtype=X.dtype) if weights is None else weights
    counts = np.bincount(labels, weights=w, minlength=k)
    inertia = float(mind @ w)
    return LloydResult(centers, labels, counts, inertia, max(n_iter, 1), converged)


def relocate_empty_centers(X, labels, centers, counts, mind, weights):
    """Move each empty center onto a far point taken from a cluster that keeps another point.

    Points are taken farthest first (``mind``: squared distance to their
    center); a point whose cluster would be left with no weight is skipped, so
    a one-point cluster is never emptied. Without weights and with n >= k
    every cluster of the returned labels has at least one point (duplicates
    included). Returns the means of the returned labels (k, d), the labels
    (n,) and the per-cluster weights (k,).
    """
    order = np.argsort(-mind, kind="stable")
    empties = np.flatnonzero(counts == 0)
    taken = 0
    for j in empties:
        while taken < len(order):
            i = order[taken]
            taken += 1
            if counts[labels[i]] > (1 if weights is None else weights[i]):
                break
        else:
            break
        old = labels[i]
        w = 1.0 if weights is None else weights[i]
        counts[old] -= w
        labels[i] = j
        counts[j] = w
        centers[j] = X[i]
    return update_centers(X, labels, len(centers), weights, centers)[0], labels, counts


def kmeans_plusplus(X: np.ndarray, k: int, rng: np.random.Generator, *,
                    weights: np.ndarray | None = None,
                    n_local_trials: int | None = None,
                    x_sq: np.ndarray | None = None) -> np.ndarray:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007), as in scikit-learn.

    Each step samples ``2 + log k`` candidates proportionally to (weighted)
    squared distance to the chosen centers and keeps the one that lowers the
    potential most. Returns the indices of the chosen rows of X. ``x_sq``: the
    rows' squared norms, if already at hand (same bits).
    """
    n = X.shape[0]
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(k))
    if x_sq is None:
        x_sq = (X * X).sum(axis=1)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    idx = np.empty(k, dtype=np.int64)
    first = rng.choice(n, p=w / w.sum())
    idx[0] = first
    closest = squared_distances(X, X[first:first + 1], x_sq)[:, 0].astype(np.float64)
    pot = closest @ w
    for c in range(1, k):
        if pot <= 0:  # every point already coincides with a center: take unused rows
            unused = np.setdiff1d(np.arange(n), idx[:c])
            idx[c] = unused[0] if len(unused) else idx[0]
            continue
        p = closest * w
        cand = rng.choice(n, size=n_local_trials, p=p / p.sum())
        d_cand = np.minimum(closest[:, None], squared_distances(X, X[cand], x_sq))
        pots = w @ d_cand
        best = int(np.argmin(pots))
        idx[c] = cand[best]
        closest = d_cand[:, best]
        pot = pots[best]
    return idx


# --------------------------------------------------------------------------- many centers
#: rows per block of the large-data kernels: 65 536 x k distances stay a few tens of MB
LARGE_BLOCK = 1 << 16


def _row_sq(X: np.ndarray, block: int = LARGE_BLOCK) -> np.ndarray:
    out = np.empty(X.shape[0], dtype=np.float64)
    for s in range(0, X.shape[0], block):
        Xb = X[s:s + block]
        out[s:s + block] = np.einsum("ij,ij->i", Xb, Xb)
    return out


def lightweight_coreset(X: np.ndarray, size: int, rng: np.random.Generator, *,
                        weights: np.ndarray | None = None, block: int = LARGE_BLOCK
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Rows and weights of a lightweight coreset of the (weighted) rows of X.

    Bachem, Lucic & Krause (KDD 2018): row x is drawn (with replacement) with
    probability ``q(x) = ½ w(x)/W + ½ w(x) ‖x − μ‖² / Σ w ‖x' − μ‖²`` (μ the
    weighted mean) and weighted ``w(x) / (size · q(x))``. With
    ``size ≥ c (d k log k + log 1/δ) / ε²``, with probability ≥ 1 − δ every set
    Q of k centers has ``|cost_coreset(Q) − cost_X(Q)| ≤ ε/2 · cost_X(Q) +
    ε/2 · cost_X({μ})``. Two passes over X in blocks (O(n d) time, O(n) extra
    memory).

    Returns
    -------
    idx : ndarray (size,) int64, rows of X
    coreset_weights : ndarray (size,) float64
    """
    n = X.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    W = float(w.sum())
    mu = np.zeros(X.shape[1])
    for s in range(0, n, block):
        mu += w[s:s + block] @ X[s:s + block]
    mu /= W
    dist = np.empty(n, dtype=np.float64)
    for s in range(0, n, block):
        diff = X[s:s + block] - mu
        dist[s:s + block] = np.einsum("ij,ij->i", diff, diff)
    dist *= w
    total = float(dist.sum())
    q = 0.5 * w / W + (0.5 * dist / total if total > 0 else 0.5 * w / W)
    cdf = np.cumsum(q)
    idx = np.searchsorted(cdf, rng.random(int(size)) * cdf[-1], side="right")
    np.minimum(idx, n - 1, out=idx)
    return idx.astype(np.int64), w[idx] / (int(size) * q[idx])


def blocked_lloyd(X: np.ndarray, init: np.ndarray, *, weights: np.ndarray | None = None,
                  max_iter: int = 300, tol: float = 1e-4, block: int = LARGE_BLOCK
                  ) -> LloydResult:
    """Weighted Lloyd for many rows: BLAS distances in row blocks, no copy of X.

    The same stopping rules as :func:`lloyd` (labels unchanged, or total squared
    shift ≤ ``tol`` times the mean per-feature variance). Memory beyond X and
    the weights: the labels (n,) in the smallest signed integer type that holds
    k, plus O(block · k) per block (the row norms are held only while the
    total variance is summed, and made again per block for the inertia);
    integer weights (counts) are taken as they are and made float64 per block. Time
    O(n k d) per round, in BLAS matrix products. An emptied cluster keeps its
    center (it has weight 0).
    """
    n, d = X.shape
    k = init.shape[0]
    centers = np.array(init, dtype=np.float64, copy=True)
    w = None if weights is None else np.asarray(weights)
    if w is not None and w.dtype.kind not in "iu":   # float weights: float64 as a whole
        w = w.astype(np.float64, copy=False)

    def w_at(s: int) -> np.ndarray | None:
        return None if w is None else w[s:s + block].astype(np.float64, copy=False)

    x_sq = _row_sq(X, block)
    # integer weights sum exactly in float64 (< 2**53): the same W as their float64 sum
    W = float(n if w is None else (int(w.sum()) if w.dtype.kind in "iu" else w.sum()))
    mean = np.zeros(d)
    for s in range(0, n, block):
        mean += (X[s:s + block].sum(axis=0) if w is None else w_at(s) @ X[s:s + block])
    mean /= W
    total_sq = float(x_sq.sum() if w is None else x_sq @ w.astype(np.float64, copy=False))
    del x_sq   # (n,): made again per block, with the same bits, for the inertia
    abs_tol = tol * max(total_sq / W - float(mean @ mean), 0.0) / d
    labels = np.full(n, -1, dtype=np.min_scalar_type(-max(k, 1)))
    col = np.arange(d)
    converged = False
    n_iter = 0
    inertia = 0.0

    def assign_all(C: np.ndarray, last: bool = False) -> tuple[int, np.ndarray, np.ndarray]:
        nonlocal inertia
        changed = 0
        sums = np.zeros(k * d)
        wsum = np.zeros(k)
        c_sq = np.einsum("ij,ij->i", C, C)
        for s in range(0, n, block):
            Xb = X[s:s + block]
            D = Xb @ C.T
            D *= -2.0
            D += c_sq
            lab = D.argmin(axis=1)
            if last:   # the rows' squared distances to their centers, this block's share
                mind = D[np.arange(len(lab)), lab] + np.einsum("ij,ij->i", Xb, Xb)
                np.maximum(mind, 0.0, out=mind)
                wl = w_at(s)
                inertia += float(mind.sum() if wl is None else mind @ wl)
            changed += int((labels[s:s + block] != lab).sum())
            labels[s:s + block] = lab
            wb = w_at(s)
            vals = Xb if wb is None else Xb * wb[:, None]
            sums += np.bincount((lab[:, None] * d + col).ravel(), weights=vals.ravel(),
                                minlength=k * d)
            wsum += np.bincount(lab, weights=wb, minlength=k)
        return changed, sums.reshape(k, d), wsum

    for n_iter in range(1, max_iter + 1):
        changed, sums, wsum = assign_all(centers)
        if changed == 0 and n_iter > 1:
            converged = True
            n_iter -= 1
            break
        new = centers.copy()
        nonempty = wsum > 0
        new[nonempty] = sums[nonempty] / wsum[nonempty, None]
        shift = float(((new - centers) ** 2).sum())
        centers = new
        if shift <= abs_tol:
            converged = True
            break
    _, _, wsum = assign_all(centers, last=True)
    return LloydResult(centers, labels, wsum, inertia, max(n_iter, 1), converged)


def weighted_kmeans(X: np.ndarray, k: int, rng: np.random.Generator, *,
                    weights: np.ndarray | None = None, sample_size: int | None = None,
                    n_init: int = 3, max_iter: int = 300, tol: float = 1e-4) -> LloydResult:
    """Weighted k-means for many rows: seeds on a coreset, then Lloyd on all rows.

    1. a lightweight coreset of ``sample_size`` rows (default
       ``max(50 000, 200 k)``; all rows when there are fewer):
       :func:`lightweight_coreset` states its guarantee — every k centers cost
       the same on the coreset as on X up to ``ε/2`` of their cost plus ``ε/2``
       of the one-center cost;
    2. ``n_init`` times weighted k-means++ (O(log k)-competitive in expectation
       on the coreset; Arthur & Vassilvitskii 2007) and Lloyd on the coreset;
       the lowest coreset cost is kept;
    3. :func:`blocked_lloyd` on all rows from those centers: Lloyd never
       increases the cost, so the result costs at most what the seeds cost on X.

    Time: O(n d) for the coreset, O(n k d) per full Lloyd round (BLAS).
    """
    n = X.shape[0]
    m = int(sample_size) if sample_size is not None else max(50_000, 200 * int(k))
    if n <= m:
        Xs, ws = X, (None if weights is None else np.asarray(weights, dtype=np.float64))
    else:
        idx, ws = lightweight_coreset(X, m, rng, weights=weights)
        Xs = np.asarray(X[idx], dtype=np.float64)
    best = None
    for _ in range(max(1, int(n_init))):
        res = lloyd(Xs, Xs[kmeans_plusplus(Xs, k, rng, weights=ws)], weights=ws,
                    max_iter=max_iter, tol=tol)
        if best is None or res.inertia < best.inertia:
            best = res
    if n <= m:
        return best
    return blocked_lloyd(X, best.centers, weights=weights, max_iter=max_iter, tol=tol)
