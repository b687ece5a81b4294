"""Run one configured experiment (see :mod:`fedclust.config`) and report it.

Used by ``fedclust run`` / ``fedclust demo``, the Flower deploy path and the
benchmarks: build the federation, fit the registered algorithm on a transport,
run the baselines it asks for on the same federation, report the metrics, and
return a JSON-ready dict. Every family-specific step goes through
:mod:`fedclust.core.registry`; nothing here names a family.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .core.exceptions import ConfigError
from .core.protocol import Protocol
from .core.registry import BASELINES, Federation, get_algorithm, get_data_source
from .sim.transport import InProcessTransport

__all__ = ["Federation", "Experiment", "build_federation", "build_estimator", "build_protocol",
           "make_transport", "run_experiment", "TRANSPORTS"]

TRANSPORTS = ("inprocess", "flower")


@dataclass
class Experiment:
    """``result`` is what ``result.json`` holds; ``model`` the fitted estimator."""

    result: dict[str, Any]
    model: Any
    federation: Federation


def build_federation(cfg: Mapping[str, Any]) -> Federation:
    """The devices (and true labels) described by ``cfg['data']`` and ``cfg['partition']``."""
    from .sim.partition import apply_partition, partition

    seed = cfg["seed"]
    data = dict(cfg["data"])
    source = get_data_source(data.pop("source"))
    if source.federated:
        return source.build(seed, **data)
    n_samples = data.pop("n_samples", None)
    X, y = source.build(seed, **data)
    if n_samples is not None and n_samples < len(X):
        keep = np.sort(np.random.default_rng(seed).choice(len(X), size=int(n_samples),
                                                          replace=False))
        X, y = X[keep], y[keep]
    part = dict(cfg["partition"])
    kind = part.pop("kind")
    n_devices = part.pop("n_devices")
    parts = partition(kind, X, y, n_devices, random_state=seed, **part)
    devices, labels = apply_partition(X, y, parts)
    return Federation(devices, labels,
                      f"{source.name} ({len(X)} points, {kind} over {n_devices} devices)")


def build_estimator(cfg: Mapping[str, Any]) -> Any:
    """The registered front-door estimator of ``cfg['algorithm']``, seeded by ``cfg['seed']``."""
    params = dict(cfg["algorithm"])
    algorithm = get_algorithm(params.pop("name"))
    return algorithm.estimator(**params, random_state=cfg["seed"])


def make_transport(cfg: Mapping[str, Any], transport: str = "inprocess", *,
                   n_devices: int | None = None):
    """The transport named ``transport`` with the faults of ``cfg['simulation']``.

    ``byzantine = α`` makes a fraction α of the devices (ids 0..n_devices-1,
    drawn from the seed) lie on the wire with ``attack`` / ``attack_scale``
    (:class:`fedclust.sim.byzantine.ByzantineTamper`), on either transport.
    """
    sim = cfg.get("simulation", {})
    kw = dict(dropout=sim.get("dropout", 0.0), late=sim.get("late", 0.0),
              secure_aggregation=bool(sim.get("secure_aggregation", False)))
    alpha = sim.get("byzantine", 0.0)
    tamper = None
    if alpha:
        from .sim.byzantine import ByzantineTamper

        tamper = ByzantineTamper(range(n_devices or 0), alpha, cfg["seed"],
                                 attack=sim.get("attack", "large-norm"),
                                 scale=sim.get("attack_scale", 100.0))
    elif {"attack", "attack_scale"} & set(sim):
        raise ConfigError("[simulation] attack/attack_scale need byzantine = <fraction> > 0")
    if transport == "inprocess":
        return InProcessTransport(progress=bool(sim.get("progress", False)), tamper=tamper, **kw)
    from .flower.transport import FlowerSimulationTransport  # optional extra

    return FlowerSimulationTransport(tamper=tamper, **kw)


class _Captured(Exception):
    pass


class _CaptureTransport:
    """A transport that records what the estimator would run, and stops it.

    ``secure_aggregation`` mirrors the config's, so an estimator that shapes its
    protocol for secure sums (FedAvg) builds the protocol the deployment runs.
    """

    def __init__(self, secure_aggregation: bool = False):
        self.secure_aggregation = secure_aggregation

    def run(self, protocol, devices, random_state=None):
        self.protocol, self.devices, self.seed = protocol, dict(devices), random_state
        raise _Captured


def build_protocol(cfg: Mapping[str, Any], federation: Federation | None = None
                   ) -> tuple[Protocol, dict[int, Any], int]:
    """The protocol, device data and seed that ``fedclust run`` would run for ``cfg``.

    Goes through the registered estimator and its validation (the estimator's
    ``fit`` hands its protocol to the transport, which is captured here), so a
    deployed run is the in-process run. Device data is ``X`` or ``(X, y)``.
    """
    fed = federation or build_federation(cfg)
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    cap = _CaptureTransport(bool(cfg.get("simulation", {}).get("secure_aggregation", False)))
    try:
        algorithm.fit(build_estimator(cfg), fed, cap)
    except _Captured:
        return cap.protocol, cap.devices, int(cap.seed)
    raise RuntimeError(f"algorithm {algorithm.name!r} finished without running a protocol")


def run_experiment(cfg: Mapping[str, Any], *, transport: str = "inprocess",
                   federation: Federation | None = None) -> Experiment:
    """Run ``cfg`` (already checked by :func:`fedclust.config.check_config`)."""
    fed = federation or build_federation(cfg)
    seed = cfg["seed"]
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    model = build_estimator(cfg)
    t0 = time.perf_counter()
    wire = make_transport(cfg, transport, n_devices=len(fed.devices))
    algorithm.fit(model, fed, wire)
    fit_time = time.perf_counter() - t0
    n_points = sum(len(X) for X in fed.devices)
    out: dict[str, Any] = {
        "title": cfg.get("title", ""),
        "federation": fed.description,
        "algorithm": algorithm.name,
        "transport": transport,
        "seed": seed,
        "n_devices": len(fed.devices),
        "n_points": int(n_points),
        "n_features": int(fed.devices[0].shape[1]),
        **algorithm.result_fields(model),
        "metrics": algorithm.report(model, fed, cfg),
        "communication": _comm(model.communication_, len(fed.devices)),
        "run_log": {k: v for k, v in vars(model.run_log_).items()},
        "byzantine": list(getattr(getattr(wire, "tamper", None), "byzantine", [])),
        "time_s": {"fit": fit_time},
        "baselines": {},
        "config": dict(cfg),
    }
    for name, on in cfg.get("baselines", {}).items():
        if on:
            out["baselines"][name] = BASELINES[name].run(fed, cfg)
    ref = out["baselines"].get("centralized", {}).get("kmeans_cost")
    if ref and "kmeans_cost" in out["metrics"]:
        out["metrics"]["cost_ratio_vs_centralized"] = out["metrics"]["kmeans_cost"] / ref
        for entry in out["baselines"].values():
            if "kmeans_cost" in entry:
                entry["cost_ratio_vs_centralized"] = entry["kmeans_cost"] / ref
    return Experiment(out, model, fed)


def _comm(summary: dict[str, Any], n_devices: int) -> dict[str, Any]:
    # Per-device counts are kept for small federations only, so result.json stays small.
    if n_devices > 1000:
        summary = {k: v for k, v in summary.items() if k != "per_device"}
    return summary
