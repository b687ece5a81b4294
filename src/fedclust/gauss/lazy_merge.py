"""The server's BIC merges with the full family's log-determinants computed only where
they decide a score.

:meth:`ClusterSet.merge_all <fedclust.gauss.model.ClusterSet.merge_all>` scores every
same-class pair with the BIC of one Gaussian against two, each Gaussian diagonal or full,
whichever is lower: a ``D x D`` log-determinant per pair (O(C^2 D^3)). The diagonal
family costs O(D) per pair; the full family's pooled log-determinant has a lower bound
that costs O(D) per pair after O(D^3) per *cluster*. With ``M = S_p + S_q + R`` (``R``
the BIC's ridge ``diag(Sigma_rule)``) the pooled scatter is ``M + c d d^T``, and

* ``det(M + c d d^T) = det(M) (1 + c d^T M^-1 d) >= det(M) (1 + c |d|^2 / lmax(M))``
  (matrix determinant lemma; ``M^-1 >= I / lmax(M)``);
* ``det(M)^(1/D) >= det(S_p + R/2)^(1/D) + det(S_q + R/2)^(1/D)`` (Minkowski's
  determinant inequality) and ``lmax(M) <= lmax(S_p + R/2) + lmax(S_q + R/2)``.

Where that bound (lowered by a relative margin far above rounding) already exceeds the
diagonal family's term, the diagonal family decides the score, and :func:`_scores`
computes it with the same floating-point operations, in the same order, as
:meth:`ClusterSet._bic_pair`. Where the bound shows that the pair cannot pass the test
whichever family wins (one Gaussian is worse than two by more than ``merge_tol`` even
at the bound: far-apart clusters), its score stays +inf: the greedy merge only ever
takes a score below 0, so an exact value there would decide nothing. Every other pair
goes through ``ClusterSet._merge_scores`` itself. So every score that can decide, the
merges, their order and the merged statistics are bit for bit those of ``merge_all``
(tested); only the time changes. Close pairs where the full family wins (correlated or
well-populated clusters) still cost their log-determinant. The next pair is read from
every row's kept first minimum (:class:`_RowMinima`), the pair ``np.argmin`` of the whole
score matrix would give, ties included, in O(C) per merge instead of O(C^2).
"""

from __future__ import annotations

import numpy as np

from .model import ARRAYS, ClusterSet

__all__ = ["merge_all_lazy"]

#: relative safety margin of the lower bounds (rounding is ~1e-13 relative)
_MARGIN = 1e-7
#: pairs scored per call in the first fill
_BATCH = 4096


def merge_all_lazy(cs: ClusterSet, until: int = 1) -> int:
    """:meth:`ClusterSet.merge_all` (``merge_test="bic"``, full covariances) with the full
    family's log-determinant computed only where it can decide a score; other settings
    run ``cs.merge_all`` itself. Returns the number of merges."""
    C = cs.C
    if C < 2 or cs.s.merge_test != "bic" or not cs.full:
        return cs.merge_all(until=until)
    bound = _Bounds(cs, C)
    cs._ld_cache = cs._bic_logdets(cs.n[:C].copy(), cs.S[:C])
    R = np.full((C, C), np.inf)
    # the first fill, as merge_all: (p, q) for q > p of the same class, in batches of
    # about _BATCH pairs (few calls for small sets, bounded memory for large ones)
    ps: list[np.ndarray] = []
    qs: list[np.ndarray] = []
    pending = 0
    for p in range(C):
        q = np.flatnonzero(cs.cls[:C] == cs.cls[p])
        q = q[q > p]
        if q.size:
            ps.append(np.full(q.size, p))
            qs.append(q)
            pending += q.size
        if ps and (pending >= _BATCH or p == C - 1):
            bp, bq = np.concatenate(ps), np.concatenate(qs)
            score = _scores(cs, bound, bp, bq)
            R[bp, bq] = score
            R[bq, bp] = score
            ps, qs, pending = [], [], 0
    alive = np.ones(C, bool)
    best = _RowMinima(R)
    merges = 0
    while C - merges > until:
        p, q = best.first()   # np.argmin(R)'s pair, without an O(C^2) scan per merge
        if not R[p, q] < 0.0:
            break
        score, stats = cs._merge_scores(np.array([p]), np.array([q]))
        n, mu, S = stats
        cs.n[p], cs.mu[p], cs.S[p] = n[0], mu[0], S[0]
        cs.last[p] = max(cs.last[p], cs.last[q])
        cs.joined[int(cs.uid[q])] = int(cs.uid[p])
        cs.refresh(np.array([p]))
        for (ld, _), (new, _) in zip(cs._ld_cache, cs._bic_logdets(n, S)):
            ld[p] = new[0]
        alive[q] = False
        cs.n[q] = 0.0
        R[q, :] = np.inf
        R[:, q] = np.inf
        bound.update(p)
        others = np.flatnonzero(alive & (cs.cls[:C] == cs.cls[p]))
        others = others[others != p]
        row = np.full(C, np.inf)
        if others.size:
            row[others] = _scores(cs, bound, np.full(others.size, p), others)
        R[p, :] = row
        R[:, p] = row
        R[p, p] = np.inf
        best.update(p, q)
        merges += 1
    cs._ld_cache = None
    keep = np.flatnonzero(alive)
    for name in ARRAYS:
        arr = getattr(cs, name)
        arr[:keep.size] = arr[keep]
    cs.C = int(keep.size)
    return merges


