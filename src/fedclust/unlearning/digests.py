"""Digests and comparisons of protocol results: bit for bit (:func:`digest_result`) or
within the downdate tolerance (:func:`results_close`), for ``forget`` and ``verify``."""

from __future__ import annotations

import hashlib
from dataclasses import fields, is_dataclass
from typing import Any, Mapping

import numpy as np

from ..core.protocol import RunLog
from .store import digest_message

__all__ = ["DOWNDATE_RTOL", "digest_result", "results_close"]


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, RunLog) or value is None:
        return
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            h.update(f.name.encode())
            _feed(h, getattr(value, f.name))
    elif isinstance(value, Mapping):
        for k in sorted(value, key=repr):
            h.update(repr(k).encode())
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        for v in value:
            _feed(h, v)
    elif hasattr(value, "to_arrays"):
        h.update(digest_message(value).encode())
    else:
        h.update(repr(value).encode())


def digest_result(result: Any) -> str:
    """SHA-256 of a protocol result: every array bit for bit (run logs left out)."""
    h = hashlib.sha256()
    _feed(h, result)
    return h.hexdigest()


#: a downdated result's floating-point arrays equal a fresh computation's within this
#: relative tolerance (of each array's largest magnitude); everything else bit for bit
DOWNDATE_RTOL = 1e-12


def results_close(a: Any, b: Any) -> bool:
    """``a`` and ``b`` (protocol results) are equal, float arrays within
    :data:`DOWNDATE_RTOL` (run logs left out)."""
    if isinstance(a, RunLog) or a is None:
        return isinstance(b, RunLog) or b is None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind != "f":
            return bool(np.array_equal(a, b))
        scale = max(float(np.max(np.abs(a), initial=0.0)), np.finfo(a.dtype).tiny)
        return bool(np.max(np.abs(a - b), initial=0.0) <= DOWNDATE_RTOL * scale)
    if is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(results_close(getattr(a, f.name), getattr(b, f.name))
                                          for f in fields(a))
    if isinstance(a, Mapping):
        return (isinstance(b, Mapping) and set(a) == set(b)
                and all(results_close(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(results_close(x, y) for x, y in zip(a, b)))
    if hasattr(a, "to_arrays"):
        return digest_message(a) == digest_message(b)
    return a == b
