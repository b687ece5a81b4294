"""The configured algorithm on site data of a known shape: its protocol for the schema the
sites sent, the preprocessing round for that schema, the model of a finished deployed run
(``model.npz``), the sites a simulated run asks. Generic: every family is reached through
the registry (:mod:`fedclust.configured`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from ..configured import build_estimator, capture_run, forget_section, label_kind
from ..core.exceptions import ConfigError, ValidationError
from ..core.protocol import Protocol
from ..core.registry import Federation, get_algorithm

__all__ = ["experiment_part", "protocol_for_schema", "preprocess_protocol", "model_from_run",
           "save_run_model", "present_sites"]


def experiment_part(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What builds the preprocessing's and the algorithm's protocols once a schema is known
    (JSON-ready): with ``[privacy]``, its spec and the preprocessing's public settings."""
    from .preprocess import PREPROCESS_BUDGET_SHARE

    exp = {"algorithm": dict(cfg["algorithm"]), "seed": cfg["seed"],
           "secure_aggregation": bool(cfg.get("simulation", {}).get("secure_aggregation",
                                                                     False))}
    if cfg.get("privacy"):
        opts = dict(cfg.get("preprocess") or {})
        exp["privacy"] = dict(cfg["privacy"])
        exp["preprocess_privacy"] = {
            "budget_share": opts.get("budget_share", PREPROCESS_BUDGET_SHARE),
            "bounds": opts.get("bounds"), "site_rows": opts.get("site_rows")}
    return exp


def preprocess_protocol(exp: Mapping[str, Any], impute: str, scale: str, columns: Any,
                        names: Any = ()) -> Any:
    """The nodes' preprocessing round for a schema's ``columns``: the summed form under
    secure aggregation; with ``exp["privacy"]`` the release ``FederatedPreprocessor`` makes
    in process (the same share of ε, column ranges and ``site_rows``)."""
    from .preprocess import FederatedPreprocessor, PreprocessProtocol

    cols = [str(c) for c in columns]
    kw: dict[str, Any] = {}
    if exp.get("privacy"):
        from ..privacy import DifferentialPrivacy

        pp = exp["preprocess_privacy"]
        kw = FederatedPreprocessor(privacy=DifferentialPrivacy.from_config(exp["privacy"]),
                                   bounds=pp["bounds"], budget_share=pp["budget_share"],
                                   site_rows=pp["site_rows"])._protocol_privacy(len(cols), cols)
    return PreprocessProtocol(len(cols), impute=impute, scale=scale, columns=cols,
                              names=list(names), summed=bool(exp.get("secure_aggregation")),
                              **kw)


def _algorithm_cfg(exp: Mapping[str, Any], n_features: int, probe: bool = False
                   ) -> tuple[dict[str, Any], Any]:
    """(config, preprocessor stand-in) that build the algorithm's estimator: with privacy,
    its budget composed after the preprocessing's release (none for a ``probe``)."""
    from types import SimpleNamespace

    cfg = {"algorithm": dict(exp["algorithm"]), "seed": exp["seed"]}
    plan = None
    if exp.get("privacy"):
        cfg["privacy"] = dict(exp["privacy"])
        if not probe:
            plan = preprocess_protocol(exp, "mean", "standard",
                                       [f"x{j}" for j in range(n_features)]).plan
    return cfg, SimpleNamespace(privacy_plan_=plan)


def _placeholder(n_features: int, sizes: list[int], classes: Any, labels: str,
                 device_ids: Sequence[int] | None = None) -> Federation:
    """Rows of the schema's shape (no site's value): what an estimator validates and shapes
    its protocol from. Every class appears; targets are numbers for ``labels="value"``.
    ``device_ids``: the sites' ids (default: their positions)."""
    rng = np.random.default_rng(0)
    devices = [rng.standard_normal((max(int(n), 1), int(n_features))) for n in sizes]
    ys = None
    if classes is not None and labels == "class":
        ys, start = [], 0
        for X in devices:
            ys.append((start + np.arange(len(X))) % len(classes))
            start += len(X)
    elif labels == "value":
        ys = [rng.standard_normal(len(X)) for X in devices]
    return Federation(devices, ys, "placeholder rows of the sites' schema",
                      device_ids=None if device_ids is None else [int(z) for z in device_ids])


def protocol_for_schema(exp: Mapping[str, Any], n_features: int, sizes: list[int],
                        classes: Any = None, labels: str = "class", probe: bool = False,
                        device_ids: Sequence[int] | None = None) -> Protocol:
    """The protocol the configured estimator builds for sites of this shape.

    ``exp``: ``{"algorithm": {...}, "seed": s, "secure_aggregation": b}``. The
    estimator runs its own validation on placeholder rows (``sizes[z]`` rows of
    ``n_features`` columns; labels covering ``classes``) and its protocol is
    captured before any round: a protocol depends on the data's shape and classes,
    not on its values (tested for every registered algorithm). With
    ``exp["privacy"]`` the estimator's budget is what the preprocessing's release
    leaves (as ``fedclust run``); a ``probe`` (columns not known yet) skips that.
    ``device_ids``: the sites' ids, ``sizes[i]`` the rows of site ``device_ids[i]``
    (default: ids by position).
    """
    cfg, pre = _algorithm_cfg(exp, n_features, probe)
    fed = _placeholder(n_features, sizes, classes, labels, device_ids)
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    model = build_estimator(cfg, pre, classes if labels == "class" else None)
    return capture_run(algorithm, model, fed, bool(exp.get("secure_aggregation", False))).protocol


