"""Distributed noise: DP sums under secure aggregation, noised on the devices.

With central DP the server adds the Gaussian noise to the exact sum, so it
sees that sum. Under secure aggregation (:mod:`fedclust.core.secure_sum`) the
server need not see it: each device clips its own contribution and adds its
share of the noise before masking, and the server unmasks only the noisy sum.

Calibration: the fit's releases are calibrated as in the central case (the
same :func:`~fedclust.privacy.calibrate`, the same ``dp-accounting``
composition), giving a noise std ``σ`` per released coordinate. Each device
adds ``N(0, σ² / n_min)``, ``n_min`` the fewest devices the secure sum may
finish with (:func:`min_noise_devices`: the secure sum's own threshold,
``n − ⌊n/3⌋`` of ``n`` devices, so up to a third may drop out after masking).
Independent Gaussians add: a sum over ``m ≥ n_min`` devices carries noise of
variance ``m σ² / n_min ≥ σ²``, so the (ε, δ) the accountant reports holds.
The server checks ``m ≥ n_min`` from the summed device count and stops the
fit in one line otherwise; each device also refuses to reveal its shares when
the server names fewer survivors than the threshold of its group.

Trust: the guarantee counts the noise of honest devices only. ``c`` devices
that collude with the server (and tell it their noise) leave variance
``(m − c) σ² / n_min``; a server that lies about who dropped out is outside
the honest-but-curious model of :mod:`fedclust.core.secure_sum`. Each device's
own reply carries only ``σ / √n_min`` of noise: without secure aggregation it
would be under-protected, so the protocols refuse a distributed-noise round
that does not arrive as a secure sum.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..core.exceptions import ValidationError
from .accounting import Release

__all__ = ["min_noise_devices", "device_share", "check_noise_devices"]


def min_noise_devices(n_devices: int) -> int:
    """``n_min`` for a round over ``n_devices``: the secure sum's threshold
    ``n − ⌊n/3⌋`` (at least a strict majority), the fewest it finishes with."""
    n = int(n_devices)
    if n < 2:
        raise ValidationError(f"distributed DP noise needs at least 2 devices in a round, got {n}")
    return max(n - n // 3, n // 2 + 1)


def device_share(release: Release, n_min: int) -> Release:
    """The release with one device's share of the noise: std ``σ / √n_min``."""
    return replace(release, noise_multiplier=release.noise_multiplier / math.sqrt(int(n_min)))


def check_noise_devices(replies, n_devices: int, n_min: int, round_index: int) -> None:
    """Stop a distributed-noise round that is not a secure sum of at least ``n_min`` devices.

    ``replies`` is what ``server_step`` got; ``n_devices`` the summed device count.
    """
    from ..core.secure_sum import SUMMED

    if list(replies) != [SUMMED]:
        raise ValidationError(
            f"round {round_index}: distributed DP noise needs secure aggregation (each device "
            f"adds 1/sqrt({n_min}) of the noise), but the replies arrived one by one; run it "
            "with secure_aggregation=True")
    if int(n_devices) < int(n_min):
        raise ValidationError(
            f"round {round_index}: the secure sum holds {int(n_devices)} devices' noise, fewer "
            f"than the {int(n_min)} the distributed DP noise is calibrated to; the release "
            "would be under-noised")
