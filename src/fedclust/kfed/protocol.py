"""k-FED as a protocol: one round of local centers up, label maps down.

Round 0 (``action="local_centers"``): every device runs the Awasthi–Sheffet
local k-means (:func:`fedclust.local.local_kmeans`) and sends its k_z centers
and counts — ``k_z (d + 1) * 8`` bytes for float64. The server aggregates them
(:func:`fedclust.server.kfed.aggregate_centers`). Afterwards each device gets a
:class:`~fedclust.messages.LabelMap` (k_z int64) and labels its own points.
A device that was absent or late is handled by :meth:`KFedProtocol.assign_late`
with O(k_z k) server work; the only server state it needs is the final centers.

Dennis, Li & Smith, "Heterogeneity for the Win: One-Shot Federated
Clustering", ICML 2021.
"""

from __future__ import annotations

from collections import defaultdict
import math
from itertools import repeat
from operator import attrgetter, is_
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.random import server_rng
from ..core.validation import check_choice, check_float, check_int
from ..core.exceptions import IncompatibleMessageError, TooFewReplies, ValidationError
from .summary import summary_cap, summary_size
from ..core.messages import Message, ReplyTable, StackedReplies
from .stacked_steps import ACTION
from .messages import FinalCenters, LabelMap, LocalCenters, LocalSummary
from .server import (SERVER_METHODS, WEIGHTED_SERVERS, aggregate_centers, assign_to_centers,
                     explanation_warning)
from ..core.protocol import Protocol, Request, RunLog
from .device_steps import KFedDeviceSteps
from ..privacy import (DifferentialPrivacy, PrivacyPlan, Release, calibrate, planned, pop_privacy,
                       privacy_config)
from ..privacy import kmeans as pk

__all__ = ["KFedProtocol", "KFedResult"]




#: the registered name of k-FED refined by Lloyd rounds (:mod:`fedclust.lloyd.refine`)
REFINED = "kfed-refined"


def check_refine_rounds(refine_rounds: Any) -> int:
    """``refine_rounds`` as a non-negative int (clear error otherwise)."""
    if isinstance(refine_rounds, bool) or not isinstance(refine_rounds, (int, np.integer)):
        raise ValidationError(f"refine_rounds={refine_rounds!r} must be a non-negative int "
                              "(the number of Lloyd rounds after the k-FED round)")
    return check_int(refine_rounds, "refine_rounds", min_value=0)


def refine_bytes_per_round(n_clusters: int, n_features: int, itemsize: int = 8) -> dict[str, int]:
    """Bytes one device exchanges in one Lloyd round: up ``k d s + k 8 + 8`` (per-center
    sums in the data's dtype of ``s = itemsize`` bytes, int64 counts, its float64 cost;
    ``k (d + 1) 8 + 8`` for float64 data), down ``k d 8`` (the float64 centers)."""
    k, d = int(n_clusters), int(n_features)
    return {"up": k * d * int(itemsize) + k * 8 + 8, "down": k * d * 8}

@dataclass
class KFedResult:
    """Outcome of a k-FED run (server side)."""

    centers: np.ndarray                       # (k, d)
    local_centers: dict[int, np.ndarray]      # device id -> (k_z, d)
    local_counts: dict[int, np.ndarray]       # device id -> (k_z,)
    center_labels: dict[int, np.ndarray]      # device id -> (k_z,) global labels
    seed_device: int | None
    n_iter: int
    log: RunLog = field(default_factory=RunLog)
    #: with ``refine_rounds`` (:mod:`fedclust.lloyd.refine`): the one-shot k-FED centers
    #: the Lloyd rounds started from, the global cost of the centers each Lloyd round
    #: broadcast, and the number of Lloyd rounds run
    kfed_centers: np.ndarray | None = None
    cost_history: list[float] = field(default_factory=list)
    refine_rounds: int = 0


@dataclass
class KFedState:
    device_ids: tuple[int, ...]
    seed: int
    round: int = 0
    #: device id -> reply (a :class:`~fedclust.core.messages.ReplyTable` when the round's
    #: replies came in batches kept whole)
    replies: dict[int, LocalCenters] | ReplyTable = field(default_factory=dict)


