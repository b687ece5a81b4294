"""Differentially private federated Gaussian classifier: one noisy Gaussian per class.

The evolving clusters of an owner depend on the order and values of all its
samples (one extra sample can change every later assignment), so their
per-cluster statistics have no bounded sensitivity. A class, in contrast, is
an attribute of the sample itself: per-class count n_c, sum s_c and
second-moment matrix Q_c = Σ x xᵀ move by one sample's worth when a sample is
added or removed. One round:

* each owner clips its rows to ``data_bound`` B and sends its per-class
  (n_c, s_c, Q_c) (:class:`GaussClassMoments`, ``8 M (D² + D + 1)`` bytes);
* the server sums them and adds Gaussian noise to the upper triangles of
  Σ a aᵀ, a = (B, x), per class — L2 sensitivity ‖a‖² ≤ 2B² for the whole
  release, since a sample touches one class (central DP, the server trusted
  with the individual replies; :mod:`fedclust.privacy.kmeans`);
* **PSD repair**: each class covariance Q_c/n_c − μ_c μ_cᵀ is symmetrised and
  its eigenvalues are raised to at least the noise level 2√D·σ/n_c (σ the
  noise std on Q; 2√D·σ is about the spectral norm of the symmetric noise
  matrix, so a smaller eigenvalue cannot be told from noise) and to
  ``var_floor``; every class Gaussian is then positive definite and no
  direction gets a variance the noise invented. Noisy counts below 2 are set
  to 2.

With ``covariance="diag"`` only the per-class sums of squares Σ x_i² are
released (D numbers per class instead of D²): the release (B² n_c, B s_c,
(x_i²)_i) has sensitivity √3·B², each variance is floored at its own noise
level σ/n_c, and the noise does not spread over D² entries — the better
choice once D is more than a few.

The owners' replies are only added up (:attr:`summed_actions`): under secure
aggregation (:mod:`fedclust.core.secure_sum`) the server receives their sum
alone and adds the noise to it (central DP over the sum; no per-owner counts
are then known, ``local_counts`` stays empty).

The global model is then one cluster per class, scored as in
:class:`fedclust.FedGaussClassifier` (no Fisher feature selection: that round
has no DP release).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import FLOAT, Message, reject
from ..core.protocol import Request, RunLog
from ..privacy import (DifferentialPrivacy, PrivacyPlan, clip_contribution, clip_points, planned,
                       pop_privacy, privacy_config)
from ..privacy import kmeans as pk
from ..privacy import gaussian, noise_rng
from ..privacy.mechanisms import SERVER
from .classifier_protocol import GaussClassifierProtocol
from .protocol import GaussResult

__all__ = ["GaussClassMoments", "PrivateGaussClassifierProtocol", "repair_covariance",
           "repair_variances", "noise_level"]

ACTION = "gauss_class_moments"

#: eigenvalues (variances) below this fraction of their mean are raised to it
RELATIVE_FLOOR = 1e-6


def noise_level(noise_std, counts, D: int, *, full: bool):
    """The smallest variance the noise lets one tell apart: 2√D·σ/n for a covariance
    estimated from a noisy D×D second-moment sum (about the spectral norm of the
    symmetric noise matrix, divided by the count), σ/n for a variance."""
    return (2.0 * math.sqrt(D) if full else 1.0) * noise_std / np.asarray(counts, dtype=float)


def repair_covariance(C: np.ndarray, level: float, floor: float = 0.0) -> np.ndarray:
    """The PSD repair of a noisy covariance C (D, D): symmetrised, eigenvalues raised
    to at least ``level`` (the noise level), ``floor`` and 1e-6 x their mean, so
    every direction has a variance the noise did not invent and the result is
    positive definite."""
    D = C.shape[0]
    lam, V = np.linalg.eigh((C + C.T) / 2.0)
    low = max(float(floor), RELATIVE_FLOOR * max(float(lam.sum()), 0.0) / D, float(level))
    return (V * np.maximum(lam, low)) @ V.T


def repair_variances(var: np.ndarray, level: float, floor: float = 0.0) -> np.ndarray:
    """The diagonal version of :func:`repair_covariance` for noisy variances (D,)."""
    D = var.shape[0]
    low = max(float(floor), RELATIVE_FLOOR * max(float(var.sum()), 0.0) / D, float(level))
    return np.maximum(var, low)


@dataclass(frozen=True)
class GaussClassMoments(Message):
    """Owner -> server: per-class count (M,), sum (M, D) and second moments: Σ x xᵀ
    flattened (M, D²), or the sums of squares (M, D) for diagonal covariances."""

    n: np.ndarray
    s: np.ndarray
    Q: np.ndarray
    schema: ClassVar = {"n": (FLOAT, 1), "s": (FLOAT, 2), "Q": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_class_moments"

    def validate(self, sender: str) -> None:
        check_moments(self, sender, "class")


def check_moments(m: Any, sender: str, unit: str) -> None:
    """Shapes (K,), (K, D), (K, D²) or (K, D) and counts >= 0 of per-``unit`` moments."""
    K, D = m.s.shape
    if m.n.shape != (K,) or m.Q.shape not in ((K, D * D), (K, D)):
        reject(sender, f"{unit} moments have shapes {m.n.shape}, {m.s.shape}, {m.Q.shape}")
    if (m.n < 0).any():
        reject(sender, f"{unit} counts must be >= 0")


def summed_moments(replies: Mapping[int, Message]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The replies' (n, s, Q) added up (a secure sum is already one reply)."""
    ids = sorted(replies)
    return tuple(sum(getattr(replies[z], f) for z in ids).astype(np.float64) for f in "nsQ")


