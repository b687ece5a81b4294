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
from collections.abc import MutableMapping
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, ClassVar, Iterator

import numpy as np

from .exceptions import IncompatibleMessageError

__all__ = ["Message", "FLOAT", "INT", "reject", "message_nbytes", "save_message", "load_message",
           "MESSAGE_TYPES", "StackedReplies", "ReplyTable"]

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
        out = {}
        for name in _field_names(type(self)):
            a = getattr(self, name)
            out[name] = a if type(a) is np.ndarray and a.flags.c_contiguous else np.asarray(
                a, order="C")
        return out

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

    @classmethod
    def validate_many(cls, stacked: dict[str, np.ndarray]) -> bool:
        """Cross-field checks of many same-shaped messages at once (arrays stacked on axis 0).

        Return True when every message passes; False (the default) makes
        :meth:`from_arrays_many` validate one message at a time. Subclasses
        whose :meth:`validate` matters at scale implement it vectorised.
        """
        return False

    @classmethod
    def from_arrays_many(cls, items: list[dict[str, Any]], senders: list[str]
                         ) -> list["Message | IncompatibleMessageError"]:
        """:meth:`from_arrays` for many replies; same acceptance, one pass when they share shapes.

        Replies whose fields all have one dtype and shape are checked together
        (schema, finiteness, :meth:`validate_many`); if anything in that group
        fails, or shapes differ, each reply is decoded on its own so the error
        names its sender. Returns a message or the error, per reply.
        """
        if len(items) > 1 and _same_layout(items, cls.schema):
            stacked = {name: _stack([a[name] for a in items]) for name in cls.schema}
            if cls.check_stacked(stacked):
                names = _field_names(cls)
                return [cls(**{name: a[name] for name in names}) for a in items]
        out: list[Message | IncompatibleMessageError] = []
        for a, sender in zip(items, senders):
            try:
                out.append(cls.from_arrays(a, sender=sender))
            except IncompatibleMessageError as exc:
                out.append(exc)
        return out

    @classmethod
    def check_stacked(cls, stacked: dict[str, Any]) -> bool:
        """Whether many same-shaped messages, stacked on axis 0, all pass :meth:`from_arrays`:
        exactly the schema's fields, dtype kinds, dimensions, finiteness, then
        :meth:`validate_many`. False says only that one of them fails, not which."""
        if not isinstance(stacked, dict) or stacked.keys() != cls.schema.keys():
            return False
        for name, (kinds, ndim) in cls.schema.items():
            a = stacked[name]
            if not isinstance(a, np.ndarray) or a.dtype.kind not in kinds or a.ndim != ndim + 1:
                return False
        if not all(np.isfinite(v).all() for v in stacked.values() if v.dtype.kind == "f"):
            return False
        return bool(cls.validate_many(stacked))

    @property
    def nbytes(self) -> int:
        """Payload bytes of the wire form."""
        return sum(a.nbytes for a in self.to_arrays().values())


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """np.stack for same-shaped arrays (concatenate + reshape: much less per-array overhead)."""
    first = arrays[0]
    if first.ndim == 0:
        return np.array(arrays)
    return np.concatenate(arrays).reshape((len(arrays),) + first.shape)


@dataclass(frozen=True)
class StackedReplies:
    """The replies of many devices with one message type and one layout, held column-wise.

    ``arrays[name]`` stacks field ``name`` of every device's reply on axis 0,
    device ``ids[i]`` owning row ``i``. Device ``ids[i]``'s wire form is
    ``{name: arrays[name][i]}``, so its payload is :attr:`nbytes_each` bytes, as if
    it were sent alone. The in-process transport validates such a batch once
    (:meth:`Message.check_stacked`) and builds the messages as views of its rows.
    """

    message_type: type[Message]
    ids: list[int]
    arrays: dict[str, np.ndarray]

    @property
    def nbytes_each(self) -> int:
        """Payload bytes of one device's reply (every row has the same layout)."""
        return sum(a.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
                   for a in self.arrays.values())

    def wires(self) -> list[dict[str, np.ndarray]]:
        """Each device's wire form: its row of every field (views, no copies)."""
        names = list(self.arrays)
        return [dict(zip(names, row)) for row in zip(*(self.arrays[n] for n in names))]

    def messages(self) -> list[Message]:
        """Each device's message, fields viewing the batch's rows; unchecked: call
        :meth:`Message.check_stacked` on :attr:`arrays` first for replies from devices."""
        cls = self.message_type
        names = _field_names(cls)
        out = []
        for row in zip(*(self.arrays[n] for n in names)):
            msg = object.__new__(cls)   # the frozen dataclass's __init__, without its checks
            msg.__dict__.update(zip(names, row))
            out.append(msg)
        return out


