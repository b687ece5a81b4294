"""What crosses the wire: an owner's clusters up, the global model down.

Bytes per owner (float64 / int64, 8 bytes a number), with c clusters sent,
D features and M classes (M = 0 for clustering):

* ``covariance="full"``: ``8 [c (D + D(D+1)/2 + 2 + M) + 2D + 1 + M (2D + 1)]`` —
  per cluster the mean, the upper triangle of the scatter, the count, the age
  and the one-hot class; per owner the global count, mean and m2, and per class
  the count, mean and m2 (the Fisher scores' exact ingredients; M = 0 for clustering);
* ``covariance="diag"``: ``8 [c (2D + 2 + M) + 2D + 1 + M (2D + 1)]``.

The global model sent back has the same layout (c = global clusters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core.messages import FLOAT, INT, Message, reject
from .stats import psd_violation, unpack_scatter

__all__ = ["GaussClusters", "GaussModel", "GaussClassStats", "GaussClassSums", "GaussFeatures",
           "GaussMixture", "GaussEMStats", "message_numbers"]

#: tolerance of the PSD check, relative to max(1, trace) of each scatter
PSD_TOL = 1e-9


def message_numbers(c: int, D: int, M: int, covariance: str = "full") -> int:
    """How many 8-byte numbers a :class:`GaussClusters` with c clusters holds."""
    width = D * (D + 1) // 2 if covariance == "full" else D
    return c * (D + width + 2 + M) + 2 * D + 1 + M * (2 * D + 1)


@dataclass(frozen=True)
class GaussClusters(Message):
    """Owner -> server: clusters with n > kappa_n and the owner's global statistics."""

    means: np.ndarray          # (c, D) float
    scatters: np.ndarray       # (c, D(D+1)/2) packed upper triangle, or (c, D) diagonal
    counts: np.ndarray         # (c,) int64 >= 1
    ages: np.ndarray           # (c,) int64 >= 0: samples since the cluster was last activated
    classes: np.ndarray        # (c, M) int64 one-hot (M = 0 for clustering)
    global_count: np.ndarray   # () int64
    global_mean: np.ndarray    # (D,) float
    global_m2: np.ndarray      # (D,) float, sum of squared deviations per feature
    class_count: np.ndarray    # (M,) int64 samples per class
    class_mean: np.ndarray     # (M, D) float per-class feature means
    class_m2: np.ndarray       # (M, D) float per-class sums of squared deviations
    schema: ClassVar = {"means": (FLOAT, 2), "scatters": (FLOAT, 2), "counts": (INT, 1),
                        "ages": (INT, 1), "classes": (INT, 2), "global_count": (INT, 0),
                        "global_mean": (FLOAT, 1), "global_m2": (FLOAT, 1),
                        "class_count": (INT, 1), "class_mean": (FLOAT, 2),
                        "class_m2": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_clusters"

    @property
    def covariance(self) -> str:
        D = self.means.shape[1]
        return "diag" if self.scatters.shape[1] == D and D != 1 else "full"

    def validate(self, sender: str) -> None:
        c, D = self.means.shape
        if D == 0:
            reject(sender, f"{self.kind} has 0 features")
        if self.global_mean.shape != (D,) or self.global_m2.shape != (D,):
            reject(sender, f"global statistics have shapes {self.global_mean.shape} and "
                           f"{self.global_m2.shape} but the clusters have D={D}")
        if self.scatters.shape[0] != c or self.scatters.shape[1] not in (D, D * (D + 1) // 2):
            reject(sender, f"scatters has shape {self.scatters.shape}; expected ({c}, {D}) or "
                           f"({c}, {D * (D + 1) // 2})")
        for name in ("counts", "ages"):
            if getattr(self, name).shape != (c,):
                reject(sender, f"{name} has shape {getattr(self, name).shape} for {c} clusters")
        if self.classes.shape[0] != c:
            reject(sender, f"classes has {self.classes.shape[0]} rows for {c} clusters")
        if (self.counts < 1).any():
            reject(sender, f"counts must be >= 1, got {self.counts.tolist()[:10]}")
        if (self.ages < 0).any():
            reject(sender, f"ages must be >= 0, got {self.ages.tolist()[:10]}")
        if self.classes.shape[1] and (((self.classes != 0) & (self.classes != 1)).any()
                                      or (self.classes.sum(axis=1) != 1).any()):
            reject(sender, "classes must be one-hot rows")
        total = int(self.global_count)
        if total < 0 or int(self.counts.sum()) > total:
            reject(sender, f"global_count={total} but the clusters hold "
                           f"{int(self.counts.sum())} samples")
        if (self.global_m2 < 0).any():
            reject(sender, f"global_m2 has a negative variance sum {float(self.global_m2.min())}")
        M = self.classes.shape[1]
        if self.class_count.shape != (M,) or self.class_mean.shape != (M, D) \
                or self.class_m2.shape != (M, D):
            reject(sender, f"class statistics have shapes {self.class_count.shape}, "
                           f"{self.class_mean.shape}, {self.class_m2.shape}; expected ({M},), "
                           f"({M}, {D}), ({M}, {D})")
        if M and ((self.class_count < 0).any() or int(self.class_count.sum()) != total):
            reject(sender, f"class counts {self.class_count.tolist()[:10]} do not add up to "
                           f"global_count={total}")
        if (self.class_m2 < 0).any():
            reject(sender, f"class_m2 has a negative variance sum {float(self.class_m2.min())}")
        S = self.scatters if self.covariance == "diag" else unpack_scatter(self.scatters, D)
        bad = psd_violation(S)
        if bad > PSD_TOL:
            reject(sender, f"a scatter matrix is not positive semi-definite "
                           f"(eigenvalue {-bad:.3g} x trace)")


@dataclass(frozen=True)
class GaussModel(GaussClusters):
    """Server -> owner: the merged global model (layout of :class:`GaussClusters`, over
    the selected features) and ``features`` (D_all,), 1 for every feature kept."""

    features: np.ndarray = None  # type: ignore[assignment]  # (D_all,) int64 0/1
    schema: ClassVar = {**GaussClusters.schema, "features": (INT, 1)}
    kind: ClassVar[str] = "gauss_model"

    def validate(self, sender: str) -> None:
        super().validate(sender)
        f = self.features
        if ((f != 0) & (f != 1)).any() or int(f.sum()) != self.means.shape[1]:
            reject(sender, f"features must be 0/1 with {self.means.shape[1]} ones (one per "
                           f"model feature), got {f.tolist()[:20]}")


@dataclass(frozen=True)
class GaussClassStats(Message):
    """Owner -> server (feature-selection round): per-feature statistics of all rows and
    of every class: 8 [2D + 1 + M (2D + 1)] bytes."""

    global_count: np.ndarray   # () int64
    global_mean: np.ndarray    # (D,)
    global_m2: np.ndarray      # (D,)
    class_count: np.ndarray    # (M,) int64
    class_mean: np.ndarray     # (M, D)
    class_m2: np.ndarray       # (M, D)
    schema: ClassVar = {"global_count": (INT, 0), "global_mean": (FLOAT, 1),
                        "global_m2": (FLOAT, 1), "class_count": (INT, 1),
                        "class_mean": (FLOAT, 2), "class_m2": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_class_stats"

    def validate(self, sender: str) -> None:
        D = self.global_mean.shape[0]
        M = self.class_count.shape[0]
        if D == 0 or self.global_m2.shape != (D,) or self.class_mean.shape != (M, D) \
                or self.class_m2.shape != (M, D):
            reject(sender, f"statistics have shapes {self.global_mean.shape}, "
                           f"{self.global_m2.shape}, {self.class_mean.shape}, "
                           f"{self.class_m2.shape} (D={D}, M={M})")
        if (self.class_count < 0).any() or int(self.class_count.sum()) != int(self.global_count):
            reject(sender, f"class counts {self.class_count.tolist()[:10]} do not add up to "
                           f"global_count={int(self.global_count)}")
        if (self.global_m2 < 0).any() or (self.class_m2 < 0).any():
            reject(sender, "a sum of squared deviations is negative")


@dataclass(frozen=True)
class GaussFeatures(Message):
    """Server -> owner: the features to learn on (1 = kept), after the selection round."""

    features: np.ndarray       # (D,) int64 0/1
    schema: ClassVar = {"features": (INT, 1)}
    kind: ClassVar[str] = "gauss_features"

    def validate(self, sender: str) -> None:
        f = self.features
        if ((f != 0) & (f != 1)).any() or int(f.sum()) < 1:
            reject(sender, f"features must be 0/1 with at least one 1, got {f.tolist()[:20]}")


@dataclass(frozen=True)
class GaussClassSums(Message):
    """Owner -> server (feature-selection round under secure aggregation): per class the
    count (M,), the sum (M, D) and the sum of squares (M, D) of every feature; plain
    sums over owners. ``8 M (2 D + 1)`` bytes."""

    class_count: np.ndarray  # (M,) int64
    class_sum: np.ndarray    # (M, D)
    class_sq: np.ndarray     # (M, D)
    schema: ClassVar = {"class_count": (INT, 1), "class_sum": (FLOAT, 2),
                        "class_sq": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_class_sums"

    def validate(self, sender: str) -> None:
        M = self.class_count.shape[0]
        if self.class_sum.ndim != 2 or self.class_sum.shape[0] != M \
                or self.class_sq.shape != self.class_sum.shape:
            reject(sender, f"class sums have shapes {self.class_count.shape}, "
                           f"{self.class_sum.shape}, {self.class_sq.shape}")
        if (self.class_count < 0).any() or (self.class_sq < 0).any():
            reject(sender, "class counts and sums of squares must be >= 0")


def _check_mixture_shapes(sender: str, K: int, D: int, covs: np.ndarray, what: str) -> None:
    if D == 0 or covs.shape[0] != K or covs.shape[1] not in (D, D * (D + 1) // 2):
        reject(sender, f"{what} has shape {covs.shape}; expected ({K}, {D}) or "
                       f"({K}, {D * (D + 1) // 2}) for {K} components over {D} features")


@dataclass(frozen=True)
class GaussMixture(Message):
    """Server -> owner (federated EM round): the current mixture and the candidate edits
    to score, ``8 [K (1 + D + w) + 2 c]`` bytes (w = D(D+1)/2 full, D diagonal)."""

    weights: np.ndarray   # (K,) > 0, summing to one
    means: np.ndarray     # (K, D)
    covs: np.ndarray      # (K, D(D+1)/2) packed upper triangle, or (K, D) diagonal
    edits: np.ndarray     # (c, 2) int64: (p, q) merge p < q, (p, -1) drop p, (p, -2) split p
    schema: ClassVar = {"weights": (FLOAT, 1), "means": (FLOAT, 2), "covs": (FLOAT, 2),
                        "edits": (INT, 2)}
    kind: ClassVar[str] = "gauss_mixture"

    def validate(self, sender: str) -> None:
        K, D = self.means.shape
        _check_mixture_shapes(sender, K, D, self.covs, "covs")
        if K == 0 or self.weights.shape != (K,) or (self.weights <= 0).any() \
                or abs(float(self.weights.sum()) - 1.0) > 1e-6:
            reject(sender, f"weights must be {K} positive numbers summing to one, got "
                           f"{self.weights.tolist()[:10]}")
        e = self.edits
        if e.ndim != 2 or e.shape[1] != 2 or ((e[:, 0] < 0) | (e[:, 0] >= K)).any() \
                or ((e[:, 1] >= 0) & ((e[:, 1] <= e[:, 0]) | (e[:, 1] >= K))).any() \
                or (e[:, 1] < -2).any():
            reject(sender, f"edits must be (p, q) with 0 <= p < q < {K}, (p, -1) or (p, -2), "
                           f"got "
                           f"{e.tolist()[:10]}")
        C = self.covs if self.covs.shape[1] == D and D != 1 else unpack_scatter(self.covs, D)
        low = (C.min(axis=1) if C.ndim == 2 else np.linalg.eigvalsh(C)[:, 0])
        if (low <= 0).any():
            reject(sender, f"a covariance is not positive definite (smallest eigenvalue "
                           f"{float(low.min()):.3g})")


@dataclass(frozen=True)
class GaussEMStats(Message):
    """Owner -> server (federated EM round): log-likelihood and responsibility-entropy
    sums of the current mixture and of every edit, and the E-step statistics of the
    current mixture about the broadcast means: ``8 [2 (c + 1) + K (1 + D + w)]`` bytes."""

    loglik: np.ndarray    # (c + 1,)
    entropy: np.ndarray   # (c + 1,) sums of -r log r, >= 0
    resp: np.ndarray      # (K,) responsibility sums, >= 0
    first: np.ndarray     # (K, D) sums of r (x - mu_k)
    second: np.ndarray    # (K, w) sums of r (x - mu_k)(x - mu_k)^T, packed or diagonal
    schema: ClassVar = {"loglik": (FLOAT, 1), "entropy": (FLOAT, 1), "resp": (FLOAT, 1),
                        "first": (FLOAT, 2), "second": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_em_stats"

    def validate(self, sender: str) -> None:
        K, D = self.first.shape
        _check_mixture_shapes(sender, K, D, self.second, "second")
        if self.resp.shape != (K,) or (self.resp < 0).any():
            reject(sender, f"resp must be {K} numbers >= 0, got {self.resp.tolist()[:10]}")
        if self.loglik.ndim != 1 or self.loglik.shape[0] < 1 \
                or self.entropy.shape != self.loglik.shape:
            reject(sender, f"loglik and entropy have shapes {self.loglik.shape} and "
                           f"{self.entropy.shape}")
        if (self.entropy < 0).any():
            reject(sender, f"entropy sums must be >= 0, got {self.entropy.tolist()[:10]}")
        S = self.second if self.second.shape[1] == D and D != 1 else unpack_scatter(self.second, D)
        bad = psd_violation(S)
        if bad > PSD_TOL:
            reject(sender, f"a second-moment matrix is not positive semi-definite "
                           f"(eigenvalue {-bad:.3g} x trace)")
