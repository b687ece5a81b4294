"""Consolidate merged clusters at the level of the pieces they were merged from.

The pairwise BIC merges (:meth:`~fedclust.gauss.model.ClusterSet.merge_all`) are greedy:
once small pieces have grown into several chunks of one cluster, or into a fragment on
the border of two clusters holding some rows of each, no single pair may pass, although
the mixture as a whole would be better without the chunk or the fragment. The server
still has the exact statistics (n, mean, scatter) of every piece it merged, so it can
judge the whole mixture by its classification likelihood with the pieces as atoms:

    L = sum_k [ n_k log(n_k / N) + sum_{i in k} log-likelihood of piece i under N(mu_k, Sigma_k) ],

exact from the moments (a piece's log-likelihood under any Gaussian needs only its
count, mean and scatter). :func:`consolidate` alternates

* a classification-EM step: every piece goes to the component under which its rows are
  most likely (mixing weight included), every component is re-estimated from its pieces
  (exact pooled moments, nothing is lost), and
* a dissolve step: a component (smallest first) is removed when handing each of its pieces
  to its most likely other component, those components re-estimated with the pieces'
  rows (moment matching), loses less than ``merge_tol`` nats per affected sample of
  penalised likelihood (mixture BIC, ``D + D(D+1)/2 + 1`` parameters per component,
  log N each),

* a split step: a two-Gaussian classification EM over a component's pieces proposes
  two groups of pieces, and the component is replaced by the two when the pairwise merge
  test keeps them apart (undoing a greedy merge that joined two clusters through the
  pieces between them),

then the pairwise merges again and a group merge (:func:`_merge_groups`: a group of
components, no pair of which passes, becomes one Gaussian when that lowers the mixture BIC
with memberships that are soft but shared by a piece's rows,
:func:`~fedclust.gauss.piece_stats.tied_loglik`) and a
regrouping of adjacent components into one fewer, as many or one more
(:func:`~fedclust.gauss.regroup.regroup`), until nothing changes. A component is always a pool of
whole pieces and every sample stays in a component. Maximum-likelihood covariances are ridged by the
volume-rule Sigma_0 as one pseudo-sample, as in the pairwise BIC; full or diagonal,
whichever gives the current mixture the lower BIC. Work per round O(m K D^2 + K D^3) for
m pieces and K components. Within one call the pieces do not change, so nothing is
computed twice on the same input: a group of pieces' best split (:class:`_SplitCache`),
the other components' likelihood columns of a group scored before, the pooled statistics
between dissolves, and a group merge or regrouping on a state it left unchanged; the
result is bit for bit that of computing them again (tested).
"""

from __future__ import annotations

import numpy as np

from .lazy_merge import merge_all_lazy
from .model import ClusterSet
from .piece_stats import (diagonals, own_loglik, piece_loglik, pool_pieces, ridged_params,
                          tied_from_loglik, write_back)
from .regroup import regroup

__all__ = ["consolidate", "snapshot"]


