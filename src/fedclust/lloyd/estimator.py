"""The k-means baselines every clustering family is measured against: centralized
k-means on the pooled data, and naive distributed Lloyd (many rounds) on the same
transport as the method under test."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..core.random import RandomState, root_seed
from ..core.validation import check_devices, check_int
from ..core.exceptions import ValidationError
from ..core.secure_sum import SecureAggregation
from .protocol import DistributedLloydProtocol
from ..core.protocol import Transport
from ..sim.transport import InProcessTransport

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


class DistributedLloyd:
    """Naive distributed Lloyd as an estimator (see :mod:`fedclust.lloyd.protocol`).

    Parameters
    ----------
    n_clusters : int
    points_per_device : int or None
        Raw points each device sends to seed k-means++ (default: enough for
        about 20 k points in all).
    max_rounds, tol : int, float
        Lloyd rounds and relative cost-improvement tolerance.
    random_state : int, Generator or None
    secure_aggregation : bool or SecureAggregation, default=False
        Sum each Lloyd round's per-cluster sums, counts and costs by secure
        aggregation (:mod:`fedclust.core.secure_sum`): the server learns only
        their totals, to ``2**-20`` fixed-point precision per device. The
        seeding round (a sample of raw points) is sent as before. Each secure
        round costs 3 extra exchanges and O(n_devices) key material per device.

    Attributes
    ----------
    cluster_centers_, device_labels_, cost_history_, n_rounds_, communication_
    """

    def __init__(self, n_clusters: int = 8, *, points_per_device: int | None = None,
                 max_rounds: int = 100, tol: float = 1e-4, random_state: RandomState = None,
                 progress: bool = False, secure_aggregation: Any = False):
        self.n_clusters = n_clusters
        self.points_per_device = points_per_device
        self.max_rounds = max_rounds
        self.tol = tol
        self.random_state = random_state
        self.progress = progress
        self.secure_aggregation = secure_aggregation

    def fit(self, devices: Sequence[Any], y: None = None, *,
            transport: Transport | None = None) -> "DistributedLloyd":
        devices = check_devices(devices)
        k = check_int(self.n_clusters, "n_clusters", min_value=1)
        total = sum(len(X) for X in devices)
        if total < k:
            raise ValidationError(f"the federation has {total} points for n_clusters={k}")
        ppd = self.points_per_device
        if ppd is None:
            ppd = max(1, math.ceil(20 * k / len(devices)))
        protocol = DistributedLloydProtocol(k, points_per_device=ppd,
                                            max_rounds=self.max_rounds, tol=self.tol)
        secure = SecureAggregation.coerce(self.secure_aggregation)
        if transport is None:
            transport = InProcessTransport(progress=self.progress, secure_aggregation=secure or False)
        elif secure is not None and not getattr(transport, "secure_aggregation", False):
            raise ValidationError(
                "secure_aggregation=True but the given transport has secure_aggregation off: "
                "pass secure_aggregation=True to the transport too")
        self.seed_ = root_seed(self.random_state)
        out = transport.run(protocol, dict(enumerate(devices)), self.seed_)
        res = out.result
        self.cluster_centers_ = res.centers
        self.cost_history_ = res.cost_history
        self.n_rounds_ = out.meter.rounds
        self.converged_ = res.converged
        self.device_labels_ = [out.device_outputs.get(z, {}).get("labels")
                               for z in range(len(devices))]
        self.communication_ = out.meter.summary()
        self.run_log_ = out.log
        return self
