"""Differential privacy for the federated families (cross-cutting layer).

* :class:`DifferentialPrivacy` — the user's request: total (ε, δ), the unit
  of privacy (a point or a whole device), the user's bounds, the accountant.
* :func:`calibrate` — a fit's declared :class:`Release` list -> noise scales,
  composed with ``dp-accounting`` (PLD or RDP) within the total budget.
* :mod:`~fedclust.privacy.mechanisms` — clipping and discrete Gaussian noise on
  a fixed grid, from OpenDP's cryptographic sampler (never the run's ``random_state``).
* :mod:`~fedclust.privacy.audit` — an empirical lower bound on the ε a fit spends
  (neighbouring datasets, many fits, Clopper–Pearson).
* :mod:`~fedclust.privacy.kmeans` — the private moments and candidate
  initialisation shared by the k-means families.
* :mod:`~fedclust.privacy.columns` — the private column moments of the
  federated preprocessing (public per-column ranges).
* :meth:`DifferentialPrivacy.after` — the budget left to a fit that follows
  another on the same data (the accountant composes both).

A wing declares its releases and calls these; it never draws privacy noise
from its own random streams. See ``docs/privacy.md`` for each family's
mechanism, guarantee and trust model.
"""

from .audit import AuditResult, empirical_epsilon, public_statistics
from .accounting import (MAX_NOISE_MULTIPLIER, PrivacyPlan, Release, calibrate, composed_epsilon,
                         planned)
from .mechanisms import (SecureNoise, clip_contribution, clip_points, gaussian, noise_rng,
                         symmetric_gaussian)
from .spec import DifferentialPrivacy, UNITS
from ..core.exceptions import ValidationError

__all__ = ["DifferentialPrivacy", "privacy_config", "pop_privacy", "Release", "PrivacyPlan", "calibrate", "planned", "composed_epsilon",
           "clip_points", "clip_contribution", "noise_rng", "gaussian", "symmetric_gaussian", "SecureNoise",
           "UNITS", "MAX_NOISE_MULTIPLIER", "refuse_privacy", "empirical_epsilon",
           "public_statistics", "AuditResult"]


def privacy_config(privacy: "DifferentialPrivacy", plan: "PrivacyPlan | None" = None) -> dict:
    """A protocol's privacy as config keys (``privacy_*``, and the calibrated
    ``noise_multipliers`` of ``plan``): what a Flower client rebuilds it from."""
    cfg = {f"privacy_{key}": v for key, v in privacy.to_config().items()}
    if plan is not None:
        cfg["noise_multipliers"] = [r.noise_multiplier for r in plan.releases]
    return cfg


def pop_privacy(cfg: dict) -> "DifferentialPrivacy | None":
    """Remove the ``privacy_*`` keys :func:`privacy_config` wrote from ``cfg``; the privacy
    they describe, or None."""
    priv = {key[len("privacy_"):]: cfg.pop(key) for key in list(cfg) if key.startswith("privacy_")}
    return DifferentialPrivacy.from_config(priv) if priv else None


def refuse_privacy(privacy: object, family: str, missing: str) -> None:
    """One-line refusal for a family without differential privacy yet."""
    if privacy is not None:
        raise ValidationError(f"privacy: {family} has no differentially private version yet "
                              f"({missing}); pass privacy=None")
