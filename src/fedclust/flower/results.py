"""A run's output on disk: how a ServerApp hands its result back (no pickle, no flwr).

The ServerApp runs in another thread, process or machine than the caller
(Flower's simulation engine, ``flwr run`` on a SuperLink). It writes the
:class:`~fedclust.sim.transport.RunOutput` to a folder and the transport reads
it back, bit for bit:

* ``result.npz`` — every array (result fields, per-device outputs) plus a JSON
  ``__meta__`` entry (uint8) with the scalars, the run log and the meter; read
  with ``allow_pickle=False``;
* ``result.json`` — the same run for people: centers as lists, run log,
  communication summary (JSON floats round-trip exactly, dtypes do not).

A server that fails writes ``error.json`` (exception type and text) instead.
Result objects must be dataclasses whose fields are arrays, ``dict[int,
array]``, JSON scalars / lists, or the :class:`~fedclust.protocols.base.RunLog`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ..core.exceptions import FedClustError, IncompatibleMessageError, ValidationError
from ..core.atomic import atomic_write
from ..core.protocol import RunLog
from ..sim.meter import CommunicationMeter
from ..sim.transport import RunOutput
from ..core.registry import RESULT_TYPES

__all__ = ["save_run_output", "load_run_output", "save_error", "raise_saved_error",
           "RESULT_NPZ", "RESULT_JSON", "ERROR_JSON"]

RESULT_NPZ = "result.npz"
RESULT_JSON = "result.json"
ERROR_JSON = "error.json"
_FORMAT = "fedclust-run/1"
_META = "__meta__"


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise TypeError(f"cannot store a {type(v).__name__} in a run result")


def log_to_json(log: RunLog) -> dict[str, Any]:
    return {"participants": [int(z) for z in log.participants],
            "dropped": [int(z) for z in log.dropped], "late": [int(z) for z in log.late],
            "rejected": {str(z): str(t) for z, t in log.rejected.items()},
            "failed": {str(z): str(t) for z, t in log.failed.items()},
            "distrusted": {str(z): str(t) for z, t in log.distrusted.items()},
            "removed": {str(z): int(c) for z, c in log.removed.items()},
            "removed_by_server": int(log.removed_by_server),
            "warnings": [str(w) for w in log.warnings],
            **({"privacy_ledger": _jsonable(log.privacy_ledger)} if log.privacy_ledger else {})}


def log_from_json(d: dict[str, Any]) -> RunLog:
    return RunLog(participants=[int(z) for z in d["participants"]],
                  dropped=[int(z) for z in d["dropped"]], late=[int(z) for z in d["late"]],
                  rejected={int(z): t for z, t in d["rejected"].items()},
                  failed={int(z): t for z, t in d["failed"].items()},
                  distrusted={int(z): t for z, t in d.get("distrusted", {}).items()},
                  removed={int(z): int(c) for z, c in d.get("removed", {}).items()},
                  removed_by_server=int(d.get("removed_by_server", 0)),
                  warnings=[str(w) for w in d.get("warnings", [])],
                  privacy_ledger=dict(d.get("privacy_ledger", {})))


def _write_atomic(path: Path, data: bytes) -> None:
    atomic_write(path, data)


def save_run_output(out: RunOutput, protocol_name: str, directory: str | Path,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write ``out`` to ``directory/result.npz`` and ``result.json``; returns the npz path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    result = out.result
    if not dataclasses.is_dataclass(result):
        raise TypeError(f"result of {protocol_name!r} is a {type(result).__name__}, not a dataclass")
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, RunLog):
            fields[f.name] = {"kind": "log"}
        elif isinstance(v, np.ndarray):
            arrays[f"result.{f.name}"] = v
            fields[f.name] = {"kind": "array"}
        elif isinstance(v, dict) and v and all(isinstance(a, np.ndarray) for a in v.values()):
            keys = [int(k) for k in v]
            for i, a in enumerate(v.values()):
                arrays[f"result.{f.name}.{i}"] = a
            fields[f.name] = {"kind": "array-dict", "keys": keys}
        else:
            fields[f.name] = {"kind": "value", "value": _jsonable(v)}
    outputs: dict[str, list[str]] = {}
    for z, d in out.device_outputs.items():
        outputs[str(int(z))] = list(d)
        for i, a in enumerate(d.values()):
            arrays[f"output.{int(z)}.{i}"] = np.asarray(a)
    m = out.meter
    # a wrapping protocol (site preprocessing) returns its inner protocol's result type
    result_type = next((n for n, c in RESULT_TYPES.items() if c is type(result)), protocol_name)
    meta = {
        "format": _FORMAT, "protocol": protocol_name, "result_type": result_type,
        "seed": int(out.seed),
        "result_fields": fields, "log": log_to_json(out.log), "outputs": outputs,
        "meter": {"up": {str(z): n for z, n in m.up.items()},
                  "down": {str(z): n for z, n in m.down.items()},
                  "rounds": m.rounds, "messages_up": m.messages_up,
                  "messages_down": m.messages_down,
                  "secure_exchanges": getattr(m, "secure_exchanges", 0)},
        "extra": _jsonable(extra or {}),
    }
    arrays[_META] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz = directory / RESULT_NPZ
    _write_atomic(npz, buf.getvalue())
    human = {"protocol": protocol_name, "seed": int(out.seed),
             "cluster_centers": np.asarray(getattr(result, "centers", np.zeros((0, 0)))).tolist(),
             "run_log": log_to_json(out.log), "communication": m.summary(),
             "extra": meta["extra"]}
    _write_atomic(directory / RESULT_JSON, json.dumps(human, indent=1).encode("utf-8"))
    return npz


def load_run_output(directory: str | Path) -> tuple[RunOutput, dict[str, Any]]:
    """Read what :func:`save_run_output` wrote; returns ``(RunOutput, extra)``."""
    directory = Path(directory)
    npz = directory / RESULT_NPZ
    if not npz.exists():
        raise_saved_error(directory)
        raise FedClustError(f"the Flower run wrote no result ({npz} does not exist)")
    with np.load(npz, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    try:
        meta = json.loads(bytes(arrays.pop(_META)).decode("utf-8"))
    except KeyError:
        raise IncompatibleMessageError(f"{npz}: not a fedclust run result (no {_META})") from None
    if meta.get("format") != _FORMAT:
        raise IncompatibleMessageError(f"{npz}: unknown format {meta.get('format')!r}")
    name = meta.get("result_type", meta["protocol"])
    try:
        cls = RESULT_TYPES[name]
    except KeyError:
        raise ValidationError(f"{npz}: no result type registered for protocol {name!r}") from None
    log = log_from_json(meta["log"])
    values: dict[str, Any] = {}
    for fname, spec in meta["result_fields"].items():
        kind = spec["kind"]
        if kind == "log":
            values[fname] = log
        elif kind == "array":
            values[fname] = arrays[f"result.{fname}"]
        elif kind == "array-dict":
            values[fname] = {int(k): arrays[f"result.{fname}.{i}"]
                             for i, k in enumerate(spec["keys"])}
        else:
            values[fname] = spec["value"]
    result = cls(**values)
    outputs = {int(z): {key: arrays[f"output.{z}.{i}"] for i, key in enumerate(keys)}
               for z, keys in meta["outputs"].items()}
    mm = meta["meter"]
    meter = CommunicationMeter(
        up=defaultdict(int, {int(z): n for z, n in mm["up"].items()}),
        down=defaultdict(int, {int(z): n for z, n in mm["down"].items()}),
        rounds=mm["rounds"], messages_up=mm["messages_up"], messages_down=mm["messages_down"],
        secure_exchanges=int(mm.get("secure_exchanges", 0)))
    return RunOutput(result, outputs, meter, log, int(meta["seed"])), meta["extra"]


def save_error(exc: BaseException, directory: str | Path) -> None:
    """Record a failed server run (type and text) in ``directory/error.json``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / ERROR_JSON, json.dumps(
        {"type": type(exc).__name__, "message": str(exc)}).encode("utf-8"))


def raise_saved_error(directory: str | Path) -> None:
    """Re-raise the server's error recorded in ``directory`` (if any) as a fedclust error."""
    path = Path(directory) / ERROR_JSON
    if not path.exists():
        return
    err = json.loads(path.read_text())
    from ..core import exceptions

    cls = getattr(exceptions, err.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, FedClustError)):
        cls = FedClustError
        raise cls(f"the Flower ServerApp failed: {err.get('type')}: {err.get('message')}")
    raise cls(err.get("message", ""))
