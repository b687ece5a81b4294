"""The configured estimator: what ``[algorithm]`` (and ``[privacy]``) of a config builds.

Below both :mod:`fedclust.experiment` and the site wing (:mod:`fedclust.sites`):
each builds the registered front-door estimator of a config here, and captures the
protocol that estimator would run (its own validation included) without running a
round. Every family is reached through :mod:`fedclust.core.registry`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from .core.protocol import Protocol
from .core.registry import Algorithm, Federation, get_algorithm

__all__ = ["build_estimator", "label_kind", "Captured", "CaptureTransport", "capture_run",
           "forget_section", "register_forget_section"]


def build_estimator(cfg: Mapping[str, Any], preprocessor: Any = None,
                    site_classes: Any = None) -> Any:
    """The registered front-door estimator of ``cfg['algorithm']``, seeded by ``cfg['seed']``.

    After a private ``preprocessor``, the estimator's privacy carries its
    release as ``prior``: the accountant composes both within ``[privacy]``'s ε.
    ``site_classes``: the site schema's classes (the sites' rows carry their
    indices); an estimator that takes ``classes`` gets those indices, so its
    label set is the schema's (public under privacy), not the labels seen.
    """
    params = dict(cfg["algorithm"])
    algorithm = get_algorithm(params.pop("name"))
    if site_classes is not None and "classes" not in params and \
            "classes" in inspect.signature(algorithm.estimator).parameters:
        params["classes"] = list(range(len(site_classes)))
    if cfg.get("privacy"):
        from .privacy import DifferentialPrivacy

        params["privacy"] = DifferentialPrivacy.from_config(cfg["privacy"])
        plan = getattr(preprocessor, "privacy_plan_", None)
        if plan is not None:
            params["privacy"] = params["privacy"].after(plan)
    return algorithm.estimator(**params, random_state=cfg["seed"])


def label_kind(cfg: Mapping[str, Any]) -> str:
    """How the algorithm of ``cfg`` takes site labels: ``"class"`` or ``"value"``."""
    kind = get_algorithm(cfg["algorithm"]["name"]).label_kind
    if callable(kind):
        kind = kind({k: v for k, v in cfg["algorithm"].items() if k != "name"})
    return kind


class Captured(Exception):
    """Raised by :class:`CaptureTransport` to stop the estimator before its first round."""


class CaptureTransport:
    """A transport that records what the estimator would run, and stops it.

    ``secure_aggregation`` mirrors the config's, so an estimator that shapes its
    protocol for secure sums (FedAvg) builds the protocol the deployment runs.
    After :meth:`run`: ``protocol``, ``devices`` (what the estimator handed it)
    and ``seed``.
    """

    def __init__(self, secure_aggregation: bool = False):
        self.secure_aggregation = secure_aggregation
        self.protocol: Protocol | None = None
        self.devices: dict[int, Any] = {}
        self.seed: Any = None

    def run(self, protocol: Protocol, devices: Mapping[int, Any], random_state: Any = None):
        self.protocol, self.devices, self.seed = protocol, dict(devices), random_state
        raise Captured


def capture_run(algorithm: Algorithm, estimator: Any, federation: Federation,
                secure_aggregation: bool = False) -> CaptureTransport:
    """Fit ``estimator`` on ``federation`` up to its first round: the capture holds the
    protocol, the device data and the seed it would have run."""
    cap = CaptureTransport(secure_aggregation)
    try:
        algorithm.fit(estimator, federation, cap)
    except Captured:
        return cap
    raise RuntimeError(f"algorithm {algorithm.name!r} finished without running a protocol")


#: what builds a saved model's section for ``fedclust forget``; the unlearning wing, which
#: sits above this module, registers :func:`fedclust.unlearning.saved.saved_section` here
#: when it is imported (every family's estimator imports it)
_FORGET_SECTION: list[Callable[[Any, Any], Any]] = []


def register_forget_section(builder: Callable[[Any, Any], Any]) -> None:
    """Set the builder :func:`forget_section` calls (the unlearning wing's)."""
    _FORGET_SECTION[:] = [builder]


def forget_section(model: Any, site_names: Any = ()) -> Any:
    """What a saved ``model.npz`` keeps so that ``fedclust forget`` can drop a site from
    a fitted configured estimator: :func:`fedclust.unlearning.saved.saved_section`
    (``None``: nothing kept, e.g. secure aggregation)."""
    if not _FORGET_SECTION:
        raise RuntimeError("fedclust.unlearning is not imported: nothing registered the "
                           "builder of a saved model's forget section")
    return _FORGET_SECTION[0](model, site_names)
