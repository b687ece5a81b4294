"""What crosses the wire: messages as frozen dataclasses of numpy arrays.

One codec serves every transport and the disk: ``to_arrays()`` gives a
``dict[str, numpy.ndarray]`` (what Flower's ``ArrayRecord`` and ``numpy.savez``
carry) and ``from_arrays()`` rebuilds the message **and validates it** (fields,
dtypes, shapes, finiteness, consistency with what the server asked for), so a
malformed or malicious reply is rejected by name before any server maths. No
pickle anywhere: loading uses ``allow_pickle=False``.

Byte counts are the payload sizes of these arrays (``nbytes``), which is what
the papers count; transport framing (protobuf, HTTP/2) is not included.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .exceptions import IncompatibleMessageError

__all__ = [
    "Message",
    "LocalCenters",
    "CenterBroadcast",
    "ClusterSums",
    "PointSample",
    "LabelMap",
    "message_nbytes",
    "save_message",
    "load_message",
    "MESSAGE_TYPES",
]

_FLOAT_KINDS = ("f",)
_INT_KINDS = ("i", "u")


@dataclass(frozen=True)
class Message:
    """Base class: every field is a numpy array; subclasses declare the schema.

    ``_schema`` maps field name to (dtype kind(s), number of dimensions).
    """

    _schema: ClassVar[dict[str, tuple[tuple[str, ...], int]]] = {}
    kind: ClassVar[str] = "message"

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The wire form: field name -> contiguous array (no copies when possible)."""
        # np.asarray(order="C") keeps 0-d arrays 0-d (ascontiguousarray would not)
        return {f.name: np.asarray(getattr(self, f.name), order="C")
                for f in dataclasses.fields(self)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], *, sender: str = "message") -> "Message":
        """Rebuild and validate a message; raise ``IncompatibleMessageError`` naming ``sender``."""
        if not isinstance(arrays, dict):
            raise IncompatibleMessageError(
                f"{sender}: expected a dict of arrays for {cls.kind}, got {type(arrays).__name__}")
        expected = set(cls._schema)
        got = set(arrays)
        if got != expected:
            missing = sorted(expected - got)
            extra = sorted(got - expected)
            raise IncompatibleMessageError(
                f"{sender}: {cls.kind} message has wrong fields "
                f"(missing {missing}, unexpected {extra})")
        values = {}
        for name, (kinds, ndim) in cls._schema.items():
            arr = arrays[name]
            if not isinstance(arr, np.ndarray):
                raise IncompatibleMessageError(
                    f"{sender}: field {name!r} is a {type(arr).__name__}, not a numpy array")
            if arr.dtype.kind not in kinds:
                raise IncompatibleMessageError(
                    f"{sender}: field {name!r} has dtype {arr.dtype}; expected kind {kinds}")
            if arr.ndim != ndim:
                raise IncompatibleMessageError(
                    f"{sender}: field {name!r} has shape {arr.shape}; expected {ndim}-D")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise IncompatibleMessageError(
                    f"{sender}: field {name!r} contains non-finite values (NaN or inf)")
            values[name] = arr
        msg = cls(**values)
        msg._check(sender)
        return msg

    def _check(self, sender: str) -> None:
        """Cross-field consistency; subclasses extend."""

    @property
    def nbytes(self) -> int:
        """Payload bytes of the wire form."""
        return sum(a.nbytes for a in self.to_arrays().values())


def _fail(sender: str, text: str) -> None:
    raise IncompatibleMessageError(f"{sender}: {text}")


@dataclass(frozen=True)
class LocalCenters(Message):
    """k-FED device -> server: the k_z local centers and their point counts.

    Bytes: ``k_z * d * itemsize + k_z * 8``.
    """

    centers: np.ndarray  # (k_z, d) float
    counts: np.ndarray   # (k_z,) int64, >= 1
    _schema: ClassVar = {"centers": (_FLOAT_KINDS, 2), "counts": (_INT_KINDS, 1)}
    kind: ClassVar[str] = "local_centers"

    def _check(self, sender: str) -> None:
        k_z = self.centers.shape[0]
        if k_z == 0 or self.centers.shape[1] == 0:
            _fail(sender, f"local_centers has an empty centers array of shape {self.centers.shape}")
        if self.counts.shape != (k_z,):
            _fail(sender, f"counts has shape {self.counts.shape} but there are {k_z} centers")
        if (self.counts < 1).any():
            _fail(sender, f"counts must all be >= 1, got {self.counts.tolist()}")


