"""Federated EM with model selection by the row-level BIC (``em_rounds > 0``).

The merged model is judged by the server from the pieces' moments only; the row-level
mixture likelihood needs the rows. Each EM round the server broadcasts the current
mixture (weights, means, covariances) and a short list of candidate edits: merging one
of the ``m`` closest pairs of components (Bhattacharyya distance; the merged component
moment-matches the pair), dropping one of the ``m`` lightest components (weights
renormalised) and splitting one of the ``m`` heaviest in two along its principal axis
(the two halves of a Gaussian cut at its mean: means mu +- sqrt(2 lambda / pi) v,
variance (1 - 2/pi) lambda along v, half the weight each; merging them back gives the
component again, as in split-and-merge EM). Every owner returns, over all its rows,

* the log-likelihood sum of the current mixture and of every candidate (c + 1 floats),
  and the entropy sum of each one's responsibilities, -sum r log r (c + 1 floats),
* the E-step statistics of the current mixture: per component the responsibility sum
  N_k, the sum of r (x - mu_k) and of r (x - mu_k)(x - mu_k)^T about the broadcast
  mean (packed upper triangle, or the diagonal for ``covariance="diag"``).

The server sums them over owners (a sum: nothing depends on the order), scores every
model by BIC = -2 log L + p log N (p = K (D + D(D+1)/2) + K - 1 for full covariances,
K 2D + K - 1 for diagonal ones, N the rows) or, with ``em_criterion="icl"``, by the
integrated completed likelihood
ICL = BIC + 2 sum -r log r (Biernacki, Celeux & Govaert, IEEE TPAMI 22(7), 2000: BIC
counts Gaussians, ICL counts clusters: two components that share their rows pay their
overlap, so a non-Gaussian cluster described by two overlapping Gaussians becomes one),
keeps the best, and takes one M-step on the
summed statistics (a merge adds the pair's statistics; a drop leaves the component out,
its rows go to the others at the next E-step; a split is kept as proposed and refined
by the next rounds). Covariances are ridged like the BIC
merge's: Sigma_k = (S_k + Sigma_rule) / N_k. It stops when the current mixture wins and
its log-likelihood rose by less than ``EM_TOL`` nats per row, or after ``em_rounds``.

Bytes per owner and round: up 8 [2 (c + 1) + K (1 + D + w)], down 8 [K (1 + D + w) + 2 c],
w = D(D+1)/2 (full) or D (diag), c = the candidates (at most 3 m).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.special import logsumexp

__all__ = ["Mixture", "EM_CANDIDATES", "EM_TOL", "CRITERIA", "candidate_edits", "apply_edit",
           "log_densities", "device_statistics", "n_parameters", "choose_and_step",
           "integer_counts"]

#: closest pairs offered for a merge, and lightest components offered for a drop, per round
EM_CANDIDATES = 8
#: stop when the kept mixture's log-likelihood rose by less than this, in nats per row
EM_TOL = 1e-3
#: model-selection criteria of the EM rounds
CRITERIA = ("icl", "bic")


@dataclass
class Mixture:
    """A Gaussian mixture: weights (K,), means (K, D), covariances (K, D, D) or (K, D)."""

    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray

    @property
    def full(self) -> bool:
        return self.covs.ndim == 3

    @property
    def K(self) -> int:
        return int(self.weights.shape[0])


def n_parameters(K: int, D: int, full: bool) -> int:
    """Free parameters of a K-component mixture (weights sum to one)."""
    return K * (D + (D * (D + 1) // 2 if full else D)) + K - 1


def _bhattacharyya(mix: Mixture) -> np.ndarray:
    """(K, K) Bhattacharyya distances between the components (inf on the diagonal)."""
    K = mix.K
    out = np.full((K, K), np.inf)
    ld = (np.linalg.slogdet(mix.covs)[1] if mix.full else np.log(mix.covs).sum(axis=1))
    for p in range(K):
        for q in range(p + 1, K):
            C = 0.5 * (mix.covs[p] + mix.covs[q])
            d = mix.means[p] - mix.means[q]
            if mix.full:
                quad = float(d @ np.linalg.solve(C, d))
                ldc = float(np.linalg.slogdet(C)[1])
            else:
                quad, ldc = float((d * d / C).sum()), float(np.log(C).sum())
            out[p, q] = out[q, p] = quad / 8 + 0.5 * (ldc - 0.5 * (ld[p] + ld[q]))
    return out


SPLIT = -2  # edits (p, SPLIT) split component p; (p, -1) drop it


def candidate_edits(mix: Mixture, m: int = EM_CANDIDATES) -> np.ndarray:
    """(c, 2) int64 edits: (p, q) merges components p < q, (p, -1) drops component p,
    (p, -2) splits component p.

    The m closest pairs (Bhattacharyya distance, ties by index), the m lightest
    components and the m heaviest (ties by index); only splits for a single component."""
    K = mix.K
    heavy = np.lexsort((np.arange(K), -mix.weights))[:m]
    splits = np.stack([heavy, np.full(heavy.size, SPLIT)], axis=1).astype(np.int64)
    if K < 2:
        return splits
    B = _bhattacharyya(mix)
    p, q = np.triu_indices(K, 1)
    order = np.lexsort((q, p, B[p, q]))[:m]
    merges = np.stack([p[order], q[order]], axis=1)
    light = np.lexsort((np.arange(K), mix.weights))[:m]
    drops = np.stack([light, np.full(light.size, -1)], axis=1)
    return np.concatenate([merges, drops, splits]).astype(np.int64)


def apply_edit(mix: Mixture, edit: Sequence[int]) -> Mixture:
    """The mixture with one edit applied (the merged or split components go last)."""
    p, q = int(edit[0]), int(edit[1])
    keep = np.array([k for k in range(mix.K) if k not in (p, q)], dtype=np.int64)
    if q == SPLIT:
        return _split(mix, p, keep)
    if q < 0:
        w = mix.weights[keep]
        return Mixture(w / w.sum(), mix.means[keep], mix.covs[keep])
    wp, wq = mix.weights[p], mix.weights[q]
    W = wp + wq
    mu = (wp * mix.means[p] + wq * mix.means[q]) / W
    dp, dq = mix.means[p] - mu, mix.means[q] - mu
    if mix.full:
        cov = (wp * (mix.covs[p] + np.outer(dp, dp)) + wq * (mix.covs[q] + np.outer(dq, dq))) / W
    else:
        cov = (wp * (mix.covs[p] + dp * dp) + wq * (mix.covs[q] + dq * dq)) / W
    return Mixture(np.append(mix.weights[keep], W), np.vstack([mix.means[keep], mu]),
                   np.concatenate([mix.covs[keep], cov[None]]))


def _split(mix: Mixture, p: int, keep: np.ndarray) -> Mixture:
    C = mix.covs[p]
    if mix.full:
        lam, V = np.linalg.eigh(C)
        lam, v = lam[-1], V[:, -1]
    else:
        j = int(np.argmax(C))
        lam, v = C[j], np.eye(C.size)[j]
    shift = np.sqrt(2.0 * lam / np.pi) * v
    if mix.full:
        half = C - (2.0 / np.pi) * lam * np.outer(v, v)
    else:
        half = C - (2.0 / np.pi) * lam * v
    w = mix.weights[p] / 2
    return Mixture(np.append(mix.weights[keep], [w, w]),
                   np.vstack([mix.means[keep], mix.means[p] - shift, mix.means[p] + shift]),
                   np.concatenate([mix.covs[keep], half[None], half[None]]))


def log_densities(X: np.ndarray, mix: Mixture) -> np.ndarray:
    """(n, K) log w_k + log N(x; mu_k, Sigma_k)."""
    n, D = X.shape
    out = np.empty((n, mix.K))
    for k in range(mix.K):
        E = X - mix.means[k]
        if mix.full:
            L = np.linalg.cholesky(mix.covs[k])
            Z = np.linalg.solve(L, E.T)
            quad, ld = (Z * Z).sum(axis=0), 2.0 * np.log(np.diagonal(L)).sum()
        else:
            quad, ld = (E * E / mix.covs[k]).sum(axis=1), np.log(mix.covs[k]).sum()
        out[:, k] = np.log(mix.weights[k]) - 0.5 * (quad + ld + D * np.log(2 * np.pi))
    return out


def _loglik_entropy(lp: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
    row_ll = logsumexp(lp, axis=1)
    log_r = lp - row_ll[:, None]
    R = np.exp(log_r)
    return float(row_ll.sum()), float(-(R * log_r).sum()), R, row_ll


def device_statistics(X: np.ndarray, mix: Mixture, edits: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One owner's reply: log-likelihood sums (c + 1,) of the current mixture then of
    every edit, responsibility sums (K,), sums of r (x - mu_k) (K, D) and of
    r (x - mu_k)(x - mu_k)^T (K, D, D), or its diagonal (K, D), and the entropy sums
    -sum r log r (c + 1,) in the order of the log-likelihoods."""
    ll0, ent0, R, _ = _loglik_entropy(log_densities(X, mix))
    ll, ent = [ll0], [ent0]
    for e in edits:
        a, b = _loglik_entropy(log_densities(X, apply_edit(mix, e)))[:2]
        ll.append(a)
        ent.append(b)
    K, D = mix.means.shape
    N = R.sum(axis=0)
    first = np.empty((K, D))
    second = np.empty((K, D, D) if mix.full else (K, D))
    for k in range(K):
        E = X - mix.means[k]
        RE = R[:, k, None] * E
        first[k] = RE.sum(axis=0)
        second[k] = RE.T @ E if mix.full else (RE * E).sum(axis=0)
    return np.asarray(ll), N, first, second, np.asarray(ent)


