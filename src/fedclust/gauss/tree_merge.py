"""The server's merge along a fixed hash trie over the owners' ids (``server="tree"``).

:func:`~fedclust.gauss.server.merge_messages` pools every owner's clusters and runs
one greedy BIC merge over all K of them: O(K^2 D^2) time and a K x K score matrix,
and removing one owner means running all of it again. :class:`TreeMerge` merges along
a binary trie instead:

* every owner id ``z`` gets a 64-bit key, the first 8 bytes of SHA-256 of ``z``;
  a node of the trie holds the owners whose keys start with its bit prefix;
* a node holding at most ``leaf_size`` owners is a leaf: it merges their messages;
  a larger node splits by its next key bit, and a node with one non-empty half is
  that half (no work); a node with two halves merges the two halves' cluster sets;
* "merges" is the server's step on that node's inputs alone: pool the inputs' global
  (and per-class) statistics with Chan's formula in a canonical order, add their
  clusters in a canonical order, then (a leaf) the BIC merges (:func:`merge_all_lazy`)
  with the ridge of the node's pooled statistics and :func:`consolidate` against the
  owners' clusters, as the flat server does, or (a larger node) :func:`consolidate` of
  the two halves' clusters against every owner cluster below the node. The node keeps
  which of its clusters holds each owner cluster, so a higher node judges a join made
  lower down on all the samples below it and can split it again (the split step works
  on whole owner clusters, exact statistics); the root then folds fragments and prunes
  as ``merge_messages`` does.

So the shape of the trie, and every node's result, depends only on the owners below
that node: removing (or changing) one owner changes the nodes on its path, at most
64 and about log2(n_owners / leaf_size) + 2, and nothing else. Each node's result is
kept with the identities of the inputs it was computed from; a later call over
the same inputs reuses it, so a forget recomputes the path only, and the result is
bit for bit the one a fresh computation over the remaining owners gives (the same
function of the same inputs, one BLAS thread). ``last_work`` names the nodes computed
in the last call. Work per node: O(k^2 D^2) for the k clusters of its inputs plus
O(m k D^2) per consolidation round for the m owner clusters below it, so a whole fit
costs O(m_total k D^2 log(n_owners)) instead of O(n_owners^2 c^2 D^2), and a forget
O(m_total k D^2) (the root's consolidation sees every owner cluster).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .consolidate import consolidate, snapshot
from .lazy_merge import merge_all_lazy
from .local import add_clusters
from .messages import GaussClusters
from .model import ClusterSet, Settings
from .server import sort_canonical
from .stats import merge_class_moments, merge_moments

__all__ = ["TreeMerge", "owner_key"]

_BITS = 64


def owner_key(owner_id: int) -> int:
    """The owner's 64-bit place in the trie: SHA-256 of its id (not its position)."""
    digest = hashlib.sha256(b"fedclust-gauss-tree:%d" % int(owner_id)).digest()
    return int.from_bytes(digest[:8], "big")


@dataclass(frozen=True)
class _Part:
    """A node's result: its clusters (n, mu, S, cls, last) and pooled statistics, with the
    owners' own clusters below it (``leaves``: one (n, mu, S) per owner, in a fixed order)
    and the cluster of this result that holds each of them (``comp``, -1: none)."""

    n: np.ndarray
    mu: np.ndarray
    S: np.ndarray
    cls: np.ndarray
    last: np.ndarray
    g: tuple
    gc: tuple
    leaves: tuple
    comp: np.ndarray

    def key(self) -> tuple:
        return (float(self.g[0]), tuple(self.g[1].tolist()), tuple(self.g[2].tolist()),
                int(self.n.size))


