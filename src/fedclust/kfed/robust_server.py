"""k-FED's server when some devices lie: keep the well-supported groups, robust means.

A Byzantine device can send any centers. The paper's farthest-point seeding
picks the most remote center first, so one far-away lie takes a global center
and two true clusters merge; a plain Lloyd mean is pulled arbitrarily far. With
``trim = α`` (at most ``t = ⌊α Z⌋`` of the Z replying devices lie):

1. **Groups.** The scale of honest disagreement is the median, over all
   centers, of the distance to the nearest center of *another* device
   (honest devices are the majority and report nearby estimates of the same
   true means). Centers closer than ``factor ×`` that scale are linked; the
   connected components are the candidate groups.
2. **Support.** A group's support is the number of distinct devices with a
   center in it, where devices whose reports coincide (closer than
   ``COINCIDE ×`` the scale) count once: estimates from independent samples
   never coincide, so identical reports are one witness (collusion or copied
   data), not several. A group supported by more than t devices cannot be made of
   liars alone: it is kept. If fewer than k groups are kept, the next most
   supported groups are added until k are (the server knows k: a true
   cluster held by more devices than any set of colluding liars wins).
   Centers of the other groups are *distrusted*: left out of seeding and
   Lloyd, still labelled (nearest final center), and their devices named.
3. **Seeding and Lloyd** as the chosen ``method`` on the trusted centers, then
   every final center becomes the coordinate-wise α-trimmed mean of its trusted
   members (:func:`fedclust.core.robust.trimmed_mean`), so a lie that joined a
   true group moves it by a bounded amount.

What no server can do: when t colluding liars report one point and a true
cluster is held by t devices or fewer, the two look the same from the centers.
``trim = 0`` is exactly the paper's server. Cost: O(N² d) for N = Σ k_z centers,
in row blocks (O(block · N) memory), plus a connected-components pass.
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

#: centers closer than this multiple of the median nearest-other-device distance are linked
DISTRUST_FACTOR = 4.0
#: reports closer than this multiple of that scale coincide: independent estimates never do
COINCIDE = 1e-3


@dataclass(frozen=True)
class Distrust:
    """Which device centers the robust server left out, and why."""

    keep: np.ndarray          # (N,) bool over the concatenated centers
    support: np.ndarray       # (N,) distinct devices in each center's group
    radius: float             # linking distance of the groups
    n_trim: int               # t: devices that may lie


def _pairwise_within(C: np.ndarray, owner: np.ndarray):
    """Nearest other-device distance of every center, and a function giving the radius graph."""
    n = len(C)
    block = max(1, BLOCK * 64 // max(n, 1))
    nearest_other = np.empty(n)
    for s in range(0, n, block):
        D = squared_distances(C[s:s + block], C)
        D[owner[s:s + block][:, None] == owner[None, :]] = np.inf
        nearest_other[s:s + block] = D.min(axis=1)

    def graph(radius: float) -> csr_matrix:
        rows, cols = [], []
        for s in range(0, n, block):
            D = squared_distances(C[s:s + block], C)
            r, c = np.nonzero(D <= radius * radius)
            rows.append(r + s)
            cols.append(c)
        r, c = np.concatenate(rows), np.concatenate(cols)
        return csr_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(n, n))

    return np.sqrt(np.maximum(nearest_other, 0.0)), graph


def distrusted_centers(centers: Sequence[np.ndarray], trim: float, n_clusters: int,
                       factor: float = DISTRUST_FACTOR) -> Distrust:
    """Steps 1–2 of the module docstring over the devices' centers (one array per device)."""
    n_devices = len(centers)
    t = int(np.floor(trim * n_devices))
    sizes = np.array([len(c) for c in centers])
    n = int(sizes.sum())
    if t < 1 or n_devices < 2:
        return Distrust(np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64), np.inf, t)
    owner = np.repeat(np.arange(n_devices), sizes)
    C = np.concatenate(centers, axis=0).astype(np.float64, copy=False)
    nearest_other, graph = _pairwise_within(C, owner)
    scale = float(np.median(nearest_other[np.isfinite(nearest_other)]))
    radius = factor * scale
    _, group = connected_components(graph(radius), directed=False)
    # distinct devices per group; reports that coincide count once (see the module docstring)
    _, spot = connected_components(graph(COINCIDE * scale), directed=False)
    n_groups = group.max() + 1
    devices_in = np.bincount(np.unique(np.stack([group, owner], 1), axis=0)[:, 0],
                             minlength=n_groups)
    spots_in = np.bincount(np.unique(np.stack([group, spot], 1), axis=0)[:, 0],
                           minlength=n_groups)
    support = np.minimum(devices_in, spots_in)
    keep_group = support > t
    if keep_group.sum() < n_clusters:
        order = np.argsort(-support, kind="stable")
        keep_group[order[:n_clusters]] = True
    return Distrust(keep_group[group], support[group], radius, t)


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