def consolidate(cs: ClusterSet, pieces: dict, max_rounds: int = 10, split: bool = True,
                slots: np.ndarray | None = None) -> int:
    """Refine ``cs`` (after :meth:`ClusterSet.merge_all`) against the ``pieces`` it was
    merged from (:func:`snapshot` taken before the merges, or any pieces whose ``uid``
    names the cluster that holds them); returns the number of components removed
    (negative when the splits added more). ``split=False`` leaves out the split step.
    ``slots``, if given, (m,) int, receives every piece's final cluster index (-1: in no
    cluster). Only for clustering with ``merge_test="bic"``."""
    slot = cs.row_clusters(pieces["uid"])
    if slots is not None:
        slots[:] = slot
    if cs.s.merge_test != "bic" or cs.n_classes or cs.C < (1 if split else 2):
        return 0
    ok = slot >= 0
    n, mu0, S = pieces["n"][ok], pieces["mu"][ok], pieces["S"][ok]
    slot = slot[ok]
    full = cs.full
    center = cs.g[1]
    mu = mu0 - center
    T = S + n[:, None, None] * mu[:, :, None] * mu[:, None, :] if full else S + n[:, None] * mu ** 2
    N = float(n.sum())
    ridge = cs.s0_rule
    D = cs.D
    K0 = cs.C
    z = slot.copy()
    splits = _SplitCache(cs, n, mu, S, T, ridge)
    idle_groups: set[bytes] = set()    # states on which the group merge merged nothing
    idle_regroup: set[bytes] = set()   # and the regrouping changed nothing
    for _ in range(max_rounds):
        changed = False
        K = cs.C
        Z = np.zeros((n.size, K))
        Z[np.arange(n.size), z] = 1.0
        fam = _family(Z, n, mu, T, ridge, full, N)
        npar = D + (D * (D + 1) // 2 if fam else D) + 1
        TT, SS = (T, S) if fam else (diagonals(T), diagonals(S))
        # classification EM over the pieces (a few steps; the likelihood only grows)
        for _ in range(20):
            nk, mk, Sk = pool_pieces(Z, n, mu, TT, fam)
            live = nk > 0
            P, ld = ridged_params(nk[live], Sk[live], ridge, fam)
            ll = piece_loglik(n, mu, SS, nk[live], mk[live], P, ld, N, fam)
            idx = np.flatnonzero(live)
            znew = idx[np.argmax(ll, axis=1)]
            if np.array_equal(znew, z):
                break
            z = znew
            Z = np.zeros((n.size, K))
            Z[np.arange(n.size), z] = 1.0
            changed = True
        # dissolve: smallest first, each against the current mixture
        nk = Z.T @ n
        pooled = None   # the components' statistics, pooled again only after a dissolve
        for k in np.argsort(nk, kind="stable"):
            if nk[k] == 0 or (Z.sum(axis=0) > 0).sum() < 2:
                continue
            if pooled is None:
                pooled = pool_pieces(Z, n, mu, TT, fam)
            if _dissolve(k, z, Z, n, mu, S, T, ridge, fam, N, npar, cs.s.merge_tol, pooled):
                changed = True
                pooled = None
        if split and _split(cs, z, center, splits) > 0:
            changed = True
            Z = np.zeros((n.size, cs.C))
            Z[np.arange(n.size), z] = 1.0
        nk, mk, Sk = pool_pieces(Z, n, mu, T, full)
        live = np.flatnonzero(nk > 0)
        write_back(cs, live, nk, mk + center, Sk, z)
        uz = cs.uid[np.searchsorted(live, z)]
        merged = merge_all_lazy(cs)   # cs.merge_all(), bit for bit, faster
        z = cs.row_clusters(uz)
        if split:
            # a step that changed nothing on this very state changes nothing on it again
            # (both are functions of the state and of this call's fixed pieces)
            state = _state(cs, z, fam)
            grouped = 0 if state in idle_groups else _merge_groups(
                cs, z, n, mu, S, center, fam, splits)
            if grouped:
                z = cs.row_clusters(uz)
                merged += grouped
                state = _state(cs, z, fam)
            else:
                idle_groups.add(state)
            moved = 0
            if state not in idle_regroup:
                moved, z = regroup(cs, z, n, mu, S, T, ridge, center, fam)
                if not moved:
                    idle_regroup.add(state)
            merged += moved
        changed = changed or merged > 0
        if not changed:
            break
    if slots is not None:
        slots[np.flatnonzero(ok)] = z
    return K0 - cs.C


def _state(cs: ClusterSet, z: np.ndarray, fam: bool) -> bytes:
    """The exact state the group merge and the regrouping act on: the components'
    classes and statistics (their bits), every piece's component and the family."""
    C = cs.C
    return b"".join([bytes([fam]), np.int64(C).tobytes(), cs.cls[:C].tobytes(),
                     cs.n[:C].tobytes(), cs.mu[:C].tobytes(), cs.S[:C].tobytes(),
                     np.asarray(z, np.int64).tobytes()])


class _SplitCache:
    """:func:`_best_split` of groups of pieces, kept for the rest of one :func:`consolidate`
    call. Within a call the pieces (n, centred mu, S, T), the ridge and the settings do
    not change, so a group of pieces, named by their indices in increasing order (the
    order :func:`_best_split` sees them in), determines the result bit for bit: a
    component that no step changed since the last round, or a group merge's candidate
    seen before, is not split again."""

    def __init__(self, cs: ClusterSet, n, mu, S, T, ridge):
        self.cs, self.n, self.mu, self.S, self.T, self.ridge = cs, n, mu, S, T, ridge
        self._kept: dict[bytes, tuple] = {}

    def __call__(self, rows: np.ndarray) -> tuple:
        """:func:`_best_split` of the pieces ``rows`` (increasing piece indices)."""
        key = np.asarray(rows, np.int64).tobytes()
        out = self._kept.get(key)
        if out is None:
            out = _best_split(self.cs, self.n[rows], self.mu[rows], self.S[rows],
                              self.T[rows], self.ridge)
            self._kept[key] = out
        return out


def _split(cs: ClusterSet, z, center, splits: _SplitCache) -> int:
    """Split every component in two where a two-Gaussian classification EM over its
    pieces finds halves that the pairwise merge test keeps apart; the second half becomes
    a new cluster of ``cs`` (its statistics are written back by the caller) and z is
    updated in place. Returns the number of splits."""
    count = 0
    for k in range(cs.C):
        mine = np.flatnonzero(z == k)
        h, score, halves = splits(mine)
        if h is None or not score >= 0.0:
            continue
        nh, mh, Sh = halves
        cs.add(mh[1:] + center, Sh[1:], nh[1:], cs.cls[[k]], cs.last[[k]])
        z[mine[~h]] = cs.C - 1
        count += 1
    return count


def _best_split(cs: ClusterSet, n, mu, S, T, ridge, max_iter: int = 25):
    """The two groups that :func:`_cem_pieces` proposes for the pieces (n, mu, S, T), the
    pairwise merge score of the two (>= 0: the merge test keeps them apart) and their
    (n, mu, S); (None, -inf, None) where no split is proposed."""
    full = cs.full
    if n.size < 2:
        return None, -np.inf, None
    h = _cem_pieces(n, mu, S if full else diagonals(S), T, ridge, full, max_iter)
    if h is None:
        return None, -np.inf, None
    H = np.stack([h, ~h], axis=1).astype(float)
    nh, mh, Sh = pool_pieces(H, n, mu, T, full)
    pooled = pool_pieces(np.ones((n.size, 1)), n, mu, T, full)
    own = [(ld[0], ld[1]) for ld, _ in cs._bic_logdets(nh, Sh)]
    score = cs._bic_pair(nh[:1], nh[1:], own, pooled[0], pooled[2])[0]
    return h, score, (nh, mh, Sh)


#: pairs are the pairwise merge test's; a group starts at three components
_MIN_GROUP = 3


def _soft_group_score(cs: ClusterSet, G: list[int], z, n, mu, S, fam,
                      kept: dict | None = None) -> float:
    """Change of the mixture BIC, per sample of the group G, when the components G become
    one Gaussian (their pooled statistics), less ``merge_tol``: merge while < 0. The
    mixture log-likelihood of a piece's rows is bounded below by
    n_i log sum_k exp(l_ik / n_i) (l_ik: the log-likelihood of its rows under component k
    with its weight; the bound is exact for responsibilities shared by the piece's rows),
    so, unlike the classification likelihood, overlapping components keep the rows they
    share. Evaluated on the pieces of G's components; the other components stay.
    ``kept``: the other components' likelihood columns by the set of G, for a caller that
    scores groups of the same cluster set again (they depend on the set alone, not on the
    order of G: the same rows, the same other components in increasing order)."""
    full = fam
    SS = S if full else diagonals(S)
    C = cs.C
    G = np.asarray(G)
    rest = np.setdiff1d(np.arange(C), G)
    rows = np.isin(z, G)
    N = float(cs.n[:C].sum())
    nG = float(cs.n[G].sum())

    def stats(idx):
        Sk = cs.S[idx] if (full or not cs.full) else np.diagonal(cs.S[idx], axis1=1, axis2=2)
        return cs.n[idx], cs.mu[idx], Sk

    nr, mr, Sr = n[rows], mu[rows], SS[rows]

    def loglik(nk, mk, Sk):
        P, ld = ridged_params(nk, Sk, cs.s0_rule, full)
        return piece_loglik(nr, mr, Sr, nk, mk, P, ld, N, full)

    # the other components' columns are the same before and after: computed once
    nk, mk, Sk = stats(np.r_[G, rest])
    key = tuple(sorted(int(g) for g in G))
    others = None if kept is None else kept.get(key)
    if others is None:
        others = loglik(nk[G.size:], mk[G.size:], Sk[G.size:])
        if kept is not None:
            kept[key] = others

    def bound(nk, mk, Sk):
        own = loglik(nk, mk, Sk)
        return float(tied_from_loglik(nr, np.hstack([own, others])).sum())

    before = bound(nk[:G.size], mk[:G.size], Sk[:G.size])
    m = (nk[:G.size, None] * mk[:G.size]).sum(axis=0) / nG
    d = mk[:G.size] - m
    if full:
        P = Sk[:G.size].sum(axis=0) + np.einsum("k,kd,ke->de", nk[:G.size], d, d)
    else:
        P = Sk[:G.size].sum(axis=0) + (nk[:G.size, None] * d ** 2).sum(axis=0)
    after = bound(np.array([nG]), m[None], P[None])
    D = cs.D
    npar = D + (D * (D + 1) // 2 if full else D) + 1
    return (-2.0 * (after - before) - (G.size - 1) * npar * np.log(N)) / (2.0 * nG) \
        - cs.s.merge_tol


def _merge_groups(cs: ClusterSet, z, n, mu, S, center, fam, splits: _SplitCache,
                  max_group: int = 5) -> int:
    """Merge groups of 3 to ``max_group`` components that one Gaussian describes better
    than the group's components (:func:`_soft_group_score` < 0), although no pair of them
    passes: the chunks of one cluster that a classification likelihood leaves (a core and
    sectors of its rim). A group grows from a component, smallest first, by its nearest
    neighbour in pairwise merge score; it is merged only when its pieces are not split in
    two by the split step's test. Returns the number of merges."""
    C = cs.C
    if C < 3:
        return 0
    p, q = np.triu_indices(C, 1)
    R = np.full((C, C), np.inf)
    same = cs.cls[p] == cs.cls[q]
    sc, _ = cs._merge_scores(p[same], q[same])
    R[p[same], q[same]] = sc
    R[q[same], p[same]] = sc
    done = np.zeros(C, bool)
    groups = []
    columns: dict = {}   # cs is not changed until the merges below: reused by G's set
    mu_abs = mu + center
    for k in np.argsort(cs.n[:C], kind="stable"):
        if done[k]:
            continue
        G = [int(k)]
        while len(G) < max_group:
            near = R[G].min(axis=0)
            near[G] = np.inf
            near[done] = np.inf
            j = int(np.argmin(near))
            if not np.isfinite(near[j]):
                break
            G.append(j)
            if (len(G) < _MIN_GROUP
                    or not _soft_group_score(cs, G, z, n, mu_abs, S, fam, columns) < 0.0):
                continue
            _, split_score, _ = splits(np.flatnonzero(np.isin(z, G)))
            if split_score < 0.0:
                groups.append([int(cs.uid[g]) for g in G])
                done[G] = True
            break
    for uids in groups:
        for u in uids[1:]:
            a = int(np.flatnonzero(cs.uid[:cs.C] == uids[0])[0])
            b = int(np.flatnonzero(cs.uid[:cs.C] == u)[0])
            _, stats = cs._merge_scores(np.array([a]), np.array([b]))
            cs._merge_pair(a, b, stats, 0)
    return sum(len(g) - 1 for g in groups)


def _cem_pieces(n, mu, S, T, ridge, full, max_iter):
    """Two-Gaussian classification EM with the pieces (n, mu, S; T their second moments)
    as atoms, started by cutting the piece means at the pooled mean across the pooled
    first principal axis. Returns the membership of the first half, or None."""
    nk, mk, Sk = pool_pieces(np.ones((n.size, 1)), n, mu, T, full)
    if full:
        vec = np.linalg.eigh(Sk[0])[1][:, -1]
    else:
        vec = np.eye(mu.shape[1])[int(np.argmax(Sk[0]))]
    h = (mu - mk[0]) @ vec > 0
    N = float(n.sum())
    for _ in range(max_iter):
        if h.all() or not h.any():
            return None
        H = np.stack([h, ~h], axis=1).astype(float)
        nh, mh, Sh = pool_pieces(H, n, mu, T, full)
        P, ld = ridged_params(nh, Sh, ridge, full)
        ll = piece_loglik(n, mu, S, nh, mh, P, ld, N, full)
        new = ll[:, 0] >= ll[:, 1]
        if np.array_equal(new, h):
            break
        h = new
    if h.all() or not h.any():
        return None
    return h


def _family(Z, n, mu, T, ridge, full, N) -> bool:
    """True: full covariances give the current mixture the lower BIC (else diagonal)."""
    if not full:
        return False
    D = mu.shape[1]
    Td = diagonals(T)
    bic = {}
    for fam, TT in ((True, T), (False, Td)):
        nk, _, Sk = pool_pieces(Z, n, mu, TT, fam)
        live = nk > 0
        P, ld = ridged_params(nk[live], Sk[live], ridge, fam)
        npar = D + (D * (D + 1) // 2 if fam else D) + 1
        bic[fam] = -2 * own_loglik(nk[live], Sk[live], P, ld, N, fam).sum() \
            + live.sum() * npar * np.log(N)
    return bool(bic[True] <= bic[False])


def _dissolve(k, z, Z, n, mu, S, T, ridge, fam, N, npar, tol, pooled) -> bool:
    """Hand the pieces of component k to their best other components if the mixture BIC
    loses less than ``tol`` nats per affected sample; updates z and Z in place.
    ``pooled``: the components' (n, mean, scatter) under Z (:func:`pool_pieces`)."""
    TT = T if fam else diagonals(T)
    SS = S if fam else diagonals(S)
    nk, mk, Sk = pooled
    others = np.flatnonzero((nk > 0) & (np.arange(nk.size) != k))
    mine = np.flatnonzero(z == k)
    P, ld = ridged_params(nk[others], Sk[others], ridge, fam)
    ll = piece_loglik(n[mine], mu[mine], SS[mine], nk[others], mk[others], P, ld, N, fam)
    to = others[np.argmax(ll, axis=1)]
    aff = np.unique(np.append(to, k))
    Pa, lda = ridged_params(nk[aff], Sk[aff], ridge, fam)
    before = own_loglik(nk[aff], Sk[aff], Pa, lda, N, fam).sum()
    z2 = z.copy()
    z2[mine] = to
    Z2 = np.zeros_like(Z)
    Z2[np.arange(n.size), z2] = 1.0
    nk2, _, Sk2 = pool_pieces(Z2, n, mu, TT, fam)
    rec = np.unique(to)
    Pr, ldr = ridged_params(nk2[rec], Sk2[rec], ridge, fam)
    after = own_loglik(nk2[rec], Sk2[rec], Pr, ldr, N, fam).sum()
    # BIC change of the whole mixture (only the affected terms move), per affected sample
    score = (-2.0 * (after - before) - npar * np.log(N)) / (2.0 * nk[aff].sum()) - tol
    if not score < 0.0:
        return False
    z[:] = z2
    Z[:] = Z2
    return True


def snapshot(cs: ClusterSet) -> dict:
    """The statistics and uids of the current clusters (the pieces for :func:`consolidate`)."""
    C = cs.C
    return {"n": cs.n[:C].copy(), "mu": cs.mu[:C].copy(), "S": cs.S[:C].copy(),
            "uid": cs.uid[:C].copy()}
