"""k-FED's server when some devices lie: keep the well-supported groups, robust means.

A Byzantine device can send any centers. The paper's farthest-point seeding
picks the most remote center first, so one far-away lie takes a global center
and two true clusters merge; a plain Lloyd mean is pulled arbitrarily far. With
``trim = α`` (at most ``t = ⌈α Z⌉`` of the Z replying devices lie):

1. **Scale.** The scale of honest disagreement ``s`` is the median, over all
   centers, of the distance to the nearest center of *another* device
   (honest devices are the majority and report nearby estimates of the same
   true means; a minority of lies, however far, cannot move a median). It
   only sizes the first ball of each group; the group then takes its own
   scale (step 2), since the nearest neighbour is about as far as a typical
   neighbour in high dimension but much closer in low dimension.
2. **Groups: a greedy cover by balls, not linkage.** A center's *support* is
   the number of distinct devices with a center within ``R = factor × s`` of
   it, where devices whose reports coincide (closer than ``COINCIDE × s``)
   count once: estimates from independent samples never coincide, so
   identical reports are one witness (collusion or copied data). The most
   supported free center opens a group with its ball; the group then grows
   by one linking step (free centers within R of a member) and is cut back
   to its own radius ``r_g = max(R, GROUP_FACTOR × median distance)`` around
   the coordinate-wise median of its members, until its members stop
   changing. The cut is a per-group robust scale: linking lets a true cluster
   wider than one ball (low dimension, few devices) be taken whole, and the
   cut stops the chain at the next cluster, whose centers are a minority of
   what was linked and cannot move the median; its centers stop being free;
   repeat. Centers left over join the nearest group when within
   ``STRAGGLER_FACTOR ×`` the pooled scale (the median distance of all grouped
   centers to their group's median): the sparse outskirts of a true cluster.
   A linkage at one global radius would chain neighbouring true clusters at
   moderate separation into fewer than k groups, and filling up to k would
   then admit the liars' lone centers; here a far lie never widens a radius.
3. **Trust.** A group's support is finally counted in its core, the
   centers within ``CORE_FACTOR ×`` the pooled scale of its median (liars
   spread along a segment link into one loose group, but few of them sit in
   its core; an honest group is as tight as the others). A group supported
   by more than t devices cannot be made of liars alone: it is kept (however
   many there are). Otherwise a group is kept only as one of the k most
   supported groups (the server knows k: a true cluster held by more
   devices than any set of colluding liars wins)
   *and* only when at least two devices support it — a center no other device
   corroborates is never trusted, so when fewer than k groups qualify the
   plain server splits the kept ones rather than admitting lone lies.
   Centers of the other groups, and centers no group took, are *distrusted*:
   left out of seeding and Lloyd, still labelled (nearest final center), and
   their devices named.
4. **Seeding and Lloyd** as the chosen ``method`` on the trusted centers, then
   every final center becomes the coordinate-wise α-trimmed mean of its trusted
   members (:func:`fedclust.core.robust.trimmed_mean`), so a lie that joined a
   true group moves it by a bounded amount. In both, a device's rows in one
   group share one unit of weight (:meth:`Distrust.device_weights`): k'
   identical lies weigh as one witness.

What no server can do: when t colluding liars (with data of their own, so
their reports do not coincide) form one tight group and a true cluster is held
by t devices or fewer, the two look the same from the centers. ``trim = 0``
is exactly the paper's server. Cost: O(N² d) for N = Σ k_z centers, in row
blocks (O(block · N) memory), plus O(G · nnz) for the cover (G groups, nnz
the pairs within R).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from ..core.kmeans import BLOCK, assign, squared_distances
from ..core.robust import trimmed_mean

__all__ = ["distrusted_centers", "robust_means", "relabel", "DISTRUST_FACTOR", "Distrust"]

#: first ball radius of a group, in median nearest-other-device distances
DISTRUST_FACTOR = 2.0
#: reports closer than this multiple of that scale coincide: independent estimates never do
COINCIDE = 1e-3
#: a group takes the free centers within this multiple of its members' median distance
GROUP_FACTOR = 3.0
#: at most this many re-centring steps per group
GROUP_STEPS = 10
#: a left-over center joins the nearest group within this multiple of the pooled scale
STRAGGLER_FACTOR = GROUP_FACTOR
#: a group's support counts the devices within this multiple of the pooled scale of its median
CORE_FACTOR = 2.0


@dataclass(frozen=True)
class Distrust:
    """Which device centers the robust server left out, and why."""

    keep: np.ndarray          # (N,) bool over the concatenated centers
    support: np.ndarray       # (N,) distinct devices in each center's group
    radius: float             # ball radius of the cover (R)
    n_trim: int               # t: devices that may lie
    #: (N,) group of every center (-1: none); a device's rows in one group share one weight
    group: np.ndarray | None = None

    def device_weights(self, owner: np.ndarray) -> np.ndarray:
        """(N,) weight 1 / (rows of the same device in the same group): one device is one
        witness per group, however many identical rows it sends there."""
        if self.group is None:
            return np.ones(len(owner))
        key = np.stack([owner, self.group], 1)
        _, inv, cnt = np.unique(key, axis=0, return_inverse=True, return_counts=True)
        return 1.0 / cnt[inv.ravel()]


def _pairwise_within(C: np.ndarray, owner: np.ndarray, q: int):
    """Distance of every center to the nearest center of its q-th nearest other device, and a
    function giving the radius graph. ``owner`` is sorted (each device's rows contiguous)."""
    n = len(C)
    block = max(1, BLOCK * 64 // max(n, 1))
    starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
    devs = owner[starts]
    q = int(min(max(q, 1), max(len(devs) - 1, 1)))
    kth_other = np.empty(n)
    for s in range(0, n, block):
        D = squared_distances(C[s:s + block], C)
        per_device = np.minimum.reduceat(D, starts, axis=1)          # (block, devices)
        per_device[owner[s:s + block][:, None] == devs[None, :]] = np.inf
        kth_other[s:s + block] = np.partition(per_device, q - 1, axis=1)[:, q - 1]

    def graph(radius: float) -> csr_matrix:
        rows, cols = [], []
        for s in range(0, n, block):
            D = squared_distances(C[s:s + block], C)
            r, c = np.nonzero(D <= radius * radius)
            rows.append(r + s)
            cols.append(c)
        r, c = np.concatenate(rows), np.concatenate(cols)
        return csr_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n))

    return np.sqrt(np.maximum(kth_other, 0.0)), graph


