"""Calibration: from a total (ε, δ) and a fit's declared releases to noise scales.

A wing declares what a fit releases (:class:`Release`: what, its L2
sensitivity under the unit of privacy, how many times, its share of the
budget). :func:`calibrate` finds one noise scale ``z`` such that release ``i``
gets the Gaussian noise multiplier ``z / sqrt(share_i)`` and the composition
of every release, computed by ``dp-accounting`` (privacy-loss distributions,
pessimistic, or Rényi DP), stays within the requested ε at the requested δ.
The composition itself is never computed here: only a bisection over ``z``.

Gaussian mechanism with multiplier z: release ``f(D) + N(0, (z Δ)^2 I)`` for
a statistic of L2 sensitivity Δ (Dwork & Roth 2014; the accountant's
``GaussianDpEvent``). A release computed over a Poisson sample of the units
(each included independently with probability q, the draw kept secret) is
the accountant's ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``:
amplification by subsampling, computed by ``dp-accounting`` too. Balle & Wang (ICML 2018) give the exact single-release
(ε, δ) curve the tests compare with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..core.composition import composed_epsilon, prior_releases
from ..core.exceptions import ValidationError
from .spec import DifferentialPrivacy

__all__ = ["Release", "PrivacyPlan", "calibrate", "planned", "composed_epsilon",
           "MAX_NOISE_MULTIPLIER"]

#: beyond this noise multiplier (noise std / sensitivity) a release carries no
#: usable signal for federations below ~10^7 points per cluster; a budget
#: needing more is refused as too small
MAX_NOISE_MULTIPLIER = 1000.0
_MIN_MULTIPLIER = 0.25


@dataclass(frozen=True)
class Release:
    """One kind of release of a fit.

    Parameters
    ----------
    what : str
        What is released, e.g. ``"lloyd round: per-cluster sums and counts"``.
    sensitivity : float
        L2 sensitivity Δ under the unit of privacy (add/remove one point or device).
    repeats : int
        How many times it is released (rounds); each is one Gaussian mechanism.
    share : float
        Relative budget weight: the noise multiplier is ``z / sqrt(share)``.
    noise_multiplier : float
        Filled by :func:`calibrate` (0 for ε = ∞).
    sampling : float in (0, 1]
        Poisson sampling probability of the units (devices or points) that
        take part in each repeat; 1 = all of them. Valid only when the sample
        is drawn at random and kept secret from whoever sees the releases.
    """

    what: str
    sensitivity: float
    repeats: int = 1
    share: float = 1.0
    noise_multiplier: float = math.nan
    sampling: float = 1.0

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on every released coordinate (``z Δ``)."""
        return self.noise_multiplier * self.sensitivity

    def as_dict(self) -> dict[str, Any]:
        out = {"what": self.what, "sensitivity": self.sensitivity, "repeats": self.repeats,
               "noise_multiplier": self.noise_multiplier, "noise_std": self.noise_std}
        if self.sampling < 1.0:
            out["sampling"] = self.sampling
        return out


@dataclass(frozen=True)
class PrivacyPlan:
    """A calibrated request: the user's :class:`DifferentialPrivacy` and its releases."""

    spec: DifferentialPrivacy
    releases: tuple[Release, ...] = field(default_factory=tuple)
    epsilon_spent: float = 0.0

    @property
    def prior(self) -> tuple[Release, ...]:
        """The releases made before this fit (``spec.prior``), calibrated already."""
        return tuple(Release(what, sens, reps, 1.0, mult, q)
                     for what, sens, reps, mult, q in self.spec.prior)

    def release(self, what_prefix: str) -> Release:
        """The release whose ``what`` starts with ``what_prefix``."""
        for r in self.releases:
            if r.what.startswith(what_prefix):
                return r
        raise KeyError(what_prefix)

    def summary(self) -> dict[str, Any]:
        """What an estimator stores as ``privacy_`` (before adding the clipping counts)."""
        s = self.spec
        return {"epsilon": s.epsilon, "delta": s.delta, "unit": s.unit,
                "accountant": s.accountant, "epsilon_spent": self.epsilon_spent,
                "data_bound": s.data_bound, "clip_norm": s.clip_norm,
                "noise_seeded": s.noise_seed is not None,
                "releases": [r.as_dict() for r in self.prior + self.releases]}


def _multipliers(releases: Sequence[Release], z: float) -> tuple[tuple[float, int, float], ...]:
    return tuple((z / math.sqrt(r.share), r.repeats, r.sampling) for r in releases)


