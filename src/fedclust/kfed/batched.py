"""Awasthi–Sheffet local k-means for a *stack* of same-shaped devices at once.

Many small devices (say 10⁵ phones with 20 points each) make per-device Python
overhead dominate; here B devices of equal (n, d, k) run as one vectorised
pass: batched Gram eigendecompositions, batched k-means++, batched Lloyd.
:func:`fedclust.local.local_kmeans` calls this with B = 1, so a device gets the
same result whether it runs alone or in a batch (up to BLAS rounding).

Randomness: k-means++ consumes a fixed number of uniforms per device,
``1 + (k - 1) * trials``, drawn up front from the device's own stream and used
by inverse-CDF sampling, so batching cannot change which points are picked.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..core.kmeans import relocate_empty_centers

__all__ = ["n_uniforms", "spectral_kmeans_batch", "spectral_seed_batch", "projection_batch",
           "nested_projections", "kmeanspp_batch", "lloyd_batch"]


#: S_r smaller than this fraction of an average cluster (n / k) is too small to trust.
MIN_FILTERED_FRACTION = 0.1


def n_trials(k: int) -> int:
    """Candidates per k-means++ step (scikit-learn's 2 + log k)."""
    return 2 + int(np.log(k))


def n_uniforms(k: int) -> int:
    """Uniform draws k-means++ consumes for k centers."""
    return 1 + (k - 1) * n_trials(k)


def projection_batch(X: np.ndarray, k: int) -> np.ndarray:
    """An orthonormal basis of every device's top-k right singular subspace, (B, d, k).

    Only the subspace matters: the device step uses projected *distances*
    (k-means++ and the filter) and lifts seeds back with ``V Vᵀ``, all invariant
    to a rotation of the basis. Many small devices use batched subspace iteration
    (:func:`_subspace_batch`: a few batched matmuls instead of one LAPACK call
    per device, which costs ~30 µs each however small the matrix); a device whose
    iteration has not converged, and every device when k is not small against
    the Gram size, gets an exact ``eigh``.
    """
    B, n, d = X.shape
    if n >= d:
        G = X.transpose(0, 2, 1) @ X                           # (B, d, d)
        V = top_eigvecs(G, k)
        return V
    K = X @ X.transpose(0, 2, 1)                               # (B, n, n)
    U = top_eigvecs(K, k)
    return _orthonormalize(X.transpose(0, 2, 1) @ U)           # spans the same subspace


def nested_projections(X: np.ndarray, k_max: int) -> np.ndarray:
    """Exact top-``k_max`` bases (B, d, k_max) whose first k columns are the top-k basis.

    For a search over k (``n_local_clusters="auto"``): one ``eigh`` per device
    serves every k <= k_max, and ``[:, :, :k]`` is the basis a one-device
    :func:`projection_batch` gives (eigh for the Gram of X, or of X Xᵀ with
    Gram–Schmidt, which keeps leading columns).
    """
    B, n, d = X.shape
    if n >= d:
        return np.linalg.eigh(X.transpose(0, 2, 1) @ X)[1][:, :, ::-1][:, :, :k_max]
    U = np.linalg.eigh(X @ X.transpose(0, 2, 1))[1][:, :, ::-1][:, :, :k_max]
    return _orthonormalize(X.transpose(0, 2, 1) @ U)


#: Batches smaller than this, or k above this fraction of the Gram size, use eigh directly.
_SUBSPACE_MIN_BATCH = 64
#: Grams at least this wide (an eigh of ~1 ms each) take subspace iteration from this batch size
_SUBSPACE_WIDE = 64
_SUBSPACE_MIN_BATCH_WIDE = 4
#: k above this fraction of m: eigh. Measured per device in batches of 4,096 (one thread):
#: the iteration that fails costs its own time on top of the eigh it ends in, so it pays
#: where (its cost when it fails) + (its cost when it converges) < eigh's, i.e. where it
#: wins with even odds of converging. At m = 20: eigh 27 µs; k = 4 fails in 15 µs and
#: converges in 6 µs (pays), k = 5 in 19 and 8 (does not); at m = 16, 32 and 64 the two
#: sides meet at about k = m / 4 too. Whether a device converges depends on its data (a
#: gap after its k-th eigenvalue), not on (n, d, k): a device asked for more centers than
#: it holds groups fails, one holding k separated groups converges.
_SUBSPACE_MAX_K_FRACTION = 0.25
#: Batches of at least twice this many devices run the iteration on this many first; when none
#: of them converges (a rung asking every device for more centers than it holds groups, as
#: k_z = 4 on devices of 2 groups), the batch's other devices take eigh without trying it.
#: A later device that would have converged then gets eigh's basis of the same subspace
#: (a rotation of it, up to rounding) instead of the iteration's.
_SUBSPACE_PROBE = 64
#: A basis Q is accepted when ‖G Q − Q (QᵀGQ)‖_F <= this × ‖G‖_F.
_SUBSPACE_RTOL = 1e-9


def top_eigvecs(G: np.ndarray, k: int) -> np.ndarray:
    """Basis of the top-k eigenspace of symmetric PSD matrices G (B, m, m) -> (B, m, k)."""
    B, m, _ = G.shape
    min_batch = _SUBSPACE_MIN_BATCH if m < _SUBSPACE_WIDE else _SUBSPACE_MIN_BATCH_WIDE
    if B < min_batch or k > _SUBSPACE_MAX_K_FRACTION * m:
        return np.linalg.eigh(G)[1][:, :, ::-1][:, :, :k]
    if B >= 2 * _SUBSPACE_PROBE:
        # the iteration on the first devices alone (each device's basis is computed on its
        # own, so splitting the batch changes no bits): when none of them converges, the
        # rest of the batch goes straight to eigh
        Qp, okp = _subspace_batch(G[:_SUBSPACE_PROBE], k)
        if not okp.any():
            return np.linalg.eigh(G)[1][:, :, ::-1][:, :, :k]
        Qr, okr = _subspace_batch(G[_SUBSPACE_PROBE:], k)
        Q, ok = np.concatenate([Qp, Qr]), np.concatenate([okp, okr])
    else:
        Q, ok = _subspace_batch(G, k)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        Q[bad] = np.linalg.eigh(G[bad])[1][:, :, ::-1][:, :, :k]
    return Q


def _subspace_batch(G: np.ndarray, k: int, sweeps: int = 4, squarings: int = 3,
                    power_sweeps: int = 3):
    """Subspace iteration on the top-k eigenspace of every G; returns (Q, converged).

    ``sweeps`` plain sweeps ``Q <- orth(G Q)`` first (a d² k product each: enough when
    the top-k eigenvalues stand well apart from the rest, as with separated clusters);
    the devices whose basis still fails the residual test then take ``power_sweeps``
    sweeps with ``G^(2^squarings)`` (d³ per squaring, but each sweep gains 2^squarings
    plain ones).
    """
    B, m, _ = G.shape
    norm = np.sqrt(np.einsum("bij,bij->b", G, G))
    Q = _orth(G @ _start_basis(m, k))
    for _ in range(sweeps):
        Q = _orth(G @ Q)
    ok = _converged(G, Q, norm)
    bad = np.flatnonzero(~ok)
    if len(bad) == 0:
        return Q, ok
    Gb = G[bad]
    scale = np.trace(Gb, axis1=1, axis2=2)
    scale = np.where(scale > 0, scale, 1.0)
    P = Gb / scale[:, None, None]                              # eigenvalues in [0, 1]
    # two buffers in turn: a fresh (B, m, m) result per squaring costs as much in page
    # faults as the product itself
    spare = np.empty_like(P)
    for _ in range(squarings):
        np.matmul(P, P, out=spare)
        P, spare = spare, P
    del spare
    Qb = Q[bad]
    for _ in range(power_sweeps):
        Qb = _orth(P @ Qb)
    Q[bad] = Qb
    ok[bad] = _converged(Gb, Qb, norm[bad])
    return Q, ok


@lru_cache(maxsize=32)
def _start_basis(m: int, k: int) -> np.ndarray:
    """A fixed (m, k) ±1 start for every device (no randomness consumed): a hash of (i, j),
    so its columns are independent (a periodic pattern repeats columns). Made once per
    (m, k) (every stacked chunk asks again), read-only."""
    i = np.arange(m, dtype=np.uint64)[:, None]
    j = np.arange(k, dtype=np.uint64)[None, :]
    h = i * np.uint64(0x9E3779B97F4A7C15) + j * np.uint64(0xC2B2AE3D27D4EB4F)
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)   # splitmix64's mixer (wraps modulo 2^64)
    h ^= h >> np.uint64(32)
    start = np.where(h & np.uint64(1), 1.0, -1.0)
    start.setflags(write=False)
    return start


