"""Split pooled data over simulated devices.

Every partitioner returns a list of int64 index arrays into the pooled data,
one per device; together they use every index exactly once (no point is
dropped, none duplicated) and every device gets at least one point. A scheme
that cannot meet this raises :class:`~fedclust.exceptions.ValidationError`.
All randomness comes from the one ``random_state`` argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.random import RandomState, root_seed
from ..core.validation import check_array, check_choice, check_float, check_int
from ..core.exceptions import ValidationError

__all__ = [
    "iid_partition",
    "structured_partition",
    "dirichlet_partition",
    "power_law_partition",
    "uniform_partition",
    "weighted_partition",
    "unbalanced_partition",
    "similarity_partition",
    "degree_partition",
    "apply_partition",
    "partition",
    "PARTITION_KINDS",
    "PARTITION_OPTIONS",
]

def _rng(random_state: RandomState) -> np.random.Generator:
    return np.random.default_rng(root_seed(random_state))


def _check_y(y: Any) -> np.ndarray:
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValidationError(f"y must be 1-D (one label per point), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValidationError("y is empty: give at least one labelled point")
    return arr


def _check_fits(n_samples: int, n_devices: int, min_size: int = 1) -> None:
    if n_devices * min_size > n_samples:
        raise ValidationError(
            f"n_devices={n_devices} devices with at least {min_size} point(s) each need "
            f"{n_devices * min_size} points, but there are only n_samples={n_samples}; "
            "use fewer devices")


def iid_partition(n_samples: int, n_devices: int,
                  random_state: RandomState = None) -> list[np.ndarray]:
    """Uniformly random split into ``n_devices`` parts whose sizes differ by at most 1.

    Parameters
    ----------
    n_samples : int
    n_devices : int
        ``1 <= n_devices <= n_samples``.
    random_state : int, Generator or None

    Returns
    -------
    list of ndarray
        ``n_devices`` int64 index arrays.
    """
    n = check_int(n_samples, "n_samples", min_value=1)
    m = check_int(n_devices, "n_devices", min_value=1)
    _check_fits(n, m)
    perm = _rng(random_state).permutation(n).astype(np.int64)
    return [np.array(p) for p in np.array_split(perm, m)]


def structured_partition(y: Any, n_local_clusters: int, m0: int | None = None,
                         n_devices: int | None = None,
                         random_state: RandomState = None) -> list[np.ndarray]:
    """k-FED's structured partition: every device holds at most k' classes.

    The distinct labels are shuffled and cut into ``ceil(n_classes / k')``
    groups of ``k'`` labels (the last group smaller when ``k'`` does not divide
    the number of classes). Each group's points go to devices of its own,
    dealt class by class in round-robin so that every device of the group gets
    points of every class of the group (when the class has enough points) and
    device sizes within a group differ by at most one.

    Give exactly one of ``m0`` (devices per group; ``n_groups * m0`` devices)
    or ``n_devices`` (>= n_groups): then every group gets
    ``n_devices // n_groups`` devices and the ``n_devices % n_groups`` extra
    devices go one each to the groups with the most points.

    Parameters
    ----------
    y : array-like of shape (n,)
        Labels (true classes or oracle clusters).
    n_local_clusters : int
        k', the number of labels per group (>= 1).
    m0 : int, optional
    n_devices : int, optional
    random_state : int, Generator or None

    Returns
    -------
    list of ndarray
        int64 index arrays; devices are ordered group by group.

    References
    ----------
    Dennis, Li, Smith, ICML 2021, §4.1 (Gaussian setting) and §4.2 (Fig. 2).
    """
    y = _check_y(y)
    kp = check_int(n_local_clusters, "n_local_clusters", min_value=1)
    if (m0 is None) == (n_devices is None):
        raise ValidationError(
            f"give exactly one of m0 (devices per group) and n_devices, got "
            f"m0={m0!r} and n_devices={n_devices!r}")
    rng = _rng(random_state)
    classes, inv = np.unique(y, return_inverse=True)
    inv = inv.ravel()
    order = rng.permutation(len(classes))
    groups = [order[s:s + kp] for s in range(0, len(classes), kp)]
    n_groups = len(groups)
    sizes = np.array([np.isin(inv, g).sum() for g in groups])
    if m0 is not None:
        m0 = check_int(m0, "m0", min_value=1)
        per_group = np.full(n_groups, m0)
    else:
        m = check_int(n_devices, "n_devices", min_value=1)
        if m < n_groups:
            raise ValidationError(
                f"n_devices={m} is fewer than the {n_groups} groups of "
                f"n_local_clusters={kp} labels ({len(classes)} classes); "
                f"use n_devices >= {n_groups} or a larger n_local_clusters")
        per_group = np.full(n_groups, m // n_groups)
        extra = np.argsort(-sizes, kind="stable")[: m % n_groups]
        per_group[extra] += 1
    parts: list[np.ndarray] = []
    for gi, (g, n_dev) in enumerate(zip(groups, per_group)):
        if sizes[gi] < n_dev:
            raise ValidationError(
                f"group {gi} (labels {classes[g].tolist()}) has {sizes[gi]} points for "
                f"{n_dev} devices; every device needs a point: use fewer devices")
        # Class-sorted, each class shuffled; dealing round-robin stratifies.
        idx = np.concatenate([rng.permutation(np.flatnonzero(inv == c)) for c in g])
        for j in range(n_dev):
            parts.append(rng.permutation(idx[j::n_dev]).astype(np.int64))
    return parts


def dirichlet_partition(y: Any, n_devices: int, alpha: float,
                        random_state: RandomState = None, min_size: int = 1,
                        max_tries: int = 100) -> list[np.ndarray]:
    """Label-skewed split: each class's points spread by Dirichlet(alpha) proportions.

    For every class c, ``p_c ~ Dir(alpha * 1_m)`` over the m devices and the
    class's shuffled points are cut at ``floor(cumsum(p_c) * n_c)``. Small
    alpha gives few classes per device; large alpha approaches IID. The whole
    draw is repeated (at most ``max_tries`` times) until every device has at
    least ``min_size`` points (Hsu, Qi, Brown 2019; Yurochkin et al. 2019).

    Parameters
    ----------
    y : array-like of shape (n,)
    n_devices : int
    alpha : float
        Concentration (> 0).
    random_state : int, Generator or None
    min_size : int, default=1
    max_tries : int, default=100

    Returns
    -------
    list of ndarray
        ``n_devices`` int64 index arrays.
    """
    y = _check_y(y)
    m = check_int(n_devices, "n_devices", min_value=1)
    a = check_float(alpha, "alpha", min_value=0.0, min_inclusive=False)
    min_size = check_int(min_size, "min_size", min_value=1)
    max_tries = check_int(max_tries, "max_tries", min_value=1)
    _check_fits(y.shape[0], m, min_size)
    rng = _rng(random_state)
    _, inv = np.unique(y, return_inverse=True)
    inv = inv.ravel()
    by_class = [np.flatnonzero(inv == c) for c in range(int(inv.max()) + 1)]
    smallest = 0
    for _ in range(max_tries):
        buckets: list[list[np.ndarray]] = [[] for _ in range(m)]
        for idx in by_class:
            p = rng.dirichlet(np.full(m, a))
            cuts = np.floor(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for z, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                buckets[z].append(chunk)
        parts = [rng.permutation(np.concatenate(b)).astype(np.int64) for b in buckets]
        smallest = min(len(p) for p in parts)
        if smallest >= min_size:
            return parts
    raise ValidationError(
        f"dirichlet_partition: after max_tries={max_tries} draws with alpha={a}, "
        f"n_devices={m} the smallest device still had {smallest} < min_size={min_size} "
        "points; raise alpha, or lower n_devices or min_size")


def power_law_partition(n_samples: int, n_devices: int, exponent: float = 1.5,
                        min_size: int = 1,
                        random_state: RandomState = None) -> list[np.ndarray]:
    """Random split with power-law (Pareto) distributed device sizes.

    Device z gets ``min_size`` points plus a share of the remaining
    ``n_samples - n_devices * min_size`` points proportional to a weight
    ``w_z ~ Pareto(exponent)`` (i.i.d., density ``a w^(-a-1)`` on ``w >= 1``,
    so ``P(W > w) = w^(-a)``), rounded by largest remainders so sizes sum to
    ``n_samples``. Smaller ``exponent`` means heavier tails (a few huge
    devices). Points are assigned uniformly at random.

    Parameters
    ----------
    n_samples : int
    n_devices : int
    exponent : float, default=1.5
        Pareto tail index a (> 0).
    min_size : int, default=1
    random_state : int, Generator or None

    Returns
    -------
    list of ndarray
        ``n_devices`` int64 index arrays.
    """
    n = check_int(n_samples, "n_samples", min_value=1)
    m = check_int(n_devices, "n_devices", min_value=1)
    a = check_float(exponent, "exponent", min_value=0.0, min_inclusive=False)
    min_size = check_int(min_size, "min_size", min_value=1)
    _check_fits(n, m, min_size)
    rng = _rng(random_state)
    w = rng.pareto(a, size=m) + 1.0
    rest = n - m * min_size
    share = w / w.sum() * rest
    sizes = np.floor(share).astype(np.int64)
    short = rest - int(sizes.sum())
    sizes[np.argsort(-(share - sizes), kind="stable")[:short]] += 1
    sizes += min_size
    perm = rng.permutation(n).astype(np.int64)
    return [np.array(p) for p in np.split(perm, np.cumsum(sizes)[:-1])]


# -- the partitions of Balcan, Ehrlich & Liang (NIPS 2013), §5 ------------------

def _assign_by_probability(P: np.ndarray, min_size: int, rng: np.random.Generator
                           ) -> list[np.ndarray]:
    """Each point i goes to device z with probability P[i, z] (rows sum to 1), then
    devices below ``min_size`` take random points from the largest devices."""
    n, m = P.shape
    _check_fits(n, m, min_size)
    cum = np.cumsum(P, axis=1)
    cum[:, -1] = 1.0
    owner = (rng.random(n)[:, None] > cum).sum(axis=1)
    for z in range(m):
        short = min_size - int((owner == z).sum())
        while short > 0:
            sizes = np.bincount(owner, minlength=m)
            donor = int(np.argmax(sizes))
            pick = rng.choice(np.flatnonzero(owner == donor),
                              size=min(short, sizes[donor] - min_size), replace=False)
            owner[pick] = z
            short -= len(pick)
    return [rng.permutation(np.flatnonzero(owner == z)).astype(np.int64) for z in range(m)]


def _by_weights(n_samples: int, w: np.ndarray, min_size: int, rng) -> list[np.ndarray]:
    return _assign_by_probability(np.broadcast_to(w / w.sum(), (n_samples, len(w))),
                                  min_size, rng)


def uniform_partition(n_samples: int, n_devices: int, min_size: int = 1,
                      random_state: RandomState = None) -> list[np.ndarray]:
    """Every point goes to a device chosen uniformly at random (multinomial sizes;
    Balcan et al. 2013 "uniform"). Unlike :func:`iid_partition`, sizes vary."""
    n = check_int(n_samples, "n_samples", min_value=1)
    m = check_int(n_devices, "n_devices", min_value=1)
    return _by_weights(n, np.ones(m), check_int(min_size, "min_size", min_value=1), _rng(random_state))


def weighted_partition(n_samples: int, n_devices: int, min_size: int = 1,
                       random_state: RandomState = None) -> list[np.ndarray]:
    """Device z has weight w_z ~ |N(0, 1)|; every point goes to z with probability
    w_z / Σ w (Balcan et al. 2013 and Liang et al. 2014, "weighted")."""
    n = check_int(n_samples, "n_samples", min_value=1)
    m = check_int(n_devices, "n_devices", min_value=1)
    rng = _rng(random_state)
    w = np.abs(rng.standard_normal(m)) + 1e-12
    return _by_weights(n, w, check_int(min_size, "min_size", min_value=1), rng)


def unbalanced_partition(n_samples: int, n_devices: int, ratio: float = 20.0,
                         min_size: int = 1, random_state: RandomState = None
                         ) -> list[np.ndarray]:
    """A random half of the devices (rounded down) gets ``ratio`` times the
    expected data of the others; points are assigned at random by those weights."""
    n = check_int(n_samples, "n_samples", min_value=1)
    m = check_int(n_devices, "n_devices", min_value=1)
    r = check_float(ratio, "ratio", min_value=0.0, min_inclusive=False)
    rng = _rng(random_state)
    w = np.ones(m)
    w[rng.permutation(m)[: m // 2]] = r
    return _by_weights(n, w, check_int(min_size, "min_size", min_value=1), rng)


def similarity_partition(X: Any, n_devices: int, min_size: int = 1,
                         random_state: RandomState = None) -> list[np.ndarray]:
    """Each device is anchored at a random data point a_z; point x goes to z with
    probability ∝ exp(−‖x − a_z‖² / σ²), σ² the median squared distance of a point
    to its nearest anchor (Balcan et al. 2013, "similarity-based": similar points
    tend to share a node)."""
    X = check_array(X, "X")
    m = check_int(n_devices, "n_devices", min_value=1)
    rng = _rng(random_state)
    n = X.shape[0]
    _check_fits(n, m, 1)
    anchors = X[rng.choice(n, size=m, replace=False)]
    D = ((X * X).sum(1)[:, None] - 2.0 * X @ anchors.T + (anchors * anchors).sum(1)[None, :])
    np.maximum(D, 0.0, out=D)
    scale = float(np.median(D.min(axis=1))) or 1.0
    logits = -D / scale
    logits -= logits.max(axis=1, keepdims=True)
    P = np.exp(logits)
    P /= P.sum(axis=1, keepdims=True)
    return _assign_by_probability(P, check_int(min_size, "min_size", min_value=1), rng)


def degree_partition(n_samples: int, graph: Any, min_size: int = 1,
                     random_state: RandomState = None) -> list[np.ndarray]:
    """Every point goes to node z with probability ∝ deg(z) (Balcan et al. 2013,
    "degree-based"). ``graph``: a networkx graph on nodes 0..m-1, a symmetric
    adjacency matrix (m, m), or the m degrees themselves."""
    n = check_int(n_samples, "n_samples", min_value=1)
    if hasattr(graph, "degree") and hasattr(graph, "nodes"):
        nodes = sorted(graph.nodes)
        if nodes != list(range(len(nodes))):
            raise ValidationError("graph nodes must be 0..m-1")
        deg = np.array([graph.degree(z) for z in nodes], dtype=np.float64)
    else:
        arr = np.asarray(graph, dtype=np.float64)
        if arr.ndim == 2:
            if arr.shape[0] != arr.shape[1] or not np.array_equal(arr, arr.T):
                raise ValidationError(
                    f"graph adjacency must be square and symmetric, got shape {arr.shape}")
            deg = (arr != 0).sum(axis=1) - (np.diag(arr) != 0)
        elif arr.ndim == 1:
            deg = arr
        else:
            raise ValidationError(f"graph must be a graph, an adjacency or degrees, got shape {arr.shape}")
        deg = np.asarray(deg, dtype=np.float64)
    if len(deg) == 0 or (deg < 0).any() or not np.isfinite(deg).all() or deg.sum() <= 0:
        raise ValidationError(f"degrees must be finite, >= 0 and not all 0, got {deg.tolist()[:10]}")
    return _by_weights(n, deg, check_int(min_size, "min_size", min_value=1), _rng(random_state))


def apply_partition(X: Any, y: Any, parts: Sequence[Any]
                    ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Cut pooled data into per-device arrays.

    Parameters
    ----------
    X : array-like of shape (n, d)
    y : array-like of shape (n,) or None
    parts : sequence of int arrays
        Must use every index of ``0..n-1`` exactly once.

    Returns
    -------
    devices : list of ndarray, each (n_z, d)
    labels : list of ndarray, each (n_z,), or None when ``y`` is None
    """
    X = check_array(X, "X")
    n = X.shape[0]
    if y is not None:
        y = _check_y(y)
        if y.shape[0] != n:
            raise ValidationError(f"y has {y.shape[0]} labels but X has {n} rows")
    parts = [np.asarray(p) for p in parts]
    if not parts:
        raise ValidationError("parts is empty: give at least one device")
    for z, p in enumerate(parts):
        if p.ndim != 1 or p.dtype.kind not in "iu":
            raise ValidationError(
                f"parts[{z}] must be a 1-D integer index array, got dtype {p.dtype} "
                f"and shape {p.shape}")
        if p.size == 0:
            raise ValidationError(f"parts[{z}] is empty; every device needs a point")
        if p.min() < 0 or p.max() >= n:
            raise ValidationError(
                f"parts[{z}] holds index {p.min() if p.min() < 0 else p.max()} "
                f"outside 0..{n - 1}")
    counts = np.bincount(np.concatenate(parts), minlength=n)
    if (counts != 1).any():
        dup, miss = int((counts > 1).sum()), int((counts == 0).sum())
        raise ValidationError(
            f"parts must use every index 0..{n - 1} exactly once: {dup} index(es) "
            f"repeated, {miss} missing")
    devices = [X[p] for p in parts]
    labels = None if y is None else [y[p] for p in parts]
    return devices, labels