def _m_step(mix: Mixture, N: np.ndarray, first: np.ndarray, second: np.ndarray,
            ridge: np.ndarray) -> tuple[Mixture, np.ndarray]:
    """Weights, means and ridged covariances (S + ridge) / N from the summed statistics
    about the broadcast means; also the scatters S (about the new means)."""
    d = first / N[:, None]
    mu = mix.means + d
    if mix.full:
        S = second - N[:, None, None] * d[:, :, None] * d[:, None, :]
        S = 0.5 * (S + np.transpose(S, (0, 2, 1)))
        cov = (S + np.diag(ridge)) / N[:, None, None]
    else:
        S = np.maximum(second - N[:, None] * d * d, 0.0)
        cov = (S + ridge) / N[:, None]
    return Mixture(N / N.sum(), mu, cov), S


def choose_and_step(mix: Mixture, edits: np.ndarray, ll: np.ndarray, N: np.ndarray,
                    first: np.ndarray, second: np.ndarray, ridge: np.ndarray,
                    entropy: np.ndarray | None = None
                    ) -> tuple[Mixture, np.ndarray, int, np.ndarray]:
    """Score the current mixture and every edit on the summed owner statistics (BIC, or
    ICL = BIC + 2 ``entropy`` when the entropy sums are given), keep the best and take
    one M-step. Returns the new mixture, its scatters, the index of the kept model
    (0 = no edit, i = edits[i - 1]) and the score of every model."""
    n_rows = float(N.sum())
    D = mix.means.shape[1]
    sizes = [mix.K] + [mix.K + (1 if e[1] == SPLIT else -1) for e in edits]
    bic = np.array([-2.0 * ll[i] + n_parameters(k, D, mix.full) * np.log(n_rows)
                    for i, k in enumerate(sizes)])
    if entropy is not None:
        bic = bic + 2.0 * np.asarray(entropy, float)
    best = int(np.argmin(bic))
    keep = np.arange(mix.K)
    if best and int(edits[best - 1][1]) == SPLIT:  # kept as proposed; the next rounds refine it
        new = apply_edit(mix, edits[best - 1])
        p = int(edits[best - 1][0])
        Nk = np.append(N[keep[keep != p]], [N[p] / 2, N[p] / 2])
        S = Nk[:, None, None] * new.covs if new.full else Nk[:, None] * new.covs
        return new, S, best, bic
    if best:
        p, q = (int(v) for v in edits[best - 1])
        keep = np.array([k for k in range(mix.K) if k not in (p, q)], dtype=np.int64)
        if q >= 0:  # the merged component's rows: both members' (about their own means)
            N, first, second, means = _pooled_stats(mix, keep, p, q, N, first, second)
            mix = Mixture(mix.weights[np.append(keep, p)], means, mix.covs[np.append(keep, p)])
    if best and int(edits[best - 1][1]) < 0:
        mix = Mixture(mix.weights[keep], mix.means[keep], mix.covs[keep])
        N, first, second = N[keep], first[keep], second[keep]
    new, S = _m_step(mix, N, first, second, ridge)
    return new, S, best, bic