class TreeMerge:
    """The trie merge with its per-node results kept between calls.

    Parameters
    ----------
    leaf_size : int
        Owners merged together at a leaf (a node with more splits in two).
    """

    def __init__(self, leaf_size: int = 8):
        self.leaf_size = int(leaf_size)
        self._kept: dict[tuple[int, int], tuple[tuple, _Part]] = {}
        self._final: tuple[tuple, ClusterSet] | None = None
        #: the nodes computed in the last call, ``"depth:prefix"`` (``"root"``: the final steps)
        self.last_work: list[str] = []

    def clear(self) -> None:
        """Forget every kept node result (the next call computes everything)."""
        self._kept.clear()
        self._final = None

    def merge(self, msgs: Sequence[GaussClusters], ids: Sequence[int], settings: Settings,
              n_classes: int, previous: GaussClusters | None = None) -> ClusterSet:
        """The global model from the owners' messages ``msgs`` (owner ids ``ids``)."""
        if len(msgs) != len(ids):
            raise ValueError(f"{len(msgs)} messages for {len(ids)} owner ids")
        self.last_work = []
        keyed = sorted(((owner_key(z), int(z), m) for z, m in zip(ids, msgs)),
                       key=lambda t: (t[0], t[1]))
        used: set[tuple[int, int]] = set()
        top = self._node(keyed, 0, 0, settings, n_classes, used)
        for k in [k for k in self._kept if k not in used]:
            del self._kept[k]   # nodes of departed owners
        inputs = (top, previous)
        if self._final is not None and _same(self._final[0], inputs):
            return _copy(self._final[1])
        if previous is None:   # the top node is merged and consolidated already
            srv = _set_of(top, settings, n_classes)
        else:
            srv = _merge_parts([top, _part_of_message(previous, settings, n_classes)],
                               settings, n_classes)[0]
        srv.absorb_fragments()
        srv.prune()
        sort_canonical(srv)
        self.last_work.append("root")
        self._final = (inputs, srv)
        return _copy(srv)

    def _node(self, keyed: list, depth: int, prefix: int, settings: Settings,
              n_classes: int, used: set) -> _Part:
        if len(keyed) > self.leaf_size and depth < _BITS:
            bit = 1 << (_BITS - 1 - depth)
            left = [t for t in keyed if not t[0] & bit]
            right = [t for t in keyed if t[0] & bit]
            if not left or not right:   # one half: that half is this node
                return self._node(left or right, depth + 1, 2 * prefix + bool(right),
                                  settings, n_classes, used)
            inputs = (self._node(left, depth + 1, 2 * prefix, settings, n_classes, used),
                      self._node(right, depth + 1, 2 * prefix + 1, settings, n_classes, used))
        else:
            inputs = tuple(t[2] for t in keyed)
        here = (depth, prefix)
        used.add(here)
        kept = self._kept.get(here)
        if kept is not None and _same(kept[0], inputs):
            return kept[1]
        if isinstance(inputs[0], _Part):
            srv = _merge_parts(list(inputs), settings, n_classes)
        else:
            srv = _merge_parts([_part_of_message(m, settings, n_classes) for m in inputs],
                               settings, n_classes)
        srv, leaves, comp = srv
        C = srv.C
        part = _Part(srv.n[:C].copy(), srv.mu[:C].copy(), srv.S[:C].copy(),
                     srv.cls[:C].copy(), srv.last[:C].copy(), srv.g, srv.gc, leaves, comp)
        self._kept[here] = (inputs, part)
        self.last_work.append(f"{depth}:{prefix:0{depth}b}" if depth else "0:")
        return part