def _scores(cs: ClusterSet, bound: "_Bounds", p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``cs._merge_scores(p, q)[0]``, bit for bit: where the full family's bounded term
    exceeds the diagonal family's exact one, the diagonal family decides the score and it
    is computed here in the same operations as :meth:`ClusterSet._bic_pair`; the other
    pairs go through ``cs._merge_scores`` itself."""
    n_p, n_q = cs.n[p], cs.n[q]
    n = n_p + n_q
    delta = cs.mu[q] - cs.mu[p]
    c = (n_p * n_q / n)[..., None]
    # the pooled scatter's diagonal, as merge_clusters forms it: (S_p + S_q) + (c d_i) d_i
    dS = np.diagonal(cs.S, axis1=1, axis2=2)   # a view: only the pairs' diagonals are read
    diag = (dS[p] + dS[q]) + (c * delta) * delta
    (own_d, npar_d), (own_f, npar_f) = cs._ld_cache
    with np.errstate(divide="ignore", invalid="ignore"):
        ld_d = np.log((diag + cs.s0_rule) / n[..., None]).sum(axis=-1)
    w = n_p / n
    labels = n_p * np.log(w) + n_q * np.log1p(-w)
    logn = np.log(n)
    one = np.minimum(np.full(n.shape[0], np.inf), n * ld_d + npar_d * logn)
    two = np.full(n.shape[0], np.inf)
    two = np.minimum(two, n_p * own_d[p] + n_q * own_d[q] - 2.0 * labels
                     + (2 * npar_d + 1) * logn)
    two = np.minimum(two, n_p * own_f[p] + n_q * own_f[q] - 2.0 * labels
                     + (2 * npar_f + 1) * logn)
    out = (one - two) / (2.0 * n) - cs.s.merge_tol
    full_low = n * bound.log_det_low(p, q, n, c[:, 0], delta) + npar_f * logn
    full_low = full_low - _MARGIN * (np.abs(full_low) + 1.0)
    undecided = ~(full_low > one)
    # pairs that cannot merge: even with the full family's lower bound, one Gaussian is
    # worse than two by more than merge_tol; their exact score never decides (argmin
    # only takes a score < 0), so it stays +inf
    one_low = np.minimum(one, full_low)
    apart = ((one_low - two) / (2.0 * n) - cs.s.merge_tol
             > _MARGIN * (np.abs(one_low) + np.abs(two) + 1.0) / (2.0 * n))
    out[undecided & apart] = np.inf
    undecided &= ~apart
    if undecided.any():
        out[undecided] = cs._merge_scores(p[undecided], q[undecided])[0]
    return out


class _Bounds:
    """Per-cluster log det and largest eigenvalue of ``S + R/2``; pair lower bounds."""

    def __init__(self, cs: ClusterSet, C: int):
        self.cs = cs
        self.half = np.diag(0.5 * cs.s0_rule)
        self.ld = np.empty(C)
        self.lmax = np.empty(C)
        self.update(np.arange(C))

    def update(self, idx) -> None:
        idx = np.atleast_1d(idx)
        A = self.cs.S[idx] + self.half
        sign, ld = np.linalg.slogdet(A)
        self.ld[idx] = np.where(sign > 0, ld, -np.inf)
        self.lmax[idx] = np.linalg.eigvalsh(A)[:, -1]

    def log_det_low(self, p, q, n, c, delta) -> np.ndarray:
        """Lower bounds of log det((S_pooled + R) / n) of the pairs (p, q)."""
        D = self.cs.D
        d2 = np.einsum("kd,kd->k", delta, delta)
        with np.errstate(divide="ignore", invalid="ignore"):
            quad = d2 / (self.lmax[p] + self.lmax[q])
            out = (D * np.logaddexp(self.ld[p] / D, self.ld[q] / D)
                   + np.log1p(c * quad) - D * np.log(n))
        return np.where(np.isnan(out), -np.inf, out)


class _RowMinima:
    """Every row's first minimum of the symmetric score matrix R, so that the pair
    ``np.argmin(R)`` picks (the first minimum in row-major order: the first row holding
    the global minimum, its first column there; NaN counts as the minimum, as in
    ``np.argmin``) costs O(C) per merge instead of an O(C^2) scan. After a merge only
    rows p and q and columns p and q of R change: a row whose minimum sat in one of them
    is scanned again, the others compare their new entry in column p with their minimum.
    A row whose minimum is +inf keeps any column: it cannot hold a pair that merges
    (``merge_all`` stops at a minimum >= 0)."""

    def __init__(self, R: np.ndarray):
        self.R = R
        self.arg = np.argmin(R, axis=1)
        self.val = R[np.arange(R.shape[0]), self.arg]

    def first(self) -> tuple[int, int]:
        p = int(np.argmin(self.val))
        return p, int(self.arg[p])

    def update(self, p: int, q: int) -> None:
        R, arg, val = self.R, self.arg, self.val
        col = R[:, p]
        # a row with no finite score (dead, or no live partner) cannot hold the pair
        # that merges next; its arg is never read while its minimum is +inf
        redo = (((arg == p) | (arg == q)) & (val != np.inf)) | np.isnan(col) | np.isnan(val)
        redo[[p, q]] = True
        better = ~redo & ((col < val) | ((col == val) & (p < arg) & (val != np.inf)))
        arg[better] = p
        val[better] = col[better]
        rows = np.flatnonzero(redo)
        a = np.argmin(R[rows], axis=1)
        arg[rows] = a
        val[rows] = R[rows, a]
