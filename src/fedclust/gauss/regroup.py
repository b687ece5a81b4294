"""Re-partition groups of adjacent components over their pieces (a step of
:func:`~fedclust.gauss.consolidate.consolidate`).

The pairwise merges, the split step and the group merge each change one component or join
several into one. None of them can move the pieces of a cluster that greedy merges shared
out between its neighbours back together: a cluster whose border pieces went to its two
neighbours and whose core is left as two chunks is, pair by pair, better kept as it is.
:func:`regroup` looks at a group of 2 to ``max_group`` adjacent components (those that
share the rows of border pieces, by the mixture's posteriors) and re-partitions the
group's pieces into K - 1, K or K + 1 components: an EM over the pieces with memberships
shared by a piece's rows (exact weighted moments) from deterministic starts (every pair of
the group joined, the current partition, every component cut in two across its first
principal axis), every piece then going to its most likely component. The proposals are
compared with the current partition by the mixture BIC of the group's rows, the other
components staying as they are, with the soft bound of
:func:`~fedclust.gauss.piece_stats.tied_loglik`; the best one replaces the current
partition when it lowers that BIC by more than ``merge_tol`` nats per sample of the group
(the effect size of the pairwise test) and also lowers the group's classification BIC
(each component fitted to its own pieces; the bound shares a piece's memberships among its
rows, so alone it undervalues components that overlap inside pieces, such as two
Gaussians sharing a centre). A component stays a pool of whole pieces and no sample is lost; the step
depends only on the pieces, so ``forget`` stays exact. Work per group
O(g^2 m_G g D^2) per EM step for m_G pieces and g components.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from .piece_stats import (diagonals, own_loglik, piece_loglik, pool_pieces, ridged_params,
                          tied_loglik, write_back)
from .model import ClusterSet

__all__ = ["regroup"]

#: a component's neighbours must share at least this many rows (expected, by posteriors)
_MIN_SHARED = 1.0
#: EM stops when no piece's membership moves by more than this
_R_TOL = 1e-3
#: a component whose weight falls below this fraction of the group's rows is dropped
_EMPTY = 1e-9


def regroup(cs: ClusterSet, z, n, mu, S, T, ridge, center, fam, max_group: int = 4,
            max_iter: int = 20):
    """Re-partition groups of adjacent components of ``cs`` where the mixture BIC prefers
    another partition of their pieces (module docstring). ``z`` (m,) is every piece's
    component slot, (n, mu, S, T) the pieces' counts, centred means, scatters and second
    moments, ``fam`` the covariance family of the step (True: full). Returns the number of
    groups changed and the pieces' slots in the updated ``cs``."""
    changed = 0
    tried: set[int] = set()   # uids whose groups were tried against the current partition
    for _ in range(cs.C):     # at most one change per component present at the start
        if cs.C < 2:
            break
        ctx = _Context(cs, z, n, mu, S, T, ridge, fam)
        best = None
        for k in np.argsort(ctx.nk, kind="stable"):
            if int(cs.uid[k]) in tried or ctx.nk[k] == 0:
                continue
            tried.add(int(cs.uid[k]))
            for G in ctx.groups(int(k), max_group):
                cand = ctx.best_partition(G, max_iter)
                if cand is not None and (best is None or cand[0] < best[0]):
                    best = cand
            if best is not None:
                break
        if best is None:
            break
        z = _apply(cs, z, best[1], best[2], n, mu, T, center)
        tried.clear()   # the changed group moved rows that other groups' scores use
        changed += 1
    return changed, z


