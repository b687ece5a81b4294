"""The evolving Gaussian cluster set: online learning, merging, aging, scoring.

One :class:`ClusterSet` serves the single-owner online model, every owner's
local step and the server's merge. It stores exact sufficient statistics per
cluster — mean ``mu``, scatter ``S``, count ``n``, class, last activation time —
and a cache (precision matrix and log-determinant of each cluster's covariance)
that is kept current by rank-one (Sherman–Morrison / matrix-determinant-lemma)
updates and refreshed from a Cholesky factor every ``max(32, D)`` updates, so a
sample costs O(c D^2) and no matrix is ever inverted blindly.

A cluster's covariance (a documented choice) is the
posterior-mean-like shrinkage

    Sigma_i = (S_i + n0 Sigma_0) / (n_i + n0 - 1),

which is Sigma_0 for a single sample (the paper's new-cluster rule), tends to
S_i / n_i as the cluster grows, and is never singular (duplicates, constant
features, D > n_i). ``n0`` (``prior_weight``) defaults to 2 (D + 1).

Merging (``merge_test``): by default a pair merges when one Gaussian describes its
samples at most ``merge_tol`` nats per sample worse than two, by BIC on their exact
pooled statistics (:meth:`ClusterSet._bic_scores`); the paper's
volume criterion (with a size cap) stays available as ``"volume"``.

Ožbot & Škrjanc, "Federated learning with self-evolving Gaussian clusters";
Škrjanc, "Cluster-volume-based merging approach for incrementally evolving
fuzzy Gaussian clustering — eGAUSS+", IEEE TFS 28(9), 2020.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.linalg import lapack
from scipy.stats import chi2

from ..core.threads import one_blas_thread
from . import fast_scan
from .merging import ClusterMerging
from .stats import (feature_variances, merge_moments, neighbour_variance,
                    prior_variances)

__all__ = ["Settings", "ClusterSet", "VOLUMES", "PREDICT_RULES", "MERGE_TESTS", "one_thread"]


#: BLAS on one thread: these are many small (D x D) operations, for which a
#: threaded BLAS only adds synchronisation (measured 100x slower on a busy 2-core box)
one_thread = one_blas_thread


@lru_cache(maxsize=256)
def _chi2_gate(quantile: float, D: int) -> float:
    return float(chi2.ppf(quantile, D))

#: volume measure of the merge criterion -> exponent applied to det(Sigma)
VOLUMES = {"det": 1.0, "sqrt_det": 0.5, "det_root": None}  # det_root: 1/D
PREDICT_RULES = ("likelihood", "gamma")
MERGE_TESTS = ("bic", "volume")
#: merge_test="bic": merge while one Gaussian loses less than this many nats per sample
MERGE_TOL = 0.01
#: per-cluster arrays (moved together when clusters are removed, merged or sorted)
ARRAYS = ("mu", "S", "P", "n", "ld", "cls", "last", "upd", "uid")


@dataclass(frozen=True)
class Settings:
    """Resolved hyper-parameters (see :class:`fedclust.EvolvingGaussians` for their meaning)."""

    covariance: str = "full"
    gate_quantile: float = 0.99
    n_sigma: float | None = None
    volume_fraction: float = 0.003
    n_r: float | None = None
    prior_weight: float | None = None
    kappa_m: float = 1.5
    volume: str = "det"
    max_volume: float = 0.1
    max_clusters: int = 200
    min_weight: float = 0.005
    var_floor: float = 1e-6
    predict_rule: str = "likelihood"
    merge_test: str = "bic"
    pooled_shrinkage: float = 0.0
    merge_tol: float = MERGE_TOL


class ClusterSet(ClusterMerging):
    """Clusters over D features (``n_classes = 0``: clustering; else one class per cluster)."""

    def __init__(self, n_features: int, settings: Settings, n_classes: int = 0):
        D = int(n_features)
        self.D = D
        self.s = settings
        self.full = settings.covariance == "full"
        self.n_classes = int(n_classes)
        self.n0 = float(2 * (D + 1) if settings.prior_weight is None else settings.prior_weight)
        self.removed = 0.0  # samples dropped with the clusters removed past max_clusters
        # cluster identities: every cluster gets a new uid; a merge maps the uid that goes
        # to the one that stays, a removal to -1 (lets an owner find the rows of a cluster)
        self.next_uid = 0
        self.joined: dict[int, int] = {}
        self.birth_ratio = np.inf  # neighbour scale of new clusters (set_birth_scale), / var
        if settings.n_sigma is not None:
            self.gate = float(settings.n_sigma) ** 2
        else:
            self.gate = _chi2_gate(settings.gate_quantile, D)
        w = VOLUMES[settings.volume]
        self.vol_w = 1.0 / D if w is None else w
        self.refresh_every = max(32, D)
        self.C = 0
        self.t = 0
        self._alloc(8)
        self.g = (0, np.zeros(D), np.zeros(D))  # global (count, mean, m2)
        M = self.n_classes  # per-class (counts, means, m2): the Fisher scores' ingredients
        self.gc = (np.zeros(M, np.int64), np.zeros((M, D)), np.zeros((M, D)))
        self._set_prior()

    # -- storage -----------------------------------------------------------
    def _alloc(self, cap: int) -> None:
        D, C = self.D, getattr(self, "C", 0)
        shape_S = (cap, D, D) if self.full else (cap, D)
        new = {"mu": np.zeros((cap, D)), "S": np.zeros(shape_S), "P": np.zeros(shape_S),
               "n": np.zeros(cap), "ld": np.zeros(cap), "cls": np.full(cap, -1, np.int64),
               "last": np.zeros(cap, np.int64), "upd": np.zeros(cap, np.int64),
               "uid": np.zeros(cap, np.int64)}
        for name, arr in new.items():
            old = getattr(self, name, None)
            if old is not None and C:
                arr[:C] = old[:C]
            setattr(self, name, arr)
        self.cap = cap

    def _set_prior(self) -> None:
        count, _, m2 = self.g
        self.var = feature_variances(count, m2, self.s.var_floor)
        self.s0_rule = prior_variances(self.var, volume_fraction=self.s.volume_fraction,
                                       n_r=self.s.n_r)
        self.ld_global = float(np.log(self.var).sum())
        self._g_refreshed = max(count, 1)
        self.s0 = np.minimum(self.s0_rule, self.birth_ratio * self.var)
        self.ld0 = float(np.log(self.s0).sum())

    def set_birth_scale(self, X: np.ndarray) -> None:
        """Narrow Sigma_0 to the neighbourhood scale of the rows X (``merge_test="bic"``).

        Sigma_0 = min(volume rule, v diag(var)), v the median squared distance (features
        scaled by the global variances, per dimension) from a row to its ceil(sqrt(n) / 2)-th
        nearest row (:func:`~fedclust.gauss.stats.neighbour_variance`). New clusters then
        start no wider than a local neighbourhood, so a birth never spans two clusters that
        are close relative to the global spread (high D); the BIC merges join the pieces.
        Only the learning owner uses it; the server and the broadcast model keep the volume
        rule (no rows there), which only touches the covariance of very small clusters.
        """
        if self.s.merge_test != "bic" or self.s.n_r is not None or X.shape[0] < 3:
            return
        # never below the variance floor (duplicated rows have no neighbourhood at all)
        self.birth_ratio = max(neighbour_variance(X, self.var), self.s.var_floor)
        self._set_prior()
        self.refresh(np.arange(self.C))

    def update_global(self, count: float, mean: np.ndarray, m2: np.ndarray) -> None:
        """Pool more global statistics in (Chan); refresh every cache when they moved."""
        self.g = merge_moments(self.g, (count, mean, m2))
        if self.g[0] >= 2 * self._g_refreshed or count >= 0.5 * self.g[0] or self.g[0] < 64:
            self._set_prior()
            self.refresh(np.arange(self.C))

    def set_global(self, count: float, mean: np.ndarray, m2: np.ndarray) -> None:
        self.g = (count, np.array(mean, float), np.array(m2, float))
        self._set_prior()
        self.refresh(np.arange(self.C))

    # -- covariance cache ----------------------------------------------------
    def covariance(self, idx: np.ndarray) -> np.ndarray:
        """Effective covariances (k, D, D) or diagonals (k, D) of clusters ``idx``."""
        n = self.n[idx]
        denom = (n + self.n0 - 1.0)
        if self.full:
            A = self.S[idx].copy()
            A[:, np.arange(self.D), np.arange(self.D)] += self.n0 * self.s0
            return A / denom[:, None, None]
        return (self.S[idx] + self.n0 * self.s0) / denom[:, None]

    def _factor(self, Sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Precisions and log-determinants of covariances via Cholesky (jitter if needed)."""
        if not self.full:
            Sig = np.maximum(Sig, np.finfo(float).tiny)
            return 1.0 / Sig, np.log(Sig).sum(axis=1)
        P = np.empty_like(Sig)
        ld = np.empty(Sig.shape[0])
        eye = np.eye(self.D)
        for k, A in enumerate(Sig):
            L, jitter = None, 0.0
            scale = float(np.trace(A)) / self.D or 1.0
            while L is None:
                try:
                    L = np.linalg.cholesky(A + jitter * scale * eye)
                except np.linalg.LinAlgError:
                    jitter = 1e-12 if jitter == 0 else jitter * 100
            ld[k] = 2.0 * np.log(np.diag(L)).sum()
            inv, info = lapack.dpotri(L, lower=1)  # inverse from the Cholesky factor
            if info != 0:
                inv = np.linalg.solve(A + jitter * scale * eye, eye)
            P[k] = np.tril(inv) + np.tril(inv, -1).T
        return P, ld

    def refresh(self, idx: np.ndarray) -> None:
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size == 0:
            return
        self.P[idx], self.ld[idx] = self._factor(self.covariance(idx))
        self.upd[idx] = 0

    # -- cluster bookkeeping ---------------------------------------------------
    def add(self, mu: np.ndarray, S: np.ndarray, n: np.ndarray, cls: np.ndarray,
            last: np.ndarray) -> np.ndarray:
        """Append clusters; returns their indices."""
        k = len(n)
        while self.C + k > self.cap:
            self._alloc(2 * self.cap)
        idx = np.arange(self.C, self.C + k)
        self.mu[idx], self.S[idx], self.n[idx] = mu, S, n
        self.cls[idx], self.last[idx] = cls, last
        self.uid[idx] = np.arange(self.next_uid, self.next_uid + k)
        self.next_uid += k
        self.C += k
        self.refresh(idx)
        return idx

    def _new(self, x: np.ndarray, c: int) -> int:
        if self.C == self.cap:
            self._alloc(2 * self.cap)
        j = self.C
        self.mu[j] = x
        self.S[j] = 0.0
        self.n[j] = 1.0
        self.cls[j] = c
        self.last[j] = self.t
        self.upd[j] = 0
        self.uid[j] = self.next_uid
        self.next_uid += 1
        # Sigma = Sigma_0 exactly: diagonal precision and log-det without a factorisation
        if self.full:
            self.P[j] = np.diag(1.0 / self.s0)
        else:
            self.P[j] = 1.0 / self.s0
        self.ld[j] = self.ld0
        self.C += 1
        return j

    def keep_clusters(self, keep: np.ndarray) -> None:
        """Keep only the clusters ``keep`` (increasing indices), in that order."""
        for name in ARRAYS:
            arr = getattr(self, name)
            arr[:keep.size] = arr[keep]
        self.C = int(keep.size)

    def remove(self, j: int) -> None:
        """Delete cluster j (the last cluster moves into its slot)."""
        last = self.C - 1
        if j != last:
            for name in ARRAYS:
                arr = getattr(self, name)
                arr[j] = arr[last]
        self.C -= 1

    def prune(self) -> None:
        """Enforce ``max_clusters``. With ``merge_test="bic"`` the passing BIC merges run
        first, best first, until half the cap is left (no sample lost; the least certain
        merges wait for more data); past the cap the oldest clusters are removed (never a
        class's last cluster) and their samples counted in ``removed``."""
        if self.C > self.s.max_clusters and self.s.merge_test == "bic":
            self.merge_all(until=self.s.max_clusters // 2)
        while self.C > self.s.max_clusters:
            age = self.t - self.last[:self.C]
            if self.n_classes:
                counts = np.bincount(self.cls[:self.C], minlength=self.n_classes)
                age = np.where(counts[self.cls[:self.C]] > 1, age, -np.inf)
                if not np.isfinite(age).any():
                    return
            # oldest first; among equals the smallest cluster goes
            order = np.lexsort((self.n[:self.C], -age))
            self.removed += float(self.n[int(order[0])])
            self.joined[int(self.uid[int(order[0])])] = -1
            self.remove(int(order[0]))

    # -- online learning ---------------------------------------------------------
    #: use the compiled loop when numba imports (tests switch it off to compare)
    use_fast = True

    def learn(self, X: np.ndarray, y: np.ndarray | None = None,
              labels: np.ndarray | None = None) -> None:
        """One pass over the rows of X (class indices ``y`` when classifying); ``labels``
        (n,) int64, if given, receives the uid of the cluster each row went to."""
        lab = np.empty(X.shape[0], np.int64) if labels is None else labels
        if self.full and self.use_fast and fast_scan.HAVE_NUMBA:
            return self._learn_fast(np.ascontiguousarray(X, dtype=np.float64), y, lab)
        return self._learn_numpy(X, y, lab)

    def row_clusters(self, labels: np.ndarray) -> np.ndarray:
        """Current cluster index of every row from the uids that :meth:`learn` recorded
        (-1: the row's cluster was removed past ``max_clusters``)."""
        root = np.arange(self.next_uid)
        done: dict[int, int] = {}
        for u in self.joined:  # follow merges to the uid that stayed (memoised)
            path, v = [u], self.joined[u]
            while v >= 0 and v in self.joined and v not in done:
                path.append(v)
                v = self.joined[v]
            v = done.get(v, v)
            for w in path:
                done[w] = v
                root[w] = v
        slot = np.full(self.next_uid + 1, -1, np.int64)  # index -1 -> the last entry: -1
        slot[self.uid[:self.C]] = np.arange(self.C)
        return slot[root[labels]]

    @property
    def merges_online(self) -> bool:
        """The paper's rule merges pairs active for a sample as it streams; the BIC rule
        merges only in :meth:`merge_all` (end of a pass, cap, server): a merge decided on a
        few samples could not be undone later."""
        return self.s.merge_test == "volume"

    def _learn_fast(self, X: np.ndarray, y: np.ndarray | None, lab: np.ndarray) -> None:
        yy = (np.full(X.shape[0], -1, np.int64) if y is None
              else np.ascontiguousarray(y, dtype=np.int64))
        i, N = 0, X.shape[0]
        while i < N:
            act = np.empty(max(self.C, 1), np.int64)
            i, j, code, t, na = fast_scan.scan_full(
                X, yy, i, self.t, self.mu, self.S, self.P, self.ld, self.n, self.cls,
                self.last, self.upd, self.C, self.gate, self.n0, self.refresh_every, act,
                self.merges_online, self.uid, lab)
            self.t = int(t)
            if code == fast_scan.DONE:
                return
            if code == fast_scan.NEW:
                self.t += 1
                j = self._new(X[i], int(yy[i]))
                lab[i] = self.uid[j]
                if self.C > self.s.max_clusters:
                    self.prune()
            else:
                if self.upd[j] >= self.refresh_every:
                    self.refresh(np.array([j]))
                if na:
                    self._merge_around(int(j), act[:na].copy())
            i += 1

    def _learn_numpy(self, X: np.ndarray, y: np.ndarray | None, lab: np.ndarray) -> None:
        full = self.full
        gate = self.gate
        online = self.merges_online
        for i in range(X.shape[0]):
            x = X[i]
            c = -1 if y is None else int(y[i])
            self.t += 1
            C = self.C
            if C == 0:
                j = self._new(x, c)
                lab[i] = self.uid[j]
                continue
            diff = x - self.mu[:C]
            if full:
                Pd = np.matmul(self.P[:C], diff[:, :, None])[:, :, 0]
            else:
                Pd = self.P[:C] * diff
            d2 = np.einsum("ij,ij->i", Pd, diff)
            if y is not None:
                d2 = np.where(self.cls[:C] == c, d2, np.inf)
            j = int(np.argmin(d2))
            if d2[j] <= gate:
                lab[i] = self.uid[j]
                self._absorb(j, x, diff[j], Pd[j], float(d2[j]))
                if online:
                    active = np.flatnonzero(d2 <= gate)
                    if active.size > 1:
                        self._merge_around(j, active[active != j])
            else:
                j = self._new(x, c)
                lab[i] = self.uid[j]
                if self.C > self.s.max_clusters:
                    self.prune()

    def _absorb(self, j: int, x: np.ndarray, e: np.ndarray, Pe: np.ndarray, d2: float) -> None:
        n = self.n[j]
        m = n + self.n0 - 1.0
        self.mu[j] += e / (n + 1.0)
        f = n / (n + 1.0)
        if self.full:
            self.S[j] += f * np.outer(e, e)
        else:
            self.S[j] += f * e * e
        self.n[j] = n + 1.0
        self.last[j] = self.t
        self.upd[j] += 1
        if not self.full:
            v = (self.S[j] + self.n0 * self.s0) / (m + 1.0)
            self.P[j] = 1.0 / v
            self.ld[j] = np.log(v).sum()
            return
        if self.upd[j] >= self.refresh_every:
            self.refresh(np.array([j]))
            return
        # Sigma' = a (Sigma + r e e^T), a = m/(m+1), r = f/m (Sherman–Morrison + det lemma)
        a = m / (m + 1.0)
        r = f / m
        den = 1.0 + r * d2
        self.P[j] -= (r / den) * np.outer(Pe, Pe)
        self.P[j] /= a
        self.ld[j] += self.D * np.log(a) + np.log(den)

    # -- scoring -----------------------------------------------------------------
    def log_scores(self, X: np.ndarray, rule: str) -> np.ndarray:
        """(N, C): log mixture-weighted Gaussian density ("likelihood") or log gamma."""
        C = self.C
        P, ld = self.scoring_precisions()
        out = np.empty((X.shape[0], C))
        for k in range(C):
            diff = X - self.mu[k]
            if self.full:
                d2 = np.einsum("ij,jk,ik->i", diff, P[k], diff, optimize=True)
            else:
                d2 = (diff ** 2 * P[k]).sum(axis=1)
            d2 = np.maximum(d2, 0.0)
            if rule == "gamma":
                out[:, k] = -d2 / self.D
            else:
                out[:, k] = -0.5 * (d2 + ld[k]) + np.log(self.n[k])
        return out

    def scoring_precisions(self) -> tuple[np.ndarray, np.ndarray]:
        """Precisions (C, D, D) or (C, D) and log-determinants (C,) used to score samples.

        With ``pooled_shrinkage`` = 0 these are the learning caches, i.e. the covariances
        (S_i + n0 Sigma_0) / (n_i + n0 - 1). With w > 0 (the classifier's default) the
        prior is replaced at prediction by T = w x the pooled within-cluster variance
        (diagonal: sum_i diag S_i / sum_i n_i, floored like the global variances): a
        regularised-discriminant-analysis-like shrinkage toward the clusters' own scale
        instead of the new-cluster scale, which in high D is nearly the whole data's
        spread. Computed from the broadcast model alone (no extra bytes); O(C D^3).
        """
        C = self.C
        w = self.s.pooled_shrinkage
        if w <= 0.0 or C == 0:
            return self.P[:C], self.ld[:C]
        n = self.n[:C]
        Sd = np.diagonal(self.S[:C], axis1=1, axis2=2) if self.full else self.S[:C]
        T = w * feature_variances(float(n.sum()), Sd.sum(axis=0), self.s.var_floor)
        denom = n + self.n0 - 1.0
        if self.full:
            A = self.S[:C].copy()
            A[:, np.arange(self.D), np.arange(self.D)] += self.n0 * T
            return self._factor(A / denom[:, None, None])
        return self._factor((self.S[:C] + self.n0 * T) / denom[:, None])
