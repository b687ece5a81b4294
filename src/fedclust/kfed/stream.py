"""k-FED over a stream of devices: only each device's centers and counts are kept.

``KFed.fit(devices)`` with ``devices`` an iterator (a generator, a lazy
reader of site files) runs here, in process: devices are read in chunks,
same-shaped devices of a chunk run the local step as one batch
(:func:`fedclust.kfed.batched.spectral_kmeans_batch`, with the same per-device
random streams as the protocol's ``client_steps``), and the chunk's rows are
dropped. Memory grows with Σ k_z · d (the device centers), not with the rows.
With the default server each device refines its summary up the
:func:`~fedclust.kfed.summary.summary_ladder` exactly as the protocol's devices do
(its scatters are not kept, so no explanation warning is raised).
The server step then runs on all device centers: the protocol's own
:func:`~fedclust.kfed.server.aggregate_centers` while the centers are few,
else directly on the stacked centers, so no per-device object and no second
copy of the centers is built — ``server="kmeans++"`` by
:func:`fedclust.core.kmeans.weighted_kmeans` (coreset seeding, blocked Lloyd),
the default server by :func:`fedclust.kfed.keyed.sampled_weighted_kmeans`
(keyed coreset, blocked Lloyd; the list fit's result bit for bit).

Row labels are not kept (the rows are gone): ``center_labels_[z]`` maps each of
device z's centers to its cluster, and ``predict`` labels any rows.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence as SequenceABC
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..core.exceptions import FedClustError, ValidationError
from ..core.kmeans import weighted_kmeans
from ..core.protocol import Request
from ..core.random import device_rng, device_uniforms, server_rng
from ..core.threads import one_blas_thread
from ..core.validation import check_devices
from .batched import n_uniforms, spectral_kmeans_batch
from .protocol import ACTION, KFedProtocol
from .local import use_randomized_svd
from .summary import summary_kmeans_stacked, summary_ladder
from .keyed import StackedKeys, sample_size, sampled_weighted_kmeans
from .server import KEYED_SERVERS, LARGE_N, aggregate_centers

__all__ = ["is_stream", "fit_stream", "StreamFit", "Ragged"]

#: rows read before a chunk's devices run (≈ 20 MB of float64 at d = 20)
CHUNK_ROWS = 1 << 17
#: device centers per storage block: blocks of ≥ 32 MB are their own memory maps, so
#: each one goes back to the system as soon as it is copied into the final array
BLOCK_BYTES = 64 << 20


class _Blocks:
    """Append-only rows in large fixed blocks; ``stack()`` frees each block as it copies."""

    def __init__(self, dtype: Any):
        self.dtype, self.blocks, self.fill, self.rows = np.dtype(dtype), [], 0, 0

    def append(self, a: np.ndarray) -> None:
        a = np.asarray(a, dtype=self.dtype)
        while len(a):
            if not self.blocks or self.fill == len(self.blocks[-1]):
                cap = max(1, BLOCK_BYTES // max(1, self.dtype.itemsize * int(np.prod(a.shape[1:]))))
                self.blocks.append(np.empty((cap,) + a.shape[1:], dtype=self.dtype))
                self.fill = 0
            take = min(len(a), len(self.blocks[-1]) - self.fill)
            self.blocks[-1][self.fill:self.fill + take] = a[:take]
            self.fill += take
            self.rows += take
            a = a[take:]

    def stack(self, row_shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty((self.rows,) + row_shape, dtype=self.dtype)
        at = 0
        while self.blocks:
            b = self.blocks.pop(0)
            n = min(len(b), self.rows - at)
            out[at:at + n] = b[:n]
            at += n
            del b
        return out


def is_stream(X: Any) -> bool:
    """True for an iterable of devices that is not a sequence or an array (a generator)."""
    return (isinstance(X, Iterable) and not isinstance(X, (SequenceABC, np.ndarray, dict))
            and not hasattr(X, "shape"))


class Ragged(SequenceABC):
    """Rows ``offsets[i]:offsets[i+1]`` of one stacked array as item i (views, no copies)."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self.data[self.offsets[i]:self.offsets[i + 1]]


@dataclass
class StreamFit:
    centers: np.ndarray          # (k, d) final centers
    local_centers: np.ndarray    # (N, d) all device centers, device after device
    local_counts: np.ndarray     # (N,)
    center_labels: np.ndarray    # (N,) cluster of every device center
    offsets: np.ndarray          # (Z + 1,) device z's centers are rows offsets[z]:offsets[z+1]
    device_ids: Sequence         # (Z,) range(Z) unless ids were given
    seed_device: int | None
    n_iter: int
    n_points: int


