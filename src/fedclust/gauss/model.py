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

Merging: the paper's volume criterion (with a size cap) and, optionally (the
clustering default), a classification-likelihood test on the exact pooled
statistics (:meth:`ClusterSet._likelihood_loss`).

Ožbot & Škrjanc, "Federated learning with self-evolving Gaussian clusters";
Škrjanc, "Cluster-volume-based merging approach for incrementally evolving
fuzzy Gaussian clustering — eGAUSS+", IEEE TFS 28(9), 2020.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.linalg import lapack
from scipy.special import digamma
from scipy.stats import chi2

from ..core.threads import one_blas_thread
from . import _fast
from .stats import feature_variances, merge_clusters, merge_moments, prior_variances

__all__ = ["Settings", "ClusterSet", "VOLUMES", "PREDICT_RULES", "one_thread"]


#: BLAS on one thread: these are many small (D x D) operations, for which a
#: threaded BLAS only adds synchronisation (measured 100x slower on a busy 2-core box)
one_thread = one_blas_thread


@lru_cache(maxsize=256)
def _chi2_gate(quantile: float, D: int) -> float:
    return float(chi2.ppf(quantile, D))

#: volume measure of the merge criterion -> exponent applied to det(Sigma)
VOLUMES = {"det": 1.0, "sqrt_det": 0.5, "det_root": None}  # det_root: 1/D
PREDICT_RULES = ("likelihood", "gamma")
#: ridge (in units of Sigma_0) of the data covariances compared by the likelihood merge test
ML_RIDGE = 0.1
#: the adaptive Sigma_0 never shrinks below this fraction (per dimension) of the volume rule
MIN_PRIOR_FACTOR = 0.01
#: the valley test's grid on the segment between two means: t^2 and (1 - t)^2, 33 points
_T2 = np.linspace(0.0, 1.0, 33)[:, None] ** 2
_U2 = _T2[::-1]
#: the adaptive Sigma_0 follows this quantile of the mature clusters' volumes (lower quartile)
PRIOR_QUANTILE = 0.25


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
    merge_test: str = "both"
    overlap_tol: float = 0.0
    adaptive_prior: bool = True
    max_dip: float = 0.75
    pooled_shrinkage: float = 0.0