def group_moments(labels: np.ndarray, X: np.ndarray, K: int, diag: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of ``labels`` (n,) over rows ``X`` (n, D): count (K,), sum (K, D) and
    Σ x xᵀ (K, D, D), or Σ x² (K, D) when ``diag``."""
    D = X.shape[1]
    n = np.bincount(labels, minlength=K).astype(np.float64)
    s = np.zeros((K, D))
    np.add.at(s, labels, X)
    if diag:
        Q = np.zeros((K, D))
        np.add.at(Q, labels, X * X)
        return n, s, Q
    Q = np.zeros((K, D, D))
    for j in np.unique(labels):
        Xj = X[labels == j]
        Q[j] = Xj.T @ Xj
    return n, s, Q


class PrivateGaussBase:
    """What the private Gaussian protocols share: the privacy spec and its calibrated noise
    multipliers travel in the config (a rebuilt protocol adds the same noise), and a
    device's rows are clipped to ``data_bound`` before anything is computed from them."""

    def _clipped_rows(self, X: Any, device_id: int) -> tuple[np.ndarray, Any, int]:
        """(rows clipped to the data bound, labels or None, number of rows clipped)."""
        p: Any = self   # a GaussProtocol subclass: _device_data, n_features, privacy
        Xd, y = p._device_data(X, device_id)
        if Xd.shape[1] != p.n_features:
            raise ValidationError(f"device {device_id} has {Xd.shape[1]} features but the "
                                  f"federation has n_features={p.n_features}")
        Xc, n_clipped = clip_points(Xd, float(p.privacy.data_bound))
        return Xc, y, n_clipped

    def config(self) -> dict[str, Any]:
        cfg = super().config()  # type: ignore[misc]
        cfg.update(privacy_config(self.privacy, self.plan))  # type: ignore[attr-defined]
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Any:
        cfg = dict(config)
        return cls(privacy=pop_privacy(cfg), **cfg)


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    result: GaussResult | None = None
    local_counts: dict = None


class PrivateGaussClassifierProtocol(PrivateGaussBase, GaussClassifierProtocol):
    """:class:`GaussClassifierProtocol` under (ε, δ)-DP: one noisy Gaussian per class."""

    name = "gauss-classifier-dp"
    reply_types = {ACTION: GaussClassMoments}
    #: per-class counts, sums and second moments: plain sums over the owners
    summed_actions = frozenset({ACTION})

    def __init__(self, *, privacy: DifferentialPrivacy, noise_multipliers=None, **kw: Any):
        super().__init__(**kw)
        self.selects = False
        self.privacy = privacy
        privacy.require(data_bound=True, clip_norm=privacy.unit == "device",
                        family="FedGaussClassifier")
        if self.n_features is None:
            raise ValidationError("privacy: the private Gaussian classifier needs n_features")
        self.diag = self.settings.covariance == "diag"
        release = pk.moments_release(privacy, what="class moments: per-class count, sum and "
                                     "second-moment matrix (central DP)")
        if self.diag:
            from dataclasses import replace
            release = replace(release, what="class moments: per-class count, sum and sums of "
                              "squares (central DP)", sensitivity=release.sensitivity
                              * math.sqrt(3.0) / 2.0)
        self.plan: PrivacyPlan = planned(privacy, [release], noise_multipliers,
                                         family="this FedGaussClassifier fit")

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(int(z) for z in device_ids), int(seed), local_counts={})

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a fit asks of each device, by action: its one round."""
        return {ACTION: 1}

    def next_request(self, state: _State) -> Request | None:
        return Request(0, ACTION) if state.round == 0 else None

    def check_reply(self, state, request, device_id, reply) -> None:
        if not isinstance(reply, GaussClassMoments):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {ACTION}, got {type(reply).__name__}")
        if reply.s.shape != (self.n_classes, self.n_features):
            raise IncompatibleMessageError(
                f"device {device_id}: class moments over {reply.s.shape} (classes, features); "
                f"the federation has ({self.n_classes}, {self.n_features})")

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if not replies:
            raise ValidationError("no device replied; no model")
        n, s, Q = summed_moments(replies)
        M, D = s.shape
        rng = noise_rng(self.privacy.noise_seed, SERVER, request.round)
        B = float(self.privacy.data_bound)
        rel = self.plan.releases[0]
        if self.diag:   # entries (B² n, B s, x²) all carry noise std z Δ
            n = gaussian(n, rel.noise_std / (B * B), rng)
            s = gaussian(s, rel.noise_std / B, rng)
            Q = gaussian(Q, rel.noise_std, rng)
        else:
            Q = Q.reshape(M, D, D)
            for c in range(M):
                n[c], s[c], Q[c] = pk.noisy_moments(n[c], s[c], Q[c], rel, B, rng)
        state.result = self._gaussians(n, s, Q)
        # an owner's exact class counts are not released (local_counts stays empty)
        state.round += 1

    def _gaussians(self, n: np.ndarray, s: np.ndarray, Q: np.ndarray) -> GaussResult:
        M, D = s.shape
        counts = np.maximum(n, 2.0)
        means = s / counts[:, None]
        if self.diag:
            return self._diag_gaussians(counts, means, Q)
        scat = np.empty((M, D, D))
        for c in range(M):
            C = Q[c] / counts[c] - np.outer(means[c], means[c])
            scat[c] = repair_covariance(C, noise_level(self.plan.releases[0].noise_std,
                                                      counts[c], D, full=True),
                                        self.settings.var_floor) * counts[c]
        counts = np.rint(counts)
        N = float(counts.sum())
        gmean = means.T @ counts / N
        gm2 = np.maximum(np.einsum("cii->i", Q) - N * gmean ** 2, 0.0)
        class_m2 = np.einsum("cii->ci", scat)
        scatters = scat if self.settings.covariance == "full" else class_m2.copy()
        return GaussResult(
            means=means, scatters=scatters, counts=counts.astype(np.int64),
            ages=np.zeros(M, np.int64), classes=np.arange(M, dtype=np.int64),
            global_count=int(N), global_mean=gmean, global_m2=gm2,
            class_count=counts.astype(np.int64), class_mean=means.copy(),
            class_m2=class_m2, features=np.ones(D, np.int64))

    def _diag_gaussians(self, counts: np.ndarray, means: np.ndarray, Q: np.ndarray
                        ) -> GaussResult:
        M, D = means.shape
        var = Q / counts[:, None] - means ** 2
        level = noise_level(self.plan.releases[0].noise_std, counts, D, full=False)
        var = np.stack([repair_variances(var[c], level[c], self.settings.var_floor)
                        for c in range(M)])
        counts = np.rint(counts)
        scat = var * counts[:, None]
        N = float(counts.sum())
        gmean = means.T @ counts / N
        gm2 = np.maximum(Q.sum(axis=0) - N * gmean ** 2, 0.0)
        return GaussResult(
            means=means, scatters=scat, counts=counts.astype(np.int64),
            ages=np.zeros(M, np.int64), classes=np.arange(M, dtype=np.int64),
            global_count=int(N), global_mean=gmean, global_m2=gm2,
            class_count=counts.astype(np.int64), class_mean=means.copy(), class_m2=scat.copy(),
            features=np.ones(D, np.int64))

    def finish(self, state: _State, log: RunLog) -> GaussResult:
        if state.result is None:
            raise ValidationError("no device replied (all dropped, failed or rejected); no model")
        state.result.local_counts = dict(state.local_counts)
        state.result.log = log
        return state.result

    # -- client ------------------------------------------------------------
    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action != ACTION:
            raise ValidationError(f"gauss-classifier-dp has no client action {request.action!r}")
        Xc, y, n_clipped = self._clipped_rows(X, device_id)
        state["n_clipped"] = np.asarray(n_clipped, dtype=np.int64)
        M = self.n_classes
        n, s, Q = group_moments(y, Xc, M, self.diag)
        if self.privacy.unit == "device":
            B = float(self.privacy.data_bound)
            rel = self.plan.releases[0]
            (n, s, Q), _ = clip_contribution(
                [n, s, Q], [B * B, B if self.diag else math.sqrt(2.0) * B, 1.0],
                rel.sensitivity)
        return GaussClassMoments(n=n, s=s, Q=Q.reshape(M, -1))

    def client_finish(self, message, X, state) -> dict[str, np.ndarray]:
        out = super().client_finish(message, X, state)
        if "n_clipped" in state:
            out["n_clipped"] = state["n_clipped"]
        return out
