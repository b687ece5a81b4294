"""Files that are never half-written.

Every output and checkpoint of a run goes through :func:`atomic_write`: the
bytes go to a temporary file in the same folder, are flushed to disk
(``fsync``), and the temporary file is renamed over the target
(:func:`os.replace`, atomic on POSIX and Windows). A run killed at any moment
leaves the previous complete file or none, never a truncated one.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Mapping

import numpy as np

__all__ = ["atomic_write", "atomic_open", "write_text_atomic", "write_json_atomic",
           "write_npz_atomic"]


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, newline: str | None = None
                ) -> Iterator[IO[Any]]:
    """``open(path, mode)`` whose content appears at ``path`` only when the block ends
    without an exception (then atomically); otherwise ``path`` is left as it was."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open: mode={mode!r} must be 'wb' or 'w'")
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8",
                                                             "newline": newline})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(folder)


def atomic_write(path: str | os.PathLike, data: bytes | Callable[[IO[bytes]], None]) -> Path:
    """Write ``data`` (bytes, or a function writing to a binary file) to ``path`` atomically."""
    with atomic_open(path, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, value: Any, **dumps: Any) -> Path:
    """Write ``json.dumps(value, **dumps)`` to ``path`` atomically."""
    return write_text_atomic(path, json.dumps(value, **dumps))


def write_npz_atomic(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], *,
                     compressed: bool = False) -> Path:
    """``numpy.savez`` of ``arrays`` to ``path`` atomically (no object arrays: no pickle)."""
    for key, a in arrays.items():
        if np.asarray(a).dtype == object:
            raise TypeError(f"{path}: array {key!r} has dtype object (it would need pickle)")
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return atomic_write(path, buf.getvalue())
