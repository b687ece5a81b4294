"""scikit-learn-style front doors over the protocols.

``KFed(...).fit(devices)`` validates the federation, builds a
:class:`~fedclust.protocols.kfed.KFedProtocol` and runs it on the in-process
transport (or any transport passed to ``fit``). The same protocol object runs
unchanged on Flower (:mod:`fedclust.flower`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Sequence

import numpy as np

from sklearn.base import BaseEstimator, ClusterMixin

from ..core.checkpoint import privacy_summary
from ..core.random import RandomState, root_seed
from ..privacy import DifferentialPrivacy
from ..core.estimators import CenterEstimatorMixin, split_federation
from ..core.validation import (check_array, check_device_ids, check_devices, check_flags,
                               check_int, check_n_local_clusters)
from ..core.exceptions import ValidationError
from .fit_checks import check_local_clusters, sendable_centers
from .messages import LocalCenters
from .server import WEIGHTED_SERVERS, assign_to_centers
from .protocol import (REFINED, KFedProtocol, KFedResult, check_refine_rounds,
                       refine_bytes_per_round)
from ..core.protocol import Request, Transport
from ..core.registry import PROTOCOLS
from ..sim.gc_pause import cyclic_gc_paused
from ..sim.transport import InProcessTransport
from ..unlearning.forget import ForgetMixin, run_recorded

__all__ = ["KFed"]


class KFed(ForgetMixin, CenterEstimatorMixin, ClusterMixin, BaseEstimator):
    """k-FED: one-shot federated k-means (Dennis, Li & Smith, ICML 2021).

    Each device runs the Awasthi–Sheffet local k-means with k_z clusters and
    sends its centers and counts once; the server clusters all device centers
    into k groups. With the default server every device gets the k final
    centers back and labels its points by the nearest one (so ``labels_``
    equals ``predict``); with the paper's servers each point's label is the
    group of its local center.

    Parameters
    ----------
    n_clusters : int
        k, the number of global clusters.
    n_local_clusters : "auto", int or sequence of int, default="auto"
        k' for every device, or one k_z per device (devices may differ); with
        the default server a device sends at least ``min(2k, n_z // 5)``
        centers (2k capped at 8 KiB worth) whatever k_z says (its labels come from the final centers, and
        a coarser summary can merge groups the server cannot split again).
        ``"auto"``: with the default server every device starts at
        ``min(2k, n_z // 5)`` centers, 2k capped at 8 KiB worth
        (:func:`fedclust.kfed.summary.summary_size`)
        and doubles them until its local clusters hide at most a quarter of its
        scatter, at most 8 KiB (:func:`fedclust.kfed.summary.summary_ladder`,
        :func:`fedclust.kfed.summary.summary_kmeans_stacked`);
        with the other servers a device picks its own k_z from its data, between
        ``min(k, n_z // 5)`` and ``min(2k, n_z // 5)``, by the X-means BIC of
        its local k-means (:func:`fedclust.kfed.local_auto.local_kmeans_auto`):
        under-clustering cannot be undone by the server, over-clustering can.
        Under privacy ``"auto"`` is k on every device (a data-chosen k_z would
        be a release). The paper's server wants k_z = the number of groups a
        device holds.
    server : str, default="weighted-kmeans++"
        Aggregation, one of ``"weighted-kmeans++"``, ``"farthest-lloyd1"``,
        ``"farthest-lloyd"``, ``"single-linkage"``, ``"kmeans++"``.
        Default ``"weighted-kmeans++"``: device centers weighted
        by their counts, 10 to 100 greedy weighted k-means++ starts (fewer on more
        device centers) and the farthest-first start, weighted Lloyd to convergence,
        the lowest weighted cost kept; its k-means++ draws are keyed by device id, so
        that ``forget`` follows the fit's trace instead of running the step again
        (:mod:`fedclust.kfed.keyed`, ``docs/unlearning.md``); devices also send each
        local cluster's scatter (``run_log_.warnings``) and get the final centers back. ``"farthest-lloyd1"`` is the paper's
        server (farthest-point initialisation + one Lloyd round; every paper
        reproduction names it), ``"farthest-lloyd"`` Lloyd to convergence (the
        authors' code), ``"single-linkage"`` the poster's union-find merge,
        ``"kmeans++"`` unweighted k-means++ restarts (``weighted=`` applies);
        ``"weighted-kmeans++-keyed"`` is another name of the default.
        See ``docs/kfed.md`` for when to use which.
    weighted : bool, default=False
        Weight device centers by their point counts in the server's Lloyd.
    first_device : {"widest", "random"} or int, default="widest"
        Which device's centers seed the farthest-point traversal of the paper's
        servers; the default server's farthest-first start always takes the widest
        device (its forget follows the device ids, not their positions).
    max_iter, tol : int, float
        Server Lloyd limits (``farthest-lloyd``) and the Lloyd tolerance.
    local_max_iter : int, default=300
        Lloyd iterations on each device.
    allow_raw_points : bool, default=False
        Let a device with n_z <= k_z send its raw points as centers.
    trim : float in [0, 0.5), default=0
        Byzantine-robust server: at most this fraction of devices may send
        arbitrary centers. Centers no ``⌈trim·Z⌉`` other devices corroborate are
        left out of the seeding and Lloyd, final centers are trimmed means, and
        ``run_log_.distrusted`` names the devices concerned
        (:mod:`fedclust.kfed.robust_server`). 0 is the paper's server.
    privacy : DifferentialPrivacy or None
        Point-level (ε, δ)-DP local centers (needs ``data_bound``): each device
        clips its points, releases noisy moments and noisy candidate sums
        calibrated to its own counts (noise added on the device, the server is
        not trusted), and computes its k_z centers from them; a point lives on
        one device, so the fit costs two releases whatever the number of
        devices. ``unit="device"`` is refused: hiding a whole device would need
        local DP noise of std 2·z·B·√k on every coordinate of every center
        (z the one-release multiplier: 294 ≈ 27 B at ε = 1, δ = 1e-6, B = 11,
        k = 10; the error names it for the given values). See ``docs/privacy.md``.
    refine_rounds : int, default=0
        Distributed Lloyd rounds after the k-FED round, started from its
        centers (:mod:`fedclust.lloyd.refine`): at most r more rounds (fewer
        when the cost improves by at most ``tol``, relative) for the pooled
        k-means cost; the answer is scikit-learn's ``KMeans(init=<k-FED
        centers>, n_init=1, max_iter=r)`` on the pooled rows, and every device
        labels its points by the nearest final center. Refused under
        ``privacy`` and with ``trim``.
    random_state : int, Generator or None
        Seeds everything but the privacy noise; every device has its own
        stream keyed by its id.
    progress : bool, default=False
        Progress bar over devices.

    Attributes
    ----------
    cluster_centers_ : ndarray (k, d)
    labels_ : ndarray (n,)
        Every point's cluster: the devices' labels concatenated in device order,
        or in the row order of X for ``fit(X, groups=...)``; ``fit_predict``
        returns it.
    device_labels_ : list of ndarray (n_z,) or None
        Induced clustering of every device (``None`` for a device that did not
        take part, e.g. dropped by the transport).
    local_centers_, local_counts_ : list of ndarray (k_z, d) / (k_z,) or None
        What each device sent.
    communication_ : dict
        ``rounds``, ``bytes_up``, ``bytes_down``, ``bytes_total`` and per-device counts;
        with ``refine_rounds``, ``refine``: the Lloyd rounds run and each one's
        bytes per device (``bytes_up_per_device``, ``bytes_down_per_device``).
    kfed_centers_ : ndarray (k, d)
        The one-shot k-FED centers (``cluster_centers_`` without ``refine_rounds``).
    refine_cost_history_ : list of float
        With ``refine_rounds``: the global k-means cost of the centers each
        Lloyd round broadcast (the first is the k-FED centers' cost).
    run_log_ : RunLog
        Participants, dropped, late, failed and rejected devices; ``warnings``:
        the default server's diagnostic (the answer costs over 1.10 times another
        k-center answer built from the devices' summaries, or one final center
        holds several groups: :mod:`fedclust.kfed.explain`).
    seed_ : int
        The root seed actually used (reproduces the run when ``random_state=None``).
    privacy_ : dict or None
        The budget, the accountant's composed ε and every release (each device
        counts the points it clipped and keeps the count).

    Notes
    -----
    Device z sends ``k_z (d + 1) * 8`` bytes (float64 centers + int64 counts;
    ``k_z (d + 2) * 8`` with the default server's scatter) and receives
    ``k_z * 8`` (its label map; ``k d 8``, the final centers, with the default
    server). Server work: O(Σk_z · k · d) per Lloyd round. For the pooled cost
    at the price of more rounds, ``refine_rounds=r``: each Lloyd round costs a
    device ``k (d + 1) 8 + 8`` bytes up and ``k d 8`` down.
    """

    def __init__(self, n_clusters: int = 8, n_local_clusters: int | Sequence[int] | str = "auto",
                 *, server: str = "weighted-kmeans++", weighted: bool = False,
                 first_device: str | int = "widest", max_iter: int = 300, tol: float = 1e-4,
                 local_max_iter: int = 300, allow_raw_points: bool = False,
                 trim: float = 0.0, privacy: DifferentialPrivacy | None = None,
                 refine_rounds: int = 0, random_state: RandomState = None,
                 progress: bool = False):
        self.n_clusters = n_clusters
        self.n_local_clusters = n_local_clusters
        self.server = server
        self.weighted = weighted
        self.first_device = first_device
        self.max_iter = max_iter
        self.tol = tol
        self.local_max_iter = local_max_iter
        self.allow_raw_points = allow_raw_points
        self.trim = trim
        self.privacy = privacy
        self.refine_rounds = refine_rounds
        self.random_state = random_state
        self.progress = progress

    def _protocol(self, device_ids: Sequence[int], k_locals: Sequence[int] | str,
                  n_features: int | None = None) -> KFedProtocol:
        k_local: int | dict[int, int] | str
        if isinstance(k_locals, str):
            k_local = k_locals
        else:
            k_local = k_locals[0] if len(set(k_locals)) == 1 else dict(zip(device_ids, k_locals))
        kw: dict[str, Any] = dict(
            server=self.server, weighted=self.weighted,
            first_device=self.first_device, max_iter=self.max_iter, tol=self.tol,
            local_max_iter=self.local_max_iter, allow_raw_points=self.allow_raw_points,
            n_features=n_features, trim=self.trim, privacy=self.privacy)
        if check_refine_rounds(self.refine_rounds):
            # registered by fedclust.lloyd (the Lloyd rounds live there)
            return PROTOCOLS[REFINED](self.n_clusters, k_local,
                                      refine_rounds=self.refine_rounds, **kw)
        return KFedProtocol(self.n_clusters, k_local, **kw)

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "KFed":
        """Run k-FED over a federation.

        Parameters
        ----------
        X : sequence or iterator of ndarray (n_z, d), or ndarray (n, d)
            One array per device; or all rows with ``groups``; or one array
            alone, a federation of one device
            (:func:`fedclust.core.estimators.split_federation`). An iterator
            (a generator, a lazy reader of site files) is streamed in process
            when no transport, privacy or ``trim`` is set: only each device's
            centers and counts are kept (memory O(Σ k_z d), not the rows;
            :mod:`fedclust.kfed.stream`), and ``device_labels_`` holds None.
        y : ignored
        groups : array (n,) or None
            Device id of every row of ``X``; ``labels_`` then follows the rows of X.
        device_ids : sequence of int or None
            Names the devices (default 0..Z-1); a device's random stream follows
            its id, so permuting devices together with their ids leaves the
            result unchanged.
        transport : Transport or None
            Default: the in-process simulator.
        """
        from .stream import is_stream

        check_flags(self, "weighted", "allow_raw_points", "progress")
        # a federation held in memory is 10^5 small objects (devices, replies, records),
        # none in a reference cycle: the cyclic collector would only walk them (a stream
        # keeps no per-device objects and may run for many minutes: the collector stays on)
        with nullcontext() if is_stream(X) else cyclic_gc_paused():
            return self._fit(X, groups=groups, device_ids=device_ids, transport=transport)

    def _fit(self, X: Any, *, groups: Any, device_ids: Sequence[int] | None,
             transport: Transport | None) -> "KFed":
        from .stream import is_stream

        refine = check_refine_rounds(self.refine_rounds)
        if refine and self.privacy is not None:
            raise ValidationError(
                "privacy: refine_rounds is not available with privacy: every device would noise "
                "its own local centers, and the private Lloyd rounds need their own start; use "
                "DistributedLloyd(privacy=...)")
        if is_stream(X):
            # a generator / lazy reader: streamed when nothing needs the rows twice
            if (transport is None and groups is None and self.privacy is None
                    and not self.trim and not refine
                    and (isinstance(self.n_local_clusters, (int, np.integer))
                         # the default server's devices size their summary themselves
                         or (self.n_local_clusters == "auto" and self.server in WEIGHTED_SERVERS))):
                return self._fit_stream(X, device_ids)
            X = list(X)
        fed = split_federation(X, groups=groups, device_ids=device_ids)
        devices, device_ids = fed.devices, fed.device_ids
        n_clusters = check_int(self.n_clusters, "n_clusters", min_value=1)
        if device_ids is not None:
            device_ids = [check_int(z, f"device_ids[{i}]", min_value=0)
                          for i, z in enumerate(device_ids)]
        devices = check_devices(devices, ids=device_ids)
        device_ids = check_device_ids(device_ids, len(devices))
        auto = isinstance(self.n_local_clusters, str)
        if auto and self.n_local_clusters != "auto":
            raise ValidationError(f"n_local_clusters={self.n_local_clusters!r} must be 'auto', "
                                  "an int or one int per device")
        sizes = [len(X) for X in devices]
        k_locals = sendable_centers(
            sizes, n_clusters,
            None if auto else check_n_local_clusters(self.n_local_clusters, len(devices)),
            private=self.privacy is not None)
        check_local_clusters(sizes, device_ids, n_clusters, k_locals, auto=auto,
                             private=self.privacy is not None,
                             allow_raw_points=self.allow_raw_points)
        if self.privacy is not None and not isinstance(self.privacy, DifferentialPrivacy):
            raise ValidationError(f"privacy={self.privacy!r} must be a "
                                  "fedclust.privacy.DifferentialPrivacy or None")
        protocol = self._protocol(device_ids, "auto" if auto else k_locals, devices[0].shape[1])
        transport = transport or InProcessTransport(progress=self.progress)
        self.seed_ = root_seed(self.random_state)
        out = run_recorded(self, transport, protocol, dict(zip(device_ids, devices)), self.seed_)
        self._store(out.result, out.device_outputs, out.meter, device_ids)
        self._protocol_ = protocol
        self._unlearning_.trace_of = _downdate_trace   # worked out at the first forget
        self._rows = fed.rows
        self.privacy_ = None
        if protocol.plan is not None:
            # clipping counts stay on the devices
            self.privacy_ = privacy_summary(protocol.plan, out.log)
        return self

    def _fit_stream(self, devices: Any, device_ids: Any) -> "KFed":
        """``fit`` over an iterator of devices: only centers and counts are kept
        (:mod:`fedclust.kfed.stream`); row labels are not (``device_labels_`` holds None)."""
        from .stream import Ragged, fit_stream

        n_clusters = check_int(self.n_clusters, "n_clusters", min_value=1)
        k_local = ("auto" if isinstance(self.n_local_clusters, str) else
                   check_int(self.n_local_clusters, "n_local_clusters", min_value=1))
        protocol = KFedProtocol(
            n_clusters, k_local, server=self.server, weighted=self.weighted,
            first_device=self.first_device, max_iter=self.max_iter, tol=self.tol,
            local_max_iter=self.local_max_iter, allow_raw_points=self.allow_raw_points)
        self.seed_ = root_seed(self.random_state)
        fit = fit_stream(protocol, devices, self.seed_, device_ids=device_ids)
        Z = len(fit.device_ids)
        self.cluster_centers_ = fit.centers
        self.n_features_in_ = fit.centers.shape[1]
        self.device_ids_ = fit.device_ids
        self.device_labels_ = [None] * Z
        self.local_centers_ = Ragged(fit.local_centers, fit.offsets)
        self.local_counts_ = Ragged(fit.local_counts, fit.offsets)
        self.center_labels_ = Ragged(fit.center_labels, fit.offsets)
        up = int(fit.local_centers.nbytes + fit.local_counts.nbytes)
        if protocol.summarise:   # the default server's message also carries each scatter
            up += 8 * len(fit.local_counts)   # (float64; the stream does not keep them)
        down = int(len(fit.center_labels) * 8)
        self.communication_ = {"rounds": 1, "bytes_up": up, "bytes_down": down,
                               "bytes_total": up + down, "messages_up": Z, "messages_down": Z,
                               "n_devices": Z, "n_points": fit.n_points}
        from ..core.protocol import RunLog

        self.run_log_ = RunLog(participants=fit.device_ids)
        self.seed_device_ = fit.seed_device
        self.n_iter_ = fit.n_iter
        self.kfed_centers_ = fit.centers
        self.refine_cost_history_ = []
        self._result = KFedResult(centers=fit.centers, local_centers={}, local_counts={},
                                  center_labels={}, seed_device=fit.seed_device,
                                  n_iter=fit.n_iter, log=self.run_log_)
        self._protocol_ = protocol
        self.privacy_ = None
        return self

    def _store(self, result: KFedResult, outputs, meter, device_ids) -> None:
        self.cluster_centers_ = result.centers
        self.n_features_in_ = result.centers.shape[1]
        self.device_ids_ = list(device_ids)
        try:
            self.device_labels_ = [out.get("labels")
                                   for out in map(outputs.__getitem__, device_ids)]
        except KeyError:   # a device without outputs (dropped, late, failed)
            self.device_labels_ = [outputs[z].get("labels") if z in outputs else None
                                   for z in device_ids]
        self.local_centers_ = list(map(result.local_centers.get, device_ids))
        self.local_counts_ = list(map(result.local_counts.get, device_ids))
        self.center_labels_ = list(map(result.center_labels.get, device_ids))
        self.communication_ = meter.summary()
        self.kfed_centers_ = (result.centers if result.kfed_centers is None
                              else result.kfed_centers)
        self.refine_cost_history_ = list(result.cost_history)
        if check_refine_rounds(self.refine_rounds):
            data = result.centers if result.kfed_centers is None else result.kfed_centers
            per_round = refine_bytes_per_round(*result.centers.shape,
                                               itemsize=data.dtype.itemsize)
            self.communication_["refine"] = {
                "rounds": int(result.refine_rounds),
                "bytes_up_per_device": per_round["up"],
                "bytes_down_per_device": per_round["down"]}
        self.run_log_ = result.log
        self.seed_device_ = result.seed_device
        self.n_iter_ = result.n_iter
        self._result = result

    def _apply_forget(self, out, device_ids) -> None:
        """The model after :meth:`forget` (``fedclust.unlearning``): as ``fit`` stores it."""
        self._store(out.result, out.device_outputs, out.meter, device_ids)
        u = self._unlearning_
        nxt = self.__dict__.pop("_next_trace", None)
        u.trace = nxt
        if nxt is not None:
            nxt.scrub()
        if nxt is None:
            u.trace_of = _downdate_trace

    def _check_remaining(self, u: Any, kept: Any, new_data: dict[int, Any]) -> None:
        """The checks of :meth:`fit` on the federation a forget leaves (the devices' sizes
        from their data where held, else from their kept counts)."""
        proto = u.protocol
        ids = list(kept.device_ids)
        replies = kept.rounds[0].replies if kept.rounds else {}
        sizes = []
        for z in ids:
            X = new_data.get(z, u.data.get(z))
            if X is None and z not in replies:
                return   # a size not known here: the server step decides
            sizes.append(int(replies[z].counts.sum()) if X is None else len(X))
        private = self.privacy is not None
        k_locals = sendable_centers(sizes, proto.n_clusters,
                                    None if proto.auto else [proto.k_local(z) for z in ids],
                                    private=private)
        try:
            check_local_clusters(sizes, ids, proto.n_clusters, k_locals, auto=proto.auto,
                                 private=private, allow_raw_points=proto.allow_raw_points,
                                 raw_check=[z in new_data for z in ids])
        except ValidationError as exc:
            raise ValidationError(f"forget: a fresh fit on what would remain refuses: {exc}; "
                                  "the model is unchanged") from None

    def _downdate(self, u: Any, drop: list[int], kept: Any) -> Any:
        """The paper's server: the result without ``drop`` from the previous one
        (:mod:`fedclust.kfed.downdate`), or None where its step must run in full."""
        if u.trace is None or len(u.store.rounds) != 1:
            return None
        return self._follow_trace(u, u.trace, u.store.rounds[0].replies, drop)

    def _replace(self, u: Any, entering: dict[int, Any], store: Any) -> Any:
        """After row deletions the devices' new summaries enter the server's trace (the
        default server's: :mod:`fedclust.kfed.keyed_rows`; the paper's:
        :mod:`fedclust.kfed.downdate_rows`), or None where its step must run in full."""
        from .downdate import Lloyd1Trace
        from .keyed_trace import KeyedTrace

        tr = u.trace
        if not isinstance(tr, (KeyedTrace, Lloyd1Trace)) or len(store.rounds) != 1:
            return None
        got = self._follow_trace(u, tr, store.rounds[0].replies, [], entering)
        if got is None:
            u.trace = None   # it may hold the new pieces already: traced again when read
        return got

    def _follow_trace(self, u: Any, tr: Any, replies: dict[int, Any], drop: list[int],
                      entering: dict[int, Any] | None = None) -> Any:
        """The server's trace ``tr`` without the devices ``drop`` and with the new
        summaries ``entering``: ``(result, rechecked, exact)``, or None where its step must
        run in full (the trace of the next forget is kept in ``_next_trace``)."""
        from .downdate import downdate
        from .keyed_trace import KeyedTrace
        from .keyed_unlearn import keyed_forget

        forget = keyed_forget if isinstance(tr, KeyedTrace) else downdate
        got = forget(u.protocol, tr, replies, drop, entering)
        if got is None:
            return None
        result, self._next_trace = got
        # the paper server's trace is always a downdate (within 1e-12): it has no flag
        return result, self._next_trace.rechecked, bool(getattr(self._next_trace, "exact",
                                                                False))

    def assign_device(self, X_new: Any, n_local_clusters: int | None = None, *,
                      device_id: int | None = None) -> np.ndarray:
        """Label a device that was absent at fit time, touching no other device.

        The device runs the local step on ``X_new`` (with ``n_local_clusters``,
        default the model's k' or the most common k_z) and its centers are
        mapped to the nearest final centers: O(k_z k d) server work. The device
        is recorded under ``device_id`` (default: a fresh id).

        Returns
        -------
        labels : ndarray (n_new,)
        """
        self._check_fitted()
        X_new = check_array(X_new, "X_new")
        if X_new.shape[1] != self.n_features_in_:
            raise ValidationError(
                f"X_new has {X_new.shape[1]} features but the model was fitted with "
                f"{self.n_features_in_}")
        if n_local_clusters is None:
            k_locals = [len(c) for c in self.local_centers_ if c is not None]
            n_local_clusters = max(set(k_locals), key=k_locals.count)
        k_z = check_int(n_local_clusters, "n_local_clusters", min_value=1)
        if device_id is None:
            device_id = max(self.device_ids_) + 1
        device_id = check_int(device_id, "device_id", min_value=0)
        plan = getattr(self._protocol_, "plan", None)
        proto = KFedProtocol(self.n_clusters, {device_id: k_z}, tol=self.tol,
                             local_max_iter=self.local_max_iter,
                             allow_raw_points=self.allow_raw_points,
                             n_features=self.n_features_in_ if plan else None,
                             privacy=self.privacy if plan else None,
                             noise_multipliers=[r.noise_multiplier for r in plan.releases]
                             if plan else None)

        state: dict[str, np.ndarray] = {}
        reply = proto.client_step(Request(0, "local_centers"), X_new, device_id=device_id,
                                  seed=self.seed_, state=state)
        reply = LocalCenters.from_arrays(reply.to_arrays(), sender=f"device {device_id}")
        mapping = proto.assign_late(self._result, device_id, reply)
        if device_id not in self.device_ids_:
            self.device_ids_.append(device_id)
            self.device_labels_.append(None)
            self.local_centers_.append(None)
            self.local_counts_.append(None)
            self.center_labels_.append(None)
        pos = self.device_ids_.index(device_id)
        labels = mapping[state["local_labels"]]
        if (self._protocol_.server in WEIGHTED_SERVERS
                or self._protocol_.name == REFINED):   # as the fitted devices
            labels = assign_to_centers(X_new.astype(self.cluster_centers_.dtype, copy=False),
                                       self.cluster_centers_)
        self.device_labels_[pos] = labels
        self.local_centers_[pos] = reply.centers
        self.local_counts_[pos] = reply.counts
        self.center_labels_[pos] = mapping
        return labels


def _downdate_trace(u: Any) -> Any:
    """What the paper's server leaves for a downdate (:mod:`fedclust.kfed.downdate`), checked
    against the result it gave; None for another server or where they disagree."""
    from ..unlearning.forget import DOWNDATE_RTOL
    from .downdate import applies, lloyd1_trace
    from .keyed_trace import applies as keyed_applies, best_of, keyed_trace

    if len(u.store.rounds) != 1 or not u.store.complete:
        return None
    if keyed_applies(u.protocol):
        from .keyed import sample_size

        replies = u.store.rounds[0].replies
        if sample_size(sum(len(r.centers) for r in replies.values()),
                       u.protocol.n_clusters) is not None:
            return None   # the starts ran on a coreset: a forget runs the step again
        trace = keyed_trace(u.protocol, replies, u.seed)
        if trace is None:
            return None
        b = best_of(trace.runs)
        if b is None:
            return None
        run = trace.runs[b]
        labels = u.result.center_labels
        if not (np.array_equal(run.cs[-1], np.asarray(u.result.centers)) and np.array_equal(
                np.concatenate([labels[z] for z in trace.ids]), run.A[-1])):
            return None   # the trace does not follow the result
        return trace
    if not applies(u.protocol):
        return None
    trace = lloyd1_trace(u.protocol, u.store.rounds[0].replies)
    if trace is None:
        return None
    centers = np.asarray(u.result.centers)
    again = trace.sums / trace.weights[:, None]
    scale = max(float(np.abs(centers).max(initial=0.0)), 1e-300)
    if again.shape != centers.shape or np.abs(again - centers).max() > DOWNDATE_RTOL * scale:
        return None
    labels = u.result.center_labels
    if not np.array_equal(np.concatenate([labels[z] for z in trace.ids]), trace.labels):
        return None   # a tie broken otherwise: the trace would not follow the result
    return trace
