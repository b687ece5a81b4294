"""Owner-side maths: learn a local cluster set in one pass and pack it as a message.

``learn_local`` first pools the owner's global statistics (exact per-feature
mean and variance of its rows, plus any broadcast global statistics), so the
new-cluster covariance Sigma_0 and the variance floor come from the data scale,
then streams the rows once (O(n c D^2) time, O(c D^2) memory). With the BIC merge
test an owner merges only when its cluster count passes ``max_clusters``: the server
decides the other merges on the pooled samples (BIC judges a pair by how many samples
it holds, and a merge cannot be undone). After its pass the owner looks at its rows once
more: a cluster whose own rows the merge test would keep apart as two is split
(:meth:`~fedclust.gauss.model.ClusterSet.split_by_rows`).
"""

from __future__ import annotations

import numpy as np

from .messages import GaussClusters
from .model import ClusterSet, Settings
from .stats import merge_moments, moments, pack_scatter, unpack_scatter

__all__ = ["learn_local", "to_message", "from_message"]


def learn_local(X: np.ndarray, y: np.ndarray | None, settings: Settings, n_classes: int,
                prior: tuple[float, np.ndarray, np.ndarray] | None = None) -> ClusterSet:
    """Learn the owner's rows (``y``: class indices 0..M-1, or None) in one pass.

    ``merge_test="bic"``: new clusters start at the rows' neighbourhood scale
    (:meth:`ClusterSet.set_birth_scale`), and after the pass a cluster is split in two
    where the merge test keeps the two halves of its own rows apart
    (:meth:`ClusterSet.split_by_rows`)."""
    own = moments(X)
    g = own if prior is None else merge_moments(prior, own)
    cs = ClusterSet(X.shape[1], settings, n_classes)
    cs.set_global(*g)
    cs.set_birth_scale(X)
    labels = np.empty(X.shape[0], np.int64)
    cs.learn(X, y, labels)
    cs.split_by_rows(X, labels)
    return cs


def to_message(cs: ClusterSet, kappa_n: float, own_moments: tuple, *,
               own_class_moments: tuple | None = None,
               cls: type[GaussClusters] = GaussClusters) -> GaussClusters:
    """Clusters with n > kappa_n (and, per class, at least the largest one) plus the
    owner's global statistics ``own_moments`` = (count, mean, m2) and, when
    classifying, its per-class ``own_class_moments`` = (counts (M,), means, m2 (M, D))."""
    C = cs.C
    keep = cs.n[:C] > kappa_n
    if cs.n_classes:
        for c in np.unique(cs.cls[:C]):  # every class the owner holds survives
            members = np.flatnonzero(cs.cls[:C] == c)
            if not keep[members].any():
                keep[members[np.argmax(cs.n[members])]] = True
    elif C and not keep.any():
        keep[int(np.argmax(cs.n[:C]))] = True
    idx = np.flatnonzero(keep)
    S = cs.S[idx]
    scatters = pack_scatter(S) if cs.full else S.copy()
    onehot = np.zeros((idx.size, cs.n_classes), dtype=np.int64)
    if cs.n_classes:
        onehot[np.arange(idx.size), cs.cls[idx]] = 1
    count, mean, m2 = own_moments
    M, D = cs.n_classes, cs.D
    cc, cm, cv = own_class_moments if own_class_moments is not None else (
        np.zeros(M, np.int64), np.zeros((M, D)), np.zeros((M, D)))
    return cls(means=cs.mu[idx].copy(), scatters=scatters,
               counts=np.rint(cs.n[idx]).astype(np.int64),
               ages=(cs.t - cs.last[idx]).astype(np.int64), classes=onehot,
               global_count=np.asarray(int(count), dtype=np.int64),
               global_mean=np.asarray(mean, dtype=float), global_m2=np.asarray(m2, dtype=float),
               class_count=np.asarray(cc, dtype=np.int64), class_mean=np.asarray(cm, dtype=float),
               class_m2=np.asarray(cv, dtype=float))


def from_message(msg: GaussClusters, settings: Settings, n_classes: int) -> ClusterSet:
    """A cluster set holding exactly the clusters and global statistics of ``msg``."""
    D = msg.means.shape[1]
    cs = ClusterSet(D, settings, n_classes)
    cs.set_global(float(msg.global_count), msg.global_mean, msg.global_m2)
    cs.gc = (msg.class_count.copy(), msg.class_mean.copy(), msg.class_m2.copy())
    add_clusters(cs, msg)
    return cs


def add_clusters(cs: ClusterSet, msg: GaussClusters) -> None:
    D = msg.means.shape[1]
    S = unpack_scatter(msg.scatters.astype(float), D) if cs.full else msg.scatters.astype(float)
    if cs.full and msg.scatters.shape[1] == D and D > 1:  # diagonal sent to a full model
        S = np.einsum("kd,de->kde", msg.scatters.astype(float), np.eye(D))
    cls = (np.argmax(msg.classes, axis=1) if msg.classes.shape[1]
           else np.full(msg.means.shape[0], -1, np.int64))
    cs.add(msg.means.astype(float), S, msg.counts.astype(float), cls,
           cs.t - msg.ages.astype(np.int64))
