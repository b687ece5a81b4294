"""The composition of Gaussian releases, computed by ``dp-accounting``.

Below both the privacy wing (:mod:`fedclust.privacy.accounting`, which calibrates
noise against it) and the core's own ledgers (:mod:`fedclust.core.checkpoint`,
:mod:`fedclust.core.policy`, which count what a run or a device has spent).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

__all__ = ["composed_epsilon", "prior_releases"]

_PLD_DISCRETIZATION = 1e-3   # pessimistic either way; 1e-4 is 5-10x slower for <0.01 % of ε


def _dp_accounting():
    try:
        import dp_accounting
    except ImportError:  # pragma: no cover - the extra is part of dev installs
        raise ImportError("differential privacy needs the accountant: "
                          "pip install 'fedclust[privacy]' (dp-accounting)") from None
    return dp_accounting


def _event(multipliers: tuple[tuple[float, int, float], ...]):
    dp_accounting = _dp_accounting()

    def one(z: float, q: float):
        g = dp_accounting.GaussianDpEvent(z)
        return g if q >= 1.0 else dp_accounting.PoissonSampledDpEvent(q, g)

    events = [one(z, q) if n == 1 else dp_accounting.SelfComposedDpEvent(one(z, q), n)
              for z, n, q in multipliers]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


@lru_cache(maxsize=4096)
def _epsilon(multipliers: tuple[tuple[float, int, float], ...], delta: float,
             accountant: str) -> float:
    _dp_accounting()
    from dp_accounting import pld, rdp

    acc = (pld.PLDAccountant(value_discretization_interval=_PLD_DISCRETIZATION)
           if accountant == "pld" else rdp.RdpAccountant())
    acc.compose(_event(multipliers))
    return float(acc.get_epsilon(delta))


def composed_epsilon(multipliers: Sequence[tuple], delta: float,
                     accountant: str = "pld") -> float:
    """ε at ``delta`` of Gaussian mechanisms ``(noise multiplier, repeats)`` or
    ``(noise multiplier, repeats, Poisson sampling probability)`` composed by
    ``dp-accounting`` (PLD, pessimistic estimate, or RDP)."""
    key = tuple((float(m[0]), int(m[1]), float(m[2]) if len(m) > 2 else 1.0)
                for m in multipliers if m[1] > 0)
    return _epsilon(key, float(delta), accountant)


def prior_releases(spec: Any) -> tuple[tuple[float, int, float], ...]:
    """The fixed (multiplier, repeats, sampling) of the releases made before this fit
    (``spec``: a :class:`fedclust.privacy.DifferentialPrivacy`; its ``prior``)."""
    return tuple((mult, reps, q) for _, _, reps, mult, q in spec.prior if mult > 0 and reps > 0)
