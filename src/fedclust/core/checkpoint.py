"""Server state that survives a crash: checkpoints and the write-ahead privacy ledger.

A transport that checkpoints writes, after every completed round, one file
``checkpoint.npz`` into its checkpoint folder: the protocol's server state
as a *plain value* (:func:`to_plain` — JSON for the structure, numpy arrays
beside it; no pickle), the round count, the run log, the communication meter
and whatever the transport itself must carry (the simulated devices' own
state on the in-process transport). The file is replaced atomically
(:mod:`fedclust.core.atomic`), so a crash leaves the last complete round.

Randomness needs no saved positions: every stream is keyed by (seed, device,
round) (:mod:`fedclust.core.random`, :func:`fedclust.privacy.noise_rng`), so a
resumed run with the same seed and ``noise_seed`` draws exactly what the
uninterrupted run draws; the checkpoint records the seed and the protocol's
config, and a resume with different ones is refused.

The **privacy ledger** (``ledger.json``) is written ahead: before a round
that may release anything is sent to the devices, the round is recorded as
spent and the file flushed to disk. A crash inside that round leaves the
entry beyond the last checkpoint; the resumed run redoes the round, and the
ledger counts the lost release as well (a redone round may see other replies,
so its release is a new one even under the same noise seed). The run's true
ε is the plan's releases composed with every lost one
(:meth:`PrivacyLedger.epsilon_spent`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .atomic import write_json_atomic, write_npz_atomic
from .exceptions import FedClustError
from .messages import ReplyTable
from .protocol import Protocol

__all__ = ["CheckpointError", "to_plain", "from_plain", "save_checkpoint", "load_checkpoint",
           "PrivacyLedger", "CHECKPOINT_FILE", "LEDGER_FILE", "round_releases",
           "privacy_summary"]

CHECKPOINT_FILE = "checkpoint.npz"
LEDGER_FILE = "ledger.json"
_META = "__meta_json__"
_FORMAT = 1


class CheckpointError(FedClustError):
    """A checkpoint cannot be written, read, or does not belong to this run."""


# -- plain values --------------------------------------------------------------------
def to_plain(value: Any, arrays: dict[str, np.ndarray], where: str = "state") -> Any:
    """``value`` as JSON-ready structure; its numpy arrays go into ``arrays``.

    Handles None, bool, int, float (NaN/inf too), str, numpy arrays and
    scalars, lists, tuples, sets, dicts (any plain keys), instances of
    fedclust's dataclasses (their attributes, including ones set after
    construction) and protocols (as their class and :meth:`Protocol.config`,
    rebuilt by ``from_config``). Anything else is refused, naming where it sits.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        if a.dtype == object:
            raise CheckpointError(f"{where}: an object array cannot be checkpointed")
        key = f"a{len(arrays)}"
        arrays[key] = a
        return {"__nd__": key, "scalar": isinstance(value, np.generic)}
    if isinstance(value, list):
        return [to_plain(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple) and type(value) is tuple:
        return {"__tuple__": [to_plain(v, arrays, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, (set, frozenset)):
        items = sorted(value, key=repr)
        return {"__set__": [to_plain(v, arrays, f"{where}{{}}") for v in items],
                "frozen": isinstance(value, frozenset)}
    if isinstance(value, ReplyTable):   # replies held column-wise: kept as a dictionary
        value = dict(value)
    if isinstance(value, dict):
        if type(value) not in (dict, defaultdict):
            raise CheckpointError(f"{where}: {type(value).__name__} cannot be checkpointed")
        return {"__dict__": [[to_plain(k, arrays, f"{where} key"),
                              to_plain(v, arrays, f"{where}[{k!r}]")] for k, v in value.items()]}
    cls = type(value)
    if isinstance(value, Protocol):   # a composite protocol's inner one: its config
        return {"__protocol__": f"{cls.__module__}:{cls.__qualname__}",
                "config": to_plain(value.config(), arrays, f"{where}.config()")}
    if dataclasses.is_dataclass(value) and cls.__module__.startswith("fedclust."):
        return {"__dc__": f"{cls.__module__}:{cls.__qualname__}",
                "attrs": {k: to_plain(v, arrays, f"{where}.{k}") for k, v in vars(value).items()}}
    raise CheckpointError(
        f"{where}: a {cls.__module__}.{cls.__qualname__} cannot be checkpointed (plain values, "
        "numpy arrays and fedclust dataclasses only)")


#: classes that moved to another module, by the ``module:qualname`` an older checkpoint
#: names them with
_MOVED = {"fedclust.gauss.protocol:GaussClassifierProtocol":
          "fedclust.gauss.classifier_protocol:GaussClassifierProtocol"}


def _fedclust_class(name: str, protocol: bool = False) -> type:
    """The fedclust dataclass (or protocol class) ``module:qualname`` names."""
    module, _, qual = _MOVED.get(name, name).partition(":")
    if not module.startswith("fedclust.") or not qual:
        raise CheckpointError(f"checkpoint names a class outside fedclust: {name!r}")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    ok = isinstance(obj, type) and (issubclass(obj, Protocol) if protocol
                                    else dataclasses.is_dataclass(obj))
    if not ok:
        raise CheckpointError(f"checkpoint names {name!r}, which is not a fedclust "
                              f"{'protocol' if protocol else 'dataclass'}")
    return obj


def from_plain(plain: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """Inverse of :func:`to_plain`."""
    if isinstance(plain, list):
        return [from_plain(v, arrays) for v in plain]
    if not isinstance(plain, dict):
        return plain
    if "__float__" in plain:
        return float(plain["__float__"])
    if "__nd__" in plain:
        a = np.array(arrays[plain["__nd__"]])
        return a[()] if plain.get("scalar") else a
    if "__tuple__" in plain:
        return tuple(from_plain(v, arrays) for v in plain["__tuple__"])
    if "__set__" in plain:
        items = [from_plain(v, arrays) for v in plain["__set__"]]
        return frozenset(items) if plain.get("frozen") else set(items)
    if "__dict__" in plain:
        return {_key(from_plain(k, arrays)): from_plain(v, arrays) for k, v in plain["__dict__"]}
    if "__protocol__" in plain:
        config = from_plain(plain["config"], arrays)
        return _fedclust_class(plain["__protocol__"], protocol=True).from_config(config)
    if "__dc__" in plain:
        cls = _fedclust_class(plain["__dc__"])
        obj = object.__new__(cls)
        for k, v in plain["attrs"].items():
            object.__setattr__(obj, k, from_plain(v, arrays))   # frozen dataclasses too
        return obj
    raise CheckpointError(f"checkpoint: unknown entry {sorted(plain)[:3]}")


def _key(k: Any) -> Any:
    return k.item() if isinstance(k, np.generic) else k


# -- the checkpoint file ----------------------------------------------------------------
def save_checkpoint(folder: str | Path, meta: Mapping[str, Any], values: Mapping[str, Any]
                    ) -> Path:
    """Write ``meta`` (JSON-ready) and ``values`` (plain values) as ``folder/checkpoint.npz``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    plain = {name: to_plain(v, arrays, name) for name, v in values.items()}
    doc = {"format": _FORMAT, **meta, "values": plain}
    arrays[_META] = np.frombuffer(json.dumps(doc).encode("utf-8"), dtype=np.uint8)
    return write_npz_atomic(folder / CHECKPOINT_FILE, arrays)


def load_checkpoint(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(meta, values)`` of ``folder/checkpoint.npz``, or ``None`` when there is none."""
    path = Path(folder) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        doc = json.loads(bytes(arrays.pop(_META)).decode("utf-8"))
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a readable fedclust checkpoint ({exc})") from None
    if doc.get("format") != _FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {doc.get('format')!r}, "
                              f"expected {_FORMAT}")
    values = {name: from_plain(v, arrays) for name, v in doc.pop("values").items()}
    return doc, values


def check_same_run(path: Path, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume a checkpoint of another run (other protocol, config, seed, devices)."""
    for key, value in current.items():
        kept = saved.get(key)
        if json.loads(json.dumps(value)) != kept:
            raise CheckpointError(
                f"{path}: the checkpoint is of another run ({key} {_short(kept)} in the "
                f"checkpoint, {_short(value)} in this run); resume with the same configuration "
                "and seed, or start afresh in another folder")


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) < 200 else text[:197] + "..."


# -- the privacy ledger -----------------------------------------------------------------
def round_releases(protocol: Any, request: Any) -> list[tuple[str, float, float]]:
    """``(what, noise multiplier, sampling)`` of what a round may release.

    A protocol names them with ``round_releases(request)`` (a list of
    :class:`fedclust.privacy.Release`); one that does not, but runs a private
    plan, is charged the most expensive release of its plan (the smallest
    multiplier): an upper bound. Non-private runs release nothing here.
    """
    plan = getattr(protocol, "plan", None)
    spec = getattr(plan, "spec", None)
    if plan is None or not getattr(spec, "private", False) or not plan.releases:
        return []
    hook = getattr(protocol, "round_releases", None)
    rels = list(hook(request)) if hook is not None else [
        min(plan.releases, key=lambda r: (r.noise_multiplier, -r.sampling))]
    return [(r.what, float(r.noise_multiplier), float(r.sampling)) for r in rels]


class PrivacyLedger:
    """Rounds that may have released something, persisted before the release.

    ``entries``: one per round sent out, ``{"round", "action", "releases"}``;
    ``lost``: entries of rounds that a crash interrupted (their releases
    happened, the round is redone). ``path`` ``None``: in memory only.
    """

    def __init__(self, path: Path | None = None):
        self.path = path
        self.entries: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []

    @classmethod
    def open(cls, path: Path, completed_rounds: int | None) -> "PrivacyLedger":
        """The ledger at ``path``; entries past ``completed_rounds`` (the last checkpoint)
        become lost releases. ``completed_rounds=None``: a fresh run (any old ledger there
        belongs to a run that is not resumed and is replaced)."""
        ledger = cls(path)
        if completed_rounds is None or not path.exists():
            return ledger
        doc = json.loads(path.read_text())
        entries = doc.get("entries", [])
        ledger.entries = entries[:completed_rounds]
        ledger.lost = doc.get("lost", []) + entries[completed_rounds:]
        ledger._flush()
        return ledger

    def spend(self, round_index: int, action: str, releases: Sequence[tuple[str, float, float]],
              n_completed: int) -> None:
        """Record round number ``n_completed`` (0-based count of rounds done) as spent,
        durably, before it is sent out."""
        del self.entries[n_completed:]
        self.entries.append({"round": int(round_index), "action": action,
                             "releases": [list(r) for r in releases]})
        self._flush()

    def _flush(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, {"entries": self.entries, "lost": self.lost}, indent=1)

    def summary(self, plan: Any = None) -> dict[str, Any]:
        """What the run log reports: rounds spent, lost releases, the true ε."""
        out: dict[str, Any] = {"rounds_released": sum(1 for e in self.entries if e["releases"]),
                               "lost_releases": [dict(e) for e in self.lost if e["releases"]]}
        if plan is not None:
            out["epsilon_spent"] = self.epsilon_spent(plan)
        return out

    def epsilon_spent(self, plan: Any) -> float:
        """The plan's ε composed with every lost release (the plan's own ε when none)."""
        extra = [(z, 1, q) for e in self.lost for _, z, q in e["releases"]]
        if not extra or not plan.spec.private:
            return float(plan.epsilon_spent)
        from .composition import composed_epsilon, prior_releases

        spec = plan.spec
        planned = [(r.noise_multiplier, r.repeats, r.sampling) for r in plan.releases]
        return composed_epsilon(list(prior_releases(spec)) + planned + _grouped(extra), spec.delta,
                                spec.accountant)


def _grouped(extra: list[tuple[float, int, float]]) -> list[tuple[float, int, float]]:
    counts: dict[tuple[float, float], int] = {}
    for z, n, q in extra:
        counts[(z, q)] = counts.get((z, q), 0) + n
    return [(z, n, q) for (z, q), n in counts.items()]


def privacy_summary(plan: Any, log: Any) -> dict[str, Any]:
    """``plan.summary()`` with the run's true ε: the ledger's when a crash made a round
    release twice (``log.privacy_ledger``, filled by a checkpointing transport)."""
    out = plan.summary()
    ledger = getattr(log, "privacy_ledger", None) or {}
    if ledger.get("lost_releases"):
        out["epsilon_spent"] = ledger["epsilon_spent"]
        out["lost_releases"] = ledger["lost_releases"]
    return out
