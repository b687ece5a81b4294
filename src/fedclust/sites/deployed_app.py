"""A deployed app's protocol and sites from its config alone (``fedclust flower app``):
:class:`~fedclust.sites.deployed.SitePreprocessProtocol` around the configured algorithm's
protocol, and the site files' paths keyed by their device ids (no file is read).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ..core.exceptions import ConfigError, ValidationError
from ..core.protocol import Protocol
from .deployed import SitePreprocessProtocol

__all__ = ["deployed_protocol"]


def deployed_protocol(cfg: Mapping[str, Any], request: Any, count_sites: bool
                      ) -> tuple[Protocol, dict[int, Any], int]:
    """``(protocol, devices, seed)`` of a deployed app on site files, from the config alone.

    ``request``: the ``[data]`` table's :class:`~fedclust.sites.schema_round.SchemaRequest`.
    The protocol is :class:`SitePreprocessProtocol` around the configured algorithm's
    protocol; ``devices`` are the site files' paths when ``count_sites`` (no file is read).
    """
    from dataclasses import replace as dc_replace

    from ..configured import label_kind
    from .algorithm import experiment_part, preprocess_protocol, protocol_for_schema

    opts = dict(cfg.get("preprocess") or {})
    kind = label_kind(cfg)
    exp = experiment_part(cfg)
    if exp.get("privacy"):
        _check_private_preprocess(exp)
    # the algorithm's protocol for a placeholder schema: its name, supervision, summed rounds
    probe = protocol_for_schema(exp, max(1, len(request.features or ())) + 1, [512, 512],
                                (0, 1) if request.label else None, kind, probe=True)
    labels = "none" if not probe.supervised or request.label is None else kind
    if probe.supervised and request.label is None:
        raise ConfigError(f"[algorithm] {cfg['algorithm']['name']!r} needs labels: set "
                          "[data] label = \"<column>\"")
    summed = sorted(set(getattr(probe, "summed_actions", ()))
                    | set(preprocess_protocol({"secure_aggregation": exp["secure_aggregation"]},
                                              "mean", "standard", ["x"]).summed_actions))
    request = dc_replace(request, labels=labels)
    if exp.get("privacy"):   # no category or label set leaves a site: the config's public ones
        try:
            request = request.public()
        except ValidationError as exc:
            raise ConfigError(str(exc)) from None
    site_ids = str(cfg["data"].get("site_ids", "position"))
    protocol = SitePreprocessProtocol(
        probe.name, json.dumps(exp), json.dumps(request.to_json()),
        opts.get("impute", "mean"), opts.get("scale", "standard"), bool(probe.supervised),
        summed, site_ids)
    devices: dict[int, Any] = {}
    if count_sites:
        from ..core.random import named_device_ids
        from . import site_paths

        try:
            paths = site_paths(cfg["data"])
        except ValidationError as exc:
            raise ValidationError(f"{exc} (the app reads no site file: pass --min-nodes N "
                                  "when the files are not on this machine)") from None
        # a site file's name is its stem (read_table), the name its id is drawn from
        ids = (named_device_ids([_stem(p) for p in paths]) if site_ids == "name"
               else range(len(paths)))
        devices = dict(zip(ids, paths))
    return protocol, devices, int(cfg["seed"])


def _stem(path: str) -> str:
    """A site file's name as :func:`fedclust.sites.read_table` gives it (nothing is read)."""
    from pathlib import Path

    from .files_in import file_stem

    return file_stem(Path(path))


def _check_private_preprocess(exp: Mapping[str, Any]) -> None:
    """One line at app writing for what the nodes' private preprocessing round lacks."""
    from .algorithm import preprocess_protocol

    pp = exp["preprocess_privacy"]
    if pp["bounds"] is None:
        raise ConfigError("[preprocess] needs bounds = [[low, high], ...] (a public range "
                          "per column) under [privacy]: the preprocessing round is private too")
    if exp["privacy"].get("unit") == "device" and pp["site_rows"] is None:
        raise ConfigError("[preprocess] needs site_rows = N (the most rows one site may "
                          "weigh, a public number) under [privacy] unit = \"device\": the "
                          "preprocessing round hides whole sites too")
    try:
        preprocess_protocol(exp, "mean", "standard",
                            [f"x{j}" for j in range(len(pp["bounds"]))])
    except ValidationError as exc:
        raise ConfigError(f"[preprocess] {exc}") from None
