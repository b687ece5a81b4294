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

* **trust-radius rounds** — per-cluster sums of x − c clipped to a radius r
  and counts (:func:`relative_sums`): sensitivity r√(1 + 1/d) with γ = r/√d;
  the first round at r = B also releases the spread Σ min(‖x − c‖, B)
  (sensitivity B), from which :func:`trust_radius` sets r for the later
  rounds (post-processing); :func:`box_centers` is the data-independent start.

Device-level: each release's contribution of a device is clipped to
(point sensitivity) × C / B, which is then the sensitivity.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..core.kmeans import assign
from .accounting import Release
from .mechanisms import clip_contribution, clip_points, gaussian, symmetric_gaussian
from .spec import DifferentialPrivacy

__all__ = ["moments_release", "sums_release", "device_moments", "noisy_moments",
           "gaussian_subspace", "draw_candidates", "candidate_sums", "cluster_sums",
           "noisy_cluster_sums", "centers_from_candidates", "n_candidates", "count_weight",
           "lift", "private_local_centers", "relative_sums", "noisy_relative_sums",
           "spread_release", "trust_radius", "relative_step", "box_centers", "box_radius"]

MOMENTS = "moments: count, sum and second-moment matrix (central DP)"
CANDIDATES = "candidates: per-candidate sums and counts"
LLOYD = "lloyd round: per-cluster sums of x - c clipped to the trust radius, and counts"
FINAL = "final lloyd round: per-cluster sums of x - c clipped to the trust radius, and counts"
SPREAD = "first lloyd round: sum of nearest-center distances clipped to data_bound"
#: the trust radius is this many times the (upper-confidence) mean distance to the nearest
#: center: beyond the 95 % quantile of a Gaussian cluster's distances in 2 or more dimensions
RADIUS_FACTOR = 2.0
#: the mean distance is taken at its estimate plus this many noise stds (upper confidence):
#: a noisy estimate widens the radius rather than freezing the centers
RADIUS_CONFIDENCE = 1.0
#: budget weight of the spread (one number, needed only to within a factor ~2) beside 1
#: for a middle Lloyd round
SPREAD_SHARE = 0.25
#: box start: candidates per cluster (the weighted k-means merges 3k noisy centroids)
BOX_CANDIDATES = 3


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
                 share: float = 1.0, radius: float | None = None) -> Release:
    """Joint (sums, γ·counts) release: sensitivity r√(1 + 1/d) with γ = r/√d, r the
    radius the summed vectors are clipped to (``data_bound`` when None)."""
    r = float(spec.data_bound if radius is None else radius)
    return Release(what, r * math.sqrt(1.0 + 1.0 / d) * _scale(spec), repeats, share)


def spread_release(spec: DifferentialPrivacy, *, share: float = 1.0) -> Release:
    """Σ min(‖x − c(x)‖, B) over the points: one point adds at most B (sensitivity B)."""
    return Release(SPREAD, float(spec.data_bound) * _scale(spec), 1, share)


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