class _ReplayTransport:
    """Hands a finished run's output to an estimator (its protocol must be the run's)."""

    def __init__(self, out: Any, name: str, config: Mapping[str, Any],
                 secure_aggregation: bool = False):
        self.out, self.name, self.config = out, name, json.loads(json.dumps(config))
        # as the run's transport: an estimator shapes its protocol for secure sums
        self.secure_aggregation = bool(secure_aggregation)

    def run(self, protocol, devices, random_state=None):
        if protocol.name != self.name or json.loads(json.dumps(protocol.config())) != self.config:
            raise ValidationError(f"the run's protocol {self.name!r} is not the one the config's "
                                  "algorithm builds; the model cannot be rebuilt")
        return self.out


def model_from_run(exp: Mapping[str, Any], out: Any, inner_config: Mapping[str, Any],
                   n_features: int, sizes: list[int], classes: Any, labels: str,
                   device_ids: Sequence[int] | None = None) -> Any:
    """``(estimator, placeholder federation)``: the configured estimator fitted from a
    finished run's output (a deployed run), as if it had run it."""
    cfg, pre = _algorithm_cfg(exp, n_features)
    fed = _placeholder(n_features, sizes, classes, labels, device_ids)
    algorithm = get_algorithm(cfg["algorithm"]["name"])
    probe = protocol_for_schema(exp, n_features, sizes, classes, labels,
                                device_ids=device_ids)
    model = build_estimator(cfg, pre, classes if labels == "class" else None)
    algorithm.fit(model, fed, _ReplayTransport(out, probe.name, inner_config,
                                               bool(exp.get("secure_aggregation", False))))
    return model, fed


def save_run_model(out: Any, extra: Mapping[str, Any], directory: Any) -> Any:
    """``directory/model.npz`` of a deployed run on site files (``extra``: the run's
    :meth:`~fedclust.sites.deployed.SitePreprocessProtocol.run_extra`; ``out.summaries``:
    what the server kept of the algorithm's rounds, saved for ``fedclust forget``); None
    when the algorithm registers no export."""
    from pathlib import Path

    from .files_out import save_model
    from .preprocess import FederatedPreprocessor
    from . import SiteSchema

    exp = extra["experiment"]
    algorithm = get_algorithm(exp["algorithm"]["name"])
    if algorithm.export is None:
        return None
    schema = SiteSchema.from_json(extra["schema"])
    p = extra["preprocess"]
    pre = FederatedPreprocessor.from_saved(
        {"mean": np.asarray(p["mean"]), "var": np.asarray(p["var"]),
         "scale": np.asarray(p["scale_"]), "count": np.asarray(p["count"], np.int64),
         "n_rows": np.asarray(p["n_rows"], np.int64)},
        {"impute": p["impute"], "scale": p["scale"], "columns": p["columns"]})
    model, fed = model_from_run(exp, out, extra["inner_config"],
                                len(schema.columns),
                                [int(n) or max(extra["site_rows"]) for n in extra["site_rows"]],
                                schema.classes,
                                extra["labels"], device_ids=extra.get("device_ids"))
    exported = algorithm.export(model, fed)
    if exported is None:
        return None
    return save_model(Path(directory) / "model.npz", exported, algorithm=algorithm.name,
                      preprocessor=pre, schema=schema, sites=extra["sites"],
                      unlearning=forget_section(model, extra["sites"]))

    own = set(SitePreprocessProtocol.reply_types)
    out = copy.copy(out)
    out.summaries = replace(kept, rounds=[r for r in kept.rounds if r.action not in own])
    return out


def present_sites(cfg: Mapping[str, Any], fed: Federation) -> list[int]:
    """Sites that the algorithm's run asks in its first round (not dropped, not late)."""
    sim = cfg.get("simulation", {})
    if not sim.get("dropout") and not sim.get("late"):
        return list(range(len(fed.devices)))
    from ..sim.faults import draw_faults

    # the seed the estimator hands its transport (the faults are drawn from it)
    probe = _placeholder(fed.devices[0].shape[1], [len(X) for X in fed.devices],
                         fed.extra["sites"].schema.classes, label_kind(cfg))
    cap = capture_run(get_algorithm(cfg["algorithm"]["name"]),
                      build_estimator({"algorithm": cfg["algorithm"], "seed": cfg["seed"]}), probe,
                      bool(sim.get("secure_aggregation", False)))
    ids = list(fed.device_ids or range(len(fed.devices)))  # the faults are drawn by id
    absent, late = draw_faults(ids, int(cap.seed),
                               dropout=sim.get("dropout", 0.0), late=sim.get("late", 0.0))
    keep = [i for i, z in enumerate(ids) if z not in absent and z not in late]
    if not keep:
        raise ConfigError("[simulation] drops or delays every site: nothing to preprocess")
    return keep