class ClusterSet:
    """Clusters over D features (``n_classes = 0``: clustering; else one class per cluster)."""

    def __init__(self, n_features: int, settings: Settings, n_classes: int = 0):
        D = int(n_features)
        self.D = D
        self.s = settings
        self.full = settings.covariance == "full"
        self.n_classes = int(n_classes)
        self.n0 = float(2 * (D + 1) if settings.prior_weight is None else settings.prior_weight)
        self._adapt_at = (0, 0)  # (samples seen, mature clusters) at the last evaluation
        self.prior_cap = 1.0  # upper bound of the adaptive factor (a pilot pass sets it)
        self.prior_quantile = PRIOR_QUANTILE
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
               "last": np.zeros(cap, np.int64), "upd": np.zeros(cap, np.int64)}
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
        self.prior_factor = self.adaptive_factor()
        self.s0 = self.s0_rule * self.prior_factor
        self.ld0 = float(np.log(self.s0).sum())

    # -- adaptive new-cluster scale ---------------------------------------------
    def mature_count(self) -> float:
        """Samples a cluster needs before its scatter shapes Sigma_0: D + 1 (S nonsingular)."""
        return float(self.D + 1)

    def adaptive_factor(self, quantile: float | None = None) -> float:
        """Shrink factor f <= 1 of Sigma_0 = f * (volume rule) from the mature clusters.

        With ``adaptive_prior``: once at least two clusters hold >= :meth:`mature_count`
        samples, f = min(1, lower quartile_i (det Sigma_i / det Sigma_0_rule)^(1/D)) over
        them, Sigma_i estimated from the scatter: a new cluster is no wider (in volume)
        than the smaller mature clusters. A deterministic function of the global
        statistics and the clusters, so the server and an owner rebuilding the broadcast
        model get the same value. Per-dimension volumes keep the rule free of D. The
        log-determinants are corrected for their small-sample bias (Wishart), so clusters
        count as mature from D + 1 samples; a quantile ignores a few merged giants or
        tiles. Never below ``MIN_PRIOR_FACTOR``, never above ``prior_cap`` (1, or the
        factor a pilot pass over the same rows ended with: :func:`learn_local`).
        """
        if not self.s.adaptive_prior or self.s.n_r is not None:
            return 1.0
        cap = self.prior_cap
        if self.C < 2:
            return cap
        idx = np.flatnonzero(self.n[:self.C] >= self.mature_count())
        if idx.size < 2:
            return cap
        n = self.n[idx]
        # unbiased log det Sigma from a scatter with n - 1 degrees of freedom (Wishart):
        # E log det S = log det Sigma + sum_i digamma((n - i) / 2) + D log 2
        # (diagonal: each variance separately, D digamma((n - 1) / 2) + D log 2)
        dof = (n[:, None] - np.arange(1, self.D + 1)) if self.full else (n[:, None] - 1.0)
        dof = np.broadcast_to(dof, (n.size, self.D))
        ld = (self._ridged_logdet(self.S[idx], np.ones_like(n), self.s0_rule)
              - digamma(dof / 2.0).sum(axis=1) - self.D * np.log(2.0))
        ratio = np.exp((ld - float(np.log(self.s0_rule).sum())) / self.D)
        q = self.prior_quantile if quantile is None else quantile
        return float(min(cap, max(np.quantile(ratio, q), MIN_PRIOR_FACTOR)))

    def _ridged_logdet(self, S: np.ndarray, n: np.ndarray, base: np.ndarray) -> np.ndarray:
        """log det of the data covariances (S + ML_RIDGE diag(base)) / n (nearly S / n,
        never singular)."""
        if self.full:
            A = S.copy()
            A[:, np.arange(self.D), np.arange(self.D)] += ML_RIDGE * base
            return np.linalg.slogdet(A / n[:, None, None])[1]
        return np.log((S + ML_RIDGE * base) / n[:, None]).sum(axis=1)

    def adapt_prior(self) -> bool:
        """Re-evaluate the adaptive Sigma_0 from the current clusters; refresh the caches
        when it moved. Returns whether it moved."""
        f = self.adaptive_factor()
        self._adapt_at = (self.t, int(np.count_nonzero(self.n[:self.C] >= self.mature_count())))
        if f == self.prior_factor:
            return False
        self.prior_factor = f
        self.s0 = self.s0_rule * f
        self.ld0 = float(np.log(self.s0).sum())
        self.refresh(np.arange(self.C))
        return True

    def _next_adapt_t(self) -> int:
        return int(np.ceil(1.5 * max(self._adapt_at[0], 32)))

    def _maybe_adapt(self) -> None:
        """Online schedule: re-evaluate when the samples seen or the mature clusters have
        grown by half since the last evaluation (O(log) evaluations per stream)."""
        if not self.s.adaptive_prior:
            return
        m0 = self._adapt_at[1]
        if self.t >= self._next_adapt_t():
            self.adapt_prior()
            return
        m = int(np.count_nonzero(self.n[:self.C] >= self.mature_count()))
        if m >= 2 and m >= 1.5 * max(m0, 1):
            self.adapt_prior()

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
        # Sigma = Sigma_0 exactly: diagonal precision and log-det without a factorisation
        if self.full:
            self.P[j] = np.diag(1.0 / self.s0)
        else:
            self.P[j] = 1.0 / self.s0
        self.ld[j] = self.ld0
        self.C += 1
        return j

    def remove(self, j: int) -> None:
        """Delete cluster j (the last cluster moves into its slot)."""
        last = self.C - 1
        if j != last:
            for name in ("mu", "S", "P", "n", "ld", "cls", "last", "upd"):
                arr = getattr(self, name)
                arr[j] = arr[last]
        self.C -= 1

    def prune(self) -> None:
        """Remove the oldest clusters past ``max_clusters`` (never a class's last cluster)."""
        while self.C > self.s.max_clusters:
            age = self.t - self.last[:self.C]
            if self.n_classes:
                counts = np.bincount(self.cls[:self.C], minlength=self.n_classes)
                age = np.where(counts[self.cls[:self.C]] > 1, age, -np.inf)
                if not np.isfinite(age).any():
                    return
            # oldest first; among equals the smallest cluster goes
            order = np.lexsort((self.n[:self.C], -age))
            self.remove(int(order[0]))

    # -- online learning ---------------------------------------------------------
    #: use the compiled loop when numba is installed (tests switch it off to compare)
    use_fast = True

    def learn(self, X: np.ndarray, y: np.ndarray | None = None) -> None:
        """One pass over the rows of X (class indices ``y`` when classifying)."""
        if self.full and self.use_fast and _fast.HAVE_NUMBA:
            return self._learn_fast(np.ascontiguousarray(X, dtype=np.float64), y)
        return self._learn_numpy(X, y)

    def _learn_fast(self, X: np.ndarray, y: np.ndarray | None) -> None:
        yy = (np.full(X.shape[0], -1, np.int64) if y is None
              else np.ascontiguousarray(y, dtype=np.int64))
        i, N = 0, X.shape[0]
        while i < N:
            act = np.empty(max(self.C, 1), np.int64)
            stop = N  # the adaptive prior's schedule cuts the stream into stretches
            if self.s.adaptive_prior:
                stop = min(N, i + max(1, self._next_adapt_t() - self.t))
            i, j, code, t, na = _fast.scan_full(
                X[:stop], yy, i, self.t, self.mu, self.S, self.P, self.ld, self.n, self.cls,
                self.last, self.upd, self.C, self.gate, self.n0, self.refresh_every, act)
            self.t = int(t)
            if code == _fast.DONE:
                if stop == N:
                    return
                self._maybe_adapt()
                continue
            if code == _fast.NEW:
                self.t += 1
                self._maybe_adapt()
                self._new(X[i], int(yy[i]))
                if self.C > self.s.max_clusters:
                    self.prune()
            else:
                if self.upd[j] >= self.refresh_every:
                    self.refresh(np.array([j]))
                if na:
                    self._merge_around(int(j), act[:na].copy())
            i += 1

    def _learn_numpy(self, X: np.ndarray, y: np.ndarray | None = None) -> None:
        full = self.full
        gate = self.gate
        for i in range(X.shape[0]):
            x = X[i]
            c = -1 if y is None else int(y[i])
            if self.s.adaptive_prior and self.t >= self._next_adapt_t():
                self._maybe_adapt()  # between samples, where the compiled loop pauses too
            self.t += 1
            C = self.C
            if C == 0:
                self._maybe_adapt()
                self._new(x, c)
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
                self._absorb(j, x, diff[j], Pd[j], float(d2[j]))
                active = np.flatnonzero(d2 <= gate)
                if active.size > 1:
                    self._merge_around(j, active[active != j])
            else:
                self._maybe_adapt()
                self._new(x, c)
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

    # -- merging -------------------------------------------------------------------
    def _merge_scores(self, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, tuple]:
        """Merge score of p[k] with q[k]: merge while < 0.

        Volume criterion: log(V_pq / (V_p + V_q)) - log kappa_m, inf where the size
        cap forbids the merge. With ``merge_test="both"`` also the likelihood test
        (:meth:`_likelihood_loss` - ``overlap_tol``, no cap: it bounds itself);
        the smaller of the two scores counts.
        """
        n, mu, S = merge_clusters(self.n[p], self.mu[p], self.S[p],
                                  self.n[q], self.mu[q], self.S[q])
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
        # the size cap bounds the volume criterion (loose for unequal sizes)
        cap = 0.5 * ld > np.log(self.s.max_volume) + 0.5 * self.ld_global
        score = np.where(cap, np.inf, score)
        if self.s.merge_test == "both":
            # the volume criterion only for a pair whose mixture has no valley between the
            # means: in D >= 5 young clusters of two neighbouring blobs pass it (their
            # union's volume grows along one axis only), a core and its halo do not dip
            cand = score < 0.0  # the valley only matters where the volume criterion passes
            if np.isfinite(self.s.max_dip) and cand.any():
                deep = self._dip(p[cand], q[cand]) < -self.s.max_dip
                score[np.flatnonzero(cand)[deep]] = np.inf
            score = np.minimum(score, self._likelihood_loss(p, q, n, S) - self.s.overlap_tol)
        return score, (n, mu, S)

    def _dip(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        """Deepest valley of the two-cluster mixture density on the segment between the means.

        min_t log f(t) - min(log f(0), log f(1)) <= 0 over 33 points t in [0, 1],
        f(t) = n_p N(x_t; mu_p, Sigma_p) + n_q N(x_t; mu_q, Sigma_q) (0: no valley).
        Two equal Gaussians delta sigma apart dip by
        log(2 exp(-delta^2 / 8) / (1 + exp(-delta^2 / 2))): 0.75 at delta ~ 3.4.
        O(D^2) per pair from the cached (shrunk) precisions."""
        diff = self.mu[q] - self.mu[p]
        if self.full:
            dv = diff[:, None, :]
            a = (dv @ self.P[p] @ diff[:, :, None])[:, 0, 0]
            b = (dv @ self.P[q] @ diff[:, :, None])[:, 0, 0]
        else:
            a = (diff ** 2 * self.P[p]).sum(axis=1)
            b = (diff ** 2 * self.P[q]).sum(axis=1)
        lf = np.logaddexp(np.log(self.n[p]) - 0.5 * (_T2 * a + self.ld[p]),
                          np.log(self.n[q]) - 0.5 * (_U2 * b + self.ld[q]))
        return lf.min(axis=0) - np.minimum(lf[0], lf[-1])

    def _likelihood_loss(self, p: np.ndarray, q: np.ndarray, n: np.ndarray, S: np.ndarray
                         ) -> np.ndarray:
        """Classification log-likelihood per sample lost by pooling p and q into one Gaussian.

        0.5 [log det Sigma_pq - w log det Sigma_p - (1 - w) log det Sigma_q] - H(w),
        w = n_p / n_pq, H the entropy of (w, 1 - w): the labels the split spends
        (Celeux & Govaert's classification likelihood). Scale- and dimension-free:
        two equal unit Gaussians pass when closer than 2 sqrt 3 sigma; a small
        cluster passes into a large one when KL(p || q) <~ log(1 / w) + 1. The
        data covariances (prior weight ~0), not the shrunk ones, are compared:
        the prior would make young clusters look alike.
        """
        wp = self.n[p] / n
        wq = 1.0 - wp
        ent = -(wp * np.log(wp) + wq * np.log(wq))
        k = n.shape[0]  # one LAPACK call for the three sets of matrices
        ld = self._ridged_logdet(np.concatenate([S, self.S[p], self.S[q]]),
                                 np.concatenate([n, self.n[p], self.n[q]]), self.s0)
        lpq, lp, lq = ld[:k], ld[k:2 * k], ld[2 * k:]
        return 0.5 * (lpq - wp * lp - wq * lq) - ent

    def _merge_pair(self, p: int, q: int, stats: tuple, k: int) -> int:
        """Replace p by the union of p and q, delete q; returns p's final index."""
        n, mu, S = stats
        self.n[p], self.mu[p], self.S[p] = n[k], mu[k], S[k]
        self.last[p] = max(self.last[p], self.last[q])
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

    def merge_all(self) -> int:
        """Server merge: repeatedly merge the best nearby same-class pair; returns #merges.

        Candidate pairs: one mean inside the other's gate. The order of the
        clusters does not matter beyond exact ties (the best pair is global).
        """
        merges = 0
        C = self.C
        if C < 2:
            return 0
        R = np.full((C, C), np.inf)
        for p in range(C):
            self._score_row(R, p, C)
        alive = np.ones(C, bool)
        while True:
            flat = int(np.argmin(R))
            p, q = divmod(flat, C)
            if not R[p, q] < 0.0:
                break
            score, stats = self._merge_scores(np.array([p]), np.array([q]))
            n, mu, S = stats
            self.n[p], self.mu[p], self.S[p] = n[0], mu[0], S[0]
            self.last[p] = max(self.last[p], self.last[q])
            self.refresh(np.array([p]))
            alive[q] = False
            self.n[q] = 0.0
            R[q, :] = np.inf
            R[:, q] = np.inf
            self._score_row(R, p, C, alive)
            merges += 1
        keep = np.flatnonzero(alive)
        for name in ("mu", "S", "P", "n", "ld", "cls", "last", "upd"):
            arr = getattr(self, name)
            arr[:keep.size] = arr[keep]
        self.C = int(keep.size)
        return merges

    def absorb_fragments(self) -> int:
        """Fold clusters holding less than ``min_weight`` of the data into their best neighbour.

        A fragment's statistics join the same-class cluster under which its mean
        is most likely (exact pooled statistics, no point is lost); a class's
        only cluster is kept. Returns the number of fragments folded.
        """
        folded = 0
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

    def _score_row(self, R: np.ndarray, p: int, C: int, alive: np.ndarray | None = None) -> None:
        others = np.arange(C)
        ok = (others != p) & (self.cls[:C] == self.cls[p])
        if alive is not None:
            ok &= alive
        if not ok.any():
            R[p, :] = np.inf
            R[:, p] = np.inf
            return
        q = others[ok]
        diff = self.mu[q] - self.mu[p]
        if self.full:
            d_pq = np.einsum("kd,de,ke->k", diff, self.P[p], diff)
            d_qp = np.einsum("kd,kde,ke->k", diff, self.P[q], diff)
        else:
            d_pq = (diff ** 2 * self.P[p]).sum(axis=1)
            d_qp = (diff ** 2 * self.P[q]).sum(axis=1)
        near = (d_pq <= self.gate) | (d_qp <= self.gate)
        if self.s.merge_test == "both":  # the midpoint inside both gates (as online)
            near |= (d_pq <= 4.0 * self.gate) & (d_qp <= 4.0 * self.gate)
        row = np.full(C, np.inf)
        if near.any():
            qn = q[near]
            score, _ = self._merge_scores(np.full(qn.size, p), qn)
            row[qn] = score
        R[p, :] = row
        R[:, p] = row
        R[p, p] = np.inf

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