def _chunks(devices: Iterator[Any]) -> Iterator[list[Any]]:
    chunk, rows = [], 0
    for X in devices:
        chunk.append(X)
        rows += int(getattr(X, "shape", (1,))[0]) if hasattr(X, "shape") else 1
        if rows >= CHUNK_ROWS:
            yield chunk
            chunk, rows = [], 0
    if chunk:
        yield chunk


def _local_steps(protocol: KFedProtocol, chunk: list[Any], ids: list[int], d: int | None,
                 seed: int, request: Request) -> tuple[list[Any], list[Any]]:
    """Centers and counts of a chunk's devices: same-shaped devices as one batch, the rest
    (and any device the batch cannot take) one by one, for the exact error."""
    groups: dict[tuple, list[int]] = {}
    for i, X in enumerate(chunk):
        ok = (isinstance(X, np.ndarray) and X.ndim == 2 and X.dtype.kind == "f"
              and (d is None or X.shape[1] == d))
        k_i = protocol.k_local(ids[i]) if ok else 0
        if ok and protocol.summarise:   # the default server's summary ladder from k_sent
            ok = X.shape[0] > protocol.k_sent(k_i, X.shape[0], X.shape[1])
        elif ok:
            ok = X.shape[0] > k_i and not (X.shape[1] > k_i and use_randomized_svd(
                X.shape[0], X.shape[1], k_i))
        if ok:
            groups.setdefault((X.shape, X.dtype.str), []).append(i)
        else:
            groups.setdefault(("single", i), []).append(i)
    C_out: list[Any] = [None] * len(chunk)
    N_out: list[Any] = [None] * len(chunk)
    for key, members in groups.items():
        batch = None
        if key[0] != "single":
            k = protocol.k_local(ids[members[0]])
            if len({protocol.k_local(ids[i]) for i in members}) == 1:
                batch = np.stack([chunk[i] for i in members])
                if not np.isfinite(batch).all():
                    batch = None
        if batch is not None and protocol.summarise:
            n, d_ = batch.shape[1:]
            mids = [ids[i] for i in members]
            ladder = summary_ladder(n, d_, protocol.n_clusters,
                                    start=protocol.k_sent(k, n, d_))
            try:   # as the protocol's client_steps: the same uniforms, streams and rungs
                rungs = summary_kmeans_stacked(
                    batch, ladder, device_uniforms(seed, mids, 0, n_uniforms(ladder[-1])),
                    lambda j: device_rng(seed, mids[j], 0), max_iter=protocol.local_max_iter,
                    tol=protocol.tol, devices=[f"device {z}" for z in mids])
            except FedClustError:   # one by one below, each device its own error
                rungs = []
            else:
                for idx, C, N, _, _ in rungs:
                    for j, c, cnt in zip(idx, C, N):
                        C_out[members[j]], N_out[members[j]] = c, cnt.astype(np.int64)
                members = []
        elif batch is not None:
            mids = [ids[i] for i in members]
            U = device_uniforms(seed, mids, 0, n_uniforms(k))
            C, _, N, _ = spectral_kmeans_batch(batch, k, U, max_iter=protocol.local_max_iter,
                                               tol=protocol.tol)
            bad = (N == 0).any(axis=1)
            for j, i in enumerate(members):
                if not bad[j]:
                    C_out[i], N_out[i] = C[j], N[j].astype(np.int64)
            members = [i for j, i in enumerate(members) if bad[j]]
        for i in members:  # one by one: the exact error, or the raw-points case
            X = check_devices([chunk[i]], ids=[ids[i]])[0]
            if d is not None and X.shape[1] != d:
                raise ValidationError(f"device {ids[i]} has {X.shape[1]} features but the "
                                      f"first device has {d}")
            msg = protocol.client_step(request, X, device_id=ids[i], seed=seed, state={})
            C_out[i], N_out[i] = msg.centers, msg.counts
    return C_out, N_out


def _sampled_on_stack(C_all: np.ndarray, N_all: np.ndarray, offsets: np.ndarray,
                      ids: Sequence, k: int, seed: int, protocol: KFedProtocol):
    """:func:`~fedclust.kfed.keyed.sampled_weighted_kmeans` on the stacked device centers
    (C_all (N, d), N_all (N,), device z's rows ``offsets[z]:offsets[z + 1]``), keyed by the
    device ids as the protocol's server keys them (:class:`~fedclust.kfed.keyed.StackedKeys`:
    each block's keys made from the offsets, no (N,) key arrays; the counts as weights,
    made float per block); None where it cannot run (then the caller takes
    :func:`~fedclust.kfed.server.aggregate_centers`)."""
    return sampled_weighted_kmeans(C_all, k, N_all, StackedKeys(ids, offsets), None, seed,
                                   sample_size(len(C_all), k), max_iter=protocol.max_iter,
                                   tol=protocol.tol)