class _Context:
    """The pieces' pooled statistics and posteriors under the current components."""

    def __init__(self, cs, z, n, mu, S, T, ridge, fam):
        self.cs, self.z, self.n, self.mu, self.ridge, self.fam = cs, z, n, mu, ridge, fam
        self.TT = T if fam else diagonals(T)
        self.SS = S if fam else diagonals(S)
        self.N = float(n.sum())
        C = cs.C
        Z = np.zeros((n.size, C))
        Z[np.arange(n.size), z] = 1.0
        self.nk, self.mk, self.Sk = pool_pieces(Z, n, mu, self.TT, fam)
        D = mu.shape[1]
        self.npar = D + (D * (D + 1) // 2 if fam else D) + 1
        live = self.nk > 0
        self.live = live
        # expected rows each component shares with each other (posteriors of the pieces)
        P, ld = ridged_params(self.nk[live], self.Sk[live], ridge, fam)
        a = piece_loglik(n, mu, self.SS, self.nk[live], self.mk[live], P, ld, self.N,
                             fam) / n[:, None]
        r = np.exp(a - a.max(axis=1, keepdims=True))
        r /= r.sum(axis=1, keepdims=True)
        W = np.zeros((C, C))
        idx = np.flatnonzero(live)
        share = np.zeros((n.size, C))
        share[:, idx] = n[:, None] * r
        np.add.at(W, z, share)
        W[np.arange(C), np.arange(C)] = 0.0
        self.W = W + W.T

    def groups(self, k: int, max_group: int):
        """Groups of 2..max_group components grown from k by the neighbour sharing the
        most rows with the group."""
        G = [k]
        while len(G) < max_group:
            near = self.W[G].sum(axis=0)
            near[G] = -np.inf
            near[~self.live] = -np.inf
            j = int(np.argmax(near))
            if not near[j] >= _MIN_SHARED:
                return
            G.append(j)
            yield list(G)

    def _bound(self, rows, nk, mk, Sk) -> float:
        return float(tied_loglik(self.n[rows], self.mu[rows], self.SS[rows], nk, mk, Sk,
                                    self.ridge, self.N, self.fam).sum())

    def _score(self, rows, rest, labels, K) -> float:
        """BIC of the group's rows / (2 n_G) for a partition of them into K components."""
        Z = np.zeros((rows.size, K))
        Z[np.arange(rows.size), labels] = 1.0
        nk, mk, Sk = pool_pieces(Z, self.n[rows], self.mu[rows], self.TT[rows], self.fam)
        nG = float(self.n[rows].sum())
        ll = self._bound(rows, np.r_[nk, self.nk[rest]], np.vstack([mk, self.mk[rest]]),
                         np.concatenate([Sk, self.Sk[rest]]))
        return (-2.0 * ll + K * self.npar * np.log(self.N)) / (2.0 * nG)

    def _hard(self, rows, labels, K) -> float:
        """Classification BIC of the group's rows for a partition of them (each component
        fitted to its own pieces, weights included)."""
        Z = np.zeros((rows.size, K))
        Z[np.arange(rows.size), labels] = 1.0
        nk, _, Sk = pool_pieces(Z, self.n[rows], self.mu[rows], self.TT[rows], self.fam)
        P, ld = ridged_params(nk, Sk, self.ridge, self.fam)
        own = own_loglik(nk, Sk, P, ld, self.N, self.fam).sum()
        return -2.0 * own + K * self.npar * np.log(self.N)

    def best_partition(self, G, max_iter):
        """(J, labels, G) of the best proposal for the pieces of G when it beats the
        current partition, else None."""
        rows = np.flatnonzero(np.isin(self.z, G))
        rest = np.setdiff1d(np.flatnonzero(self.live), G)
        pos = {g: i for i, g in enumerate(G)}
        cur = np.array([pos[int(v)] for v in self.z[rows]])
        g = len(G)
        current = self._score(rows, rest, cur, g)
        hard_current = self._hard(rows, cur, g)
        starts = []
        for p, q in combinations(range(g), 2):
            s = cur.copy()
            s[s == q] = p
            starts.append(s)
        starts.append(cur)
        for p in range(g):
            s = self._cut(rows, cur, p, g)
            if s is not None:
                starts.append(s)
        best = None
        for s in starts:
            lab, K = self._em(rows, s, max_iter)
            if K < 1:
                continue
            J = self._score(rows, rest, lab, K)
            if J < current - self.cs.s.merge_tol and (best is None or J < best[0]) \
                    and self._hard(rows, lab, K) < hard_current:
                best = (J, lab)
        if best is None:
            return None
        return best[0], (rows, best[1]), G

    def _cut(self, rows, cur, p, g):
        """Start: component p's pieces cut at their pooled mean across the first
        principal axis (the new half gets label g)."""
        mine = cur == p
        if mine.sum() < 2:
            return None
        r = rows[mine]
        nk, mk, Sk = pool_pieces(np.ones((r.size, 1)), self.n[r], self.mu[r], self.TT[r],
                              self.fam)
        if self.fam:
            vec = np.linalg.eigh(Sk[0])[1][:, -1]
        else:
            vec = np.eye(self.mu.shape[1])[int(np.argmax(Sk[0]))]
        side = (self.mu[r] - mk[0]) @ vec > 0
        if side.all() or not side.any():
            return None
        s = cur.copy()
        s[np.flatnonzero(mine)[side]] = g
        return s

    def _em(self, rows, lab, max_iter):
        """EM of the group's components over the pieces ``rows`` from the hard labels
        ``lab``, with memberships shared by a piece's rows (each step raises the bound of
        :func:`~fedclust.gauss.piece_stats.tied_loglik`; soft memberships let overlapping
        components keep the rows they share, where a classification EM would hand a
        narrow component's border to a wide neighbour); components that lose all their
        weight are dropped. Returns every piece's most likely component (0..K-1) and K."""
        n, mu, SS, TT = self.n[rows], self.mu[rows], self.SS[rows], self.TT[rows]
        lab = np.unique(lab, return_inverse=True)[1]
        R = np.zeros((rows.size, int(lab.max()) + 1))
        R[np.arange(rows.size), lab] = 1.0
        for _ in range(max_iter):
            nk, mk, Sk = pool_pieces(R, n, mu, TT, self.fam)
            keep = nk > _EMPTY * n.sum()
            P, ld = ridged_params(nk[keep], Sk[keep], self.ridge, self.fam)
            a = piece_loglik(n, mu, SS, nk[keep], mk[keep], P, ld, self.N,
                                 self.fam) / n[:, None]
            new = np.exp(a - a.max(axis=1, keepdims=True))
            new /= new.sum(axis=1, keepdims=True)
            done = new.shape == R.shape and np.abs(new - R).max() < _R_TOL
            R = new
            if done:
                break
        lab = np.unique(np.argmax(R, axis=1), return_inverse=True)[1]
        return lab, int(lab.max()) + 1


def _apply(cs: ClusterSet, z, part, G, n, mu, T, center):
    """Write the partition ``part`` = (rows, labels) of the pieces of the components G into
    ``cs``: a new component keeps the identity of the old one it shares most rows with
    (largest overlaps first), a left-over one is removed, an extra one is added. Returns
    the pieces' slots in the updated ``cs``."""
    rows, lab = part
    K = int(lab.max()) + 1
    Gs = np.sort(np.asarray(G))
    old = np.searchsorted(Gs, z[rows])
    overlap = np.zeros((K, Gs.size))
    np.add.at(overlap, (lab, old), n[rows])
    slot_of = np.full(K, -1)
    taken = np.zeros(Gs.size, bool)
    for flat in np.argsort(-overlap, axis=None, kind="stable"):
        a, b = np.unravel_index(flat, overlap.shape)
        if slot_of[a] < 0 and not taken[b] and overlap[a, b] > 0:
            slot_of[a], taken[b] = Gs[b], True
    for a in np.flatnonzero(slot_of < 0):
        src = Gs[0]
        cs.add(cs.mu[[src]], cs.S[[src]], cs.n[[src]], cs.cls[[src]], cs.last[[src]])
        slot_of[a] = cs.C - 1
    z = z.copy()
    z[rows] = slot_of[lab]
    full = cs.full
    Z = np.zeros((n.size, cs.C))
    Z[np.arange(n.size), z] = 1.0
    nk, mk, Sk = pool_pieces(Z, n, mu, T, full)
    live = np.flatnonzero(nk > 0)
    write_back(cs, live, nk, mk + center, Sk, z)
    return np.searchsorted(live, z)
