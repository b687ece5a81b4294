"""The k-means baselines every clustering family is measured against: centralized
k-means on the pooled data, and naive distributed Lloyd (many rounds) on the same
transport as the method under test."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from sklearn.base import BaseEstimator, ClusterMixin

from ..core.checkpoint import privacy_summary
from ..core.estimators import CenterEstimatorMixin, split_federation
from ..core.random import RandomState, root_seed
from ..privacy import DifferentialPrivacy
from ..privacy.distributed import min_noise_devices
from ..core.validation import check_device_ids, check_devices, check_flags, check_int
from ..core.exceptions import ValidationError
from .protocol import DistributedLloydProtocol, private_start
from ..core.protocol import Transport
from ..sim.transport import fit_transport
from ..unlearning.forget import ForgetMixin, run_recorded

__all__ = ["centralized_kmeans", "DistributedLloyd"]


def centralized_kmeans(devices: Sequence[Any], n_clusters: int, *, n_init: int = 1,
                       random_state: RandomState = None, max_iter: int = 300):
    """scikit-learn ``KMeans`` (Lloyd, k-means++) on the pooled data of all devices.

    Returns the fitted ``sklearn.cluster.KMeans``; its labels are in device order.
    """
    from sklearn.cluster import KMeans

    devices = check_devices(devices)
    X = np.concatenate(devices)
    k = check_int(n_clusters, "n_clusters", min_value=1, max_value=len(X))
    seed = root_seed(random_state) % (2**32)
    return KMeans(k, n_init=n_init, algorithm="lloyd", max_iter=max_iter,
                  random_state=seed).fit(X)


class DistributedLloyd(ForgetMixin, CenterEstimatorMixin, ClusterMixin, BaseEstimator):
    """Distributed Lloyd as an estimator, optionally differentially private
    (see :mod:`fedclust.lloyd.protocol`).

    Parameters
    ----------
    n_clusters : int
    points_per_device : int or None
        ``init="sample"``: raw points each device sends to seed k-means++
        (default: enough for about 20 k points in all).
    max_rounds : int or None
        Lloyd rounds at most (default 100; under privacy exactly this many run
        and each is a release: by default 3 after the moments start and 2
        after the box start, see :func:`~fedclust.lloyd.protocol.private_start`).
    tol : float
        Relative cost-improvement tolerance (not used under privacy).
    init : {"sample", "candidates", "box", "kfed"}, ndarray (k, d) or None
        Raw-point sample + k-means++ (default without privacy), the
        private-capable moments + candidates initialisation (no raw point
        leaves a device), the box start (3k data-independent candidates
        spread over the cube inscribed in the data ball, no moments; without
        privacy the cube [-1, 1]^d), or one k-FED round (each device's k local
        centers, grouped by k-FED's default server; refused under privacy, see
        :mod:`fedclust.lloyd.protocol`). ``init="kfed"`` with ``max_rounds=r``
        is k-FED refined by r Lloyd rounds. An array of k centers is the
        start itself, as in scikit-learn's ``KMeans(init=array)``: no start
        round, the first Lloyd round broadcasts them (refused under privacy:
        a start outside the fit is not in its release plan; without privacy,
        r rounds from centers C give scikit-learn's ``KMeans(init=C,
        n_init=1, max_iter=r)`` on the pooled rows). With privacy the default picks the
        moments or the box start from n, k, d and ε
        (:func:`~fedclust.lloyd.protocol.private_start`; the federation's size
        n is treated as public).
    rounds : int or None
        Alias of ``max_rounds``; give at most one of them.
    privacy : DifferentialPrivacy or None
        Central (ε, δ)-DP over the whole fit (needs ``data_bound``; ``clip_norm``
        too at ``unit="device"``): the server adds Gaussian noise to the sums of
        the moments, candidate and Lloyd replies; see ``docs/privacy.md``.
    random_state : int, Generator or None
        Seeds everything but the privacy noise.
    secure_aggregation : bool or SecureAggregation, default=False
        Sum each Lloyd round's per-cluster sums, counts and costs by secure
        aggregation (:mod:`fedclust.core.secure_sum`): the server learns only
        their totals, to ``2**-20`` fixed-point precision per device; so are
        the candidate initialisation's moments and candidate sums. The
        ``"sample"`` seeding round (raw points) and the ``"kfed"`` round (local
        centers) are sent as before. With ``privacy`` the devices add the
        Gaussian noise (distributed noise, :mod:`fedclust.privacy.distributed`):
        each adds ``σ/√n_min`` of it, ``n_min = n − ⌊n/3⌋`` for ``n`` devices,
        and the server sees only noisy sums. Each secure round costs 3 extra
        exchanges and O(n_devices) key material per device.

    Attributes
    ----------
    cluster_centers_ : ndarray (k, d)
    labels_ : ndarray (n,)
        Every point's cluster (device order, or the row order of X with ``groups``).
    device_labels_ : list of ndarray (n_z,) or None
    cost_history_, n_rounds_, communication_
    privacy_ : dict or None
        epsilon, delta, unit, accountant, epsilon_spent (the accountant's
        composed ε), every release (what, sensitivity, noise multiplier and
        std). Each device counts the points it clipped and keeps the count.

    Notes
    -----
    Init ``candidates`` costs each device ``(d² + d + 1) 8`` bytes up once and
    ``M (d + 1) 8`` once; init ``kfed`` ``k (d + 1) 8`` once (float64 data); every Lloyd round ``k (d + 1) 8 + 8`` up, ``k d 8`` down.
    """

    def __init__(self, n_clusters: int = 8, *, points_per_device: int | None = None,
                 max_rounds: int | None = None, tol: float = 1e-4,
                 init: str | np.ndarray | None = None,
                 privacy: DifferentialPrivacy | None = None, random_state: RandomState = None,
                 progress: bool = False, secure_aggregation: Any = False,
                 rounds: int | None = None):
        self.n_clusters = n_clusters
        self.rounds = rounds
        self.points_per_device = points_per_device
        self.max_rounds = max_rounds
        self.tol = tol
        self.init = init
        self.privacy = privacy
        self.random_state = random_state
        self.progress = progress
        self.secure_aggregation = secure_aggregation

    def _apply_forget(self, out: Any, device_ids: Sequence[int]) -> None:
        """The model after :meth:`forget` (``fedclust.unlearning``): every Lloyd round depends
        on every device, so a forget asks every device again (a recorded retrain)."""
        res = out.result
        self.cluster_centers_ = res.centers
        self.cost_history_ = res.cost_history
        self.n_rounds_ = len(self._unlearning_.store.rounds)
        self.converged_ = res.converged
        self.device_ids_ = list(device_ids)
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels") for z in device_ids]
        self.run_log_ = out.log

    def _forget_protocol(self, u: Any, kept: Any, new_data: dict) -> Any:
        """The default ``points_per_device`` follows the number of devices, as in ``fit``."""
        if self.points_per_device is not None:
            return u.protocol
        ppd = max(1, math.ceil(20 * u.protocol.n_clusters / len(kept.device_ids)))
        if ppd == u.protocol.points_per_device:
            return u.protocol
        return type(u.protocol).from_config({**u.protocol.config(), "points_per_device": ppd})

    def fit(self, X: Any, y: None = None, *, groups: Any = None,
            device_ids: Sequence[int] | None = None,
            transport: Transport | None = None) -> "DistributedLloyd":
        """Run Lloyd over a federation; ``X``, ``groups``, ``device_ids`` and ``transport``
        as in :meth:`fedclust.KFed.fit`."""
        check_flags(self, "progress")
        fed = split_federation(X, groups=groups, device_ids=device_ids)
        ids = None if fed.device_ids is None else [
            check_int(z, f"device_ids[{i}]", min_value=0) for i, z in enumerate(fed.device_ids)]
        devices = check_devices(fed.devices, ids=ids)
        ids = check_device_ids(ids, len(devices))
        k = check_int(self.n_clusters, "n_clusters", min_value=1)
        total = sum(len(X) for X in devices)
        if total < k:
            raise ValidationError(f"the federation has {total} points for n_clusters={k}")
        ppd = self.points_per_device
        if ppd is None:
            ppd = max(1, math.ceil(20 * k / len(devices)))
        if self.privacy is not None and not isinstance(self.privacy, DifferentialPrivacy):
            raise ValidationError(f"privacy={self.privacy!r} must be a "
                                  "fedclust.privacy.DifferentialPrivacy or None")
        rounds = self.max_rounds
        if self.rounds is not None:
            if rounds is not None:
                raise ValidationError(f"rounds={self.rounds!r} and max_rounds={rounds!r} are the "
                                      "same setting; give one of them")
            rounds = self.rounds
        given = self.init is not None and not isinstance(self.init, str)
        init, auto_rounds = (self.init if given else self.init or "sample"), 100
        if self.privacy is not None and not given:   # a given start: the protocol refuses it
            # the federation's size is public here (as is δ, picked from it)
            start, auto_rounds = private_start(total, k, devices[0].shape[1], self.privacy)
            init = self.init or start
            if self.init is not None and self.init != start:
                auto_rounds = 2 if init == "box" else 3
        if rounds is None:
            rounds = auto_rounds
        transport = fit_transport(transport, self.secure_aggregation, self.progress)
        # under secure aggregation the devices add the DP noise (the server sees noisy sums)
        noise_devices = (min_noise_devices(len(devices)) if self.privacy is not None
                         and getattr(transport, "secure_aggregation", False) else 0)
        protocol = DistributedLloydProtocol(k, points_per_device=ppd, max_rounds=rounds,
                                            tol=self.tol, init=init, privacy=self.privacy,
                                            n_features=devices[0].shape[1],
                                            noise_devices=noise_devices)
        self.seed_ = root_seed(self.random_state)
        out = run_recorded(self, transport, protocol, dict(zip(ids, devices)), self.seed_)
        res = out.result
        self.cluster_centers_ = res.centers
        self.cost_history_ = res.cost_history
        self.n_rounds_ = out.meter.rounds
        self.converged_ = res.converged
        self.n_features_in_ = devices[0].shape[1]
        self.device_ids_ = ids
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels") for z in ids]
        self._rows = fed.rows
        self.communication_ = out.meter.summary()
        self.run_log_ = out.log
        self.privacy_ = None
        if protocol.plan is not None:
            # clipping counts stay on the devices
            self.privacy_ = privacy_summary(protocol.plan, out.log)
        return self