def planned(spec: DifferentialPrivacy, releases: Sequence[Release],
            multipliers: Sequence[float] | None = None, *, family: str = "this fit"
            ) -> PrivacyPlan:
    """:func:`calibrate`, or, for a protocol rebuilt from its config, the plan with the
    noise multipliers that config carries (calibrated once, on the server)."""
    if multipliers is None:
        return calibrate(spec, releases, family=family)
    out = tuple(replace(r, noise_multiplier=float(z)) for r, z in zip(releases, multipliers))
    spent = 0.0
    if spec.private:
        if any(not r.noise_multiplier > 0 for r in out if r.repeats > 0):
            raise ValidationError(f"privacy: {family} was given a release without noise at "
                                  f"epsilon={spec.epsilon:g}")
        spent = composed_epsilon(prior_releases(spec) + tuple((r.noise_multiplier, r.repeats, r.sampling)
                                                      for r in out), spec.delta, spec.accountant)
    return PrivacyPlan(spec, out, spent)


def calibrate(spec: DifferentialPrivacy, releases: Sequence[Release], *,
              family: str = "this fit") -> PrivacyPlan:
    """Noise multipliers for ``releases`` so that their composition is (ε, δ)-DP.

    Bisection over one scale ``z`` (relative precision 1e-3) keeping the
    upper end, so the composed ε reported by the accountant never exceeds
    ``spec.epsilon``. The releases of ``spec.prior`` (made earlier in the
    run, their noise fixed) are composed with ``releases``. Raises
    :class:`ValidationError` naming the smallest ε that works when the budget
    would need a multiplier above :data:`MAX_NOISE_MULTIPLIER`.
    """
    releases = tuple(releases)
    for r in releases:
        if (not (r.sensitivity > 0 and math.isfinite(r.sensitivity)) or r.repeats < 0
                or r.share <= 0 or not 0.0 < r.sampling <= 1.0):
            raise ValidationError(f"privacy: bad release declaration {r}")
    if spec.private and any(not mult > 0 for _, _, reps, mult, _ in spec.prior if reps > 0):
        raise ValidationError("privacy: a prior release without noise (made at epsilon=inf) "
                              f"cannot be composed into epsilon={spec.epsilon:g}")
    if not spec.private or not releases:
        spent = (composed_epsilon(prior_releases(spec), spec.delta, spec.accountant)
                 if spec.private and prior_releases(spec) else 0.0)
        return PrivacyPlan(spec, tuple(replace(r, noise_multiplier=0.0) for r in releases), spent)
    eps, delta, acc = float(spec.epsilon), float(spec.delta), spec.accountant
    prior = prior_releases(spec)
    f = lambda z: composed_epsilon(prior + _multipliers(releases, z), delta, acc)  # noqa: E731
    z_max = MAX_NOISE_MULTIPLIER * math.sqrt(min(r.share for r in releases))
    n_releases = sum(r.repeats for r in releases)
    eps_min = f(z_max)
    if eps_min > eps:
        raise ValidationError(
            f"privacy: epsilon={eps:g} is too small for the {n_releases} releases of {family}"
            f"{' after the earlier releases of the run' if prior else ''} "
            f"(the noise would exceed {MAX_NOISE_MULTIPLIER:g} x the sensitivity); the smallest "
            f"epsilon that works is {eps_min:.4g} (or declare fewer rounds)")
    # bracket [lo, hi] with f(lo) > eps >= f(hi); multipliers below _MIN_MULTIPLIER are
    # never used (the accountant's grids explode there and ε is beyond ~100 anyway)
    lo, hi = _MIN_MULTIPLIER, 1.0
    if f(hi) > eps:
        while f(hi) > eps:
            lo, hi = hi, min(hi * 2.0, z_max)
    else:
        while hi / 2.0 >= _MIN_MULTIPLIER and f(hi / 2.0) <= eps:
            hi = hi / 2.0
        lo = max(hi / 2.0, _MIN_MULTIPLIER)
        if lo == hi:
            return PrivacyPlan(spec, tuple(replace(r, noise_multiplier=z) for r, (z, _, _) in
                                           zip(releases, _multipliers(releases, hi))), f(hi))
    while hi / lo > 1.0 + 1e-3:
        mid = math.sqrt(lo * hi)
        if f(mid) > eps:
            lo = mid
        else:
            hi = mid
    mult = _multipliers(releases, hi)
    out = tuple(replace(r, noise_multiplier=z) for r, (z, _, _) in zip(releases, mult))
    return PrivacyPlan(spec, out, f(hi))
