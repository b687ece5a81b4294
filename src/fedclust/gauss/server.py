"""Server-side maths: pool the owners' statistics exactly and merge their clusters.

The global statistics are pooled with Chan's formula; the clusters of every
owner are put in one canonical order (class, then size, then mean), so the
result does not depend on the order in which owners reply; then the best
same-class pair is merged while it passes the merge test (:meth:`ClusterSet.merge_all`,
run as :func:`~fedclust.gauss.lazy_merge.merge_all_lazy`:
BIC by default; the paper's volume criterion with its size cap, followed by folding
fragments below ``min_weight``, with ``merge_test="volume"``), the merged clusters are
consolidated against the received pieces (:func:`~fedclust.gauss.consolidate.consolidate`:
clustering with the BIC test), and the oldest
clusters past ``max_clusters`` are removed (their samples counted in ``removed``). Work: O(K^2 D^2 + m K D^3) for K received
clusters and m merges.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .combine import combine_by_entropy, combine_unimodal
from .consolidate import consolidate, snapshot
from .lazy_merge import merge_all_lazy
from .local import add_clusters
from .messages import GaussClusters
from .model import ARRAYS, ClusterSet, Settings
from .stats import merge_class_moments, merge_moments

__all__ = ["merge_messages", "canonical_order", "sort_canonical"]


def canonical_order(msgs: Sequence[GaussClusters]) -> list[GaussClusters]:
    """Messages sorted by content (global count, then mean), not by arrival."""
    keys = [(int(m.global_count), tuple(np.asarray(m.global_mean).tolist()),
             tuple(np.asarray(m.global_m2).tolist()), int(m.means.shape[0])) for m in msgs]
    return [msgs[i] for i in sorted(range(len(msgs)), key=lambda i: keys[i])]


def merge_messages(msgs: Sequence[GaussClusters], settings: Settings, n_classes: int,
                   previous: GaussClusters | None = None, combine: str = "none") -> ClusterSet:
    """The global model from the owners' messages (and the previous global model);
    ``combine="entropy"`` then combines its components by the entropy of the posteriors
    (:func:`~fedclust.gauss.combine.combine_by_entropy`), ``combine="unimodal"`` the pairs
    whose mixture has one mode (:func:`~fedclust.gauss.combine.combine_unimodal`)."""
    parts = ([previous] if previous is not None else []) + canonical_order(list(msgs))
    D = parts[0].means.shape[1]
    g: tuple = (0, np.zeros(D), np.zeros(D))
    for m in parts:
        g = merge_moments(g, (int(m.global_count), m.global_mean, m.global_m2))
    srv = ClusterSet(D, settings, n_classes)
    srv.set_global(*g)
    gc = (np.zeros(n_classes, np.int64), np.zeros((n_classes, D)), np.zeros((n_classes, D)))
    for m in parts:  # per-class statistics, pooled exactly (Fisher scores)
        gc = merge_class_moments(gc, (m.class_count, m.class_mean, m.class_m2))
    srv.gc = gc
    for m in parts:
        add_clusters(srv, m)
    _sort_canonical(srv)
    pieces = snapshot(srv)
    merge_all_lazy(srv)   # srv.merge_all(), computing only the log-determinants that decide
    consolidate(srv, pieces)
    srv.absorb_fragments()
    srv.prune()
    if combine == "entropy":
        combine_by_entropy(srv)
    elif combine == "unimodal":
        combine_unimodal(srv)
    _sort_canonical(srv)
    return srv


def _sort_canonical(cs: ClusterSet) -> None:
    C = cs.C
    if C < 2:
        return
    keys = [cs.mu[:C, d] for d in range(cs.D - 1, -1, -1)] + [-cs.n[:C], cs.cls[:C]]
    order = np.lexsort(keys)
    for name in ARRAYS:
        arr = getattr(cs, name)
        arr[:C] = arr[order]


#: clusters in the canonical order (class, then size, then mean), in place
sort_canonical = _sort_canonical