def _same(a: tuple, b: tuple) -> bool:
    """The same inputs: the very same message or node-result objects, in order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _part_of_message(m: GaussClusters, settings: Settings, n_classes: int) -> _Part:
    D = m.means.shape[1]
    cs = ClusterSet(D, settings, n_classes)
    add_clusters(cs, m)
    C = cs.C
    n, mu, S = cs.n[:C].copy(), cs.mu[:C].copy(), cs.S[:C].copy()
    return _Part(n, mu, S, cs.cls[:C].copy(),
                 cs.last[:C].copy(), (int(m.global_count), np.asarray(m.global_mean, float),
                                      np.asarray(m.global_m2, float)),
                 (m.class_count, m.class_mean, m.class_m2), ((n, mu, S),), np.arange(C))


def _merge_parts(parts: list[_Part], settings: Settings, n_classes: int
                 ) -> tuple[ClusterSet, tuple, np.ndarray]:
    """The server's step on these inputs alone (their pooled statistics set the ridge),
    consolidated against the owners' own clusters below them (exact statistics, so a
    component that a lower node joined wrongly can be split again here); returns the
    cluster set, the owners' clusters and the cluster holding each of them."""
    parts = sorted(parts, key=_Part.key)
    D = parts[0].mu.shape[1]
    g: tuple = (0, np.zeros(D), np.zeros(D))
    gc: tuple = (np.zeros(n_classes, np.int64), np.zeros((n_classes, D)),
                 np.zeros((n_classes, D)))
    for p in parts:
        g = merge_moments(g, p.g)
        gc = merge_class_moments(gc, p.gc)
    srv = ClusterSet(D, settings, n_classes)
    srv.set_global(*g)
    srv.gc = gc
    leaves: tuple = ()
    uids = []
    for p in parts:
        leaves += p.leaves
        if p.n.size:
            idx = srv.add(p.mu, p.S, p.n, p.cls, p.last)
            uids.append(np.where(p.comp >= 0, srv.uid[idx][np.maximum(p.comp, 0)], -1))
        else:
            uids.append(np.full(p.comp.size, -1, np.int64))
    uid = np.concatenate(uids) if uids else np.zeros(0, np.int64)
    if len(parts) == 1:   # a lone input (a leaf of one owner): nothing to merge with
        return srv, leaves, parts[0].comp
    sort_canonical(srv)
    if len(parts) == sum(len(p.leaves) for p in parts):   # a leaf: the owners' clusters
        pieces = snapshot(srv)
        merge_all_lazy(srv)
        slots = np.empty(pieces["n"].size, np.int64)
        consolidate(srv, pieces, slots=slots)
        # the pieces in the order of the leaves (canonical order of the owners)
        order = np.argsort(pieces["uid"], kind="stable")
        slot_of = np.full(int(pieces["uid"].max()) + 1, -1, np.int64)
        slot_of[pieces["uid"][order]] = slots[order]
        held = slot_of[uid]
    else:
        ok = uid >= 0
        n = np.concatenate([lf[0] for lf in leaves])[ok]
        pieces = {"n": n, "mu": np.concatenate([lf[1] for lf in leaves])[ok],
                  "S": np.concatenate([lf[2] for lf in leaves])[ok], "uid": uid[ok]}
        if srv.s.merge_test != "bic" or n_classes:   # no consolidation: the merges alone
            merge_all_lazy(srv)
        slots = np.empty(n.size, np.int64)
        consolidate(srv, pieces, slots=slots)
        held = np.full(uid.size, -1, np.int64)
        held[ok] = slots
    # the same clusters after the canonical sort
    before = np.where(held >= 0, srv.uid[np.maximum(held, 0)], -1)
    sort_canonical(srv)
    where = np.full(int(srv.next_uid) + 1, -1, np.int64)
    where[srv.uid[:srv.C]] = np.arange(srv.C)
    comp = np.where(before >= 0, where[before], -1)
    return srv, leaves, comp


def _set_of(p: _Part, settings: Settings, n_classes: int) -> ClusterSet:
    """The cluster set holding exactly the node result ``p``."""
    srv = ClusterSet(p.mu.shape[1], settings, n_classes)
    srv.set_global(*p.g)
    srv.gc = p.gc
    if p.n.size:
        srv.add(p.mu, p.S, p.n, p.cls, p.last)
    return srv


def _copy(cs: ClusterSet) -> ClusterSet:
    """A cluster set the caller may change without touching the kept one."""
    out = ClusterSet(cs.D, cs.s, cs.n_classes)
    out.set_global(*cs.g)
    out.gc = cs.gc
    out.removed = cs.removed
    C = cs.C
    if C:
        out.add(cs.mu[:C], cs.S[:C], cs.n[:C], cs.cls[:C], cs.last[:C])
    return out