def fit_stream(protocol: KFedProtocol, devices: Iterable[Any], seed: int, *,
               device_ids: Iterable[int] | None = None, n_jobs: int | None = None) -> StreamFit:
    """Local steps over a stream of devices, then the server step (see module docstring).

    ``n_jobs`` threads run the chunks' local steps (None: every core) while this
    thread reads the stream; at most ``n_jobs + 1`` chunks are held at once, and
    the results are taken in stream order, so they do not depend on ``n_jobs``.
    """
    ids_iter = None if device_ids is None else iter(device_ids)
    kept_c = _Blocks(np.float64)
    kept_n = _Blocks(np.int64)
    sizes: list[np.ndarray] = []
    ids_seen: list[int] = []
    n_dev = 0
    n_points = 0
    d = protocol.n_features
    request = Request(round=0, action=ACTION)
    jobs = max(1, n_jobs if n_jobs is not None else (os.cpu_count() or 1))
    pending: deque = deque()

    def keep(C_out: list[Any], N_out: list[Any]) -> None:
        nonlocal n_points
        n_points += int(sum(int(n.sum()) for n in N_out))  # a device's counts sum to its rows
        kept_c.append(np.concatenate(C_out))
        kept_n.append(np.concatenate(N_out))
        sizes.append(np.fromiter((len(c) for c in C_out), dtype=np.int64, count=len(C_out)))

    # numpy releases the GIL in the batched maths, so threads overlap the chunks
    with one_blas_thread(), ThreadPoolExecutor(jobs) as pool:
        try:
            for chunk in _chunks(iter(devices)):
                ids = (list(range(n_dev, n_dev + len(chunk))) if ids_iter is None
                       else [int(next(ids_iter)) for _ in chunk])
                if ids_iter is not None:
                    ids_seen.extend(ids)
                if d is None and isinstance(chunk[0], np.ndarray) and chunk[0].ndim == 2:
                    d = int(chunk[0].shape[1])
                n_dev += len(chunk)
                if d is None:  # the first chunk fixes the feature count for the others
                    C_out, N_out = _local_steps(protocol, chunk, ids, d, seed, request)
                    d = C_out[0].shape[1]
                    keep(C_out, N_out)
                    continue
                pending.append(pool.submit(_local_steps, protocol, chunk, ids, d, seed, request))
                del chunk
                while len(pending) > jobs:
                    keep(*pending.popleft().result())
            while pending:
                keep(*pending.popleft().result())
        finally:
            for fut in pending:
                fut.cancel()
    if n_dev == 0:
        raise ValidationError("the stream of devices was empty: nothing to fit")
    # one array for all device centers, freeing each block as it is copied
    total = kept_c.rows
    offsets = np.zeros(n_dev + 1, dtype=np.int64)   # before the stack: its temporaries are small
    np.cumsum(np.concatenate(sizes), out=offsets[1:])
    del sizes
    C_all = kept_c.stack((d,))
    N_all = kept_n.stack(())
    k = protocol.n_clusters
    if total < k:
        raise ValidationError(f"the devices sent {total} local centers in all but "
                              f"n_clusters={k}; need sum k_z >= k")
    rng = server_rng(seed)
    ids_out: Sequence = range(n_dev) if ids_iter is None else ids_seen
    res = None
    if protocol.server == "kmeans++" and total > LARGE_N:
        w = N_all.astype(np.float64) if protocol.weighted else None
        res = weighted_kmeans(C_all, k, rng, weights=w, max_iter=protocol.max_iter,
                              tol=protocol.tol)
    elif protocol.server in KEYED_SERVERS and sample_size(total, k) is not None:
        # the default server on the stacked centers in place (no per-device list, no second
        # copy): what aggregate_centers runs on their concatenation, the same bits
        res = _sampled_on_stack(C_all, N_all, offsets, ids_out, k, seed, protocol)
    if res is not None:
        final, labels, n_iter, seed_dev = res.centers, res.labels, res.n_iter, None
    else:
        first = protocol.first_device
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            ids_list = list(range(n_dev)) if ids_iter is None else ids_seen
            if int(first) not in ids_list:
                raise ValidationError(f"first_device={first} did not reply")
            first = ids_list.index(int(first))
        views = Ragged(C_all, offsets)
        agg = aggregate_centers(list(views), k, counts=list(Ragged(N_all, offsets)),
                                method=protocol.server, weighted=protocol.weighted,
                                first_device=first, rng=rng, max_iter=protocol.max_iter,
                                tol=protocol.tol, seed=seed,
                                device_ids=list(ids_out))
        final, n_iter, seed_dev = agg.centers, agg.n_iter, agg.seed_device
        labels = np.concatenate(agg.center_labels) if agg.center_labels else np.zeros(0, int)
    return StreamFit(final, C_all, N_all, labels, offsets, ids_out,
                     None if seed_dev is None else ids_out[seed_dev], n_iter, n_points)

