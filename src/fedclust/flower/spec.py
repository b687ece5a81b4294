"""What a fedclust ServerApp runs (:class:`ServerSpec`) and how it fails (:class:`ServerAppFailed`).

No Flower object here but the run config it reads: the server loop is
:mod:`fedclust.flower.server`, the apps :mod:`fedclust.flower.apps`.
"""


from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


from ..core.exceptions import FedClustError, ValidationError
from ..core.protocol import Protocol
from ..core.secure_sum import SecureAggregation


__all__ = ["ServerSpec", "ServerAppFailed", "one_line_cause", "confine_result_dir"]


class ServerAppFailed(FedClustError):
    """The fedclust ServerApp stopped; the text is the one-line cause.

    Raised out of the ServerApp so that Flower marks the run ``finished:failed``
    with this text as its status details (``flwr ls --run-id N``), which
    ``fedclust flower run`` turns into a non-zero exit. ``original`` is the
    exception that stopped the run (re-raised by in-process callers).
    """

    def __init__(self, cause: str, original: BaseException | None = None):
        super().__init__(cause)
        self.original = original


def one_line_cause(exc: BaseException) -> str:
    """``Type: text`` of an exception on one line (fedclust errors: just the text)."""
    text = " ".join(str(exc).split()) or "(no message)"
    return text if isinstance(exc, FedClustError) else f"{type(exc).__name__}: {text}"


@dataclass
class ServerSpec:
    """Everything the ServerApp needs; from code or from ``[tool.flwr.app.config]``.

    Parameters
    ----------
    protocol, protocol_config : str, dict
        Registry name and :meth:`Protocol.config` of the protocol to run.
    seed : int
        Root seed of the run (devices derive their streams from it and their id).
    dropout, late, dropped, late_devices
        Simulated faults, drawn from the seed exactly as by ``InProcessTransport``.
    min_nodes : int
        SuperNodes to wait for before starting (at most ``node_wait_s`` seconds;
        then the run goes on with the nodes that are there). A resumed run also waits
        up to ``node_wait_s`` for the checkpoint's devices that missed its hello.
    round_timeout_s : float or None
        How long a round waits for replies; missing ones are failed devices.
    result_dir : str or None
        Where the ServerApp writes ``result.npz`` / ``result.json`` (or ``error.json``).
    collect_outputs : bool
        Send device outputs (point labels) back to the server after the run.
    resume : bool
        Continue the run checkpointed in ``result_dir/checkpoint`` after its last
        complete round (:mod:`fedclust.flower.recovery`); a ServerApp with a
        ``result_dir`` writes that checkpoint after every round.
    secure_aggregation : bool
        Run the protocol's summed rounds as secure sums
        (:mod:`fedclust.core.secure_sum`); ``secagg_frac_bits`` and
        ``secagg_neighbors`` (0: every other device) are its settings.
    """

    protocol: str
    protocol_config: dict[str, Any]
    seed: int = 0
    dropout: float = 0.0
    late: float = 0.0
    dropped: list[int] = field(default_factory=list)
    late_devices: list[int] = field(default_factory=list)
    min_nodes: int = 1
    node_wait_s: float = 120.0
    round_timeout_s: float | None = 600.0
    result_dir: str | None = None
    collect_outputs: bool = False
    secure_aggregation: bool = False
    secagg_frac_bits: int = 20
    secagg_neighbors: int = 0
    secagg_signed: bool = False
    #: edges ``[u, v]`` (device ids) of a communication graph: the server then only
    #: relays messages between neighbours (:mod:`fedclust.flower.relay`); empty: a star
    graph_edges: list[list[int]] = field(default_factory=list)
    resume: bool = False

    def secure_settings(self) -> SecureAggregation | None:
        if not self.secure_aggregation:
            return None
        return SecureAggregation(int(self.secagg_frac_bits), int(self.secagg_neighbors) or None,
                                 bool(self.secagg_signed))

    @classmethod
    def for_protocol(cls, protocol: Protocol, seed: int, **kw: Any) -> "ServerSpec":
        return cls(protocol.name, dict(protocol.config()), int(seed), **kw)

    # Flower run configs hold only bool/int/float/str: lists travel as JSON text.
    def to_run_config(self) -> dict[str, Any]:
        """Flat ``[tool.flwr.app.config]`` entries (protocol parameters under ``params.``)."""
        cfg: dict[str, Any] = {
            "algorithm": self.protocol, "seed": self.seed, "dropout": float(self.dropout),
            "late": float(self.late), "dropped": json.dumps(list(self.dropped)),
            "late-devices": json.dumps(list(self.late_devices)), "min-nodes": self.min_nodes,
            "node-wait-s": float(self.node_wait_s),
            "round-timeout-s": float(self.round_timeout_s or 0.0),
            "result-dir": self.result_dir or "", "collect-outputs": self.collect_outputs,
            "secure-aggregation": bool(self.secure_aggregation),
            "secagg-frac-bits": int(self.secagg_frac_bits),
            "secagg-neighbors": int(self.secagg_neighbors),
            "secagg-signed": bool(self.secagg_signed),
            "graph-edges": json.dumps([[int(u), int(v)] for u, v in self.graph_edges]),
            "resume": bool(self.resume),
        }
        for k, v in self.protocol_config.items():
            cfg[f"params.{k}"] = json.dumps(list(v)) if isinstance(v, (list, tuple)) else v
        return cfg

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> "ServerSpec":
        rc = dict(run_config)
        if "algorithm" not in rc:
            raise ValidationError(
                "the run config has no 'algorithm' key: generate the app with "
                "`fedclust flower app DIR --config CONFIG.toml`")
        params = {}
        for k, v in rc.items():
            if k.startswith("params."):
                if isinstance(v, str) and v.startswith("["):
                    v = json.loads(v)
                params[k[len("params."):]] = v
        timeout = float(rc.get("round-timeout-s", 600.0))
        return cls(
            protocol=str(rc["algorithm"]), protocol_config=params, seed=int(rc.get("seed", 0)),
            dropout=float(rc.get("dropout", 0.0)), late=float(rc.get("late", 0.0)),
            dropped=json.loads(rc.get("dropped", "[]")),
            late_devices=json.loads(rc.get("late-devices", "[]")),
            min_nodes=int(rc.get("min-nodes", 1)), node_wait_s=float(rc.get("node-wait-s", 120.0)),
            round_timeout_s=timeout if timeout > 0 else None,
            result_dir=str(rc.get("result-dir", "")) or None,
            collect_outputs=bool(rc.get("collect-outputs", False)),
            secure_aggregation=bool(rc.get("secure-aggregation", False)),
            secagg_frac_bits=int(rc.get("secagg-frac-bits", 20)),
            secagg_neighbors=int(rc.get("secagg-neighbors", 0)),
            secagg_signed=bool(rc.get("secagg-signed", False)),
            graph_edges=json.loads(rc.get("graph-edges", "[]")),
            resume=bool(rc.get("resume", False)))


def confine_result_dir(result_dir: str, root: str | Path) -> str:
    """``result_dir`` (relative: under ``root``) as an absolute path inside ``root``;
    a run config pointing anywhere else on the server host is refused."""
    base = Path(root).resolve()
    path = Path(result_dir)
    path = (path if path.is_absolute() else base / path).resolve()
    if path != base and base not in path.parents:
        raise ValidationError(f"run config result-dir={result_dir!r} is outside the app's output "
                              f"folder {base}; give a folder inside it")
    return str(path)

