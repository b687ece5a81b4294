"""Private building blocks of the k-means families (distributed Lloyd, k-FED).

Three releases, each a Gaussian mechanism on a sum over points clipped to the
user's ``data_bound`` B (point level) or over devices whose contribution is
clipped to ``clip_norm`` C (device level):

* **moments** — count n, sum s and second-moment matrix Q = Σ x xᵀ, read as
  the upper triangle of Σ a aᵀ with a = (B, x): point-level L2 sensitivity
  ‖a‖² ≤ 2B² (the outer product's Frobenius norm is ‖a‖², not ‖a‖). The server
  forms the mean and covariance, repairs the covariance to the nearest PSD
  matrix (negative eigenvalues set to 0) and keeps its top-p eigenvectors.
* **cluster sums** — per-cluster sums and counts for any partition fixed
  before the data are read (centers or candidates that are themselves
  outputs of earlier releases), released jointly as (sums, γ·counts),
  γ = B/√d: sensitivity B√(1 + 1/d); the count noise is 1/γ of it.
* **candidates** — an initialisation with no raw point and no k-means++ on
  data: M candidate centers drawn from the private Gaussian fit inside its
  top-p subspace V (p = min(k, d)); points go to their nearest candidate in
  that subspace and each candidate's sum of the *projected* points Vᵀx (p
  numbers, not d: ‖Vᵀx‖ ≤ B, so the sensitivity is B√(1 + 1/p) with γ = B/√p)
  and count are released; the noisy candidate centroids, weighted by their
  noisy counts, are clustered into k by weighted k-means and lifted back as
  V c + (I − V Vᵀ) μ (post-processing, free). Releasing p coordinates
  instead of d keeps the noise where the clusters are told apart.

Device-level: each release's contribution of a device is clipped to
(point sensitivity) × C / B, which is then the sensitivity.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..core.kmeans import assign
from .accounting import Release
from .mechanisms import clip_contribution, gaussian, symmetric_gaussian
from .spec import DifferentialPrivacy

__all__ = ["moments_release", "sums_release", "device_moments", "noisy_moments",
           "gaussian_subspace", "draw_candidates", "candidate_sums", "cluster_sums",
           "noisy_cluster_sums", "centers_from_candidates", "n_candidates", "count_weight",
           "lift", "private_local_centers"]

MOMENTS = "moments: count, sum and second-moment matrix (central DP)"
CANDIDATES = "candidates: per-candidate sums and counts"
LLOYD = "lloyd round: per-cluster sums and counts"
FINAL = "final lloyd round: per-cluster sums and counts"


def _scale(spec: DifferentialPrivacy) -> float:
    """Device level: sensitivities are point sensitivities times C / B."""
    if spec.unit == "device":
        return float(spec.clip_norm) / float(spec.data_bound)
    return 1.0


def count_weight(bound: float, d: int) -> float:
    """γ = B/√d: the weight of counts in a joint (sums, γ·counts) release."""
    return bound / math.sqrt(d)


def moments_release(spec: DifferentialPrivacy, *, what: str = MOMENTS, share: float = 1.0) -> Release:
    B = float(spec.data_bound)
    return Release(what, 2.0 * B * B * _scale(spec), 1, share)


def sums_release(spec: DifferentialPrivacy, d: int, *, what: str = LLOYD, repeats: int = 1,
                 share: float = 1.0) -> Release:
    B = float(spec.data_bound)
    return Release(what, B * math.sqrt(1.0 + 1.0 / d) * _scale(spec), repeats, share)


# -- device side -------------------------------------------------------------------
def device_moments(X: np.ndarray, spec: DifferentialPrivacy | None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, s (d,), Q (d, d)) of the device's (already clipped) points, device-clipped if asked."""
    n = np.asarray(float(len(X)))
    s = X.sum(axis=0, dtype=np.float64)
    Q = X.T.astype(np.float64) @ X.astype(np.float64)
    if spec is not None and spec.unit == "device":
        B = float(spec.data_bound)
        (n, s, Q), _ = clip_contribution([n, s, Q], [B * B, math.sqrt(2.0) * B, 1.0],
                                         2.0 * B * float(spec.clip_norm))
    return n, s, Q


def cluster_sums(X: np.ndarray, labels: np.ndarray, k: int, spec: DifferentialPrivacy | None
                 ) -> tuple[np.ndarray, np.ndarray, bool]:
    """Per-cluster sums (k, d) and counts (k,) as float64; device-clipped if asked."""
    sums = np.zeros((k, X.shape[1]))
    np.add.at(sums, labels, X)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    clipped = False
    if spec is not None and spec.unit == "device":
        B, d = float(spec.data_bound), X.shape[1]
        (sums, counts), clipped = clip_contribution(
            [sums, counts], [1.0, count_weight(B, d)],
            B * math.sqrt(1.0 + 1.0 / d) * float(spec.clip_norm) / B)
    return sums, counts, clipped


