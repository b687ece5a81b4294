"""Distributed Lloyd's device side: what a device computes for each round of
:class:`fedclust.lloyd.protocol.DistributedLloydProtocol`.

Each round's reply is computed on the device's own rows (clipped to ``data_bound``
under privacy); with distributed noise (``noise_devices``) the device adds its share of
the round's Gaussian noise before the reply is masked and summed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..core.exceptions import ValidationError
from ..core.kmeans import assign
from ..core.messages import Message
from ..core.protocol import Request
from ..core.random import device_rng
from ..kfed.local import local_kmeans
from ..kfed.messages import LocalCenters
from ..privacy import clip_points, noise_rng
from ..privacy import kmeans as pk
from ..privacy.distributed import device_share
from ..privacy.mechanisms import DEVICE
from .messages import ClusterSums, Moments, NoisyClusterSums, NoisyMoments, PointSample

if TYPE_CHECKING:
    from ..privacy import DifferentialPrivacy, PrivacyPlan

__all__ = ["LloydDeviceSteps"]


class LloydDeviceSteps:
    """The device steps of distributed Lloyd, mixed into its protocol (which holds the
    settings they read: ``n_clusters``, ``points_per_device``, ``privacy``, ``plan``,
    ``noise_devices`` and the round rules ``_release``, ``_radius``, ``_spread_round``)."""

    n_clusters: int
    points_per_device: int
    privacy: DifferentialPrivacy | None
    plan: PrivacyPlan | None
    noise_devices: int
    summed_actions: frozenset[str]

    def _device_noise(self, msg: Message, request: Request, device_id: int) -> Message:
        """Distributed noise: this device's share of the round's Gaussian noise."""
        action, round_index = request.action, request.round
        rel = device_share(self._release(round_index, action), self.noise_devices)
        rng = noise_rng(self.privacy.noise_seed, DEVICE, device_id, round_index)
        B = float(self.privacy.data_bound)
        one = np.asarray(1, np.int64)
        if action == "moments":
            n, s, Q = pk.noisy_moments(msg.n, msg.s, msg.Q, rel, B, rng)
            return NoisyMoments(n=np.asarray(n, np.float64), s=s, Q=Q, n_devices=one)
        cost = np.asarray(msg.cost, np.float64)
        if action == "candidates" and self._relative_candidates:
            coords = request.payload.coords
            sums, counts = pk.noisy_relative_sums(
                msg.sums.astype(np.float64), msg.counts.astype(np.float64), rel,
                pk.box_radius(len(coords), coords.shape[1], B), B, rng)
        elif action == "lloyd" and self.noisy:
            sums, counts = pk.noisy_relative_sums(
                msg.sums.astype(np.float64), msg.counts.astype(np.float64), rel,
                self._radius(request.payload), B, rng)
            if self._spread_round(round_index):
                spread = device_share(self.plan.release(pk.SPREAD), self.noise_devices)
                cost = np.asarray(pk.gaussian(cost, spread.noise_std, rng), np.float64)
        else:
            sums, counts = pk.noisy_cluster_sums(msg.sums.astype(np.float64),
                                                 msg.counts.astype(np.float64), rel, B, rng)
        return NoisyClusterSums(sums=sums, counts=counts, cost=cost, n_devices=one)


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
            return self._device_noise(reply, request, device_id)
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
            if self._relative_candidates:
                coords = p.coords.astype(np.float64)
                r = pk.box_radius(len(coords), coords.shape[1], float(spec.data_bound))
                sums, counts, _, _ = pk.relative_sums(self._clipped(X, state), coords, r, spec)
                return ClusterSums(sums=sums, counts=counts, cost=np.asarray(0.0))
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
            if spec.private:    # trust-radius round: relative sums (and the spread once)
                sums, counts, spread, _ = pk.relative_sums(
                    Xc, C, self._radius(request.payload), spec,
                    spread=self._spread_round(request.round))
                return ClusterSums(sums=sums, counts=counts, cost=np.asarray(spread))
            sums, counts, _ = pk.cluster_sums(Xc, labels, k, spec)
            return ClusterSums(sums=sums, counts=counts, cost=np.asarray(float(mind.sum())))
        raise ValidationError(f"distributed Lloyd has no client action {request.action!r}")

    def _kfed_step(self, X: np.ndarray, device_id: int, seed: int,
                   state: dict[str, np.ndarray]) -> LocalCenters:
        """k-FED's device step with k local clusters (no privacy: refused at construction)."""
        rng = device_rng(seed, device_id, 0)
        return local_kmeans(X, self.n_clusters, rng, device=f"device {device_id}").message

    def client_finish(self, message: Message | None, X: np.ndarray,
                      state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if message is None:
            return {}
        out = {"labels": assign(X, message.centers.astype(X.dtype, copy=False))[0]}
        if "n_clipped" in state:
            out["n_clipped"] = state["n_clipped"]
        return out