def relative_sums(X: np.ndarray, centers: np.ndarray, radius: float,
                  spec: DifferentialPrivacy | None, *, spread: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """The trust-radius Lloyd reply of one device.

    Every (clipped) point goes to its nearest center c_j; the device sums
    ``x − c_j`` clipped to Euclidean norm ``radius`` per cluster (k, d) and
    counts the points (k,). One point changes one cluster's sum by at most
    ``radius`` and its count by 1: the joint (sums, γ·counts) release with
    γ = radius/√d has sensitivity radius·√(1 + 1/d) (:func:`sums_release`).
    With ``spread`` it also returns Σ min(‖x − c_j‖, data_bound) (sensitivity
    data_bound, :func:`spread_release`), else 0. Device level: the (sums,
    γ·counts) contribution is clipped to radius·√(1 + 1/d)·C/B and the
    spread to C.
    """
    k, d = centers.shape
    labels, mind = assign(X, centers.astype(X.dtype, copy=False))
    diff, _ = clip_points(X - centers[labels].astype(X.dtype, copy=False), float(radius))
    sums = np.zeros((k, d))
    np.add.at(sums, labels, diff)
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    total = 0.0
    if spread:
        bound = float(spec.data_bound) if spec is not None else math.inf
        total = float(np.minimum(np.sqrt(mind.astype(np.float64)), bound).sum())
    clipped = False
    if spec is not None and spec.unit == "device":
        (sums, counts), clipped = clip_contribution(
            [sums, counts], [1.0, count_weight(radius, d)],
            radius * math.sqrt(1.0 + 1.0 / d) * _scale(spec))
        total = min(total, float(spec.clip_norm))
    return sums, counts, total, clipped


def candidate_sums(X: np.ndarray, mean: np.ndarray, basis: np.ndarray, coords: np.ndarray,
                   spec: DifferentialPrivacy | None):
    """Nearest candidate of every point in the subspace (coordinates of x − mean), then
    per-candidate sums of the projected points Vᵀx (M, p) and counts (M,)."""
    P = X @ basis
    labels = assign(P - mean @ basis, coords.astype(P.dtype, copy=False))[0]
    return cluster_sums(P, labels, coords.shape[0], spec)


def box_centers(k: int, d: int, bound: float, rng: np.random.Generator, *,
                tries: int = 100) -> np.ndarray:
    """k data-independent starting centers (k, d) spread over the cube inscribed in the
    data ball, [-a, a]^d with a = bound/√d: balls of radius ρ around them fit in the
    cube without overlapping, for the largest ρ in a, a/2, a/4, ... that random
    placement (``tries`` misses per center) achieves. Reads no data."""
    a = float(bound) / math.sqrt(d)
    rho = a
    while True:
        rho /= 2.0
        centers = [rng.uniform(-(a - rho), a - rho, d)]
        miss = 0
        while len(centers) < k and miss < tries:
            c = rng.uniform(-(a - rho), a - rho, d)
            if min(np.linalg.norm(c - x) for x in centers) >= 2.0 * rho:
                centers.append(c)
                miss = 0
            else:
                miss += 1
        if len(centers) == k or rho < a * 1e-6:
            return np.array(centers + [rng.uniform(-a, a, d) for _ in range(k - len(centers))])


def box_radius(M: int, d: int, bound: float) -> float:
    """Trust radius of the box start's candidate round: twice the mean distance from a
    point spread evenly over the inscribed cube [-a, a]^d to the nearest of M evenly
    spread candidates, ≈ 2 a √(d/3) M^(-1/d) (a = bound/√d), at most ``bound``."""
    return float(min(bound, 2.0 * float(bound) / math.sqrt(3.0) * float(M) ** (-1.0 / d)))


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


def noisy_relative_sums(sums: np.ndarray, counts: np.ndarray, release: Release, radius: float,
                        bound: float, rng: np.random.Generator
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Relative sums plus noise: ``release`` is declared at radius ``bound``, so the
    noise at radius r is its std times r / bound (the same multiplier)."""
    std = release.noise_std * float(radius) / float(bound)
    d = sums.shape[1]
    return gaussian(sums, std, rng), gaussian(counts, std / count_weight(radius, d), rng)


def trust_radius(spread: float, spread_std: float, n_hat: float, bound: float) -> float:
    """The radius of the later rounds from the released spread (post-processing):
    RADIUS_FACTOR × the mean nearest-center distance, the spread taken at its upper
    confidence value, at most ``bound`` (and ``bound`` when that value is not positive)."""
    upper = float(spread) + RADIUS_CONFIDENCE * float(spread_std)
    if not upper > 0 or not n_hat > 0:
        return float(bound)
    return float(min(RADIUS_FACTOR * upper / max(float(n_hat), 1.0), bound))


def relative_step(centers: np.ndarray, sums: np.ndarray, counts: np.ndarray, *,
                  min_count: float, radius: float, bound: float, sum_std: float = 0.0
                  ) -> np.ndarray:
    """Centers moved by the noisy mean relative sum m = S/N (post-processing).

    A cluster whose noisy count is at most ``min_count`` stays. The step is
    shrunk by max(0, 1 − d (σ/N)² / ‖m‖²) (σ = ``sum_std``, the noise std of
    each coordinate of S: d (σ/N)² is the step's noise energy), so a step
    that noise could explain is damped rather than taken; a step longer than
    ``radius`` is cut to it (the exact mean of clipped vectors never is); the
    centers end in the data ball."""
    new = np.asarray(centers, dtype=np.float64).copy()
    nz = counts > min_count
    step = sums[nz] / counts[nz, None]
    if sum_std > 0:    # positive-part James-Stein: a step within its noise shrinks to 0
        noise = step.shape[1] * (sum_std / counts[nz]) ** 2
        step *= np.maximum(0.0, 1.0 - noise / np.maximum((step * step).sum(axis=1), 1e-300))[:, None]
    nrm = np.linalg.norm(step, axis=1)
    far = nrm > radius
    step[far] *= (radius / nrm[far])[:, None]
    new[nz] += step
    nrm = np.linalg.norm(new, axis=1)
    over = nrm > bound
    new[over] *= (bound / nrm[over])[:, None]
    return new


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
                            min_count: float, seed: int, centroids: np.ndarray | None = None
                            ) -> tuple[np.ndarray, np.ndarray]:
    """k centers (k, d) and their weights (k,) from noisy per-candidate sums and counts.

    Candidates with a noisy count below ``min_count`` are dropped (the k
    largest are always kept); ``centroids`` (M, d), when given, replace
    ``sums / counts`` (the box start moves its candidates by relative steps);
    centroids are pulled back into the data ball
    (true centroids of clipped points lie in it); weighted k-means (10
    k-means++ starts) groups them.
    """
    from sklearn.cluster import KMeans

    keep = counts >= min_count
    if keep.sum() < k:
        keep = np.zeros(len(counts), bool)
        keep[np.argsort(counts)[::-1][:k]] = True
    w = np.maximum(counts[keep], 1e-12)
    C = sums[keep] / w[:, None] if centroids is None else np.array(centroids[keep], dtype=float)
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
