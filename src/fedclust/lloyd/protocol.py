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
* ``init="box"`` (round 0, ``"candidates"``): the candidates round alone, with
  3k candidates spread over the cube inscribed in the data ball by the server
  without reading any data (:func:`fedclust.privacy.kmeans.box_centers`); under
  privacy devices send sums of x − c clipped to a data-independent radius;
* ``init="kfed"`` (round 0, ``"kfed"``): one k-FED round — every device
  runs k-FED's local step with k local clusters and sends its centers and
  counts (``k (d + 1) 8`` bytes); the server groups them into k (k-FED's
  default server: count-weighted k-means++ restarts, weighted Lloyd to
  convergence). Refused under privacy: each device would noise its own local
  centers, calibrated to its own counts, so on small devices the seeds are
  mostly noise and a few private Lloyd rounds do not recover from them;
  ``init="candidates"`` adds its noise once to federation-wide sums;
* ``init=<array (k, d)>`` (no start round, as scikit-learn's ``KMeans(init=array)``):
  the first Lloyd round broadcasts the given centers (k-FED's refinement,
  :class:`fedclust.lloyd.refine.RefinedKFedProtocol`, starts from its one-shot
  answer this way). Refused under privacy: centers chosen outside the fit are
  not in its release plan, and the private rounds' trust radius and release
  weights assume the plan's own start (:func:`private_start`).

Lloyd rounds (``"lloyd"``): the server broadcasts k centers (``k d 8`` bytes
per device); each device returns per-center sums, counts and its cost
(``k (d + 1) 8 + 8`` bytes); the server averages. Without privacy it stops
when the global cost improves by at most ``tol`` (relative) or after
``max_rounds``.

Private Lloyd rounds are trust-radius rounds: the server broadcasts the
centers and a radius r (:class:`RadiusBroadcast`), devices send per-cluster
sums of x − c clipped to r (noise ∝ r) and counts, and the first round also
the spread that sets r for the later rounds (:mod:`fedclust.privacy.kmeans`).

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

from ..core.kmeans import kmeans_plusplus
from ..core.random import server_rng, sklearn_seed
from ..core.validation import check_choice, check_float, check_int
from ..core.exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from ..core.messages import Message
from ..privacy import (DifferentialPrivacy, PrivacyPlan, Release, noise_rng, planned, pop_privacy,
                       privacy_config)
from ..privacy import kmeans as pk
from ..privacy.mechanisms import SERVER
from ..kfed.messages import LocalCenters
from ..kfed.server import aggregate_centers
from ..privacy.distributed import check_noise_devices
from .messages import (CandidateBroadcast, CenterBroadcast, ClusterSums, Moments, NoisyClusterSums,
                       NoisyMoments, PointSample, RadiusBroadcast)
from ..core.protocol import Protocol, Request, RunLog
from .device import LloydDeviceSteps

__all__ = ["DistributedLloydProtocol", "DistributedLloydResult", "INITS", "GIVEN",
           "check_init_centers", "private_start"]

INITS = ("sample", "candidates", "kfed", "box")
#: ``init`` name of a start from given centers (``init=<array (k, d)>``)
GIVEN = "given"


def check_init_centers(init: Any, n_clusters: int, n_features: int | None) -> np.ndarray:
    """``init`` given as centers: a finite float64 array of shape (n_clusters, d)."""
    try:
        C = np.array(init, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValidationError(f"init centers must be numbers; got {type(init).__name__}") from None
    if C.ndim != 2 or C.shape[0] != n_clusters:
        raise ValidationError(f"init centers have shape {C.shape}; expected (n_clusters, d) = "
                              f"({n_clusters}, d)")
    if n_features is not None and C.shape[1] != n_features:
        raise ValidationError(f"init centers have {C.shape[1]} features but the data have "
                              f"{n_features}")
    if not np.isfinite(C).all():
        raise ValidationError("init centers contain NaN or infinite values")
    return C


def private_start(n_samples: int, n_clusters: int, n_features: int,
                  privacy: DifferentialPrivacy) -> tuple[str, int]:
    """The start and the number of Lloyd rounds of a private fit, from (n, k, d, ε, δ)
    only (``n_samples`` is treated as public; nothing else is read from the data).

    The moments start pays for a d × d second-moment matrix with noise std σ_Q per
    entry; its noise has spectral norm about 2√d σ_Q, while data spread evenly over
    the ball give a top eigenvalue of about n B²/d. When the noise is larger
    (n < 4 d^1.5 z, z the moments' noise multiplier) or when k ≥ d (the principal
    subspace is the whole space and the moments only fit one Gaussian) the box
    start (:func:`fedclust.privacy.kmeans.box_centers`, no moments) is used with
    2 Lloyd rounds (its candidate round is already one Lloyd step); otherwise
    the moments start with 3 rounds.
    """
    k, d = int(n_clusters), int(n_features)
    if not privacy.private:
        return "candidates", 3
    if k >= d:
        return "box", 2
    try:
        probe = DistributedLloydProtocol(k, init="candidates", max_rounds=3, privacy=privacy,
                                         n_features=d)
    except ValidationError:    # ε too small even for the moments start: the box start
        return "box", 2
    z = probe.plan.releases[0].noise_multiplier
    return ("box", 2) if n_samples < 4.0 * d ** 1.5 * z else ("candidates", 3)


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
    radius: float = math.inf       # the trust radius of the next private Lloyd round
    costs: list[float] = field(default_factory=list)
    converged: bool = False


class DistributedLloydProtocol(LloydDeviceSteps, Protocol):
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
    # a device keeps only its clipped-point count between rounds, rewritten every round
    rejoin_actions = frozenset({"lloyd", "moments", "candidates"})

    def __init__(self, n_clusters: int, *, points_per_device: int = 10,
                 max_rounds: int = 100, tol: float = 1e-4, init: str | np.ndarray = "sample",
                 privacy: DifferentialPrivacy | None = None, n_features: int | None = None,
                 noise_multipliers: Sequence[float] | None = None, noise_devices: int = 0):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.points_per_device = check_int(points_per_device, "points_per_device", min_value=1)
        self.max_rounds = check_int(max_rounds, "max_rounds", min_value=1)
        self.tol = check_float(tol, "tol", min_value=0.0)
        #: the given start (``init=<array>``), else None
        self.init_centers: np.ndarray | None = None
        if isinstance(init, str):
            self.init = check_choice(init, "init", INITS)
        else:
            self.init_centers = check_init_centers(init, self.n_clusters, n_features)
            self.init = GIVEN
        self.privacy = privacy
        self.n_features = n_features
        self.plan: PrivacyPlan | None = None
        if privacy is not None:
            if self.init == "sample":
                raise ValidationError("privacy: init='sample' sends raw points; use "
                                      "init='candidates' with privacy")
            if self.init == GIVEN:
                raise ValidationError(
                    "privacy: init=<centers> is not available with privacy: centers chosen "
                    "outside the fit are not in its release plan (a start from the data would be "
                    "an unaccounted release); use the default private start")
            if self.init == "kfed":
                raise ValidationError(
                    "privacy: init='kfed' is not available with privacy: every device would noise "
                    "its own k local centers, calibrated to its own counts, so on small devices "
                    "the seeds are mostly noise and the private Lloyd rounds do not recover "
                    "(k-means cost 4.6-9.4x pooled at epsilon=1 on 30 devices of 60 points, "
                    "where init='candidates' gives 1.2-2.1); use init='candidates', whose noise "
                    "is added once to sums over the whole federation")
            privacy.require(data_bound=True, clip_norm=privacy.unit == "device",
                            family="DistributedLloyd")
            if n_features is None:
                raise ValidationError("privacy: DistributedLloydProtocol needs n_features")
            self.plan = planned(privacy, self.releases(), noise_multipliers,
                                family="this DistributedLloyd fit")
        if self.init == "box" and n_features is None:
            raise ValidationError("init='box' needs n_features (the candidates are placed "
                                  "before any data are read)")
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
        box = self.init == "box"
        out = [] if box else [pk.moments_release(self.privacy, what=pk.MOMENTS)]
        out.append(pk.sums_release(self.privacy, d if box else min(self.n_clusters, d),
                                   what=pk.CANDIDATES,
                                   share=float(T + 1)))
        if T > 1:
            out.append(pk.sums_release(self.privacy, d, repeats=T - 1))
            out.append(pk.spread_release(self.privacy, share=pk.SPREAD_SHARE))
        out.append(pk.sums_release(self.privacy, d, what=pk.FINAL, share=float(T + 1)))
        return out

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a fit asks of each device, by action (its start, then at most
        ``max_rounds`` Lloyd rounds; the spread rides on the first): a device's policy
        refuses more."""
        start = {"box": {"candidates": 1}, "candidates": {"moments": 1, "candidates": 1},
                 GIVEN: {}}
        return {**start.get(self.init, {self.init: 1}), "lloyd": self.max_rounds}

    @property
    def noisy(self) -> bool:
        """True when the run releases noisy statistics only (finite ε)."""
        return self.plan is not None and self.privacy.private

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"n_clusters": self.n_clusters,
                               "points_per_device": self.points_per_device,
                               "max_rounds": self.max_rounds, "tol": self.tol, "init": self.init}
        if self.init_centers is not None:   # config values are scalars or flat lists
            cfg["init_centers"] = self.init_centers.ravel().tolist()
            cfg["n_features"] = int(self.init_centers.shape[1])
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
        flat = cfg.pop("init_centers", None)
        if cfg.get("init") == GIVEN:
            if flat is None or cfg.get("n_features") is None:
                raise ValidationError("config init='given' needs init_centers and n_features")
            cfg["init"] = np.asarray(flat, dtype=np.float64).reshape(-1, int(cfg["n_features"]))
        return cls(cfg.pop("n_clusters"), **cfg)

    # -- server --------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> _State:
        radius = float(self.privacy.data_bound) if self.noisy else math.inf
        state = _State(tuple(device_ids), int(seed), radius=radius)
        if self.init_centers is not None:
            state.centers = self.init_centers.copy()
        if self.init == "box":
            d = int(self.n_features)
            B = math.sqrt(d) if self.privacy is None else self.privacy.data_bound
            coords = pk.box_centers(pk.BOX_CANDIDATES * self.n_clusters, d, float(B), server_rng(state.seed))
            state.candidates = CandidateBroadcast(np.zeros(d), np.eye(d), coords)
            if self.noisy:   # the first round's trust radius: the candidate round's
                state.radius = pk.box_radius(len(coords), d, float(B))
        return state

    def next_request(self, state: _State) -> Request | None:
        if self.init == GIVEN:
            if state.converged or state.lloyd_rounds >= self.max_rounds:
                return None
            return Request(state.round, "lloyd", CenterBroadcast(state.centers))
        if state.round == 0 and self.init == "box":
            return Request(0, "candidates", state.candidates)
        if state.round == 0:
            return Request(0, {"sample": "sample", "kfed": "kfed"}.get(self.init, "moments"))
        if self.init == "candidates" and state.round == 1:
            return Request(1, "candidates", state.candidates)
        if state.converged or state.lloyd_rounds >= self.max_rounds:
            return None
        if self.noisy:
            return Request(state.round, "lloyd", RadiusBroadcast(
                state.centers, np.asarray(state.radius, dtype=np.float64)))
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
            return self.plan.release(pk.CANDIDATES)
        last = round_index - self._first_lloyd == self.max_rounds - 1
        return self.plan.release(pk.FINAL if last else pk.LLOYD)

    @property
    def _relative_candidates(self) -> bool:
        """The box start's candidate round sums x − c clipped to :func:`box_radius`."""
        return self.init == "box" and self.noisy

    @property
    def _first_lloyd(self) -> int:
        return {"candidates": 2, GIVEN: 0}.get(self.init, 1)   # Lloyd rounds follow the init

    def _spread_round(self, round_index: int) -> bool:
        """Whether a private Lloyd round also releases the spread (the first of T ≥ 2):
        fixed by the config, so a server cannot ask for more releases."""
        return self.noisy and self.max_rounds > 1 and round_index == self._first_lloyd

    def _radius(self, payload: Message) -> float:
        """The trust radius a device clips to: the broadcast's, or data_bound."""
        return float(getattr(payload, "radius", self.privacy.data_bound))

    def round_releases(self, request: Request) -> list[Release]:
        """What round ``request`` releases (the write-ahead privacy ledger charges it)."""
        if self.plan is None or request.action == "sample":
            return []
        out = [self._release(request.round, request.action)]
        if request.action == "lloyd" and self._spread_round(request.round):
            out.append(self.plan.release(pk.SPREAD))
        return out

    def server_step(self, state: _State, request: Request, replies: Mapping[int, Message]) -> None:
        if not replies:
            raise TooFewReplies("no device replied")
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
            raise TooFewReplies(
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
        min_count, bound, centroids = 1.0, None, None
        if self.plan is not None:
            rel = self._release(request.round, "candidates")
            bound = float(self.privacy.data_bound)
            if self._relative_candidates:   # box start: relative sums at the box radius
                coords = state.candidates.coords
                r = pk.box_radius(len(coords), coords.shape[1], bound)
                if not self.noise_devices:
                    sums, counts = pk.noisy_relative_sums(sums, counts, rel, r, bound,
                                                          self._noise(state, request))
                centroids = pk.relative_step(coords, sums, counts, min_count=1.0, radius=r,
                                             bound=bound, sum_std=rel.noise_std * r / bound)
            elif not self.noise_devices:
                sums, counts = pk.noisy_cluster_sums(sums, counts, rel, bound,
                                                     self._noise(state, request))
            min_count = max(1.0, 3.0 * rel.noise_std / pk.count_weight(bound, sums.shape[1]))
        centers, _ = pk.centers_from_candidates(
            sums, counts, self.n_clusters, bound=bound, min_count=min_count,
            seed=sklearn_seed(server_rng(state.seed, 2)), centroids=centroids)
        cb = state.candidates
        state.centers = pk.lift(centers, cb.mean, cb.basis)

    def _centers_from_kfed(self, state: _State, replies: list[LocalCenters]) -> None:
        centers = [r.centers.astype(np.float64) for r in replies]
        counts = [r.counts for r in replies]
        agg = aggregate_centers(centers, self.n_clusters, counts=counts,
                                method="weighted-kmeans++", rng=server_rng(state.seed))
        state.centers = agg.centers

    def _lloyd_step(self, state: _State, request: Request, replies: list[ClusterSums]) -> None:
        sums = sum(r.sums for r in replies)
        counts = sum(r.counts for r in replies)
        new = state.centers.copy()
        if self.noisy:
            rel = self._release(request.round, "lloyd")
            bound, r = float(self.privacy.data_bound), state.radius
            sums, counts = sums.astype(np.float64), counts.astype(np.float64)
            spread = float(sum(float(x.cost) for x in replies))
            spread_rel = self.plan.release(pk.SPREAD) if self._spread_round(request.round) else None
            if not self.noise_devices:
                rng = self._noise(state, request)
                sums, counts = pk.noisy_relative_sums(sums, counts, rel, r, bound, rng)
                if spread_rel is not None:
                    spread = float(pk.gaussian(np.asarray(spread), spread_rel.noise_std, rng))
            # a noisy count near 0 makes a long, noisy step: the shrinkage and the radius
            # stop it, so only a count below 1 keeps its center
            new = pk.relative_step(state.centers, sums, counts, min_count=1.0, radius=r,
                                   bound=bound, sum_std=rel.noise_std * r / bound)
            if spread_rel is not None:
                state.radius = pk.trust_radius(spread, spread_rel.noise_std,
                                               float(counts.sum()), bound)
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
