"""A re-creation of the k-FED authors' reference design, for timing only.

Mirrors the structure of ``fkms/algorithms.py`` in the authors' public code
(github.com/metastableB/kfed, Don Dennis): written afresh here, not copied.

Device step (``awasthisheffet``), once per device, serially in one process:

1. ``sklearn.utils.extmath.randomized_svd(A, k')`` (default oversampling and
   power iterations), project ``A_hat = A V``;
2. k-means++ seeding on ``A_hat`` in pure Python/numpy: one ``scipy`` ``cdist``
   to the newest center per step, the distance matrix grown by concatenation,
   the next center drawn from the D^2 distribution (redrawn if already taken);
3. the 1:3 filter: the full k' x n ``cdist`` matrix, one pass per r, the set
   S_r built as a Python list; initial centers = means of A_hat[S_r] lifted
   back with V^T;
4. ``sklearn.cluster.KMeans(n_clusters=k', init=<those centers>).fit(A)``
   (Lloyd to convergence; an explicit init means a single initialisation).

Server step (``cleanup_max``): the first device's k' centers seed the set,
then the farthest remaining center (``cdist`` to the whole set, recomputed
each step, the chosen row removed with ``np.delete``) until k; then
``KMeans(n_clusters=k, init=<set>).fit(all device centers)``.

Deviations, all needed to make it run deterministically: every random draw
comes from a ``numpy.random.RandomState`` per device seeded from ``seed``
(the original uses the global ``np.random`` and ``random_state=None``); an
empty S_r (the original would pass a NaN row to KMeans, which raises) falls
back to the k-means++ seed of that cluster.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.spatial.distance import cdist


def _distance_to_set(A: np.ndarray, S: np.ndarray) -> np.ndarray:
    return cdist(A, S, metric="euclidean").min(axis=1)


def _kmeans_pp(A: np.ndarray, k: int, rs: np.random.RandomState) -> np.ndarray:
    n = A.shape[0]
    if n <= k:
        return np.array(A)
    index = rs.choice(n)
    inits = [A[index]]
    indices = [index]
    dist = _distance_to_set(A, np.array(inits))[:, None]
    while len(inits) < k:
        dx = dist.min(axis=1)
        p = dx ** 2 / np.sum(dx ** 2)
        choice = rs.choice(n, 1, p=p)[0]
        if choice in indices:
            continue
        inits.append(A[choice])
        indices.append(choice)
        new = _distance_to_set(A, A[choice][None, :])[:, None]
        dist = np.concatenate([dist, new], axis=1)
    return np.array(inits)


def awasthi_sheffet_device(A: np.ndarray, k: int, rs: np.random.RandomState):
    """One device: returns (centers (k, d), labels (n,), the fitted KMeans or None)."""
    from sklearn.cluster import KMeans
    from sklearn.utils.extmath import randomized_svd

    n, d = A.shape
    if n <= k:
        return np.array(A), np.arange(n), None
    _, _, Vt = randomized_svd(A, n_components=k, random_state=rs)
    V = Vt.T[:, :k]
    A_hat = A.dot(V)
    inits = _kmeans_pp(A_hat, k, rs)
    pd = cdist(inits, A_hat)
    sr_list = []
    for r in range(k):
        th = 3 * pd[r, :]
        rest = pd[np.arange(k) != r]
        indicator = np.sum(((rest - th) < 0).astype(int), axis=0)
        sr_list.append([i for i in range(len(indicator)) if indicator[i] == 0])
    lloyd_init = np.array([A_hat[s].mean(axis=0) if len(s) else inits[r]
                           for r, s in enumerate(sr_list)])
    lloyd_init = lloyd_init @ V.T
    km = KMeans(n_clusters=k, init=lloyd_init, n_init=1,
                random_state=rs.randint(2**31 - 1)).fit(A)
    return km.cluster_centers_, km.labels_, km


def cleanup_max(local: np.ndarray, k: int, dev_k: int, seed: int = 0):
    """Server: farthest-point seeding from the first device's centers, then KMeans."""
    from sklearn.cluster import KMeans

    init = local[:dev_k, :]
    remaining = local[dev_k:, :]
    while len(init) < k:
        dist = _distance_to_set(remaining, np.array(init))
        j = int(np.argmax(dist))
        init = np.append(init, remaining[j:j + 1, :], axis=0)
        remaining = np.delete(remaining, j, axis=0)
    km = KMeans(n_clusters=k, init=init, n_init=1, random_state=seed).fit(local)
    return km.cluster_centers_, km.labels_


def authors_kfed(devices: Sequence[np.ndarray], dev_k: int, k: int, seed: int = 0):
    """The whole reference design. Returns (local centers, final centers, device labels)."""
    local, local_labels = [], []
    for z, A in enumerate(devices):
        rs = np.random.RandomState((seed * 1_000_003 + z) % (2**32))
        centers, labels, _ = awasthi_sheffet_device(A, dev_k, rs)
        local.append(centers)
        local_labels.append(labels)
    stacked = np.concatenate(local, axis=0)
    final, center_labels = cleanup_max(stacked, k, dev_k, seed=seed)
    offsets = np.cumsum([0] + [len(c) for c in local])
    device_labels = [center_labels[offsets[z]:offsets[z + 1]][lab]
                     for z, lab in enumerate(local_labels)]
    return stacked, final, device_labels
