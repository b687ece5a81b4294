"""A SuperNode's device state on its own disk, so that a resumed Flower run finds it.

A SuperNode's ``context.state`` lasts one Flower run, and a resumed ServerApp
(:mod:`fedclust.flower.recovery`) is a new Flower run. With node config
``state-dir`` (a folder on the node), the ClientApp also writes, after every
round it answers, one file per (fit, device) into that folder:

* the **key** is computed by the node itself from the request: the protocol's
  name and config and the run's seed (:func:`run_key`) — never Flower's run id,
  which a resume changes — plus the device id; inside the file the digest of
  the node's data (its ``data-path`` file, else its arrays) and the Flower run
  that wrote it;
* the **snapshots** of the last two rounds it answered: the device state
  after the round (what ``client_step`` keeps: PCA-reduced data, local
  labels, ...; never a secure sum's secrets), the node policy's records (the
  fits charged to its ledger, the rounds answered) and the reply it sent,
  each with the digest of the request it answered (round, action, seed,
  protocol, payload);
* the digests of **every** request it answered in the fit.

Every request carries ``step``, the server's count of rounds done before it,
and a resumed run also ``resumed-rounds`` (the rounds its checkpoint holds)
and ``asked-before`` (whether those rounds asked this device anything: one
that was not, a late device or one not yet sampled, has no state to resume).
The server's checkpoint may be one round behind the node (a crash after the
node replied, before the checkpoint); the resumed server then asks that round
again. The node answers a step it already answered only with the same
request, and then with the reply it stored (the same bytes: the same release,
not charged again); a different request for it, or a step before the last one
it answered, is refused (:class:`~fedclust.core.policy.PolicyRefusal`): a
server cannot obtain a second, differently-noised release by claiming a
crash. A file that was changed (its SHA-256 over content and arrays does not
match), written for another data file, or for another device, is refused by
name. Files are written atomically (:mod:`fedclust.core.atomic`) with mode
0600, as ``npz`` without pickle plus JSON (:func:`fedclust.core.checkpoint.to_plain`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..core.atomic import write_npz_atomic
from ..core.checkpoint import from_plain, to_plain
from ..core.exceptions import ValidationError
from ..core.policy import PolicyRefusal

__all__ = ["NodeStateStore", "NodeStateError", "run_key", "request_digest", "data_digest",
           "SNAPSHOTS_KEPT", "STEP", "RESUMED", "ASKED"]

#: request head entries the server sends (``fedclust.flower.server``)
STEP = "step"
RESUMED = "resumed-rounds"
ASKED = "asked-before"
SNAPSHOTS_KEPT = 2
_FORMAT = 1
_META = "__meta_json__"
_DIGEST = "__sha256__"
_SECAGG_STATE = "secagg."   # a secure round's secrets: never written


class NodeStateError(ValidationError):
    """A node's saved state is unreadable, changed, or not this node's (named by path)."""


def _arrays_digest(h: "hashlib._Hash", arrays: Mapping[str, np.ndarray]) -> None:
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(json.dumps([key, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())


def run_key(protocol: Any, seed: int) -> str:
    """The fit a request belongs to, as the node computes it: protocol name, config, seed."""
    text = json.dumps([protocol.name, protocol.config(), int(seed)], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def request_digest(request: Any, seed: int, protocol: Any) -> str:
    """SHA-256 of what a request asks: round, action, seed, protocol and its payload."""
    h = hashlib.sha256(json.dumps([int(request.round), str(request.action), int(seed),
                                   protocol.name, protocol.config()], sort_keys=True,
                                  default=str).encode())
    if request.payload is not None:
        _arrays_digest(h, request.payload.to_arrays())
    return h.hexdigest()


_DATA_DIGESTS: dict[Any, tuple[Any, str]] = {}


def data_digest(data: Any, node_config: Mapping[str, Any], where: str) -> str:
    """SHA-256 of the node's data: its ``data-path`` file (or the file a site table was
    read from), else its arrays."""
    path = node_config.get("data-path") or getattr(data, "path", None)
    if path is not None and Path(str(path)).is_file():
        path = Path(str(path))
        st = path.stat()
        key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if key not in _DATA_DIGESTS:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            _DATA_DIGESTS[key] = (None, h.hexdigest())
        return _DATA_DIGESTS[key][1]
    key = id(data)
    kept = _DATA_DIGESTS.get(key)
    if kept is not None and kept[0] is data:
        return kept[1]
    value = data
    if hasattr(value, "as_arrays"):
        value = value.as_arrays(where)
    parts = value if isinstance(value, tuple) else (value,)
    h = hashlib.sha256()
    arrays = {str(i): np.asarray(p) for i, p in enumerate(parts)}
    if any(a.dtype.hasobject for a in arrays.values()):
        raise ValidationError(f"{where}: node config state-dir needs data it can digest "
                              "(numbers, or a data-path file)")
    _arrays_digest(h, arrays)
    if len(_DATA_DIGESTS) > 64:
        _DATA_DIGESTS.clear()
    _DATA_DIGESTS[key] = (data, h.hexdigest())   # the object is held: its id is not reused
    return h.hexdigest()


class NodeStateStore:
    """The state file of one (fit, device) in a node's ``state-dir``.

    ``load`` returns the record (a dict: ``answered`` step -> request digest,
    ``snapshots`` of the last rounds answered, ``flower_run``) or ``None``;
    ``answer`` adds a round and rewrites the file atomically.
    """

    def __init__(self, folder: str | Path, protocol: Any, seed: int, device_id: int,
                 data: str, device: str):
        self.folder = Path(folder)
        self.key = run_key(protocol, seed)
        self.protocol_name = protocol.name
        self.seed = int(seed)
        self.device_id = int(device_id)
        self.data = data
        self.device = device
        self.path = self.folder / f"fedclust-state-{self.key}-device-{self.device_id}.npz"
        self.record: dict[str, Any] | None = None

    # -- the file -------------------------------------------------------------
    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            with np.load(self.path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            meta_raw = arrays.pop(_META)
            digest = bytes(arrays.pop(_DIGEST)).decode("ascii")
            h = hashlib.sha256(bytes(meta_raw))
            _arrays_digest(h, arrays)
            if h.hexdigest() != digest:
                raise NodeStateError(f"{self.device}: state file {self.path} was changed "
                                     "since the node wrote it (its SHA-256 does not match); "
                                     "refusing to resume from it")
            doc = json.loads(bytes(meta_raw).decode("utf-8"))
            record = from_plain(doc, arrays)
        except NodeStateError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NodeStateError(f"{self.device}: state file {self.path} is not readable "
                                 f"({exc}); refusing to resume from it") from None
        if record.get("format") != _FORMAT or record.get("key") != self.key:
            raise NodeStateError(f"{self.device}: state file {self.path} is of another fit "
                                 "or format; refusing to resume from it")
        if record.get("device") != self.device_id:
            raise NodeStateError(f"{self.device}: state file {self.path} is of device "
                                 f"{record.get('device')}; refusing to resume from it")
        if record.get("data") != self.data:
            raise NodeStateError(f"{self.device}: state file {self.path} was written for "
                                 f"another data file (data digest {str(record.get('data'))[:12]}"
                                 f"..., this node's {self.data[:12]}...); refusing to resume "
                                 "from it")
        return record

    def new_record(self, flower_run: int) -> dict[str, Any]:
        return {"format": _FORMAT, "key": self.key, "protocol": self.protocol_name,
                "seed": self.seed, "device": self.device_id, "data": self.data,
                "flower_run": int(flower_run), "answered": {}, "snapshots": []}

    def _write(self, record: dict[str, Any]) -> None:
        arrays: dict[str, np.ndarray] = {}
        meta = json.dumps(to_plain(record, arrays, "node state")).encode("utf-8")
        meta_arr = np.frombuffer(meta, dtype=np.uint8)
        h = hashlib.sha256(meta)
        _arrays_digest(h, arrays)
        arrays[_META] = meta_arr
        arrays[_DIGEST] = np.frombuffer(h.hexdigest().encode("ascii"), dtype=np.uint8)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_npz_atomic(self.path, arrays)   # mkstemp: mode 0600

    # -- rounds ---------------------------------------------------------------
    def replay(self, step: int, digest: str, round_index: int, action: str
               ) -> dict[str, Any] | None:
        """The stored snapshot when ``step`` was answered with this very request; None when
        the step is new. Refuses a changed request for an answered step, and a step
        before the last answered one."""
        rec = self.record
        if rec is None:
            return None
        answered = rec["answered"]
        if step in answered:
            if answered[step] != digest:
                raise PolicyRefusal(
                    f"{self.device}: refuses {action!r} round {round_index} again with another "
                    "request than the one it answered (another payload, seed or config: a "
                    "second release of that round)")
            for snap in rec["snapshots"]:
                if snap["step"] == step:
                    return snap
            raise PolicyRefusal(f"{self.device}: refuses {action!r} round {round_index} again: "
                                f"it answered it, and {self.path} keeps only the last "
                                f"{SNAPSHOTS_KEPT} replies")
        if answered and step < max(answered):
            raise PolicyRefusal(f"{self.device}: refuses {action!r} round {round_index} (step "
                                f"{step}): it already answered step {max(answered)} of this "
                                "fit and does not go back")
        return None

    def answer(self, step: int, digest: str, state: Mapping[str, np.ndarray],
               policy: Mapping[str, np.ndarray], reply: Mapping[str, np.ndarray]) -> None:
        """Record the round just answered (its state after the round, policy records, reply)."""
        rec = self.record
        rec["answered"][int(step)] = digest
        rec["snapshots"] = [s for s in rec["snapshots"] if s["step"] != step] + [{
            "step": int(step), "request": digest,
            "state": {k: np.asarray(v) for k, v in state.items()
                      if not k.startswith(_SECAGG_STATE)},
            "policy": {k: np.asarray(v) for k, v in policy.items()},
            "reply": {k: np.asarray(v) for k, v in reply.items()}}]
        rec["snapshots"] = rec["snapshots"][-SNAPSHOTS_KEPT:]
        self._write(rec)

    def latest(self) -> dict[str, Any] | None:
        snaps = (self.record or {}).get("snapshots") or []
        return snaps[-1] if snaps else None