@dataclass(frozen=True)
class CenterBroadcast(Message):
    """Server -> devices: the current global centers (k, d)."""

    centers: np.ndarray
    _schema: ClassVar = {"centers": (_FLOAT_KINDS, 2)}
    kind: ClassVar[str] = "center_broadcast"


@dataclass(frozen=True)
class ClusterSums(Message):
    """Distributed Lloyd device -> server: per-center sums (k, d), counts (k,), local cost ()."""

    sums: np.ndarray
    counts: np.ndarray
    cost: np.ndarray
    _schema: ClassVar = {"sums": (_FLOAT_KINDS, 2), "counts": (_INT_KINDS, 1),
                         "cost": (_FLOAT_KINDS, 0)}
    kind: ClassVar[str] = "cluster_sums"

    def _check(self, sender: str) -> None:
        if self.counts.shape != (self.sums.shape[0],):
            _fail(sender, f"counts has shape {self.counts.shape} for {self.sums.shape[0]} sums")
        if (self.counts < 0).any():
            _fail(sender, "counts must be >= 0")
        if float(self.cost) < 0:
            _fail(sender, f"cost={float(self.cost)} must be >= 0")


@dataclass(frozen=True)
class PointSample(Message):
    """Device -> server: a uniform sample of raw points and the device size.

    Only the distributed-Lloyd *baseline* uses it (to seed k-means++); k-FED
    never sends raw points.
    """

    points: np.ndarray   # (m, d)
    n_points: np.ndarray  # () int64: device size, to weight the sample
    _schema: ClassVar = {"points": (_FLOAT_KINDS, 2), "n_points": (_INT_KINDS, 0)}
    kind: ClassVar[str] = "point_sample"

    def _check(self, sender: str) -> None:
        if int(self.n_points) < self.points.shape[0]:
            _fail(sender, f"n_points={int(self.n_points)} is smaller than the sample size "
                          f"{self.points.shape[0]}")


@dataclass(frozen=True)
class LabelMap(Message):
    """Server -> device: global cluster of each of the device's local centers (k_z,)."""

    global_labels: np.ndarray
    _schema: ClassVar = {"global_labels": (_INT_KINDS, 1)}
    kind: ClassVar[str] = "label_map"


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.kind: cls for cls in (LocalCenters, CenterBroadcast, ClusterSums, PointSample, LabelMap)
}

_KIND_KEY = "__kind__"


def message_nbytes(msg: Message | None) -> int:
    """Payload bytes of a message (0 for ``None``)."""
    return 0 if msg is None else msg.nbytes


def save_message(msg: Message, path: str | Path) -> None:
    """Write a message to an ``.npz`` file (no pickle)."""
    arrays = msg.to_arrays()
    arrays[_KIND_KEY] = np.frombuffer(msg.kind.encode("ascii"), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_message(path: str | Path) -> Message:
    """Read and validate a message written by :func:`save_message`."""
    import zipfile

    try:
        data = np.load(path, allow_pickle=False)
        if not hasattr(data, "files"):
            raise IncompatibleMessageError(f"{path}: expected an .npz archive of named arrays")
        with data:
            arrays = {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise IncompatibleMessageError(f"{path}: no such file") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        # object arrays (would need pickle), truncated or corrupt files
        raise IncompatibleMessageError(f"{path}: not a readable fedclust message ({exc})") from None
    kind_arr = arrays.pop(_KIND_KEY, None)
    if kind_arr is None:
        raise IncompatibleMessageError(f"{path}: not a fedclust message (no {_KIND_KEY} entry)")
    kind = bytes(kind_arr.astype(np.uint8)).decode("ascii", errors="replace")
    if kind not in MESSAGE_TYPES:
        raise IncompatibleMessageError(
            f"{path}: unknown message kind {kind!r}; known: {sorted(MESSAGE_TYPES)}")
    return MESSAGE_TYPES[kind].from_arrays(arrays, sender=str(path))
