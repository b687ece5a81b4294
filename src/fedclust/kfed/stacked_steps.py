"""k-FED's device steps and final labelling for many devices at once (the in-process
transport's column-wise path): devices of one shape and one k_z run as one batch, and the
final message labels small devices' rows in stacked chunks. Each device's result is the
one :class:`~fedclust.kfed.protocol.KFedProtocol` gives it alone, bit for bit.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import repeat
from operator import attrgetter, contains
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..core.exceptions import FedClustError
from ..core.kmeans import assign
from ..core.messages import StackedReplies
from ..core.protocol import Request
from ..core.random import device_rng, device_uniforms
from .batched import n_uniforms
from .local import local_kmeans_many, local_kmeans_stacked, local_scatter, local_scatter_stacked
from .local_auto import auto_range, local_kmeans_auto_many
from .summary import summary_kmeans_stacked, summary_ladder

__all__ = ["DeviceNames", "stacked_steps", "gather_label_maps", "label_by_centers", "ACTION"]

ACTION = "local_centers"
#: devices with at most this many values are stacked into one array per batch
STACK_MAX = 4096
#: the final centers label devices of fewer rows than this stacked together ...
SHARED_FINISH_ROWS = 256
#: ... in chunks of about this many rows (a few MB at d = 100)
SHARED_FINISH_CHUNK = 16_384
_SHAPE = attrgetter("shape")
_DTYPE = attrgetter("dtype")

Replies = dict[int, Any]


class DeviceNames(Sequence):
    """``"device <id>"`` for each id, made when asked for (only an error names a device)."""

    __slots__ = ("ids",)

    def __init__(self, ids: Sequence[int]):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [f"device {z}" for z in self.ids[i]]
        return f"device {self.ids[i]}"


def stacked_steps(protocol: Any, request: Request, devices: Mapping[int, np.ndarray], *,
                  seed: int, states: Mapping[int, dict[str, np.ndarray]],
                  one_by_one: Callable[[dict[int, Any]], Replies]
                  ) -> tuple[list[StackedReplies], Replies]:
    """The k-FED round's device steps of ``protocol`` (a non-private
    :class:`~fedclust.kfed.protocol.KFedProtocol`): devices of one shape, dtype and k_z
    run as one batch; ``(stacked replies, replies)``. Devices that cannot join a batch
    (another type or shape, too few rows, non-finite values, a batch's error) go to
    ``one_by_one`` (the protocol's own per-device steps), which names each one's error."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    single: dict[int, np.ndarray] = {}
    # k_z sent depends on (k_z, n_z, d) only: worked out once per triple, not per device
    same_k = None if protocol.auto or isinstance(protocol.n_local_clusters, Mapping) \
        else protocol.n_local_clusters
    sent: dict[tuple[int, int, int], int] = {}
    items = devices.items()
    if same_k is not None and len(devices) > 1 \
            and set(map(type, devices.values())) == {np.ndarray}:
        # one shape and dtype for all (many small devices): one group, found at C speed
        shapes = set(map(_SHAPE, devices.values()))
        dtypes = set(map(_DTYPE, devices.values()))
        if len(shapes) == 1 and len(dtypes) == 1:
            (shape,), (dtype,) = shapes, dtypes
            if len(shape) == 2 and dtype.kind == "f":
                k = protocol.k_sent(same_k, shape[0], shape[1])
                if shape[0] > k:
                    groups[(shape, dtype, k)] = list(devices)
                    items = ()
    for z, X in items:
        if isinstance(X, np.ndarray) and X.ndim == 2 and X.dtype.kind == "f":
            shape = X.shape
            key = (same_k if same_k is not None else 0 if protocol.auto else protocol.k_local(z),
                   shape[0], shape[1])
            k = sent.get(key)
            if k is None:   # the auto k_z range depends only on n: one batch per shape
                k = sent[key] = (auto_range(key[1], protocol.n_clusters)[1] if protocol.local_auto
                                 else protocol.k_sent(*key))
            if shape[0] > k:
                groups[(shape, X.dtype, k)].append(z)
                continue
        single[z] = X   # the single path gives the precise error or the raw-points case
    batches = []
    for (shape, _, k), ids in groups.items():
        if shape[0] * shape[1] <= STACK_MAX:   # many tiny devices: one copy, one check
            batch = np.concatenate(list(map(devices.__getitem__, ids))).reshape(
                (len(ids),) + shape)
            # local_kmeans_stacked's Gram matrix tests the copy for finite values (its
            # diagonal; a non-finite device raises and the group runs one by one below)
            gram_checks = (not protocol.summarise and not protocol.local_auto
                           and shape[1] > k and shape[0] >= shape[1])
            finite = (np.ones(len(ids), dtype=bool) if gram_checks
                      else np.isfinite(batch).all(axis=(1, 2)))
        else:   # large devices: local_kmeans_many stacks them in bounded chunks and
            # tests each copied chunk for finite values (a non-finite device raises, and
            # its group runs one by one below, where the device gets its own error)
            batch = [devices[z] for z in ids]
            finite = np.ones(len(ids), dtype=bool)
        if len(ids) == 1 or not finite.all():  # non-finite devices get their own error
            single.update({z: devices[z] for z in ids})
            continue
        batches.append((k, ids, batch))
    out = one_by_one(single) if single else {}
    stacked: list[StackedReplies] = []
    for k, ids, batch in batches:
        try:
            if protocol.summarise:
                n, d = devices[ids[0]].shape
                ladder = summary_ladder(n, d, protocol.n_clusters, start=k)
                results = summary_kmeans_stacked(
                    batch, ladder,
                    device_uniforms(seed, ids, request.round, n_uniforms(ladder[-1])),
                    lambda i, ids=ids: device_rng(seed, ids[i], request.round),
                    max_iter=protocol.local_max_iter, tol=protocol.tol,
                    devices=[f"device {z}" for z in ids])
            elif protocol.local_auto:
                results = local_kmeans_auto_many(
                    batch, protocol.n_clusters,
                    lambda i, ids=ids: device_rng(seed, ids[i], request.round),
                    max_iter=protocol.local_max_iter, tol=protocol.tol,
                    allow_raw_points=protocol.allow_raw_points,
                    devices=DeviceNames(ids))
            else:
                results = local_kmeans_stacked(
                    batch, k, lambda i, ids=ids: device_rng(seed, ids[i], request.round),
                    uniforms=device_uniforms(seed, ids, request.round, n_uniforms(k)),
                    max_iter=protocol.local_max_iter, tol=protocol.tol,
                    devices=DeviceNames(ids))
                if results is None:   # large devices, one randomized SVD each
                    results = local_kmeans_many(
                        batch, k, lambda i, ids=ids: device_rng(seed, ids[i], request.round),
                        uniforms=device_uniforms(seed, ids, request.round, n_uniforms(k)),
                        max_iter=protocol.local_max_iter, tol=protocol.tol,
                        devices=DeviceNames(ids))
        except FedClustError:  # e.g. a device with too few distinct points: name it singly
            out.update(one_by_one({z: devices[z] for z in ids}))
            continue
        if protocol.summarise:   # one stacked batch per rung the devices stopped at
            for idx, C, N, L, S in results:
                rung_ids = [ids[i] for i in idx]
                for z, labels in zip(rung_ids, L):
                    states[z]["local_labels"] = labels
                stacked.append(StackedReplies(protocol.reply_types[ACTION], rung_ids, {
                    "centers": C, "counts": N.astype(np.int64), "scatter": S}))
            continue
        if isinstance(results, tuple):   # (B, k, d) centers, (B, k) counts, (B, n) labels
            C, N, L, _ = results
            for state, labels in zip(map(states.__getitem__, ids), L):
                state["local_labels"] = labels
            arrays = {"centers": C, "counts": N}
            if protocol.summarise:
                arrays["scatter"] = (local_scatter_stacked(batch, C, L)
                                     if isinstance(batch, np.ndarray) else
                                     np.stack([local_scatter(devices[z], c, lab)
                                               for z, c, lab in zip(ids, C, L)]))
            stacked.append(StackedReplies(protocol.reply_types[ACTION], list(ids), arrays))
            continue
        for z, res in zip(ids, results):
            states[z]["local_labels"] = res.labels
            out[z] = protocol.summary_reply(res.message, devices[z], res.labels)
    return stacked, out


def gather_label_maps(global_labels: np.ndarray, local: list[np.ndarray],
                      states: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every device's labels from its row of the stacked label maps ``global_labels``
    (B, k_z) and its local labels ``local[i]`` (n,) (all of one length)."""
    # one copy of every device's labels (np.stack costs a Python step per array)
    labels = np.take_along_axis(np.asarray(global_labels),
                                np.concatenate(local).reshape(len(local), -1), axis=1)
    out = [{"labels": row} for row in labels]
    if any(map(contains, states, repeat("n_clipped"))):
        for o, s in zip(out, states):
            if "n_clipped" in s:
                o["n_clipped"] = s["n_clipped"]
    return out


def label_by_centers(C: np.ndarray, devices: Sequence[np.ndarray],
                     states: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Every device's rows labelled by their nearest final center of ``C`` (k, d): small
    devices' rows stacked in chunks, one BLAS pass per chunk split back per device."""
    out: list[dict[str, np.ndarray]] = [{} for _ in states]
    chunk: list[tuple[int, np.ndarray]] = []
    rows = 0

    def label_chunk() -> None:
        labels = assign(np.concatenate([X for _, X in chunk]), C)[0]
        ends = np.cumsum([len(X) for _, X in chunk]).tolist()
        # plain slices: np.split's per-piece overhead is most of this loop at 10^5 devices
        for (i, _), a, b in zip(chunk, [0] + ends[:-1], ends):
            out[i]["labels"] = labels[a:b]
        chunk.clear()

    for i, (X, s) in enumerate(zip(devices, states)):
        if "local_labels" not in s:
            continue
        X = np.asarray(X, dtype=C.dtype)
        if X.ndim != 2 or len(X) >= SHARED_FINISH_ROWS:   # large devices: alone
            out[i]["labels"] = assign(X, C)[0]
        else:
            chunk.append((i, X))
            rows += len(X)
            if rows >= SHARED_FINISH_CHUNK:
                label_chunk()
                rows = 0
        if "n_clipped" in s:
            out[i]["n_clipped"] = s["n_clipped"]
    if chunk:
        label_chunk()
    return out