def _converged(G: np.ndarray, Q: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """Residual test: ‖G Q − Q (QᵀGQ)‖_F <= :data:`_SUBSPACE_RTOL` × ‖G‖_F, per device."""
    GQ = G @ Q
    R = GQ - Q @ (Q.transpose(0, 2, 1) @ GQ)
    res = np.sqrt(np.einsum("bij,bij->b", R, R))
    return np.isfinite(res) & (res <= _SUBSPACE_RTOL * np.maximum(norm, 1e-300))


#: Gram–Schmidt (a few whole-batch operations per pair of columns) up to this many columns;
#: wider bases take LAPACK's Householder QR, one small call per device
_MGS_MAX_K = 3


def _orth(Q: np.ndarray) -> np.ndarray:
    """Orthonormal bases of the column spaces of (B, m, k) matrices (leading columns kept)."""
    if Q.shape[2] <= _MGS_MAX_K:
        return _orthonormalize(Q)
    return np.linalg.qr(Q)[0]


def _orthonormalize(Q: np.ndarray) -> np.ndarray:
    """Modified Gram–Schmidt on the k columns of every (m, k) matrix, vectorised over B.

    A column that vanishes (rank-deficient batch member) becomes NaN-free zeros;
    the residual test of :func:`_subspace_batch` then sends that device to eigh.
    """
    Q = np.array(Q, dtype=np.float64 if Q.dtype != np.float32 else np.float32, copy=True)
    for j in range(Q.shape[2]):
        q = Q[:, :, j]
        for i in range(j):
            q -= np.einsum("bm,bm->b", Q[:, :, i], q)[:, None] * Q[:, :, i]
        nrm = np.sqrt(np.einsum("bm,bm->b", q, q))
        q /= np.where(nrm > 0, nrm, 1.0)[:, None]
    return Q


def _inverse_cdf(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Row-wise sampling: p (B, n) non-negative weights, u (B, t) in [0, 1) -> indices (B, t)."""
    cum = np.cumsum(p, axis=1)
    thr = u * cum[:, -1:]
    if p.shape[1] < _SEARCH_MIN_N:   # short rows: one comparison pass over all of them
        idx = (cum[:, None, :] <= thr[:, :, None]).sum(axis=2)
    else:   # long rows: a binary search each (same count: the rows are non-decreasing)
        idx = np.array([row.searchsorted(t, side="right") for row, t in zip(cum, thr)],
                       dtype=np.int64).reshape(thr.shape)
    return np.minimum(idx, p.shape[1] - 1)


#: rows at least this long are sampled by binary search, shorter ones by one comparison pass
_SEARCH_MIN_N = 128


def kmeanspp_batch(P: np.ndarray, k: int, uniforms: np.ndarray, *, nearest: bool = False):
    """Greedy k-means++ (as scikit-learn) on every device; returns (B, k) row indices.

    ``nearest=True`` also returns, from the distances the seeding computes anyway, every
    point's nearest seed (B, n) (the first on a tie, as ``argmin``) and its squared
    distances to the nearest and to the second nearest seed (B, n) each (``inf`` for k = 1).
    """
    B, n, _ = P.shape
    T = n_trials(k)
    rows = np.arange(B)
    idx = np.empty((B, k), dtype=np.int64)
    # the first pick is uniform: _inverse_cdf on weights 1 counts the running sums 1..n
    # (exact integers) at most u n, i.e. floor(u n)
    idx[:, 0] = np.minimum(np.floor(np.asarray(uniforms[:, 0], dtype=np.float64) * n),
                           n - 1).astype(np.int64)
    # candidates' distances laid out (B, T, n): the potential is a sum along the last axis.
    # One product gives them whole: rows [−2 Pᵀ; ‖p‖²; 1] against [c, 1, ‖c‖²] (scaling by
    # a power of two is exact; the scale check keeps products far from overflow and
    # underflow), instead of a product and two passes adding the norms
    kp = P.shape[2]
    Pt = np.empty((B, kp + 2, n), dtype=P.dtype)               # (B, kp + 2, n)
    np.multiply(P.transpose(0, 2, 1), -2.0, out=Pt[:, :kp])
    np.einsum("bnd,bnd->bn", P, P, out=Pt[:, kp])
    Pt[:, kp + 1] = 1.0

    def sqdist_to(cand: np.ndarray) -> np.ndarray:             # (B, t) rows -> (B, t, n)
        Pc = np.empty(cand.shape + (kp + 2,), dtype=P.dtype)
        Pc[:, :, :kp] = P[rows[:, None], cand]
        Pc[:, :, kp] = 1.0
        np.einsum("btd,btd->bt", Pc[:, :, :kp], Pc[:, :, :kp], out=Pc[:, :, kp + 1])
        D = Pc @ Pt
        np.maximum(D, 0.0, out=D)
        return D

    closest = sqdist_to(idx[:, :1])[:, 0]
    chosen = np.zeros((B, n), dtype=bool)
    chosen[rows, idx[:, 0]] = True
    near = np.zeros((B, n), dtype=np.int64)
    second = np.full((B, n), np.inf, dtype=closest.dtype)
    # the potential (sum of the non-negative distances) is 0 only when every distance is:
    # after the first step the candidates' sums below give it without another pass
    potential = closest.max(axis=1) if k > 1 else None
    for c in range(1, k):
        p = closest
        flat = potential <= 0  # every point sits on a center: pick among unchosen rows
        if flat.any():
            p = closest.copy()
            p[flat] = (~chosen[flat]).astype(p.dtype)
        u = uniforms[:, 1 + (c - 1) * T: 1 + c * T]
        cand = _inverse_cdf(p, u)                                  # (B, T)
        D = sqdist_to(cand)
        d_cand = np.minimum(closest[:, None, :], D)                # (B, T, n)
        sums = d_cand.sum(axis=2)
        best = sums.argmin(axis=1)
        potential = sums[rows, best]
        idx[:, c] = cand[rows, best]
        if nearest:   # the new seed's distances: update the two nearest
            new = D[rows, best]
            closer = new < closest
            # the farther of the old nearest and the new seed competes for second nearest
            np.minimum(second, np.maximum(closest, new, out=new), out=second)
            near += closer * (c - near)   # exact in integers; a masked store costs more
        closest = d_cand[rows, best]
        chosen[rows, idx[:, c]] = True
    if nearest:
        return idx, near, closest, second
    return idx


def _means(X: np.ndarray, labels: np.ndarray, k: int, mask: np.ndarray | None = None):
    """Per-device sums (B, k, d) and counts (B, k) of the points with each label (those of
    ``mask`` only, when given)."""
    if mask is not None:
        labels = np.where(mask, labels, k)   # counted in a spare bin, a row of zeros below
    # the comparison writes 1.0 / 0.0 straight into the float one-hot (one pass, no bool copy)
    onehot = np.empty(labels.shape + (k,), dtype=X.dtype)
    np.equal(labels[:, :, None], np.arange(k)[None, None, :], out=onehot)
    return onehot.transpose(0, 2, 1) @ X, _counts(labels, k).astype(X.dtype)


def _counts(labels: np.ndarray, k: int) -> np.ndarray:
    """(B, n) labels in 0..k (k: not counted) -> (B, k) int64 counts, one bincount."""
    B = len(labels)
    flat = (labels + (k + 1) * np.arange(B)[:, None]).ravel()
    return np.bincount(flat, minlength=B * (k + 1)).reshape(B, k + 1)[:, :k]


#: nearest of at most this many centers: a comparison pass per center (``argmin`` along a
#: short last axis costs several times more)
_COLUMN_LOOP_MAX_K = 4


def _argmin_last(D: np.ndarray) -> np.ndarray:
    """``D.argmin(axis=2)`` (the first minimum on a tie) as int64, (B, n, k) -> (B, n)."""
    k = D.shape[2]
    if k > _COLUMN_LOOP_MAX_K:
        return D.argmin(axis=2)
    best = D[:, :, 0].copy()
    idx = np.zeros(best.shape, dtype=np.int64)
    for j in range(1, k):
        col = D[:, :, j]
        closer = col < best
        idx[closer] = j
        np.minimum(best, col, out=best)
    return idx


def _cross(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """(B, n, d) x (B, m, d) -> (B, n, m): ``‖c‖² − 2 x·c``, the squared distance less ‖x‖².

    Enough for every nearest-center choice (‖x‖² is the same for all centers of a row),
    and one pass over X fewer than the full squared distances.
    """
    D = X @ C.transpose(0, 2, 1)
    D *= -2.0
    D += np.einsum("bmd,bmd->bm", C, C)[:, None, :]
    return D


def lloyd_batch(X: np.ndarray, init: np.ndarray, *, max_iter: int, tol: float):
    """Lloyd on every device from ``init`` with the stopping rules of
    :func:`fedclust._kmeans.lloyd`; converged devices are frozen.

    Returns centers (B, k, d), labels (B, n), counts (B, k), n_iter (B,).
    """
    B, n, d = X.shape
    k = init.shape[1]
    centers = init.astype(X.dtype, copy=True)
    # tol x the mean feature variance, in one pass (np.var makes two full temporaries);
    # it only scales the stopping threshold, so the one-pass formula's rounding is harmless
    # (the rows' squared norms also bound the final assignment below)
    x2 = np.einsum("bnd,bnd->bn", X, X)
    if n > 1:
        mean = (np.ones((1, n), dtype=X.dtype) @ X)[:, 0] / n   # a reduction down short
        var = x2.sum(axis=1) / n - np.einsum("bd,bd->b", mean, mean)   # rows is slow
        abs_tol = tol * np.maximum(var, 0.0) / d
    else:
        abs_tol = np.zeros(B)
    labels = np.full((B, n), -1, dtype=np.int64)
    active = np.ones(B, dtype=bool)
    # labels already nearest to the final centers: a device whose labels did not change
    # stopped without moving its centers, so its last assignment is the final one
    fresh = np.zeros(B, dtype=bool)
    n_iter = np.zeros(B, dtype=np.int64)
    for it in range(1, max_iter + 1):
        a = np.flatnonzero(active)
        if len(a) == 0:
            break
        # all devices active (the common first rounds): views, no copy of X
        Xa, Ca = (X, centers) if len(a) == B else (X[a], centers[a])
        D = _cross(Xa, Ca)
        new = _argmin_last(D)
        same = (new == labels[a]).all(axis=1)
        active[a[same]] = False           # labels unchanged: converged at the previous round
        fresh[a[same]] = True
        if same.any():
            keep = ~same
            a, Xa, Ca, new, D = a[keep], Xa[keep], Ca[keep], new[keep], D[keep]
        if len(a) == 0:
            break
        n_iter[a] = it
        sums, counts = _means(Xa, new, k)
        upd = np.where(counts[:, :, None] > 0, sums / np.maximum(counts, 1)[:, :, None], Ca)
        nearest = new   # every point's nearest center (the relocation below may move some)
        relocate = np.flatnonzero((counts == 0).any(axis=1))
        if len(relocate) and n >= k:
            nearest = new.copy()
        for j in relocate:
            if n >= k:  # rare: move empty centers to far points, exactly as the serial Lloyd
                xj2 = np.einsum("nd,nd->n", Xa[j], Xa[j])
                mind = np.maximum(D[j, np.arange(n), new[j]] + xj2, 0.0)
                upd[j], new[j], counts[j] = relocate_empty_centers(
                    Xa[j], new[j].copy(), upd[j], counts[j].copy(), mind, None)
        moves = ((upd - Ca) ** 2).sum(axis=2)
        shift = moves.sum(axis=1)
        centers[a] = upd
        labels[a] = new
        stop = shift <= abs_tol[a]
        if stop.any():
            active[a[stop]] = False
            if d * k >= _BOUND_MIN_DK:
                s_ = np.flatnonzero(stop)
                fresh[a[s_]] = _labels_kept(D[s_], new[s_], x2[a[s_]], moves[s_], Ca[s_],
                                            upd[s_], nearest=nearest[s_])
    stale = np.flatnonzero(~fresh)   # centers moved after their last assignment
    if len(stale) == B:
        labels = _argmin_last(_cross(X, centers))
    elif len(stale):
        labels[stale] = _argmin_last(_cross(X[stale], centers[stale]))
    counts = _counts(labels, k)
    return centers, labels, counts, np.maximum(n_iter, 1)


#: the bound costs a few dozen passes over (B, n) values, the assignment it saves a product
#: of n x d x k per device: worth it from about this d x k (measured: 2x slower at d = 20,
#: k = 2; 2x faster at d = 100, k = 10)
_BOUND_MIN_DK = 256


def _labels_kept(D: np.ndarray, labels: np.ndarray, x2: np.ndarray, moves: np.ndarray,
                 old: np.ndarray, new: np.ndarray, *, nearest: np.ndarray | None = None
                 ) -> np.ndarray:
    """Devices whose every point is provably still nearest its center after the centers
    moved (Hamerly's bound), so the final assignment pass can be skipped: (B,) bool.

    D (B, n, k) is ``‖c‖² − 2 x·c`` for the ``old`` centers (overwritten here), ``labels``
    the points' labels, x2 (B, n) the rows' squared norms, ``moves`` (B, k) each center's
    squared shift. A point keeps its label when its distance to its nearest old center
    plus that center's shift stays below its distance to the second nearest less the
    largest shift (triangle inequality), by a margin far above the rounding of the squared
    distances, so the recomputed argmin could not differ. A device whose labels are not
    all nearest ones (empty clusters relocated) is assigned again. ``nearest``: the
    points' nearest columns of D (``D.argmin(axis=2)``), when the caller has them.
    """
    B, n, k = D.shape
    if k == 1:
        return np.ones(B, dtype=bool)
    nearest, own, second = _two_nearest(D, nearest)
    step = np.sqrt(moves)
    upper = np.sqrt(np.maximum(own + x2, 0.0)) + np.take_along_axis(step, nearest, axis=1)
    lower = np.sqrt(np.maximum(second + x2, 0.0)) - step.max(axis=1)[:, None]
    c2 = np.maximum(np.einsum("bkd,bkd->bk", old, old).max(axis=1),
                    np.einsum("bkd,bkd->bk", new, new).max(axis=1))
    # a dot product of d terms is off by at most about d ε (‖x‖² + ‖c‖²)
    d = old.shape[2]
    margin = max(1e-9, 8 * (d + 2) * float(np.finfo(D.dtype).eps)) * (x2 + c2[:, None])
    safe = (lower > 0) & (upper * upper + margin < lower * lower) & (nearest == labels)
    return safe.all(axis=1)


def _two_nearest(D: np.ndarray, nearest: np.ndarray | None = None):
    """Nearest column (first on a tie, as ``argmin``), its value and the second smallest
    value of every row of D (B, n, k >= 2), which is overwritten: (B, n) each. ``nearest``:
    ``D.argmin(axis=2)``, when the caller has it already."""
    k = D.shape[2]
    if k > _COLUMN_LOOP_MAX_K:
        if nearest is None:
            nearest = D.argmin(axis=2)
        own = np.take_along_axis(D, nearest[:, :, None], axis=2)[:, :, 0]
        np.put_along_axis(D, nearest[:, :, None], np.inf, axis=2)
        # the smallest left, one minimum per column (``D.min(axis=2)`` reduces each short
        # row separately, about 2.5x slower at k = 10; min is exact in any order)
        second = D[:, :, 0].copy()
        for c in range(1, k):
            np.minimum(second, D[:, :, c], out=second)
        return nearest, own, second
    own = D[:, :, 0].copy()   # one comparison pass per column (short rows reduce slowly)
    nearest = np.zeros(own.shape, dtype=np.int64)
    second = np.full(own.shape, np.inf, dtype=D.dtype)
    for c in range(1, k):
        col = D[:, :, c]
        closer = col < own
        np.minimum(second, np.where(closer, own, col), out=second)
        np.minimum(own, col, out=own)
        nearest[closer] = c
    return nearest, own, second


def spectral_kmeans_batch(X: np.ndarray, k: int, uniforms: np.ndarray, *, max_iter: int = 300,
                          tol: float = 1e-4, project: bool = True,
                          V: np.ndarray | None = None):
    """Algorithm 1 of k-FED for B devices: X (B, n, d), uniforms (B, n_uniforms(k)).

    ``V`` (B, d, k) may be given (e.g. from a randomized SVD of a large device).
    Returns centers (B, k, d), labels (B, n), counts (B, k), n_iter (B,).
    """
    theta = spectral_seed_batch(X, k, uniforms, project=project, V=V)
    return lloyd_batch(X, theta, max_iter=max_iter, tol=tol)


def spectral_seed_batch(X: np.ndarray, k: int, uniforms: np.ndarray, *, project: bool = True,
                        V: np.ndarray | None = None) -> np.ndarray:
    """Steps 1-3 of Algorithm 1 (projection, k-means++, ⅓-filtered means): θ (B, k, d)."""
    B, n, d = X.shape
    if project and d > k:
        if V is None:
            V = projection_batch(X, k)
        P = X @ V
    else:
        V, P = None, X
    # the seeding's own distances give each point's nearest seed and its second nearest
    seed_idx, nearest, d1, d2 = kmeanspp_batch(P, k, uniforms, nearest=True)
    rows = np.arange(B)[:, None]
    seeds = P[rows, seed_idx]                                  # (B, k, kp)
    keep = 9.0 * d1 <= d2   # ‖Â_i − ν_r‖ ≤ ⅓‖Â_i − ν_s‖ for every s ≠ r (all points if k = 1)
    sums, counts = _means(X, nearest, k, keep)
    # A filtered set S_r with only a handful of points gives a θ_r that sits on
    # those points in the full space, and Lloyd then keeps them as a near-singleton
    # cluster (seen when clusters overlap, c <= 5). Such θ_r use the whole
    # projected Voronoi cell of ν_r instead; an empty cell falls back to ν_r Vᵀ.
    min_size = max(2.0, MIN_FILTERED_FRACTION * n / k)
    small = counts < min_size
    redo = np.flatnonzero(small.any(axis=1))   # only these devices need their cells' sums
    if len(redo):
        cell_sums, cell_counts = _means(X[redo], nearest[redo], k)
        sm = small[redo]
        sums[redo] = np.where(sm[:, :, None], cell_sums, sums[redo])
        counts[redo] = np.where(sm, cell_counts, counts[redo])
    lifted = seeds @ V.transpose(0, 2, 1) if V is not None else seeds
    return np.where(counts[:, :, None] > 0, sums / np.maximum(counts, 1)[:, :, None], lifted)
