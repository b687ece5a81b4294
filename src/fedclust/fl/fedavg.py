"""FedAvg's protocol (:class:`FedAvgProtocol`): one global model on the rounds of
:class:`fedclust.fl.protocol.FLProtocol`, plain, as secure sums, or as distributed DP-FedAvg.

McMahan et al. 2017 (FedAvg); McMahan et al., ICLR 2018 (DP-FedAvg).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..core.exceptions import ValidationError
from ..core.messages import Message
from ..core.protocol import Request
from ..core.validation import check_choice, check_int
from ..kfed.messages import LocalCenters
from ..privacy import noise_rng
from ..privacy.distributed import check_noise_devices, device_share
from ..privacy.mechanisms import DEVICE, clip_contribution, gaussian
from .messages import LossReport, ModelUpdate, NoisyUpdate, SummedUpdate
from .protocol import KFED, LOSS, POISSON_KEY, TRAIN, FLProtocol
from .server import KFED_SERVERS

__all__ = ["FedAvgProtocol"]


class FedAvgProtocol(FLProtocol):
    """FedAvg (McMahan et al. 2017): one global model; selection random / pow-d / kfed-pow-d.

    ``kfed-pow-d`` first runs one k-FED round (``n_clusters``, ``n_local_clusters``;
    server step ``kfed_server`` as in :class:`ClusteredFedAvgProtocol`, default
    ``"kmeans++"``) whose clusters filter the power-of-choice candidates.
    """

    name = "fedavg"
    reply_types = {TRAIN: ModelUpdate, LOSS: LossReport, KFED: LocalCenters}
    _EXTRA_KEYS = ("n_clusters", "n_local_clusters", "kfed_server", "secure_sum", "noise_devices")

    def _init_extra(self, n_clusters: int = 1, n_local_clusters: int = 1,
                    kfed_server: str = "kmeans++", secure_sum: bool = False,
                    noise_devices: int = 0) -> None:
        self.n_clusters = check_int(n_clusters, "n_clusters", min_value=1)
        self.n_local_clusters = check_int(n_local_clusters, "n_local_clusters", min_value=1)
        self.kfed_server = check_choice(kfed_server, "kfed_server", KFED_SERVERS)
        self.secure_sum = bool(secure_sum)
        self.noise_devices = check_int(noise_devices, "noise_devices", min_value=0)
        if self.noise_devices and not (self.secure_sum and self.privacy is not None):
            raise ValidationError("noise_devices (distributed DP noise) needs privacy and "
                                  "secure_sum=True")
        if self.secure_sum:
            # training replies become SummedUpdate: the server only adds them up, so a
            # transport with secure aggregation can hand it their sum alone
            if self.aggregator != "mean":
                raise ValidationError(
                    f"secure aggregation needs aggregator='mean', got {self.aggregator!r}: a "
                    "trimmed mean or median needs each device's update")
            if self.privacy is not None and not self.noise_devices:
                raise ValidationError(
                    "secure aggregation with privacy= needs the distributed noise "
                    "(noise_devices=n_min: each device clips its update and adds its share of "
                    "the noise); central DP-FedAvg clips each update on the server")
            self.summed_actions = frozenset({TRAIN})
            self.reply_types = {**type(self).reply_types,
                                TRAIN: NoisyUpdate if self.noise_devices else SummedUpdate}

    def _train(self, request, X, y, *, device_id, seed, state) -> Message:
        u = self._local(request.payload.params, X, y, device_id, seed, request.round)
        if not self.secure_sum:
            return u
        if self.noise_devices:
            # a device trains whether or not its coin picks it, so its reply time tells nothing
            sampled = self._device_coin(device_id, request.round)
            return self._noisy_update(u.params - request.payload.params, device_id,
                                      request.round, sampled)
        n = int(u.n_samples)
        w = float(n) if self.weighted else 1.0
        return SummedUpdate(weighted_params=u.params * w, weight=np.float64(w),
                            loss_sum=np.float64(float(u.loss) * n), n_samples=np.int64(n),
                            n_devices=np.int64(1))

    def _device_coin(self, device_id: int, round_index: int) -> bool:
        """Whether this device takes part in this round: its own secret Poisson coin of
        probability ``sampling``, from its privacy-noise source (never the server's)."""
        if self.sampling >= 1.0:
            return True
        coin = noise_rng(self.privacy.noise_seed, DEVICE, device_id, POISSON_KEY + round_index)
        return bool(coin.random() < self.sampling)

    def _noisy_update(self, delta: np.ndarray, device_id: int, round_index: int,
                      sampled: bool = True) -> NoisyUpdate:
        """Distributed DP-FedAvg: the clipped update and count 1 (zeros when this device's
        coin left it out of the round), each plus this device's share of the noise central
        DP-FedAvg adds to the sums (std σ/√n_min)."""
        C = float(self.privacy.clip_norm)
        (delta,), _ = clip_contribution([delta], [1.0], C)
        if not sampled:
            delta = np.zeros_like(delta)
        std = device_share(self.plan.releases[0], self.noise_devices).noise_std
        count = 1.0 if sampled else 0.0
        if std > 0:
            rng = noise_rng(self.privacy.noise_seed, DEVICE, device_id, round_index)
            delta = gaussian(delta, std, rng)
            count = float(gaussian(np.float64(count), std / C, rng))
        return NoisyUpdate(delta=np.asarray(delta, np.float64), count=np.float64(count),
                           n_devices=np.int64(1))

    @staticmethod
    def _total(replies: Mapping[int, Message]) -> SummedUpdate:
        ids = sorted(replies)
        return SummedUpdate(**{f: sum(getattr(replies[z], f) for z in ids)
                               for f in SummedUpdate.schema})

    def _aggregate(self, replies: Mapping[int, Message], previous: np.ndarray,
                   round_index: int = 0) -> np.ndarray:
        if not self.secure_sum:
            return super()._aggregate(replies, previous, round_index)
        tot = self._total(replies)
        if float(tot.weight) <= 0:
            return np.array(previous, dtype=np.float64, copy=True)
        return (tot.weighted_params / float(tot.weight))[None, :].astype(np.float64)

    def _train_step(self, state, request: Request, replies: Mapping[int, Message]) -> None:
        if not self.secure_sum:
            return super()._train_step(state, request, replies)
        if not replies:
            return
        if self.noise_devices:
            return self._noisy_train_step(state, request, replies)
        state.models = self._aggregate(replies, state.models, request.round)
        tot = self._total(replies)
        state.acc["loss"] += float(tot.loss_sum)
        state.acc["n"] += int(tot.n_samples)
        state.acc["dev"] += int(tot.n_devices)

    def _noisy_train_step(self, state, request: Request, replies: Mapping[int, Message]) -> None:
        """Distributed DP-FedAvg's server step: the (already noisy) sums, as the central one."""
        ids = sorted(replies)
        delta = sum(replies[z].delta for z in ids)
        count = float(sum(float(replies[z].count) for z in ids))
        n_dev = sum(int(replies[z].n_devices) for z in ids)
        check_noise_devices(replies, n_dev, self.noise_devices, request.round)
        std = self.plan.releases[0].noise_std
        if count > max(1.0, 3.0 * std / float(self.privacy.clip_norm)):
            state.models = state.models + (delta / count)[None, :]
        state.acc["dev"] += n_dev
