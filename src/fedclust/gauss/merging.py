"""Merging and splitting of a :class:`~fedclust.gauss.model.ClusterSet` (:class:`ClusterMerging`).

Two tests decide whether a same-class pair merges (``merge_test``): the BIC on
the pair's exact pooled statistics (:meth:`ClusterMerging._bic_scores`, merge
while one Gaussian describes the samples at most ``merge_tol`` nats per sample
worse than two) or the paper's volume criterion (:meth:`ClusterMerging._volume_scores`).
:meth:`ClusterMerging.merge_all` merges the best pair first; :meth:`ClusterMerging.split_by_rows`
splits a cluster on its owner's rows where the same BIC test keeps the halves
apart; :meth:`ClusterMerging.absorb_fragments` folds tiny clusters (volume rule).

The mixin works on the storage of :class:`~fedclust.gauss.model.ClusterSet`
(``mu``, ``S``, ``n``, ``cls``, ``last``, ``uid``, the caches, ``refresh``,
``remove``, ``add``, ``keep_clusters``, ``row_clusters``).
"""

from __future__ import annotations

import numpy as np

from .stats import merge_clusters

__all__ = ["ClusterMerging", "moments_full", "cem_two"]


class ClusterMerging:
    """The merge tests, the merges and the owner's splits of a cluster set (a mixin of
    :class:`~fedclust.gauss.model.ClusterSet`)."""

    def _merge_scores(self, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, tuple]:
        """Merge score of p[k] with q[k] (merge while < 0) and the pooled (n, mu, S)."""
        n, mu, S = merge_clusters(self.n[p], self.mu[p], self.S[p],
                                  self.n[q], self.mu[q], self.S[q])
        if self.s.merge_test == "bic":
            return self._bic_scores(p, q, n, S), (n, mu, S)
        return self._volume_scores(p, q, n, S), (n, mu, S)

    def _volume_scores(self, p: np.ndarray, q: np.ndarray, n: np.ndarray, S: np.ndarray
                       ) -> np.ndarray:
        """The paper's criterion: log(V_pq / (V_p + V_q)) - log kappa_m, V = det(Sigma)^w
        of the shrunk covariances; inf where the merged sqrt det exceeds ``max_volume`` of
        the global one (the size cap)."""
        denom = n + self.n0 - 1.0
        if self.full:
            A = S.copy()
            A[:, np.arange(self.D), np.arange(self.D)] += self.n0 * self.s0
            sign, ld = np.linalg.slogdet(A / denom[:, None, None])
            ld = np.where(sign > 0, ld, np.inf)
        else:
            ld = np.log((S + self.n0 * self.s0) / denom[:, None]).sum(axis=1)
        w = self.vol_w
        score = w * ld - np.logaddexp(w * self.ld[p], w * self.ld[q]) - np.log(self.s.kappa_m)
        cap = 0.5 * ld > np.log(self.s.max_volume) + 0.5 * self.ld_global
        return np.where(cap, np.inf, score)

    def _bic_scores(self, p: np.ndarray, q: np.ndarray, n: np.ndarray, S: np.ndarray
                    ) -> np.ndarray:
        """(BIC of one Gaussian - BIC of two) / (2 n_pq) - ``merge_tol`` for the pairs
        (p, q): merge while < 0, i.e. while one Gaussian describes the pair's samples less
        than ``merge_tol`` nats per sample worse than two (an effect size: with plain BIC,
        two adjacent pieces of one large Gaussian nearly tie per sample, and the tie is
        broken by noise of order n against a penalty of order log n).

        BIC = -2 log-likelihood + (parameters) log n_pq of the pair's samples under one
        Gaussian (pooled statistics) or two (their own statistics, plus the labels:
        n_p log w + n_q log(1 - w) with w = n_p / n_pq, and one mixing weight). Each
        Gaussian is full or diagonal, whichever gives the lower BIC (``covariance="diag"``:
        diagonal only), so 64 samples in 64-D are judged by a model they can support.
        Maximum-likelihood covariances (S + Sigma_rule) / n: the volume-rule Sigma_0 once,
        as one pseudo-sample, keeps a young cluster's covariance nonsingular.
        """
        own = self._bic_logdets(self.n, self.S) if self._ld_cache is None else self._ld_cache
        return self._bic_pair(self.n[p], self.n[q], [(ld[p], ld[q]) for ld, _ in own], n, S)

    def _bic_pair(self, n_p: np.ndarray, n_q: np.ndarray, own: list, n: np.ndarray,
                  S: np.ndarray) -> np.ndarray:
        """The score of :meth:`_bic_scores` from the counts, the sides' log-determinants
        ``own`` = [(log det_p, log det_q) per covariance family] and the pooled (n, S)."""
        pooled = self._bic_logdets(n, S)
        w = n_p / n
        labels = n_p * np.log(w) + n_q * np.log1p(-w)  # <= 0
        one = np.full(n.shape[0], np.inf)
        two = np.full(n.shape[0], np.inf)
        logn = np.log(n)
        for (ld, npar), (ld_p, ld_q) in zip(pooled, own):
            one = np.minimum(one, n * ld + npar * logn)
            two = np.minimum(two, n_p * ld_p + n_q * ld_q - 2.0 * labels + (2 * npar + 1) * logn)
        return (one - two) / (2.0 * n) - self.s.merge_tol

    def split_by_rows(self, X: np.ndarray, labels: np.ndarray, max_iter: int = 25) -> int:
        """(``merge_test="bic"``) Split a cluster in two where the merge test keeps the two
        apart, on the cluster's own rows; returns the number of splits.

        A row is absorbed by the cluster whose 99 % region it falls in, so a narrow blob
        next to a wide cluster, or the tail of a neighbour, can stream into it; no merge
        can undo that. The owner still has its rows: for every cluster, a two-Gaussian
        classification EM on the rows it absorbed (``labels`` from :meth:`learn`), started
        by cutting them at their mean across their first principal axis, proposes two
        halves; the cluster is replaced by them when :meth:`_bic_scores` would not merge
        them (the same criterion, exact statistics of the halves: no sample moves to
        another cluster, none is lost); never past ``max_clusters``. O(max_iter n D^2)."""
        if self.s.merge_test != "bic":
            return 0
        slots = self.row_clusters(labels)
        order = np.argsort(slots, kind="stable")
        bounds = np.searchsorted(slots[order], np.arange(self.C + 1))
        splits = 0
        for k in range(self.C):
            if self.C >= self.s.max_clusters:  # the cap bounds the split too
                break
            R = X[order[bounds[k]:bounds[k + 1]]]
            if R.shape[0] < 4 or R.shape[0] != int(round(self.n[k])):
                continue
            z = cem_two(R, self.s0_rule, max_iter, self.full)
            if z is None:
                continue
            halves = [moments_full(R[z], self.full), moments_full(R[~z], self.full)]
            (n1, m1, S1), (n2, m2, S2) = halves
            n, _, S = merge_clusters(np.array([n1]), m1[None], S1[None],
                                     np.array([n2]), m2[None], S2[None])
            own = [(ld[0], ld[1])
                   for ld, _ in self._bic_logdets(np.array([n1, n2]), np.stack([S1, S2]))]
            if not self._bic_pair(np.array([n1]), np.array([n2]), own, n, S)[0] >= 0.0:
                continue
            self.n[k], self.mu[k], self.S[k] = n1, m1, S1
            self.refresh(np.array([k]))
            self.add(m2[None], S2[None], np.array([n2]), self.cls[[k]], self.last[[k]])
            splits += 1
        return splits

    #: per-cluster log-determinants of the BIC, cached while :meth:`merge_all` runs
    _ld_cache: list | None = None

    def _bic_logdets(self, n: np.ndarray, S: np.ndarray) -> list:
        """[(log det of the diagonal ML covariances, 2D parameters), (full, D + D(D+1)/2)]
        of the statistics (n, S), ridged by the volume-rule Sigma_0 as one pseudo-sample."""
        D = self.D
        diag = np.diagonal(S, axis1=-2, axis2=-1) if self.full else S
        with np.errstate(divide="ignore", invalid="ignore"):
            out = [(np.log((diag + self.s0_rule) / n[..., None]).sum(axis=-1), 2 * D)]
            if self.full:
                A = S + np.diag(self.s0_rule)
                out.append((np.linalg.slogdet(A / n[..., None, None])[1], D + D * (D + 1) // 2))
        return out

    def _merge_pair(self, p: int, q: int, stats: tuple, k: int) -> int:
        """Replace p by the union of p and q, delete q; returns p's final index."""
        n, mu, S = stats
        self.n[p], self.mu[p], self.S[p] = n[k], mu[k], S[k]
        self.last[p] = max(self.last[p], self.last[q])
        self.joined[int(self.uid[q])] = int(self.uid[p])
        self.refresh(np.array([p]))
        last = self.C - 1
        self.remove(q)
        return q if p == last else p

    def _merge_around(self, j: int, cand: np.ndarray) -> None:
        """Merge cluster j with the best of the clusters also active for the sample."""
        cand = list(cand)
        while cand:
            q = np.array(cand)
            score, stats = self._merge_scores(np.full(len(q), j), q)
            k = int(np.argmin(score))
            if not score[k] < 0.0:
                return
            qk = int(q[k])
            last = self.C - 1
            j = self._merge_pair(j, qk, stats, k)
            cand = [c for i, c in enumerate(cand) if i != k]
            cand = [qk if c == last else c for c in cand]  # the last cluster moved to q's slot

    def merge_all(self, until: int = 1) -> int:
        """Merge the globally best same-class pair while its score is < 0; returns #merges.

        Candidates: every pair (``"bic"``), or pairs with one mean inside the other's
        gate (``"volume"``). The order of the clusters does not matter beyond exact ties.
        Stops early when ``until`` clusters are left. O(C^2 D^3) for C clusters.
        """
        merges = 0
        C = self.C
        if C < 2:
            return 0
        if self.s.merge_test == "bic":
            self._ld_cache = self._bic_logdets(self.n[:C].copy(), self.S[:C])
        R = np.full((C, C), np.inf)
        for p in range(C):
            self._score_row(R, p, C, upper=self.s.merge_test == "bic")
        alive = np.ones(C, bool)
        while C - merges > until:
            flat = int(np.argmin(R))
            p, q = divmod(flat, C)
            if not R[p, q] < 0.0:
                break
            score, stats = self._merge_scores(np.array([p]), np.array([q]))
            n, mu, S = stats
            self.n[p], self.mu[p], self.S[p] = n[0], mu[0], S[0]
            self.last[p] = max(self.last[p], self.last[q])
            self.joined[int(self.uid[q])] = int(self.uid[p])
            self.refresh(np.array([p]))
            if self._ld_cache is not None:
                for (ld, _), (new, _) in zip(self._ld_cache, self._bic_logdets(n, S)):
                    ld[p] = new[0]
            alive[q] = False
            self.n[q] = 0.0
            R[q, :] = np.inf
            R[:, q] = np.inf
            self._score_row(R, p, C, alive)
            merges += 1
        self._ld_cache = None
        self.keep_clusters(np.flatnonzero(alive))
        return merges

    def absorb_fragments(self) -> int:
        """(``merge_test="volume"``; the BIC merges need no fold.) Fold clusters holding less than ``min_weight`` of the data into their best neighbour.

        A fragment's statistics join the same-class cluster under which its mean
        is most likely (exact pooled statistics, no point is lost); a class's
        only cluster is kept. Returns the number of fragments folded.
        """
        folded = 0
        if self.s.merge_test == "bic":
            return 0
        total = float(self.n[:self.C].sum())
        while self.C > 1:
            small = np.flatnonzero(self.n[:self.C] < self.s.min_weight * total)
            if small.size == 0:
                break
            done = False
            for f in small[np.argsort(self.n[small], kind="stable")]:
                others = np.flatnonzero((self.cls[:self.C] == self.cls[f])
                                        & (np.arange(self.C) != f))
                if others.size == 0:
                    continue
                diff = self.mu[f] - self.mu[others]
                if self.full:
                    d2 = np.einsum("kd,kde,ke->k", diff, self.P[others], diff)
                else:
                    d2 = (diff ** 2 * self.P[others]).sum(axis=1)
                k = int(np.argmin(0.5 * (d2 + self.ld[others]) - np.log(self.n[others])))
                q = int(others[k])
                stats = merge_clusters(self.n[[q]], self.mu[[q]], self.S[[q]],
                                       self.n[[f]], self.mu[[f]], self.S[[f]])
                self._merge_pair(q, int(f), stats, 0)
                folded += 1
                done = True
                break
            if not done:
                break
        return folded

    def _score_row(self, R: np.ndarray, p: int, C: int, alive: np.ndarray | None = None,
                   upper: bool = False) -> None:
        """Scores of p against the other live same-class clusters (``upper``: only those
        after p, for the first fill of R) into row and column p of R."""
        others = np.arange(C)
        ok = (others > p if upper else others != p) & (self.cls[:C] == self.cls[p])
        if alive is not None:
            ok &= alive
        if not ok.any():
            if upper:
                return
            R[p, :] = np.inf
            R[:, p] = np.inf
            return
        q = others[ok]
        near = np.ones(q.size, bool)
        if self.s.merge_test == "volume":
            diff = self.mu[q] - self.mu[p]
            if self.full:
                d_pq = np.einsum("kd,de,ke->k", diff, self.P[p], diff)
                d_qp = np.einsum("kd,kde,ke->k", diff, self.P[q], diff)
            else:
                d_pq = (diff ** 2 * self.P[p]).sum(axis=1)
                d_qp = (diff ** 2 * self.P[q]).sum(axis=1)
            near = (d_pq <= self.gate) | (d_qp <= self.gate)
        row = np.full(C, np.inf)
        if near.any():
            qn = q[near]
            score, _ = self._merge_scores(np.full(qn.size, p), qn)
            row[qn] = score
            if upper:
                R[p, qn] = score
                R[qn, p] = score
                return
        if upper:
            return
        R[p, :] = row
        R[:, p] = row
        R[p, p] = np.inf


def moments_full(R: np.ndarray, full: bool) -> tuple[float, np.ndarray, np.ndarray]:
    """(n, mean, scatter) of the rows R; the scatter's diagonal when not ``full``."""
    mu = R.mean(axis=0)
    E = R - mu
    return float(R.shape[0]), mu, (E.T @ E if full else (E * E).sum(axis=0))


def cem_two(R: np.ndarray, ridge: np.ndarray, max_iter: int, full: bool
             ) -> np.ndarray | None:
    """Two-Gaussian classification EM on the rows R (full or diagonal covariances ridged
    by ``ridge`` as one pseudo-sample, as in the BIC); start: the cut at the mean across
    the first principal axis. Returns the membership of the first half, or None (a side
    empty)."""
    n, D = R.shape
    E = R - R.mean(axis=0)
    _, vecs = np.linalg.eigh(E.T @ E)
    z = E @ vecs[:, -1] > 0
    for _ in range(max_iter):
        if z.sum() < 2 or (~z).sum() < 2:
            return None
        ll = np.empty((2, n))
        for h, m in enumerate((z, ~z)):
            nh, mu, S = moments_full(R[m], full)
            A = (S + np.diag(ridge)) / nh if full else np.diag((S + ridge) / nh)
            L = np.linalg.cholesky(A)
            Y = np.linalg.solve(L, (R - mu).T)
            ll[h] = -0.5 * (Y * Y).sum(axis=0) - np.log(np.diag(L)).sum() + np.log(nh / n)
        new = ll[0] >= ll[1]
        if np.array_equal(new, z):
            break
        z = new
    if z.sum() < 2 or (~z).sum() < 2:
        return None
    return z