def _ball_support(G: csr_matrix, free: np.ndarray, owner: np.ndarray,
                  spot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per center: distinct supporting devices among the free centers of its ball, and how
    many free centers the ball holds (coinciding reports count once)."""
    n = G.shape[0]
    rows, cols = G.nonzero()
    sel = free[cols] & free[rows]
    rows, cols = rows[sel], cols[sel]
    count = np.bincount(rows, minlength=n)
    if not len(rows):
        return np.zeros(n, dtype=np.int64), count
    dev = np.unique(rows * (owner.max() + 1) + owner[cols]) // (owner.max() + 1)
    spt = np.unique(rows * (spot.max() + 1) + spot[cols]) // (spot.max() + 1)
    return np.minimum(np.bincount(dev, minlength=n), np.bincount(spt, minlength=n)), count


def distrusted_centers(centers: Sequence[np.ndarray], trim: float, n_clusters: int,
                       factor: float = DISTRUST_FACTOR) -> Distrust:
    """Steps 1–3 of the module docstring over the devices' centers (one array per device)."""
    n_devices = len(centers)
    # a fraction trim of Z devices is up to ceil(trim Z) of them: the conservative count (with
    # floor, 2 colluders of 30 devices at trim = 0.05 out-vote t = 1 and are kept however
    # few they are next to the true clusters)
    t = int(np.ceil(trim * n_devices - 1e-9))
    sizes = np.array([len(c) for c in centers])
    n = int(sizes.sum())
    if t < 1 or n_devices < 2:
        return Distrust(np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64), np.inf, t)
    owner = np.repeat(np.arange(n_devices), sizes)
    C = np.concatenate(centers, axis=0).astype(np.float64, copy=False)
    kth_other, graph = _pairwise_within(C, owner, 1)
    finite = kth_other[np.isfinite(kth_other)]
    scale = float(np.median(finite)) if len(finite) else 0.0
    radius = factor * scale
    _, spot = connected_components(graph(COINCIDE * scale), directed=False)
    G = graph(radius)
    free = np.ones(n, dtype=bool)
    group = np.full(n, -1, dtype=np.int64)
    support = np.zeros(n, dtype=np.int64)
    keep = np.zeros(n, dtype=bool)
    n_groups = 0
    while free.any():
        sup, count = _ball_support(G, free, owner, spot)
        sup[~free] = -1
        best = int(np.lexsort((-count, -sup))[0])        # most devices, then most centers
        if sup[best] < 2:             # every group is a candidate; step 3 decides
            break
        members = free & (G.getrow(best).toarray().ravel() > 0)
        for _ in range(GROUP_STEPS):
            # one linking step (free centers within R of a member), then the group's own
            # radius around its median cuts back whatever does not belong
            linked = members | (free & (np.asarray(G[members].sum(axis=0)).ravel() > 0))
            middle = np.median(C[linked], axis=0)
            dist = np.sqrt(np.maximum(squared_distances(C, middle[None, :])[:, 0], 0.0))
            r_g = max(radius, GROUP_FACTOR * float(np.median(dist[linked])))
            grown = linked & (dist <= r_g)
            if np.array_equal(grown, members) or not grown.any():
                break
            members = grown
        group[members] = n_groups
        free &= ~members
        n_groups += 1
    if n_groups:
        # the pooled scale: the median distance of all grouped centers to their group's median
        # (honest groups are the majority of the grouped centers)
        middles = np.array([np.median(C[group == g], axis=0) for g in range(n_groups)])
        grouped = group >= 0
        pooled = float(np.median(np.linalg.norm(C[grouped] - middles[group[grouped]], axis=1)))
        if free.any():
            # stragglers (a sparse cluster's outskirts) join the nearest group within
            # STRAGGLER_FACTOR x the pooled scale
            near, d2 = assign(C[free], middles)
            take = np.sqrt(np.maximum(d2, 0.0)) <= STRAGGLER_FACTOR * pooled
            idx = np.flatnonzero(free)[take]
            group[idx] = near[take]
            free[idx] = False
        # a group's support counts the devices in its core (within CORE_FACTOR x the pooled
        # scale of its median): liars spread along a line link into one loose group, but only
        # a few of them sit in its core
        core_support = np.zeros(n_groups, dtype=np.int64)
        for g in range(n_groups):
            members = group == g
            core = members & (np.linalg.norm(C - middles[g], axis=1) <= CORE_FACTOR * pooled)
            core_support[g] = min(len(np.unique(owner[core])), len(np.unique(spot[core])))
        rank = np.empty(n_groups, dtype=np.int64)
        rank[np.argsort(-core_support, kind="stable")] = np.arange(n_groups)
        for g in range(n_groups):
            members = group == g
            s = int(core_support[g])
            support[members] = s
            keep[members] = s > t or (rank[g] < n_clusters and s >= 2)
    if free.any():                     # left out: report the support of their own ball
        support[free] = _ball_support(G, np.ones(n, dtype=bool), owner, spot)[0][free]
    if keep.sum() < n_clusters:        # nothing is corroborated (e.g. one center per device)
        keep[:] = True
    return Distrust(keep, support, radius, t, group)


def robust_means(C: np.ndarray, labels: np.ndarray, previous: np.ndarray, beta: float,
                 weights: np.ndarray | None = None) -> np.ndarray:
    """Per cluster, the coordinate-wise β-trimmed mean of its members (empty: previous center)."""
    out = previous.copy()
    for j in range(len(previous)):
        members = labels == j
        if members.any():
            out[j] = trimmed_mean(C[members], beta,
                                  None if weights is None else weights[members])
    return out


def relabel(C: np.ndarray, final: np.ndarray) -> np.ndarray:
    """Nearest final center of every device center (trusted or not)."""
    return assign(C, final)[0]
