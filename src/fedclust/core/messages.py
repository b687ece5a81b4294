"""What crosses the wire: messages as frozen dataclasses of numpy arrays.

One codec serves every transport and the disk: ``to_arrays()`` gives a
``dict[str, numpy.ndarray]`` (what Flower's ``ArrayRecord`` and ``numpy.savez``
carry) and ``from_arrays()`` rebuilds the message **and validates it** (fields,
dtypes, shapes, finiteness, then the subclass's :meth:`Message.validate`), so a
malformed or malicious reply is rejected by name before any server maths. No
pickle anywhere: loading uses ``allow_pickle=False``.

Each family declares its own messages in its wing (``fedclust/<family>/messages.py``)
as subclasses with a ``schema`` and a unique ``kind``; subclassing registers the
kind, so :func:`load_message` reads every family's messages.

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

__all__ = ["Message", "FLOAT", "INT", "reject", "message_nbytes", "save_message", "load_message",
           "MESSAGE_TYPES"]

#: dtype kinds a schema may ask for
FLOAT = ("f",)
INT = ("i", "u")

#: message kind -> class, filled by subclassing :class:`Message`
MESSAGE_TYPES: dict[str, type["Message"]] = {}


def reject(sender: str, text: str) -> None:
    """Raise :class:`IncompatibleMessageError` naming the sender (for ``Message.validate``)."""
    raise IncompatibleMessageError(f"{sender}: {text}")


@dataclass(frozen=True)
class Message:
    """Base class: every field is a numpy array; subclasses declare the schema.

    ``schema`` maps field name to (dtype kinds, number of dimensions); ``kind``
    names the message on the wire and on disk (unique across families).
    """

    schema: ClassVar[dict[str, tuple[tuple[str, ...], int]]] = {}
    kind: ClassVar[str] = "message"

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        known = MESSAGE_TYPES.get(cls.kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"message kind {cls.kind!r} is taken by {known.__qualname__}")
        MESSAGE_TYPES[cls.kind] = cls

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
        expected = set(cls.schema)
        got = set(arrays)
        if got != expected:
            missing = sorted(expected - got)
            extra = sorted(got - expected)
            raise IncompatibleMessageError(
                f"{sender}: {cls.kind} message has wrong fields "
                f"(missing {missing}, unexpected {extra})")
        values = {}
        for name, (kinds, ndim) in cls.schema.items():
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
        msg.validate(sender)
        return msg

    def validate(self, sender: str) -> None:
        """Cross-field consistency after the schema checks; subclasses extend (call :func:`reject`)."""

    @property
    def nbytes(self) -> int:
        """Payload bytes of the wire form."""
        return sum(a.nbytes for a in self.to_arrays().values())


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