def candidate_sums(X: np.ndarray, mean: np.ndarray, basis: np.ndarray, coords: np.ndarray,
                   spec: DifferentialPrivacy | None):
    """Nearest candidate of every point in the subspace (coordinates of x − mean), then
    per-candidate sums of the projected points Vᵀx (M, p) and counts (M,)."""
    P = X @ basis
    labels = assign(P - mean @ basis, coords.astype(P.dtype, copy=False))[0]
    return cluster_sums(P, labels, coords.shape[0], spec)


def lift(centers_p: np.ndarray, mean: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Subspace centers (k, p) of Vᵀx back to (k, d): V c + (I − V Vᵀ) mean."""
    return centers_p @ basis.T + (mean - basis @ (basis.T @ mean))


# -- server side (or a device releasing its own statistics) --------------------------
def noisy_moments(n, s, Q, release: Release, bound: float, rng: np.random.Generator):
    """Moments plus the Gaussian mechanism's noise (std z·Δ on the scaled entries)."""
    std = release.noise_std
    B = float(bound)
    return (float(gaussian(np.asarray(n, dtype=np.float64), std / (B * B), rng)),
            gaussian(s, std / B, rng), symmetric_gaussian(Q, std, rng))


def noisy_cluster_sums(sums: np.ndarray, counts: np.ndarray, release: Release, bound: float,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    std = release.noise_std
    d = sums.shape[1]
    return gaussian(sums, std, rng), gaussian(counts, std / count_weight(bound, d), rng)


def gaussian_subspace(n: float, s: np.ndarray, Q: np.ndarray, p: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean (d,), top-p eigenvectors (d, p) and eigenvalues (p,) of the (PSD-repaired) covariance."""
    n = max(float(n), 1.0)
    mean = s / n
    C = Q / n - np.outer(mean, mean)
    C = (C + C.T) / 2.0
    lam, V = np.linalg.eigh(C)
    order = np.argsort(lam)[::-1][:p]
    return mean, V[:, order], np.maximum(lam[order], 0.0)


def n_candidates(n_hat: float, count_std: float, k: int, *, cap: int | None = None) -> int:
    """M candidates: as many as keep about 8 count-noise stds (at least 20 points) per candidate."""
    cap = cap if cap is not None else 50 * k
    per = max(8.0 * count_std, 20.0)
    return int(min(max(k, n_hat / per), max(cap, k)))


def draw_candidates(mean: np.ndarray, basis: np.ndarray, lam: np.ndarray, M: int,
                    rng: np.random.Generator) -> np.ndarray:
    """M subspace coordinates (M, p) drawn from N(0, diag(lam)) (public randomness)."""
    return rng.standard_normal((M, basis.shape[1])) * np.sqrt(lam)


def centers_from_candidates(sums: np.ndarray, counts: np.ndarray, k: int, *, bound: float | None,
                            min_count: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """k centers (k, d) and their weights (k,) from noisy per-candidate sums and counts.

    Candidates with a noisy count below ``min_count`` are dropped (the k
    largest are always kept); centroids are pulled back into the data ball
    (true centroids of clipped points lie in it); weighted k-means (10
    k-means++ starts) groups them.
    """
    from sklearn.cluster import KMeans

    keep = counts >= min_count
    if keep.sum() < k:
        keep = np.zeros(len(counts), bool)
        keep[np.argsort(counts)[::-1][:k]] = True
    w = np.maximum(counts[keep], 1e-12)
    C = sums[keep] / w[:, None]
    if bound is not None:
        nrm = np.linalg.norm(C, axis=1)
        over = nrm > bound
        C[over] *= (bound / nrm[over])[:, None]
    if len(C) == k:
        return C, w
    km = KMeans(k, n_init=10, random_state=seed % (2**31 - 1)).fit(C, sample_weight=w)
    weights = np.bincount(km.labels_, weights=w, minlength=k)
    return km.cluster_centers_, weights


def private_local_centers(X: np.ndarray, k: int, spec: DifferentialPrivacy,
                          releases: Sequence[Release], rng: np.random.Generator,
                          noise: np.random.Generator, seed: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """A device's own DP k-means: noisy moments, then noisy candidate sums, both
    noised on the device and calibrated to its own counts (local trust model).

    ``X`` is already clipped; ``releases`` are the calibrated (moments,
    candidates) releases; ``rng`` is the device's ordinary stream (candidate
    draws), ``noise`` its privacy-noise stream. Returns k centers and their
    noisy counts.
    """
    B = float(spec.data_bound)
    d = X.shape[1]
    n, s, Q = device_moments(X, spec)
    n, s, Q = noisy_moments(n, s, Q, releases[0], B, noise)
    p = min(k, d)
    mean, basis, lam = gaussian_subspace(n, s, Q, p)
    count_std = releases[1].noise_std / count_weight(B, p)
    M = n_candidates(n, count_std, k)
    coords = draw_candidates(mean, basis, lam, M, rng)
    sums, counts, _ = candidate_sums(X, mean, basis, coords, spec)
    sums, counts = noisy_cluster_sums(sums, counts, releases[1], B, noise)
    centers, weights = centers_from_candidates(sums, counts, k, bound=B,
                                               min_count=max(1.0, 3.0 * count_std), seed=seed)
    return lift(centers, mean, basis), weights