class KFedProtocol(KFedDeviceSteps, Protocol):
    """One-shot federated k-means (k-FED). Parameters as in :class:`fedclust.KFed`."""

    name = "kfed"
    reply_types = {ACTION: LocalCenters}
    parallel_safe = True
    not_summable_reason = "k-FED's server clusters each device's local centers"

    def __init__(self, n_clusters: int, n_local_clusters: int | Mapping[int, int] | str, *,
                 server: str = "farthest-lloyd1", weighted: bool = False,
                 first_device: str | int = "widest", max_iter: int = 300, tol: float = 1e-4,
                 local_max_iter: int = 300, allow_raw_points: bool = False,
                 n_features: int | None = None, trim: float = 0.0,
                 privacy: DifferentialPrivacy | None = None,
                 noise_multipliers: Sequence[float] | None = None):
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        # Known d lets the server judge every reply on its own; without it the
        # majority d of the replies wins (a liar cannot get honest devices rejected).
        self.n_features = None if n_features is None else check_int(n_features, "n_features",
                                                                    min_value=1)
        self.auto = isinstance(n_local_clusters, str)
        if self.auto:
            if n_local_clusters != "auto":
                raise ValidationError(f"n_local_clusters={n_local_clusters!r} must be 'auto', "
                                      "an int or one int per device")
            self.n_local_clusters = "auto"
        elif isinstance(n_local_clusters, Mapping):
            self.n_local_clusters: int | dict[int, int] = {
                int(z): check_int(v, f"n_local_clusters[{z}]", min_value=1)
                for z, v in n_local_clusters.items()}
        else:
            self.n_local_clusters = check_int(n_local_clusters, "n_local_clusters", min_value=1)
        self.server = check_choice(server, "server", SERVER_METHODS)
        self.weighted = bool(weighted)
        if not (isinstance(first_device, (int, np.integer)) and not isinstance(first_device, bool)):
            check_choice(first_device, "first_device", ("widest", "random"))
        self.first_device = first_device
        self.max_iter = check_int(max_iter, "max_iter", min_value=1)
        self.tol = check_float(tol, "tol", min_value=0.0)
        self.local_max_iter = check_int(local_max_iter, "local_max_iter", min_value=1)
        self.allow_raw_points = bool(allow_raw_points)
        self.trim = check_float(trim, "trim", min_value=0.0)
        if self.trim >= 0.5:
            raise ValidationError(f"trim={self.trim} must be < 0.5 (at most a minority of "
                                  "devices may lie)")
        self.privacy = privacy
        self.plan: PrivacyPlan | None = None
        if privacy is not None:
            self.plan = self._calibrate(privacy, noise_multipliers)
        #: the default server's devices also send each local cluster's scatter (not under DP:
        #: it would be one more release) and get the final centers back
        self.summarise = self.server in WEIGHTED_SERVERS and self.plan is None
        if self.summarise:
            self.reply_types = {ACTION: LocalSummary}

    def _calibrate(self, spec: DifferentialPrivacy, multipliers) -> PrivacyPlan:
        if spec.unit == "device":
            raise ValidationError(
                "privacy: k-FED has no device-level DP: every device sends its own centers, so "
                f"hiding a whole device means local DP on them, {self._device_cost(spec)}; use "
                "unit='point', or DistributedLloyd at unit='device'")
        spec.require(data_bound=True, family="KFed")
        if self.n_features is None:
            raise ValidationError("privacy: KFedProtocol needs n_features")
        releases = [pk.moments_release(spec, what="device moments: count, sum and "
                                       "second-moment matrix (noised on the device)"),
                    pk.sums_release(spec, min(self.min_k_local(), self.n_features),
                                    what="device candidates: per-candidate sums and counts "
                                    "(noised on the device)")]
        return planned(spec, releases, multipliers, family="this KFed fit")

    def _device_cost(self, spec: DifferentialPrivacy) -> str:
        """What device-level k-FED would cost: k centers in the ball of radius B move by up
        to 2B√k (Frobenius) when the device's data change, so each coordinate would need
        Gaussian noise of std 2 z B √k, z the one-release multiplier of (ε, δ)."""
        k = self.min_k_local()
        if spec.data_bound is None or not spec.private:
            return f"Gaussian noise of std 2·z·data_bound·√k (k = {k}) on every coordinate"
        z = calibrate(replace(spec, unit="point", prior=()), [Release("centers", 1.0)]
                      ).releases[0].noise_multiplier
        std = 2.0 * z * float(spec.data_bound) * math.sqrt(k)
        return (f"Gaussian noise of std 2·z·data_bound·√k = {std:.3g} on every coordinate of "
                f"every center (z = {z:.3g} at epsilon={spec.epsilon:g}, delta={spec.delta:g}; "
                f"k = {k}), {std / float(spec.data_bound):.3g}x the data bound")

    def min_k_local(self) -> int:
        """The smallest k_z: a private device releases sums in min(k_z, d) dimensions, and
        fewer dimensions mean a larger sensitivity B√(1 + 1/p), so the smallest is declared."""
        if self.auto:   # under DP every device takes k: a data-chosen k_z would be a release
            return self.n_clusters
        if isinstance(self.n_local_clusters, int):
            return self.n_local_clusters
        return min(self.n_local_clusters.values())

    def k_local(self, device_id: int) -> int:
        """k_z of a device (clear error for a device without one); with ``"auto"`` the most
        a device may send (2k; k under DP)."""
        if self.auto:
            return self.n_clusters if self.privacy is not None else 2 * self.n_clusters
        if isinstance(self.n_local_clusters, int):
            return self.n_local_clusters
        try:
            return self.n_local_clusters[int(device_id)]
        except KeyError:
            raise ValidationError(
                f"no n_local_clusters given for device {device_id}; "
                f"known devices: {sorted(self.n_local_clusters)[:10]}") from None

    def k_sent(self, k_z: int, n_z: int, d: int | None = None) -> int:
        """The fewest centers a device of n_z points sends: k_z, and with the default server
        at least :func:`fedclust.kfed.summary.summary_size` ``min(n_z // 5, 2k)``, the 2k at
        most 8 KiB worth of centers in d dimensions (``"auto"``:
        that many, the top of its BIC range): a coarser summary can merge groups the server
        cannot split again. With the default server the device then refines its summary up
        the :func:`fedclust.kfed.summary.summary_ladder` (its local clusters' scatter at most a
        quarter of its own, at most 8 KiB); the device's labels come from the final
        centers, not from its local clusters."""
        if not self.summarise:
            return k_z
        return max(0 if self.auto else k_z, summary_size(n_z, self.n_clusters, d))

    @property
    def local_auto(self) -> bool:
        """Devices pick k_z by BIC (``"auto"`` with a server that uses k_z as sent)."""
        return self.auto and not self.summarise

    def max_sent(self, device_id: int, n_features: int = 1) -> int:
        """The most centers the server accepts from a device whose centers have
        ``n_features`` features (the default server's summary cap depends on it)."""
        k_z = self.k_local(device_id)
        if not self.summarise:
            return k_z
        return max(k_z, summary_cap(2**62, int(n_features), self.n_clusters))

    # -- config round trip (for clients on another machine) -----------------
    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "n_clusters": self.n_clusters, "server": self.server, "weighted": self.weighted,
            "first_device": self.first_device, "max_iter": self.max_iter, "tol": self.tol,
            "local_max_iter": self.local_max_iter, "allow_raw_points": self.allow_raw_points,
            "trim": self.trim,
        }
        if self.n_features is not None:
            cfg["n_features"] = self.n_features
        if self.plan is not None:
            cfg.update(privacy_config(self.privacy, self.plan))
        if isinstance(self.n_local_clusters, (int, str)):
            cfg["n_local_clusters"] = self.n_local_clusters
        else:
            ids = sorted(self.n_local_clusters)
            cfg["n_local_clusters_ids"] = ids
            cfg["n_local_clusters_values"] = [self.n_local_clusters[i] for i in ids]
        return cfg

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "KFedProtocol":
        cfg = dict(config)
        if "n_local_clusters_ids" in cfg:
            ids = cfg.pop("n_local_clusters_ids")
            vals = cfg.pop("n_local_clusters_values")
            cfg["n_local_clusters"] = dict(zip(ids, vals))
        privacy = pop_privacy(cfg)
        if privacy is not None:
            cfg["privacy"] = privacy
        n_clusters = cfg.pop("n_clusters")
        n_local = cfg.pop("n_local_clusters")
        return cls(n_clusters, n_local, **cfg)

    # -- server ------------------------------------------------------------
    def start(self, device_ids: Sequence[int], seed: int) -> KFedState:
        return KFedState(tuple(map(int, device_ids)), int(seed))

    def declared_rounds(self) -> dict[str, int]:
        """The data rounds a fit asks of each device, by action: its one round."""
        return {ACTION: 1}

    def next_request(self, state: KFedState) -> Request | None:
        if state.round > 0:
            return None
        return Request(round=0, action=ACTION)

    def check_reply(self, state: KFedState, request: Request, device_id: int, reply: Message) -> None:
        if not isinstance(reply, LocalCenters):
            raise IncompatibleMessageError(
                f"device {device_id}: expected local_centers, got {type(reply).__name__}")
        d = reply.centers.shape[1]
        k_z = self.max_sent(device_id, d)
        if reply.centers.shape[0] > k_z:
            raise IncompatibleMessageError(
                f"device {device_id}: sent {reply.centers.shape[0]} centers but at most "
                f"{k_z} are accepted (n_local_clusters={self.k_local(device_id)})")
        if self.n_features is not None and d != self.n_features:
            raise IncompatibleMessageError(
                f"device {device_id}: centers have {d} features but the federation has "
                f"n_features={self.n_features}")

    @property
    def reads_stacked_replies(self) -> bool:
        """Whether the server step takes a round's batches of replies column-wise (a
        :class:`~fedclust.core.messages.ReplyTable`; a subclass with its own checks or
        server maths gets messages)."""
        cls = type(self)
        return (cls.check_reply is KFedProtocol.check_reply
                and cls.check_batch is KFedProtocol.check_batch
                and cls.server_step is KFedProtocol.server_step
                and cls.finish is KFedProtocol.finish)

    def server_step(self, state: KFedState, request: Request, replies: Mapping[int, Message]) -> None:
        if isinstance(replies, ReplyTable) and not state.replies:
            state.replies = replies.copy()   # kept column-wise
        else:
            state.replies.update(replies)  # type: ignore[arg-type]
        state.round += 1

    def finish(self, state: KFedState, log: RunLog) -> KFedResult:
        self._drop_minority_dimension(state, log)
        ids = sorted(state.replies)
        if not ids:
            raise TooFewReplies(
                "no device replied (all dropped, late, failed or rejected); nothing to aggregate")
        table = state.replies
        if isinstance(table, ReplyTable) and table.columnar and table.ids == ids:
            field = table.column   # the batches' rows, no message object per device
        else:
            replies = list(map(state.replies.__getitem__, ids))

            def field(name: str) -> list[np.ndarray]:
                return [getattr(r, name) for r in replies]
        centers = field("centers")
        total = sum(map(len, centers))
        if total < self.n_clusters:
            raise TooFewReplies(
                f"the {len(ids)} replying devices sent {total} local centers in all but "
                f"n_clusters={self.n_clusters}; need sum k_z >= k")
        counts = field("counts")
        dtypes = set(map(attrgetter("dtype"), centers))   # all float32 stay, else float64
        if dtypes != {np.dtype(np.float32)} and dtypes != {np.dtype(np.float64)}:
            centers = [c.astype(np.float64, copy=False) for c in centers]
        first = self.first_device
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            if int(first) not in state.replies:
                raise ValidationError(f"first_device={first} did not reply")
            first = ids.index(int(first))
        agg = aggregate_centers(
            centers, self.n_clusters, counts=counts, method=self.server, weighted=self.weighted,
            first_device=first, rng=server_rng(state.seed), max_iter=self.max_iter, tol=self.tol,
            trim=self.trim, device_ids=ids, seed=state.seed)
        if agg.distrust is not None:
            dropped = ~agg.distrust.keep
            offsets = np.cumsum([0] + [len(c) for c in centers])
            for pos, z in enumerate(ids):
                n_bad = int(dropped[offsets[pos]:offsets[pos + 1]].sum())
                if n_bad:
                    log.distrusted[z] = (
                        f"device {z}: {n_bad} of its {len(centers[pos])} centers in groups that "
                        f"too few devices support (at most {agg.distrust.n_trim} may lie; "
                        f"ball radius {agg.distrust.radius:.4g})")
        if self.summarise:
            warning = explanation_warning(
                centers, counts, field("scatter"), agg.centers,
                agg.center_labels, ids)
            if warning is not None:
                log.warnings.append(warning)
        return KFedResult(
            centers=agg.centers,
            local_centers=dict(zip(ids, centers)),
            local_counts=dict(zip(ids, counts)),
            center_labels=dict(zip(ids, agg.center_labels)),
            seed_device=None if agg.seed_device is None else ids[agg.seed_device],
            n_iter=agg.n_iter, log=log)

    @staticmethod
    def _drop_minority_dimension(state: KFedState, log: RunLog) -> None:
        """Without a known d, keep the replies of the most common d and reject the rest."""
        table = state.replies
        if isinstance(table, ReplyTable) and table.columnar:
            if len({b.arrays["centers"].shape[2] for b in table.batches}) <= 1:
                return
        elif len({r.centers.shape[1] for r in state.replies.values()}) <= 1:
            return
        dims = {z: r.centers.shape[1] for z, r in state.replies.items()}
        values, counts = np.unique(list(dims.values()), return_counts=True)
        d = int(values[np.argmax(counts)])
        for z, dz in dims.items():
            if dz != d:
                log.rejected[z] = (f"device {z}: centers have {dz} features but most devices "
                                   f"sent {d}")
                del state.replies[z]
        log.participants = [z for z in log.participants if z not in log.rejected]

    def assign_late(self, result: KFedResult, device_id: int, reply: LocalCenters) -> np.ndarray:
        """Map a late/new device's centers to the final centers (O(k_z k d)); returns its labels map."""
        if reply.centers.shape[0] > self.max_sent(device_id, reply.centers.shape[1]):
            raise IncompatibleMessageError(
                f"device {device_id}: sent {reply.centers.shape[0]} centers but "
                f"n_local_clusters={self.k_local(device_id)}")
        if reply.centers.shape[1] != result.centers.shape[1]:
            raise IncompatibleMessageError(
                f"device {device_id}: centers have {reply.centers.shape[1]} features but the "
                f"model has {result.centers.shape[1]}")
        labels = assign_to_centers(reply.centers.astype(result.centers.dtype, copy=False),
                                   result.centers)
        result.local_centers[device_id] = reply.centers
        result.local_counts[device_id] = reply.counts
        result.center_labels[device_id] = labels
        return labels

    def final_message(self, result: KFedResult, device_id: int) -> Message | None:
        labels = result.center_labels.get(device_id)
        if labels is None:
            return None
        if self.server in WEIGHTED_SERVERS:
            return FinalCenters(centers=result.centers)
        return LabelMap(global_labels=labels.astype(np.int64))

    def final_messages_stacked(self, result: KFedResult, device_ids: Sequence[int]):
        """The label maps held column-wise, one batch per k_z (the final centers, one
        message for every device, as :meth:`final_message` gives them)."""
        if type(self).final_message is not KFedProtocol.final_message:   # a subclass's own
            return super().final_messages_stacked(result, device_ids)
        labels = result.center_labels
        if self.server in WEIGHTED_SERVERS:
            final = FinalCenters(centers=result.centers)
            return [], {z: final for z in device_ids if z in labels}
        by_size: dict[int, list[int]] = defaultdict(list)
        rows = list(map(labels.get, device_ids))
        sizes = set(map(len, rows)) if not any(map(is_, rows, repeat(None))) else ()
        if len(sizes) == 1:   # every device has a label map, all of one size: one batch
            by_size[sizes.pop()] = list(device_ids)
        else:
            for z, lab in zip(device_ids, rows):
                if lab is not None:
                    by_size[len(lab)].append(z)
            rows = None
        batches = [StackedReplies(LabelMap, zs, {"global_labels": np.concatenate(
            rows if rows is not None else [labels[z] for z in zs]
        ).astype(np.int64).reshape(len(zs), size)}) for size, zs in by_size.items()]
        return batches, {}

    def check_batch(self, state: KFedState, request: Request, batch: StackedReplies,
                    messages) -> dict[int, IncompatibleMessageError]:
        """:meth:`check_reply` over a batch's stacked arrays (same verdicts, one pass);
        ``messages`` may be None (built from the batch where a device is refused)."""
        def one_by_one() -> dict[int, IncompatibleMessageError]:
            return super(KFedProtocol, self).check_batch(
                state, request, batch, batch.messages() if messages is None else messages)

        if not issubclass(batch.message_type, LocalCenters):
            return one_by_one()
        sent, d = batch.arrays["centers"].shape[1:]
        if self.n_features is not None and d != self.n_features:
            return one_by_one()
        if isinstance(self.n_local_clusters, Mapping):
            over = [z for z in batch.ids if sent > self.max_sent(z, d)]
        else:
            over = batch.ids if sent > self.max_sent(batch.ids[0], d) else []
        if not over:
            return {}
        return one_by_one()
