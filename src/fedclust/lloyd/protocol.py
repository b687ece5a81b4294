"""Distributed Lloyd: the many-round k-means baseline, optionally differentially private.

Initialisation, one of

* ``init="sample"`` (round 0, ``"sample"``): every device sends
  ``points_per_device`` uniformly drawn raw points and its size; the server
  seeds k centers by weighted k-means++ on the pooled sample (raw points leave
  the devices: not available under privacy);
* ``init="candidates"`` (rounds 0-1, ``"moments"`` then ``"candidates"``):
  devices send their count, sum and second-moment matrix (``(d² + d + 1) 8``
  bytes); the server fits a Gaussian and draws M candidate centers in its
  top-min(k, d) principal subspace; devices send per-candidate sums and counts
  (``M (d + 1) 8`` bytes); the server clusters the candidate centroids,
  weighted by their counts, into k (:mod:`fedclust.privacy.kmeans`);
* ``init="kfed"`` (round 0, ``"kfed"``): one k-FED round — every device
  runs k-FED's local step with k local clusters and sends its centers and
  counts (``k (d + 1) 8`` bytes); the server groups them into k (k-FED's
  farthest-first + one Lloyd step). Under privacy each device computes
  its local centers with the private moments + candidates step of
  ``KFed(privacy=...)``, noised on the device and calibrated to its own
  counts, and the server seeds with weighted k-means++ over them (farthest
  first would pick the noisiest centers).

Lloyd rounds (``"lloyd"``): the server broadcasts k centers (``k d 8`` bytes
per device); each device returns per-center sums, counts and its cost
(``k (d + 1) 8 + 8`` bytes); the server averages. Without privacy it stops
when the global cost improves by at most ``tol`` (relative) or after
``max_rounds``.

With ``privacy`` (central DP): devices clip their points to ``data_bound``
(and, at device level, their contribution to ``clip_norm``); the server adds
Gaussian noise to the *sums* of the moments, candidate and Lloyd replies
before using them, so everything it broadcasts or returns is (ε, δ)-DP; the
server itself is trusted with the individual replies (or secure aggregation
hides them). With ``noise_devices = n_min`` (set by the estimator under secure
aggregation; :mod:`fedclust.privacy.distributed`) the devices add the noise
instead: each clips its contribution and adds ``N(0, σ²/n_min)`` before
masking, so the server unmasks only noisy sums (the moments, candidate and
Lloyd rounds are all secure sums). Exactly ``max_rounds`` Lloyd rounds run (the cost is not
released, so there is no early stop), and every round is one release
composed by the accountant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.kmeans import assign, kmeans_plusplus
from ..core.random import device_rng, server_rng, sklearn_seed
from ..core.validation import check_choice, check_float, check_int
from ..core.exceptions import IncompatibleMessageError, ValidationError
from ..core.messages import Message
from ..privacy import (DifferentialPrivacy, PrivacyPlan, Release, clip_points, noise_rng, planned,
                       pop_privacy, privacy_config)
from ..privacy import kmeans as pk
from ..privacy.mechanisms import DEVICE, SERVER
from ..kfed.local import local_kmeans
from ..kfed.messages import LocalCenters
from ..kfed.server import aggregate_centers
from ..privacy.distributed import check_noise_devices, device_share
from .messages import (CandidateBroadcast, CenterBroadcast, ClusterSums, Moments, NoisyClusterSums,
                       NoisyMoments, PointSample)
from ..core.protocol import Protocol, Request, RunLog

__all__ = ["DistributedLloydProtocol", "DistributedLloydResult", "INITS"]

INITS = ("sample", "candidates", "kfed")
KFED_MOMENTS = "k-FED round: device moments (noised on the device)"
KFED_CANDIDATES = "k-FED round: device candidate sums and counts (noised on the device)"


@dataclass
class DistributedLloydResult:
    centers: np.ndarray
    cost_history: list[float]   # global cost of the centers broadcast in each Lloyd round
    n_rounds: int
    converged: bool
    log: RunLog = field(default_factory=RunLog)
    n_candidates: int = 0


@dataclass
class _State:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    lloyd_rounds: int = 0
    centers: np.ndarray | None = None
    candidates: CandidateBroadcast | None = None
    costs: list[float] = field(default_factory=list)
    converged: bool = False


class DistributedLloydProtocol(Protocol):
    """Multi-round distributed Lloyd with counted communication, optionally DP.

    ``privacy`` is the user's :class:`~fedclust.privacy.DifferentialPrivacy`;
    ``noise_multipliers`` (moments, candidates, Lloyd) are calibrated on
    construction when not given (clients receive them in :meth:`config`).
    """

    name = "distributed-lloyd"
    reply_types = {"sample": PointSample, "lloyd": ClusterSums, "moments": Moments,
                   "candidates": ClusterSums, "kfed": LocalCenters}
    #: the Lloyd rounds' sums, counts and costs (and the candidate init's moments and
    #: candidate sums) are only added up: secure aggregation can hide each device's
    #: (the seeding sample of raw points and k-FED's local centers cannot be summed)
    summed_actions = frozenset({"lloyd", "moments", "candidates"})

    def __init__(self, n_clusters: int, *, points_per_device: int = 10,
                 max_rounds: int = 100, tol: float = 1e-4, init: str = "sample",
                 privacy: DifferentialPrivacy | None = None, n_features: int | None = None,
                 noise_multipliers: Sequence[float] | None = None, noise_devices: int = 0):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.points_per_device = check_int(points_per_device, "points_per_device", min_value=1)
        self.max_rounds = check_int(max_rounds, "max_rounds", min_value=1)
        self.tol = check_float(tol, "tol", min_value=0.0)
        self.init = check_choice(init, "init", INITS)
        self.privacy = privacy
        self.n_features = n_features
        self.plan: PrivacyPlan | None = None
        if privacy is not None:
            if self.init == "sample":
                raise ValidationError("privacy: init='sample' sends raw points; use "
                                      "init='candidates' with privacy")
            if self.init == "kfed" and privacy.unit == "device":
                raise ValidationError(
                    "privacy: init='kfed' has no device-level DP (each device releases its own "
                    "centers: local DP with noise of the order of data_bound); use "
                    "init='candidates' with unit='device'")
            privacy.require(data_bound=True, clip_norm=privacy.unit == "device",
                            family="DistributedLloyd")
            if n_features is None:
                raise ValidationError("privacy: DistributedLloydProtocol needs n_features")
            self.plan = planned(privacy, self.releases(), noise_multipliers,
                                family="this DistributedLloyd fit")
        self.noise_devices = check_int(noise_devices, "noise_devices", min_value=0)
        if self.noise_devices:
            if privacy is None:
                raise ValidationError("noise_devices is the distributed DP noise setting; "
                                      "it needs privacy")
            # noisy counts may be negative: the noisy messages do not refuse them
            self.reply_types = {**type(self).reply_types, "moments": NoisyMoments,
                                "candidates": NoisyClusterSums, "lloyd": NoisyClusterSums}

    def releases(self) -> list[Release]:
        """What a private fit releases.

        Two releases leave noise no later round removes: the candidates (they
        decide which basin Lloyd starts in) and the last Lloyd round (its noise
        stays in the final centers). Each gets weight T + 1 in 1/z² (which adds
        up over Gaussian releases): more than the moments and the first T − 1
        rounds together, which only have to place points in the right cluster
        and get 1 each.
        """
        d = int(self.n_features)
        T = self.max_rounds
        kfed = self.init == "kfed"
        out = [pk.moments_release(self.privacy, what=KFED_MOMENTS if kfed else pk.MOMENTS),
               pk.sums_release(self.privacy, min(self.n_clusters, d),
                               what=KFED_CANDIDATES if kfed else pk.CANDIDATES,
                               share=float(T + 1))]
        if T > 1:
            out.append(pk.sums_release(self.privacy, d, repeats=T - 1))
        out.append(pk.sums_release(self.privacy, d, what=pk.FINAL, share=float(T + 1)))
        return out

    @property
    def noisy(self) -> bool:
        """True when the run releases noisy statistics only (finite ε)."""
        return self.plan is not None and self.privacy.private

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"n_clusters": self.n_clusters,
                               "points_per_device": self.points_per_device,
                               "max_rounds": self.max_rounds, "tol": self.tol, "init": self.init}
        if self.n_features is not None:
            cfg["n_features"] = self.n_features
        if self.plan is not None:
            cfg.update(privacy_config(self.privacy, self.plan))
        if self.noise_devices:
            cfg["noise_devices"] = self.noise_devices
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "DistributedLloydProtocol":
        cfg = dict(config)
        privacy = pop_privacy(cfg)
        if privacy is not None:
            cfg["privacy"] = privacy
        return cls(cfg.pop("n_clusters"), **cfg)

    # -- server --------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        return _State(tuple(device_ids), int(seed))

    def next_request(self, state: _State) -> Request | None:
        if state.round == 0:
            return Request(0, {"sample": "sample", "kfed": "kfed"}.get(self.init, "moments"))
        if self.init == "candidates" and state.round == 1:
            return Request(1, "candidates", state.candidates)
        if state.converged or state.lloyd_rounds >= self.max_rounds:
            return None
        return Request(state.round, "lloyd", CenterBroadcast(state.centers))

    def check_reply(self, state: _State, request: Request, device_id: int, reply: Message) -> None:
        if request.action == "lloyd" and reply.sums.shape != state.centers.shape:
            raise IncompatibleMessageError(
                f"device {device_id}: sums have shape {reply.sums.shape}, expected "
                f"{state.centers.shape}")
        if request.action == "candidates" and reply.sums.shape != state.candidates.coords.shape:
            raise IncompatibleMessageError(
                f"device {device_id}: candidate sums have shape {reply.sums.shape}")
        if request.action == "moments" and self.n_features is not None and \
                reply.s.shape[0] != self.n_features:
            raise IncompatibleMessageError(
                f"device {device_id}: moments have {reply.s.shape[0]} features, expected "
                f"{self.n_features}")

    def _noise(self, state: _State, request: Request) -> np.random.Generator:
        return noise_rng(self.privacy.noise_seed, SERVER, request.round)

    def _release(self, round_index: int, action: str) -> Release:
        """The release a round of ``action`` makes (private fits)."""
        if action == "moments":
            return self.plan.releases[0]
        if action == "candidates":
            return self.plan.releases[1]
        first = 2 if self.init == "candidates" else 1   # Lloyd rounds follow the init
        last = round_index - first == self.max_rounds - 1
        return self.plan.releases[-1 if last else 2]

    def round_releases(self, request: Request) -> list[Release]:
        """What round ``request`` releases (the write-ahead privacy ledger charges it)."""
        if self.plan is None or request.action == "sample":
            return []
        if request.action == "kfed":
            return list(self.plan.releases[:2])
        return [self._release(request.round, request.action)]

    def _device_noise(self, msg: Message, action: str, device_id: int, round_index: int
                      ) -> Message:
        """Distributed noise: this device's share of the round's Gaussian noise."""
        rel = device_share(self._release(round_index, action), self.noise_devices)
        rng = noise_rng(self.privacy.noise_seed, DEVICE, device_id, round_index)
        B = float(self.privacy.data_bound)
        one = np.asarray(1, np.int64)
        if action == "moments":
            n, s, Q = pk.noisy_moments(msg.n, msg.s, msg.Q, rel, B, rng)
            return NoisyMoments(n=np.asarray(n, np.float64), s=s, Q=Q, n_devices=one)
        sums, counts = pk.noisy_cluster_sums(msg.sums.astype(np.float64),
                                             msg.counts.astype(np.float64), rel, B, rng)
        return NoisyClusterSums(sums=sums, counts=counts, cost=np.asarray(msg.cost, np.float64),
                                n_devices=one)

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if not replies:
            raise ValidationError(f"no device replied in round {request.round}")
        if self.noise_devices and request.action in self.summed_actions:
            check_noise_devices(replies, sum(int(r.n_devices) for r in replies.values()),
                                self.noise_devices, request.round)
        ids = sorted(replies)
        if request.action == "sample":
            self._seed_from_sample(state, [replies[z] for z in ids])
        elif request.action == "moments":
            self._candidates_from_moments(state, request, [replies[z] for z in ids])
        elif request.action == "candidates":
            self._centers_from_candidates(state, request, [replies[z] for z in ids])
        elif request.action == "kfed":
            self._centers_from_kfed(state, [replies[z] for z in ids])
        else:
            self._lloyd_step(state, request, [replies[z] for z in ids])
        state.round += 1

    def _seed_from_sample(self, state: _State, replies: list[PointSample]) -> None:
        pts = np.concatenate([r.points for r in replies])
        w = np.concatenate([np.full(len(r.points), int(r.n_points) / max(len(r.points), 1))
                            for r in replies])
        if len(pts) < self.n_clusters:
            raise ValidationError(
                f"the pooled sample has {len(pts)} points for n_clusters={self.n_clusters}")
        state.centers = pts[kmeans_plusplus(pts, self.n_clusters, server_rng(state.seed),
                                            weights=w)]

    def _candidates_from_moments(self, state: _State, request: Request,
                                 replies: list[Moments]) -> None:
        n = float(sum(float(r.n) for r in replies))
        s = sum(r.s.astype(np.float64) for r in replies)
        Q = sum(r.Q.astype(np.float64) for r in replies)
        count_std = 0.0
        if self.plan is not None and not self.noise_devices:
            rng = self._noise(state, request)
            n, s, Q = pk.noisy_moments(n, s, Q, self.plan.releases[0],
                                       self.privacy.data_bound, rng)
        d = len(s)
        p = min(self.n_clusters, d)
        if self.plan is not None:
            cand = self.plan.releases[1]
            count_std = cand.noise_std / pk.count_weight(self.privacy.data_bound, p)
        mean, basis, lam = pk.gaussian_subspace(n, s, Q, p)
        M = pk.n_candidates(n, count_std, self.n_clusters)
        coords = pk.draw_candidates(mean, basis, lam, M, server_rng(state.seed, 1))
        state.candidates = CandidateBroadcast(mean, basis, coords)

    def _centers_from_candidates(self, state: _State, request: Request,
                                 replies: list[ClusterSums]) -> None:
        sums = sum(r.sums.astype(np.float64) for r in replies)
        counts = sum(r.counts.astype(np.float64) for r in replies)
        min_count, bound = 1.0, None
        if self.plan is not None:
            rel = self.plan.releases[1]
            if not self.noise_devices:
                sums, counts = pk.noisy_cluster_sums(sums, counts, rel, self.privacy.data_bound,
                                                     self._noise(state, request))
            bound = float(self.privacy.data_bound)
            min_count = max(1.0, 3.0 * rel.noise_std / pk.count_weight(bound, sums.shape[1]))
        centers, _ = pk.centers_from_candidates(
            sums, counts, self.n_clusters, bound=bound, min_count=min_count,
            seed=sklearn_seed(server_rng(state.seed, 2)))
        cb = state.candidates
        state.centers = pk.lift(centers, cb.mean, cb.basis)

    def _centers_from_kfed(self, state: _State, replies: list[LocalCenters]) -> None:
        centers = [r.centers.astype(np.float64) for r in replies]
        counts = [r.counts for r in replies]
        if self.plan is None:   # k-FED's own server: farthest-first, one Lloyd step
            agg = aggregate_centers(centers, self.n_clusters, counts=counts,
                                    rng=server_rng(state.seed))
        else:                   # noisy centers: weighted k-means++, restarts, full Lloyd
            agg = aggregate_centers(centers, self.n_clusters, counts=counts, method="kmeans++",
                                    weighted=True, rng=server_rng(state.seed))
        state.centers = agg.centers

    def _lloyd_step(self, state: _State, request: Request, replies: list[ClusterSums]) -> None:
        sums = sum(r.sums for r in replies)
        counts = sum(r.counts for r in replies)
        new = state.centers.copy()
        if self.noisy:
            rel = self._release(request.round, "lloyd")
            bound = float(self.privacy.data_bound)
            sums, counts = sums.astype(np.float64), counts.astype(np.float64)
            if not self.noise_devices:
                sums, counts = pk.noisy_cluster_sums(sums, counts, rel, bound,
                                                     self._noise(state, request))
            # a cluster whose noisy count is within 3 noise stds of 0 keeps its center
            nz = counts > max(1.0, 3.0 * rel.noise_std / pk.count_weight(bound, sums.shape[1]))
            new[nz] = sums[nz] / counts[nz, None]
            nrm = np.linalg.norm(new, axis=1)
            over = nrm > bound
            new[over] *= (bound / nrm[over])[:, None]
        else:
            cost = float(sum(float(r.cost) for r in replies))
            nz = counts > 0
            new[nz] = sums[nz] / counts[nz, None]
            prev = state.costs[-1] if state.costs else math.inf
            state.costs.append(cost)
            state.converged = math.isfinite(prev) and prev - cost <= self.tol * prev
        state.centers = new
        state.lloyd_rounds += 1

    def finish(self, state: _State, log: RunLog) -> DistributedLloydResult:
        M = 0 if state.candidates is None else int(state.candidates.coords.shape[0])
        return DistributedLloydResult(state.centers, state.costs, state.round, state.converged,
                                      log, M)

    def final_message(self, result: DistributedLloydResult, device_id: int) -> Message | None:
        return CenterBroadcast(result.centers)

    # -- client --------------------------------------------------------------
    def _clipped(self, X: np.ndarray, state: dict[str, np.ndarray]) -> np.ndarray:
        if self.privacy is None:
            return X
        Xc, n = clip_points(X, float(self.privacy.data_bound))
        state["n_clipped"] = np.asarray(n, dtype=np.int64)
        return Xc

    def client_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        reply = self._plain_step(request, X, device_id=device_id, seed=seed, state=state)
        if self.noise_devices and request.action in self.summed_actions:
            return self._device_noise(reply, request.action, device_id, request.round)
        return reply

    def _plain_step(self, request: Request, X: np.ndarray, *, device_id: int, seed: int,
                    state: dict[str, np.ndarray]) -> Message:
        spec = self.privacy
        if request.action == "sample":
            n = len(X)
            m = min(n, self.points_per_device)
            rng = device_rng(seed, device_id, request.round)
            idx = rng.choice(n, size=m, replace=False)
            return PointSample(points=X[idx].copy(), n_points=np.asarray(n, dtype=np.int64))
        if request.action == "kfed":
            return self._kfed_step(X, device_id, seed, state)
        if request.action == "moments":
            n, s, Q = pk.device_moments(self._clipped(X, state), spec)
            return Moments(n=np.asarray(n, dtype=np.float64), s=s, Q=Q)
        if request.action == "candidates":
            p = request.payload
            sums, counts, _ = pk.candidate_sums(self._clipped(X, state), p.mean, p.basis,
                                                p.coords, spec)
            return ClusterSums(sums=sums, counts=counts, cost=np.asarray(0.0))
        if request.action == "lloyd":
            Xc = self._clipped(X, state)
            C = request.payload.centers.astype(X.dtype, copy=False)
            labels, mind = assign(Xc, C)
            k = C.shape[0]
            if spec is None:
                sums = np.zeros_like(C)
                np.add.at(sums, labels, Xc)
                counts = np.bincount(labels, minlength=k).astype(np.int64)
                return ClusterSums(sums=sums, counts=counts, cost=np.asarray(float(mind.sum())))
            sums, counts, _ = pk.cluster_sums(Xc, labels, k, spec)
            cost = 0.0 if spec.private else float(mind.sum())
            return ClusterSums(sums=sums, counts=counts, cost=np.asarray(cost))
        raise ValidationError(f"distributed Lloyd has no client action {request.action!r}")

    def _kfed_step(self, X: np.ndarray, device_id: int, seed: int,
                   state: dict[str, np.ndarray]) -> LocalCenters:
        """k-FED's device step with k local clusters (private: the DP local centers)."""
        k = self.n_clusters
        rng = device_rng(seed, device_id, 0)
        if self.plan is None:
            return local_kmeans(X, k, rng, device=f"device {device_id}").message
        Xc = self._clipped(X, state)
        centers, counts = pk.private_local_centers(
            Xc, k, self.privacy, self.plan.releases[:2], rng,
            noise_rng(self.privacy.noise_seed, DEVICE, device_id, 0),
            seed=int(rng.integers(0, 2**31 - 1)))
        return LocalCenters(centers=centers.astype(X.dtype, copy=False),
                            counts=np.maximum(np.rint(counts), 1).astype(np.int64))

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None:
            return {}
        out = {"labels": assign(X, message.centers.astype(X.dtype, copy=False))[0]}
        if "n_clipped" in state:
            out["n_clipped"] = state["n_clipped"]
        return out
