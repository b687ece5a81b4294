"""Differentially private federated Gaussian clustering: no preset k, bounded sensitivity.

An owner's evolving clusters depend on the order and values of all its rows, so
they cannot be noised with a bounded sensitivity. The private procedure keeps
the family's model (Gaussians, merged by the same BIC rule, their number decided
by the data) but computes it from releases in which **one row touches one
component**:

* a broadcast model is a list of Gaussians (mean μ_j, clipping map A_j = r L_j
  with L_j the Cholesky factor of the component's covariance, r² the χ²_D
  quantile ``gate_quantile``, log weight); each owner clips its rows to
  ``data_bound`` B, puts every row in its most likely component (a rule of the
  row and the public model only), whitens it, u = A_j⁻¹ (x − μ_j), clips u to
  norm 1 (a row farther than the gate is pulled onto it) and sends per component
  the count, Σ u and Σ u uᵀ (or Σ u², ``covariance="diag"``)
  (:class:`GaussComponentMoments`);
* one row adds (1, u, u uᵀ) to one component: L2 sensitivity √3 (‖u‖ ≤ 1; the
  upper triangle of u uᵀ has norm at most ‖u‖² ≤ 1), whatever the number of
  components. The server sums the replies and adds Gaussian noise of std z√3 to
  every released number (central DP: the server sees the replies and adds the
  noise); the noise is whitened too, so each component's covariance is estimated
  with noise proportional to its own covariance, not to B²;
* post-processing (free): the counts below 3 noise stds (or 2) are pruned, the
  mean is μ_j + A_j ū (ū pulled into the unit ball), the whitened covariance is
  shrunk toward the broadcast one (I/r²) with weight n against n₀, the count at
  which the noise level reaches it (none at ε = ∞), gets the classifier's PSD
  repair (:func:`~fedclust.gauss.private.repair_covariance`: eigenvalues raised
  to the remaining noise level) and is mapped back, A_j C Aⱼᵀ; the Gaussians
  then go through the family's BIC merge
  (:meth:`~fedclust.gauss.model.ClusterSet.merge_all`).

Rounds (each one release, accounted by ``dp-accounting`` over the whole fit):

0. the *ball*: one component, μ = 0, A = B·I — the pooled count, mean and
   covariance of the clipped rows;
1. the *candidates*: M Gaussians with means drawn from the private global
   Gaussian (public randomness from ``random_state``) and covariance Σ_g M^(-2/D)
   (each holds about 1/M of the global volume); M keeps about
   8 count-noise stds of rows per candidate, at most ``max_clusters``; the BIC
   merge then joins the candidates that describe one cluster (over-complete start,
   data-driven k);
2. ``n_rounds`` refinement rounds on the merged model (hard-assignment EM, each
   followed by the BIC merge).

Releases: 2 + ``n_rounds``, equal noise. ``unit="device"``: each owner's whole
contribution (all components) is clipped to √3·C/B, which is the sensitivity.
ε = ∞ runs the same procedure without noise (the whitened clipping stays: it is
part of the procedure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from scipy.linalg import solve_triangular
from scipy.stats import chi2

from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import FLOAT, Message
from ..core.protocol import Request, RunLog
from ..core.random import server_rng
from ..privacy import (DifferentialPrivacy, PrivacyPlan, Release, clip_contribution,
                       clip_points, gaussian, noise_rng, planned)
from ..privacy.mechanisms import SERVER, symmetric_gaussian
from .model import ClusterSet, one_thread
from .private import (PrivateGaussBase, check_moments, group_moments, noise_level,
                      repair_covariance, repair_variances, summed_moments)
from .protocol import GaussProtocol, GaussResult

__all__ = ["GaussComponentMoments", "GaussDPModel", "PrivateGaussProtocol"]

ACTION = "gauss_component_moments"
#: candidates: about this many count-noise stds of rows each (the pruning keeps >= 3)
CANDIDATE_STDS = 8.0
#: the server stream of the candidate draws (public randomness, from ``random_state``)
_CANDIDATE_BRANCH = 7
#: noise stream key offset: never the same stream as another private protocol's rounds
_NOISE_BRANCH = 3 << 20


@dataclass(frozen=True)
class GaussDPModel(Message):
    """Server -> owners: the components a row may join: means (K, D), clipping maps
    A_j (K, D, D) lower triangular or (K, D) diagonal, log weights (K,)."""

    means: np.ndarray
    maps: np.ndarray
    log_weights: np.ndarray
    schema: ClassVar = {"means": (FLOAT, 2), "maps": (FLOAT, 3), "log_weights": (FLOAT, 1)}
    kind: ClassVar[str] = "gauss_dp_model"


@dataclass(frozen=True)
class GaussDPModelDiag(Message):
    """:class:`GaussDPModel` with diagonal maps (K, D)."""

    means: np.ndarray
    maps: np.ndarray
    log_weights: np.ndarray
    schema: ClassVar = {"means": (FLOAT, 2), "maps": (FLOAT, 2), "log_weights": (FLOAT, 1)}
    kind: ClassVar[str] = "gauss_dp_model_diag"


@dataclass(frozen=True)
class GaussComponentMoments(Message):
    """Owner -> server: per component the count (K,), Σ u (K, D) and Σ u uᵀ (K, D²)
    or Σ u² (K, D) of its whitened, clipped rows."""

    n: np.ndarray
    s: np.ndarray
    Q: np.ndarray
    schema: ClassVar = {"n": (FLOAT, 1), "s": (FLOAT, 2), "Q": (FLOAT, 2)}
    kind: ClassVar[str] = "gauss_component_moments"

    def validate(self, sender: str) -> None:
        check_moments(self, sender, "component")


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    model: Message | None = None
    global_stats: tuple | None = None          # (count, mean, m2) of the ball release
    result: GaussResult | None = None
    sizes: list = field(default_factory=list)  # components after each round (post-merge)


class PrivateGaussProtocol(PrivateGaussBase, GaussProtocol):
    """:class:`GaussProtocol` under (ε, δ)-DP (see the module docstring)."""

    name = "gauss-dp"
    reply_types = {ACTION: GaussComponentMoments}
    #: the server only adds the replies up (then noises the sum): secure aggregation can
    #: hide each owner's statistics from it (the noise is still the server's to add)
    summed_actions = frozenset({ACTION})

    def __init__(self, *, privacy: DifferentialPrivacy, noise_multipliers=None, **kw: Any):
        super().__init__(**kw)
        if self.n_features is None:
            raise ValidationError("privacy: the private Gaussian clustering needs n_features")
        privacy.require(data_bound=True, clip_norm=privacy.unit == "device",
                        family="FedGaussClustering")
        self.privacy = privacy
        self.diag = self.settings.covariance == "diag"
        D = self.n_features
        self.radius = math.sqrt(float(chi2.ppf(self.settings.gate_quantile, D)))
        scale = (float(privacy.clip_norm) / float(privacy.data_bound)
                 if privacy.unit == "device" else 1.0)
        what = ("component moments: per-component count, whitened sum and second moments "
                "(central DP)")
        release = Release(what, math.sqrt(3.0) * scale, repeats=2 + self.n_rounds)
        self.plan: PrivacyPlan = planned(privacy, [release], noise_multipliers,
                                         family="this FedGaussClustering fit")

    @property
    def noise_std(self) -> float:
        return self.plan.releases[0].noise_std

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        D, B = self.n_features, float(self.privacy.data_bound)
        ball = self._message(np.zeros((1, D)), np.full((1, D), B) if self.diag
                             else B * np.eye(D)[None], np.zeros(1))
        return _State(tuple(int(z) for z in device_ids), int(seed), model=ball)

    def _message(self, means, maps, log_weights) -> Message:
        cls = GaussDPModelDiag if self.diag else GaussDPModel
        return cls(means=np.asarray(means, float), maps=np.asarray(maps, float),
                   log_weights=np.asarray(log_weights, float))

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a fit asks of each device, by action (``2 + n_rounds``)."""
        return {ACTION: 2 + self.n_rounds}

    def next_request(self, state: _State) -> Request | None:
        if state.round >= 2 + self.n_rounds:
            return None
        return Request(state.round, ACTION, payload=state.model)

    def check_reply(self, state, request, device_id, reply) -> None:
        if not isinstance(reply, GaussComponentMoments):
            raise IncompatibleMessageError(
                f"device {device_id}: expected {ACTION}, got {type(reply).__name__}")
        K, D = state.model.means.shape
        width = D if self.diag else D * D
        if reply.s.shape != (K, D) or reply.Q.shape[1] != width:
            raise IncompatibleMessageError(
                f"device {device_id}: component moments over {reply.s.shape} (components, "
                f"features) and width {reply.Q.shape[1]}; the model has ({K}, {D}) and {width}")

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if not replies:
            raise ValidationError("no device replied; no model")
        n, s, Q = summed_moments(replies)
        rng = noise_rng(self.privacy.noise_seed, SERVER, _NOISE_BRANCH + request.round)
        n, s, Q = self._noisy(n, s, Q, rng)
        with one_thread():
            counts, means, covs = self._gaussians(state.model, n, s, Q, tied=request.round == 1,
                                                  shrink=request.round >= 2)
            if request.round == 0:
                self._global(state, counts, means, covs)
            else:
                cs = self._merged(state, counts, means, covs)
                state.sizes.append(int(cs.C))
                state.result = self._result(state, cs)
                state.model = self._broadcast(cs)
        state.round += 1

    def _noisy(self, n, s, Q, rng):
        std = self.noise_std
        n, s = gaussian(n, std, rng), gaussian(s, std, rng)
        if self.diag:
            return n, s, gaussian(Q, std, rng)
        K, D = s.shape
        Q = Q.reshape(K, D, D)
        return n, s, np.stack([symmetric_gaussian(Q[j], std, rng) for j in range(K)])

    def _gaussians(self, model, n, s, Q, tied: bool = False, shrink: bool = True):
        """Counts (K',), means (K', D) and repaired covariances of the components kept.

        ``tied`` (the candidate round, where all components share one map A): one
        covariance pooled over the components, whose noise is √K' times smaller than
        that of K' separate small ones; the BIC merge then compares the candidate
        means against it. ``shrink``: toward the broadcast covariances (not for the ball,
        whose map is the data bound, not a covariance)."""
        std = self.noise_std
        keep = n >= max(3.0 * std, 2.0)
        if not keep.any():
            keep[int(np.argmax(n))] = True
        idx = np.flatnonzero(keep)
        D = s.shape[1]
        counts = np.maximum(n[idx], 2.0)
        ubar = s[idx] / counts[:, None]
        norm = np.linalg.norm(ubar, axis=1)
        ubar[norm > 1] /= norm[norm > 1, None]      # true whitened means lie in the unit ball
        level = noise_level(std, counts, D, full=not self.diag)
        A = model.maps[idx]
        means = model.means[idx] + (A * ubar if self.diag else np.einsum("kde,ke->kd", A, ubar))
        covs = np.empty((idx.size, D) if self.diag else (idx.size, D, D))
        if tied:
            N = float(counts.sum())
            if self.diag:
                v = (Q[idx].sum(axis=0) - (counts[:, None] * ubar ** 2).sum(axis=0)) / N
                covs[:] = A[0] ** 2 * repair_variances(
                    v, noise_level(std * math.sqrt(idx.size), N, D, full=False))
            else:
                C = (Q[idx].sum(axis=0) - np.einsum("k,kd,ke->de", counts, ubar, ubar)) / N
                C = repair_covariance(C, noise_level(std * math.sqrt(idx.size), N, D, full=True))
                covs[:] = A[0] @ C @ A[0].T
            return counts, means, covs
        prior = 1.0 / self.radius ** 2     # the broadcast covariance, in whitened units
        for k in range(idx.size):
            # shrink toward the broadcast covariance by the noise: weight n against the
            # count at which the noise level reaches it (0 at ε = ∞: no shrinkage)
            n0 = level[k] * counts[k] / prior if shrink else 0.0
            a = counts[k] / (counts[k] + n0)
            if self.diag:
                v = a * (Q[idx[k]] / counts[k] - ubar[k] ** 2) + (1 - a) * prior
                covs[k] = A[k] ** 2 * repair_variances(v, a * level[k])
            else:
                C = (a * (Q[idx[k]] / counts[k] - np.outer(ubar[k], ubar[k]))
                     + (1 - a) * prior * np.eye(D))
                covs[k] = A[k] @ repair_covariance(C, a * level[k]) @ A[k].T
        return counts, means, covs

    def _global(self, state: _State, counts, means, covs) -> None:
        """Round 0: the private global Gaussian, then the candidate model."""
        N, mu, cov = float(counts[0]), means[0], covs[0]
        var = cov if self.diag else np.diag(cov)
        state.global_stats = (N, mu, N * var)
        D = mu.shape[0]
        per = max(CANDIDATE_STDS * self.noise_std, 20.0)
        M = int(min(max(N / per, 1), self.settings.max_clusters))
        rng = server_rng(state.seed, _CANDIDATE_BRANCH)
        g = rng.standard_normal((M, D))
        L = np.sqrt(cov) if self.diag else np.linalg.cholesky(cov)
        cands = mu + (g * L if self.diag else g @ L.T)
        shrink = M ** (-1.0 / D)   # each candidate holds ~1/M of the global volume
        maps = np.broadcast_to(self.radius * shrink * L, (M,) + L.shape).copy()
        state.model = self._message(cands, maps, np.zeros(M))

    def _merged(self, state: _State, counts, means, covs) -> ClusterSet:
        D = means.shape[1]
        cs = ClusterSet(D, self.settings, 0)
        cs.set_global(*state.global_stats)
        S = covs * (counts[:, None] if self.diag else counts[:, None, None])
        cs.add(means, S, counts, np.full(counts.size, -1, np.int64),
               np.zeros(counts.size, np.int64))
        cs.merge_all()
        return cs

    def _broadcast(self, cs: ClusterSet) -> Message:
        C = cs.C
        cov = cs.covariance(np.arange(C))   # the model's own (prior-shrunk) covariances
        maps = self.radius * (np.sqrt(cov) if self.diag else np.linalg.cholesky(cov))
        return self._message(cs.mu[:C], maps, np.log(cs.n[:C]))

    def _result(self, state: _State, cs: ClusterSet) -> GaussResult:
        C = cs.C
        N, mu, m2 = state.global_stats
        counts = np.maximum(np.rint(cs.n[:C]), 1).astype(np.int64)
        total = int(counts.sum())   # the model's rows (noisy counts) carry the global variance
        return GaussResult(
            means=cs.mu[:C].copy(), scatters=cs.S[:C].copy(), counts=counts,
            ages=np.zeros(C, np.int64), classes=np.full(C, -1, np.int64), global_count=total,
            global_mean=np.asarray(mu, float).copy(),
            global_m2=np.asarray(m2, float) * (total / max(N, 1.0)), n_rounds=state.round + 1)

    def finish(self, state: _State, log: RunLog) -> GaussResult:
        if state.result is None:
            raise ValidationError("no device replied (all dropped, failed or rejected); no model")
        state.result.log = log
        return state.result

    # -- client ------------------------------------------------------------
    def client_step(self, request: Request, X: Any, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        if request.action != ACTION:
            raise ValidationError(f"gauss-dp has no client action {request.action!r}")
        model = request.payload
        Xc, _, n_clipped = self._clipped_rows(X, device_id)
        if request.round == 0:
            state["n_clipped"] = np.asarray(n_clipped, dtype=np.int64)
        labels, U = self._whiten(model, Xc)
        U, _ = clip_points(U, 1.0)
        K, D = model.means.shape
        n, s, Q = group_moments(labels, U, K, self.diag)
        if self.privacy.unit == "device":
            (n, s, Q), _ = clip_contribution([n, s, Q], [1.0, 1.0, 1.0],
                                             self.plan.releases[0].sensitivity)
        return GaussComponentMoments(n=n, s=s, Q=Q.reshape(K, -1))

    def _whiten(self, model, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Most likely component of every row and its whitened offset u = A⁻¹ (x − μ)."""
        K, D = model.means.shape
        r2 = self.radius ** 2
        scores = np.empty((X.shape[0], K))
        for j in range(K):
            U = self._offsets(model, j, X)
            A = model.maps[j]
            logdet = 2.0 * np.log(np.abs(A if self.diag else np.diag(A))).sum()
            scores[:, j] = (-0.5 * (r2 * np.einsum("ij,ij->i", U, U) + logdet)
                            + model.log_weights[j])
        labels = np.argmax(scores, axis=1).astype(np.int64)
        U = np.empty_like(X)
        for j in np.unique(labels):
            rows = labels == j
            U[rows] = self._offsets(model, j, X[rows])
        return labels, U

    def _offsets(self, model, j: int, X: np.ndarray) -> np.ndarray:
        A, diff = model.maps[j], X - model.means[j]
        return diff / A if self.diag else solve_triangular(A, diff.T, lower=True).T

    def client_finish(self, message, X, state) -> dict[str, np.ndarray]:
        out = super().client_finish(message, X, state)
        if "n_clipped" in state:
            out["n_clipped"] = state["n_clipped"]
        return out
