"""What a followed forget of the keyed server (:mod:`fedclust.kfed.keyed_unlearn`) leaves,
each worked out from the last forget's where the rows it sums are the same: the kept
start's exact final means, the starts' partition names and each device's center labels."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from ..core.kmeans import sum_by_label
from .keyed_trace import KeyedTrace

__all__ = ["exact_means", "center_labels", "partition_classes", "same_partitions"]


def center_labels(tr: KeyedTrace, ids: list[int], labels: np.ndarray,
                   alive: np.ndarray, rewritten: set = frozenset()) -> dict:
    """Each remaining device's alive slice of ``labels``; a device none of whose rows
    changed label since the last forget (and not ``rewritten`` by a row deletion) keeps its
    array from there (the same values)."""
    off, row_of = tr.offsets, tr.row_of
    prev = tr.center_labels
    def own(z):
        lo, hi = off[row_of[z]], off[row_of[z] + 1]
        seg = labels[lo:hi]
        # a row deletion that shrank the summary leaves the segment's tail dead
        return seg if alive[hi - 1] else seg[alive[lo:hi]]

    if tr.labels is None or not prev:
        return {z: own(z) for z in ids}
    moved = set(np.unique(tr.owner[alive & (labels != tr.labels)]).tolist()) | set(rewritten)
    return {z: own(z) if z in moved else prev[z] for z in ids}


def partition_classes(finals: list, sizes: list, alive: np.ndarray, k: int,
                       known: list, check: np.ndarray | None = None
                       ) -> tuple[list, list]:
    """``(names, codes)``: per start the first start with its partition of the remaining
    rows (``names[s] == s``: a new partition), for :func:`pick_start`. Only starts with the
    same cluster weights are compared: label by label, through the map from one start's
    labels to the other's; two starts whose ``known`` names (their partition at the last
    forget, of labels unchanged since) are equal share it without a comparison. Each new
    partition is compared with every later start still unnamed in one call
    (:func:`same_partitions`): a start takes the first earlier partition it matches.

    ``known[s]``: None or ``(name, code)`` with ``code`` (k,) the map from the start's
    labels to its class's common labels (-1: a label no remaining row had; None: not
    known). ``codes[s]``: that map for the names returned.
    ``check``: rows whose values changed since the last forget (a row deletion's new
    pieces): two starts of one known name share it only where their codes agree on those
    rows too (the other remaining rows kept their labels, and the codes agree there),
    else they are compared."""
    S = len(finals)
    names: list = [None] * S
    codes: list = [None] * S
    known = [(None, None) if x is None else x for x in known]
    if check is not None:   # rows changed: a known name holds only with its code
        known = [(None, None) if c is None else (n, c) for n, c in known]
    F = None
    for r in range(S):
        if names[r] is not None:
            continue
        names[r] = r
        name_r, code_r = known[r]
        if code_r is None:
            code_r = np.arange(k)   # a new class: the start's own labels
        codes[r] = code_r
        later = [s for s in range(r + 1, S) if names[s] is None and sizes[s] == sizes[r]]
        for s in later:
            name_s, code_s = known[s]
            if name_s is None or name_s != name_r:
                continue
            if check is not None:
                a, b = code_r[finals[r][check]], code_s[finals[s][check]]
                if (a < 0).any() or (a != b).any():
                    continue
            names[s], codes[s] = r, code_s
        rest = [s for s in later if names[s] is None]
        if rest:
            if F is None:
                F = np.stack(finals)[:, np.flatnonzero(alive)]
            same = same_partitions(F[r], F[rest], k)
            if same.any():
                # the map from each matching start's labels to r's, then r's code
                hit = np.array(rest)[same]
                to = np.full((len(hit), k), -1, np.int64)
                to[np.arange(len(hit))[:, None], F[hit]] = F[r][None, :]
                cr = np.asarray(code_r, np.int64)
                for s, t in zip(hit.tolist(), to):
                    codes[s] = np.where(t >= 0, cr[np.maximum(t, 0)], -1)
            for s, sm in zip(rest, same.tolist()):
                if sm:
                    names[s] = r
    return names, codes


def same_partitions(a: np.ndarray, B: np.ndarray, k: int) -> np.ndarray:
    """Whether labels ``a`` (n,) and each row of ``B`` (m, n) (values below k) group the
    rows alike, (m,) bool: in the table of label pairs (a, b) every a-label meets one
    b-label (a -> b is a function) and every b-label one a-label (one-to-one); one count
    of the pairs for every row of B (for a large k, the map a -> b itself)."""
    m = len(B)
    if k * k > 8 * max(len(a), 1):   # the table would outgrow the labels: a map instead
        to = np.full((m, k), -1, np.int64)
        to[np.arange(m)[:, None], a[None, :]] = B
        srt = np.sort(to, axis=1)
        return (to[:, a] == B).all(axis=1) \
            & ~((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(axis=1)
    # the pair codes in the narrowest integer that holds them (int32 counts three times
    # faster than int64)
    it = np.int32 if m * k * k < 2 ** 31 else np.int64
    pairs = (np.arange(m, dtype=it)[:, None] * (k * k) + a.astype(it)[None, :] * k) \
        + B.astype(it)
    hit = np.bincount(pairs.ravel(), minlength=m * k * k).reshape(m, k, k) > 0
    return (hit.sum(axis=2) <= 1).all(axis=1) & (hit.sum(axis=1) <= 1).all(axis=1)


def exact_means(Cw: np.ndarray, w: np.ndarray, labels: np.ndarray, alive: np.ndarray,
                k: int, ref: tuple | None = None, rewritten: np.ndarray | None = None
                ) -> np.ndarray:
    """The weighted means of the remaining rows by label with the bits of
    :func:`~fedclust.core.kmeans.update_centers` over the remaining rows stacked alone:
    the same one-hot product and weighted count, each cluster summed in row order (the
    removed rows go to a k-th cluster that is dropped, so they add nothing, not even a
    rounding). ``Cw`` (N, d): the rows times their weights.

    ``ref``: ``(labels, alive, centers)`` of an earlier call. A cluster whose rows are
    the same (none left, joined or changed label) sums the same rows in the same order,
    so it keeps its mean from there; only the others are summed again, over their rows
    alone (each cluster's sum and count in row order, as over all rows). ``rewritten``:
    rows whose values changed since ``ref`` (a row deletion's new pieces)."""
    if ref is not None and len(ref[2]) == k:
        lab0, alive0, centers0 = ref
        diff = (alive != alive0) | (labels != lab0)
        if rewritten is not None:
            diff[rewritten] = True
        touched = np.union1d(labels[diff & alive], lab0[diff & alive0])
        centers = centers0.copy()
        if len(touched):
            # the touched clusters' one-hot rows over all rows (the others' columns
            # empty): each cluster summed in row order by the same product
            t = len(touched)
            to = np.full(k, t)
            to[touched] = np.arange(t)
            rows = np.flatnonzero(alive & (to[labels] < t))
            lab = to[labels[rows]]
            by = np.argsort(lab, kind="stable")
            indptr = np.concatenate([[0], np.cumsum(np.bincount(lab, minlength=t))])
            onehot = csr_matrix((np.ones(len(rows)), rows[by], indptr), shape=(t, len(Cw)))
            counts = np.bincount(lab, weights=w[rows], minlength=t)
            centers[touched] = (onehot @ Cw) / counts[:, None]
        return centers
    lab = np.where(alive, labels, k)
    sums = np.zeros((k + 1, Cw.shape[1]))
    sum_by_label(Cw, lab, k + 1, sums)
    counts = np.bincount(lab, weights=w, minlength=k + 1)
    return sums[:k] / counts[:k, None]