class ReplyTable(MutableMapping):
    """A round's checked replies, device id -> message, held as stacked batches.

    The mapping of :class:`StackedReplies` ``batches`` (each checked whole, device
    ``batch.ids[i]`` owning row ``i``), in batch order. :attr:`ids` and
    :meth:`column` read the batches without a message object per device (a server
    that reads the replies column-wise); any other access builds every device's
    message once (views of the batch rows, as :meth:`StackedReplies.messages`) and
    from then on the table is a plain dictionary of them.
    """

    __slots__ = ("batches", "_ids", "_id_set", "_messages")

    def __init__(self, batches: list[StackedReplies]):
        self.batches = list(batches)
        self._ids: list[int] | None = None
        self._id_set: frozenset[int] | None = None
        self._messages: dict[int, Message] | None = None

    @property
    def columnar(self) -> bool:
        """Whether the batches still are the table (no device added, replaced or removed)."""
        return self._messages is None

    @property
    def ids(self) -> list[int]:
        """The devices, in order (batch by batch)."""
        if self._messages is not None:
            return list(self._messages)
        if self._ids is None:
            self._ids = [z for b in self.batches for z in b.ids]
        return self._ids

    def column(self, name: str) -> list[np.ndarray]:
        """Field ``name`` of every device's reply in :attr:`ids` order (views of the rows)."""
        if self._messages is not None:
            return [getattr(m, name) for m in self._messages.values()]
        return list(chain.from_iterable(b.arrays[name] for b in self.batches))

    def _dict(self) -> dict[int, Message]:
        if self._messages is None:
            msgs: dict[int, Message] = {}
            for b in self.batches:
                msgs.update(zip(b.ids, b.messages()))
            self._messages = msgs
        return self._messages

    def __getitem__(self, device_id: int) -> Message:
        return self._dict()[device_id]

    def __setitem__(self, device_id: int, message: Message) -> None:
        self._dict()[device_id] = message

    def __delitem__(self, device_id: int) -> None:
        del self._dict()[device_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        if self._messages is not None:
            return len(self._messages)
        return sum(len(b.ids) for b in self.batches)

    def __contains__(self, device_id: object) -> bool:
        if self._messages is not None:
            return device_id in self._messages
        if self._id_set is None:
            self._id_set = frozenset(self.ids)
        return device_id in self._id_set

    def copy(self) -> "ReplyTable | dict[int, Message]":
        """A table over the same batches (a dictionary once messages are built)."""
        if self._messages is not None:
            return dict(self._messages)
        return ReplyTable(self.batches)

    def __repr__(self) -> str:
        return f"ReplyTable({len(self)} replies in {len(self.batches)} batches)"


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _same_layout(items: list[Any], schema: dict[str, Any]) -> bool:
    """All items are dicts with exactly the schema's fields, as arrays of one dtype and shape."""
    first = items[0]
    if not isinstance(first, dict) or first.keys() != schema.keys():
        return False
    ref = {}
    for name in schema:
        a = first[name]
        if not isinstance(a, np.ndarray):
            return False
        ref[name] = (a.dtype, a.shape)
    for item in items[1:]:
        if not isinstance(item, dict) or item.keys() != schema.keys():
            return False
        for name, (dt, shape) in ref.items():
            a = item[name]
            if not isinstance(a, np.ndarray) or a.dtype != dt or a.shape != shape:
                return False
    return True


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
