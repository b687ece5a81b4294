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
from ..core.secure_sum import SUMMED
from ..privacy import (DifferentialPrivacy, PrivacyPlan, calibrate, clip_contribution, clip_points,
                       pop_privacy, privacy_config)
from ..privacy import kmeans as pk
from ..privacy import gaussian, noise_rng
from ..privacy.mechanisms import SERVER
from .protocol import GaussClassifierProtocol, GaussResult

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


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    result: GaussResult | None = None
    local_counts: dict = None


class PrivateGaussClassifierProtocol(GaussClassifierProtocol):
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
        if noise_multipliers is None:
            self.plan: PrivacyPlan = calibrate(privacy, [release],
                                               family="this FedGaussClassifier fit")
        else:
            from dataclasses import replace
            self.plan = PrivacyPlan(privacy, (replace(release, noise_multiplier=float(
                noise_multipliers[0])),), math.nan)

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg.update(privacy_config(self.privacy, self.plan))
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "PrivateGaussClassifierProtocol":
        cfg = dict(config)
        return cls(privacy=pop_privacy(cfg), **cfg)

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(int(z) for z in device_ids), int(seed), local_counts={})

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
        ids = sorted(replies)
        n = sum(replies[z].n for z in ids).astype(np.float64)
        s = sum(replies[z].s for z in ids).astype(np.float64)
        Q = sum(replies[z].Q for z in ids).astype(np.float64)
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
        # under secure aggregation the one reply is the sum: no owner's own counts
        state.local_counts = {z: np.rint(replies[z].n).astype(np.int64) for z in ids
                              if z != SUMMED}
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
        Xd, y = self._device_data(X, device_id)
        if Xd.shape[1] != self.n_features:
            raise ValidationError(f"device {device_id} has {Xd.shape[1]} features but the "
                                  f"federation has n_features={self.n_features}")
        Xc, n_clipped = clip_points(Xd, float(self.privacy.data_bound))
        state["n_clipped"] = np.asarray(n_clipped, dtype=np.int64)
        M, D = self.n_classes, Xd.shape[1]
        n = np.bincount(y, minlength=M).astype(np.float64)
        s = np.zeros((M, D))
        np.add.at(s, y, Xc)
        if self.diag:
            Q = np.zeros((M, D))
            np.add.at(Q, y, Xc * Xc)
        else:
            Q = np.zeros((M, D, D))
            for c in np.unique(y):
                Xk = Xc[y == c]
                Q[c] = Xk.T @ Xk
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