#: partition kind -> the options it takes besides ``n_devices`` (config keys too)
PARTITION_OPTIONS: dict[str, set[str]] = {
    "iid": set(),
    "structured": {"n_local_clusters", "m0"},
    "dirichlet": {"alpha", "min_size", "max_tries"},
    "power-law": {"exponent", "min_size"},
    "uniform": {"min_size"},
    "weighted": {"min_size"},
    "unbalanced": {"ratio", "min_size"},
    "similarity": {"min_size"},
    "degree": {"graph", "min_size"},
}
PARTITION_KINDS = tuple(PARTITION_OPTIONS)


def partition(kind: str, X: Any, y: Any, n_devices: int, *,
              random_state: RandomState = None, **kwargs: Any) -> list[np.ndarray]:
    """Dispatch to one partitioner by name.

    Parameters
    ----------
    kind : {"iid", "structured", "dirichlet", "power-law", "uniform", "weighted",
            "unbalanced", "similarity", "degree"}
    X : array-like of shape (n, d)
        Only its number of rows is used.
    y : array-like of shape (n,) or None
        Required for "structured" and "dirichlet".
    n_devices : int
    random_state : int, Generator or None
    **kwargs
        ``n_local_clusters`` (structured, required), ``alpha`` (dirichlet,
        required), ``min_size``/``max_tries`` (dirichlet), ``exponent``/``min_size``
        (power-law); ``min_size`` (uniform, weighted, similarity), ``ratio``
        (unbalanced), ``graph`` (degree, required: graph, adjacency or degrees).

    Returns
    -------
    list of ndarray
        int64 index arrays (see :func:`apply_partition`).
    """
    check_choice(kind, "kind", PARTITION_KINDS)
    n = int(np.shape(X)[0]) if np.ndim(X) >= 1 else 0
    unknown = set(kwargs) - PARTITION_OPTIONS[kind]
    if unknown:
        raise ValidationError(
            f"partition kind={kind!r} does not take {sorted(unknown)}; "
            f"it accepts {sorted(PARTITION_OPTIONS[kind]) or 'no extra options'}")
    if kind in ("structured", "dirichlet"):
        if y is None:
            raise ValidationError(f"partition kind={kind!r} needs labels y, got None")
        if np.shape(y)[:1] != (n,):
            raise ValidationError(f"y has shape {np.shape(y)} but X has {n} rows")
    if kind == "iid":
        return iid_partition(n, n_devices, random_state=random_state)
    if kind == "uniform":
        return uniform_partition(n, n_devices, random_state=random_state, **kwargs)
    if kind == "weighted":
        return weighted_partition(n, n_devices, random_state=random_state, **kwargs)
    if kind == "unbalanced":
        return unbalanced_partition(n, n_devices, random_state=random_state, **kwargs)
    if kind == "similarity":
        return similarity_partition(X, n_devices, random_state=random_state, **kwargs)
    if kind == "degree":
        if "graph" not in kwargs:
            raise ValidationError("partition kind='degree' needs graph=... (a graph, an "
                                  "adjacency matrix or the node degrees)")
        parts = degree_partition(n, random_state=random_state, **kwargs)
        if len(parts) != n_devices:
            raise ValidationError(
                f"the graph has {len(parts)} nodes but n_devices={n_devices}")
        return parts
    if kind == "power-law":
        return power_law_partition(n, n_devices, random_state=random_state, **kwargs)
    if kind == "structured":
        if "n_local_clusters" not in kwargs:
            raise ValidationError("partition kind='structured' needs n_local_clusters=...")
        return structured_partition(y, n_devices=n_devices, random_state=random_state,
                                    **kwargs)
    if "alpha" not in kwargs:
        raise ValidationError("partition kind='dirichlet' needs alpha=...")
    return dirichlet_partition(y, n_devices, random_state=random_state, **kwargs)
