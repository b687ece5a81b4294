"""The user's privacy request: :class:`DifferentialPrivacy`.

It holds what the user decides (the budget, the unit of privacy, the bounds)
and nothing the data would tell: DP never looks at the data to set its own
bound. Estimators take it as ``privacy=`` and hand it to
:func:`fedclust.privacy.calibrate` with the releases their fit declares.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from ..core.exceptions import ValidationError

__all__ = ["DifferentialPrivacy", "UNITS", "ACCOUNTANTS", "privacy_config_keys"]

UNITS = ("point", "device")
ACCOUNTANTS = ("pld", "rdp")


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValidationError(f"privacy: {name}={value!r} must be a real number")
    return float(value)


@dataclass(frozen=True)
class DifferentialPrivacy:
    """(ε, δ)-differential privacy for a whole fit, accounted with ``dp-accounting``.

    Parameters
    ----------
    epsilon : float > 0 or ``math.inf``
        Total ε over every release of the fit (rounds, restarts, probes).
        ``math.inf`` runs the same mechanisms with no noise (a reference, no privacy).
    delta : float in (0, 1)
        Total δ; pick it well below 1 / (number of points or devices).
    unit : {"point", "device"}
        What is protected: one data point (record) of a device, or all the
        data of one device (a whole hospital or phone).
    data_bound : float > 0, optional
        Every point is clipped to Euclidean norm ``data_bound`` around the
        origin before any statistic is computed (needed by the clustering
        families). It is the user's bound: DP never peeks at the data to set
        it; centre the data with public knowledge of its domain first. Each
        device counts the points it clipped and keeps the count (its ``n_clipped``
        output); it is not released.
    clip_norm : float > 0, optional
        ``unit="device"``: bound on the norm of one device's contribution. For
        the clustering families it is in data units (a device weighs at most
        as much as ``clip_norm / data_bound`` points of maximal norm); for the
        federated-learning families it bounds the L2 norm of a model update.
    noise_seed : int, optional
        Seeds the privacy noise, for tests and reproduction only: with a
        known seed the noise can be subtracted and **the guarantee is void**.
        By default the noise comes from the operating system's entropy,
        never from ``random_state``.
    accountant : {"pld", "rdp"}
        Privacy-loss-distribution (tight) or Rényi accountant of ``dp-accounting``.
    prior : tuple of (what, sensitivity, repeats, noise multiplier[, sampling]), optional
        Releases already made on the same data within the same total budget
        (e.g. by a private :class:`~fedclust.sites.preprocess.FederatedPreprocessor`
        before the algorithm; see :meth:`after`). The accountant composes them
        with this fit's releases, so ``epsilon`` stays the total of the run.

    Examples
    --------
    >>> dp = DifferentialPrivacy(epsilon=1.0, delta=1e-6, data_bound=10.0)
    """

    epsilon: float
    delta: float
    unit: str = "point"
    data_bound: float | None = None
    clip_norm: float | None = None
    noise_seed: int | None = None
    accountant: str = "pld"
    prior: tuple = ()

    def __post_init__(self) -> None:
        eps = _real(self.epsilon, "epsilon")
        if not eps > 0 or math.isnan(eps):
            raise ValidationError(f"privacy: epsilon={self.epsilon!r} must be > 0 "
                                  "(math.inf for no privacy)")
        delta = _real(self.delta, "delta")
        if not 0.0 < delta < 1.0:
            raise ValidationError(f"privacy: delta={self.delta!r} must be in (0, 1)")
        if self.unit not in UNITS:
            raise ValidationError(f"privacy: unit={self.unit!r} is unknown; use one of {UNITS}")
        if self.accountant not in ACCOUNTANTS:
            raise ValidationError(
                f"privacy: accountant={self.accountant!r} is unknown; use one of {ACCOUNTANTS}")
        for name in ("data_bound", "clip_norm"):
            v = getattr(self, name)
            if v is not None:
                f = _real(v, name)
                if not (f > 0 and math.isfinite(f)):
                    raise ValidationError(f"privacy: {name}={v!r} must be a finite number > 0")
        if self.noise_seed is not None and (
                isinstance(self.noise_seed, bool) or not isinstance(self.noise_seed, numbers.Integral)
                or self.noise_seed < 0):
            raise ValidationError(f"privacy: noise_seed={self.noise_seed!r} must be an int >= 0")
        prior = []
        for r in self.prior:
            try:
                what, sens, reps, mult, *q = r
                q = float(q[0]) if len(q) == 1 else (1.0 if not q else math.nan)
                if not 0.0 < q <= 1.0:
                    raise ValueError
                prior.append((str(what), float(sens), int(reps), float(mult), q))
            except (TypeError, ValueError):
                raise ValidationError(f"privacy: prior release {r!r} must be (what, sensitivity, "
                                      "repeats, noise multiplier[, sampling in (0, 1]])") from None
        object.__setattr__(self, "prior", tuple(prior))

    def after(self, plan: Any) -> "DifferentialPrivacy":
        """The same request with ``plan``'s calibrated releases (and their priors) as
        :attr:`prior`: what a fit that follows ``plan`` on the same data has left."""
        done = tuple((r.what, r.sensitivity, r.repeats, r.noise_multiplier, r.sampling)
                     for r in plan.releases)
        return replace(self, prior=tuple(plan.spec.prior) + done)

    @property
    def private(self) -> bool:
        """False for ε = ∞ (mechanisms run without noise)."""
        return math.isfinite(self.epsilon)

    def require(self, *, data_bound: bool = False, clip_norm: bool = False,
                family: str = "this estimator") -> None:
        """Raise one line when a bound the family needs is missing."""
        if data_bound and self.data_bound is None:
            raise ValidationError(
                f"privacy: {family} needs data_bound (the norm every point is clipped to); "
                "got None")
        if clip_norm and self.clip_norm is None:
            raise ValidationError(
                f"privacy: {family} with unit={self.unit!r} needs clip_norm (the bound on one "
                "device's contribution); got None")

    def to_config(self) -> dict[str, Any]:
        """Scalars for a protocol config (``inf`` travels as a string)."""
        cfg: dict[str, Any] = {"epsilon": "inf" if not self.private else float(self.epsilon),
                               "delta": float(self.delta), "unit": self.unit,
                               "accountant": self.accountant}
        for name in ("data_bound", "clip_norm", "noise_seed"):
            if getattr(self, name) is not None:
                cfg[name] = getattr(self, name)
        if self.prior:  # one string: configs travel as scalars and flat lists
            cfg["prior"] = json.dumps([list(r) for r in self.prior])
        return cfg

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "DifferentialPrivacy":
        cfg = dict(cfg)
        if isinstance(cfg.get("epsilon"), str) and cfg["epsilon"].lower() in ("inf", "infinity"):
            cfg["epsilon"] = math.inf
        if isinstance(cfg.get("prior"), str):
            cfg["prior"] = tuple(tuple(r) for r in json.loads(cfg["prior"]))
        unknown = set(cfg) - set(privacy_config_keys())
        if unknown:
            raise ValidationError(f"privacy: unknown key(s) {sorted(unknown)}")
        if "epsilon" not in cfg or "delta" not in cfg:
            raise ValidationError("privacy: epsilon and delta are required")
        return cls(**cfg)


#: a ``[privacy]`` key's line in ``fedclust run --help`` (one per field of the class)
_CONFIG_HELP = {
    "epsilon": "<float> > 0 (required), the total ε of the run, preprocessing included; "
               "\"inf\" runs the mechanisms without noise",
    "delta": "<float> in (0, 1) (required), the total δ",
    "unit": " | ".join(f'"{u}"' for u in UNITS) + ": one record, or all of one device's data",
    "data_bound": "<float> > 0, the norm every point is clipped to (clustering families)",
    "clip_norm": "<float> > 0, the bound on one device's contribution (unit = \"device\")",
    "noise_seed": "<int> >= 0, seeds the noise: tests only, the guarantee is void",
    "accountant": " | ".join(f'"{a}"' for a in ACCOUNTANTS) + " (dp-accounting's PLD or RDP)",
    "prior": "releases already made within the budget (JSON list; written by fedclust "
             "itself when a preprocessing round spent part of ε)",
}


def privacy_config_keys() -> dict[str, str]:
    """The keys a ``[privacy]`` table accepts, the fields of :class:`DifferentialPrivacy`,
    each with its line of ``fedclust run --help``."""
    return {f.name: _CONFIG_HELP[f.name] for f in fields(DifferentialPrivacy)}