def _pooled_stats(mix, keep, p, q, N, first, second):
    """Statistics with components p and q pooled into one (last), re-centred at the
    pair's weighted mean."""
    Np, Nq = N[p], N[q]
    Npq = Np + Nq
    c = (Np * mix.means[p] + Nq * mix.means[q]) / Npq
    f, s = [], []
    for j in (p, q):
        a = mix.means[j] - c  # recentre sum r (x - mu_j) and its square at c
        fj = first[j] + N[j] * a
        if mix.full:
            sj = (second[j] + np.outer(first[j], a) + np.outer(a, first[j])
                  + N[j] * np.outer(a, a))
        else:
            sj = second[j] + 2 * first[j] * a + N[j] * a * a
        f.append(fj)
        s.append(sj)
    N2 = np.append(N[keep], Npq)
    first2 = np.vstack([first[keep], f[0] + f[1]])
    second2 = np.concatenate([second[keep], (s[0] + s[1])[None]])
    means2 = np.vstack([mix.means[keep], c])
    return N2, first2, second2, means2


def integer_counts(N: np.ndarray, total: int) -> np.ndarray:
    """Responsibility sums rounded to integers that add up to ``total`` (largest
    remainder)."""
    N = np.asarray(N, float) * (total / max(float(N.sum()), 1e-300))
    base = np.floor(N).astype(np.int64)
    short = int(total - base.sum())
    if short > 0:
        base[np.argsort(-(N - base), kind="stable")[:short]] += 1
    return base
