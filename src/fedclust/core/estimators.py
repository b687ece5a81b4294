"""What every federated front door shares: the input forms of ``fit`` and the labels.

``fit`` accepts a federation in three forms (:func:`split_federation`):

* a sequence of per-device 2-D arrays ``[X_0, X_1, ...]`` (and ``[y_0, y_1, ...]``);
* one 2-D array ``X`` (n, d) with ``groups`` (n,), each row's device id (the
  ``fit(X, groups=site_ids)`` form of scikit-learn's group-aware tools). Devices
  are ordered by their sorted group ids; a device's id is its group value when
  the groups are non-negative integers, else its position in that order.
  ``labels_`` then comes back in the row order of ``X``;
* one 2-D array ``X`` without ``groups`` (numpy, pandas, or a list of rows as
  ``X.tolist()`` makes): a federation of one device (the centralized case, and
  what scikit-learn's own checks pass). A list of numpy arrays is always a list
  of devices, so that a 1-D device gets its own error.

scikit-learn's pattern for the center-based families: ``fit`` sets
``cluster_centers_``, ``n_features_in_`` and ``device_labels_``; ``labels_``,
``predict`` and ``fit_predict`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from .exceptions import NotFittedError, ValidationError
from .kmeans import assign
from .validation import check_array, check_query

__all__ = ["CenterEstimatorMixin", "DeviceLabelsMixin", "Federation", "KMeansScoreMixin",
           "RowOrder", "kmeans_cost", "split_federation"]


@dataclass(frozen=True)
class RowOrder:
    """Where the devices' rows sit in the caller's ``X``.

    ``order`` (groups form only): the rows of ``X`` in device order, so that
    ``X[order]`` is the devices' rows concatenated; ``sizes``: rows per device.
    Both are ``None`` for the list form.
    """

    order: np.ndarray | None = None
    sizes: np.ndarray | None = None

    def to_rows(self, per_device: list[np.ndarray | None], fill: int = -1) -> np.ndarray:
        """Concatenate per-device arrays; in the groups form, back in the row order of X.

        A device without output (``None``: it did not take part) is left out in
        the list form and filled with ``fill`` in the groups form.
        """
        if self.order is None:
            parts = [a for a in per_device if a is not None]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        parts = [np.full(int(n), fill, dtype=np.int64) if a is None else np.asarray(a)
                 for a, n in zip(per_device, self.sizes)]
        flat = np.concatenate(parts)
        out = np.empty_like(flat)
        out[self.order] = flat
        return out


@dataclass(frozen=True)
class Federation:
    """A federation as ``fit`` received it, split into devices (``labels``: None for clustering;
    ``device_ids``: None for the default 0..Z-1)."""

    devices: list[Any]
    labels: list[Any] | None
    device_ids: list[int] | None
    rows: RowOrder = RowOrder()


def _is_single_array(X: Any) -> bool:
    """One array (numpy, pandas, anything with ``__array__``, or a list of rows given as lists,
    as ``X.tolist()`` makes), not a sequence of per-device 2-D arrays. A list of 1-D numpy
    arrays stays a list of devices, so that a 1-D device gets its own error."""
    if isinstance(X, np.ndarray):
        return X.dtype.kind != "O" or X.ndim == 2
    if isinstance(X, (list, tuple)):
        return len(X) > 0 and isinstance(X[0], (list, tuple)) and np.ndim(X[0]) == 1
    return hasattr(X, "__array__")


def _as_2d(X: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(X)
    except ValueError as exc:  # a ragged list of rows
        raise ValidationError(f"{name} reads as a list of rows (its first entry is a list) but the "
                              f"rows do not stack ({exc}); pass one 2-D array per device") from None
    if arr.ndim != 2:
        raise ValidationError(
            f"{name} must be one 2-D array (n, d) or a sequence of per-device 2-D arrays, "
            f"got an array of shape {arr.shape}")
    return arr


def _object_groups(g: np.ndarray) -> np.ndarray:
    """An object array of group ids (pandas' column of strings, or of Python ints) as a
    string or integer array; a missing or other value is named with its row."""
    if all(isinstance(v, str) for v in g):
        return g.astype(str)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in g):
        return g.astype(np.int64)
    kinds = {type(v).__name__ for v in g}
    if kinds & {"str"} and len(kinds) > 1:
        row = next(i for i, v in enumerate(g) if not isinstance(v, str))
        raise ValidationError(f"groups mixes strings with {type(g[row]).__name__} values "
                              f"(row {row}: {g[row]!r}); every device id must be a string, or "
                              "every one an integer")
    row = next(i for i, v in enumerate(g)
               if not isinstance(v, (int, np.integer)) or isinstance(v, bool))
    raise ValidationError(f"groups row {row} is {g[row]!r} ({type(g[row]).__name__}); device "
                          "ids must be integers or strings")


def split_federation(X: Any, y: Any = None, *, groups: Any = None, device_ids: Any = None,
                     x_name: str = "X", y_name: str = "y") -> Federation:
    """Bring any of the three input forms of ``fit`` (module docstring) to a list of devices.

    Only the split happens here; the estimator validates the devices' contents
    (``check_devices``) as before. ``y`` is ``None`` for clustering.
    """
    if X is None:
        raise ValidationError(f"{x_name} is None: give one 2-D array per device, or one 2-D "
                              "array (with groups= naming every row's device)")
    if sp.issparse(X):
        raise ValidationError(f"{x_name} is a scipy sparse matrix; fedclust needs dense arrays "
                              f"(pass {x_name}.toarray())")
    # iterating a dict gives its keys, read as devices (a dok_matrix is one: sparse first)
    if isinstance(X, Mapping):
        raise ValidationError(
            f"{x_name} is a {type(X).__name__} of devices; pass list({x_name}.values()) with "
            f"device_ids=list({x_name}.keys())"
            + ("" if y is None else f" (and {y_name} in the same order)"))
    single = _is_single_array(X)
    if groups is None:
        if not single:
            return Federation(X, y, None if device_ids is None else list(device_ids))
        X = _as_2d(X, x_name)
        ys = None if y is None else [np.asarray(y)]
        return Federation([X], ys, None if device_ids is None else list(device_ids))
    if not single:
        raise ValidationError(f"groups= needs {x_name} as one 2-D array (n, d); got a "
                              f"{type(X).__name__} of devices (drop groups, or stack the rows)")
    if device_ids is not None:
        raise ValidationError("pass groups or device_ids, not both (with groups, the device "
                              "ids are the group values)")
    X = _as_2d(X, x_name)
    g = np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != X.shape[0]:
        raise ValidationError(f"groups has shape {g.shape} but {x_name} has {X.shape[0]} rows; "
                              "give one device id per row")
    if g.dtype.kind == "O":
        g = _object_groups(g)
    if g.dtype.kind not in "biuUS":
        raise ValidationError(f"groups has dtype {g.dtype}; device ids must be integers or "
                              "strings")
    if g.shape[0] == 0:
        raise ValidationError(f"{x_name} has 0 rows: nothing to fit")
    ids, codes = np.unique(g, return_inverse=True)
    order = np.argsort(codes, kind="stable")
    sizes = np.bincount(codes, minlength=len(ids))
    cuts = np.cumsum(sizes)[:-1]
    devices = np.split(X[order], cuts)
    ys = None
    if y is not None:
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValidationError(f"{y_name} has shape {y.shape} but {x_name} has "
                                  f"{X.shape[0]} rows")
        ys = np.split(y[order], cuts)
    named = ids.dtype.kind in "iu" and (ids.dtype.kind == "u" or ids.min() >= 0)
    return Federation(devices, ys, [int(z) for z in ids] if named else None,
                      RowOrder(order, sizes))


class DeviceLabelsMixin:
    """``labels_`` from ``device_labels_`` (set by ``fit``); scikit-learn's ``ClusterMixin``
    turns it into ``fit_predict``."""

    def _check_fitted(self) -> Any:
        if not hasattr(self, "device_labels_"):
            raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; "
                                 "call fit first")

    @property
    def labels_(self) -> np.ndarray:
        """Every point's cluster: the devices' labels concatenated in device order, or in the
        row order of X for ``fit(X, groups=...)`` (-1 for a device that did not take part)."""
        self._check_fitted()
        return getattr(self, "_rows", RowOrder()).to_rows(self.device_labels_)


def kmeans_cost(X: np.ndarray, centers: np.ndarray, sample_weight: Any = None) -> float:
    """sum_i w_i min_j ||x_i - c_j||^2 of the rows X (n, d) on ``centers`` (k, d), the
    distances computed exactly (in float64) once the nearest center is found."""
    n = X.shape[0]
    w = None
    if sample_weight is not None:
        w = check_array(sample_weight, "sample_weight", dtype=np.float64, ndim=1)
        if w.shape != (n,) or (w < 0).any():
            bad = "" if w.shape != (n,) else f" ({w[w < 0][0]} at index {int(np.argmax(w < 0))})"
            raise ValidationError(f"sample_weight must be {n} finite non-negative numbers, got "
                                  f"shape {w.shape}{bad}")
    X = X.astype(np.float64, copy=False)
    C = np.asarray(centers, dtype=np.float64)
    labels = assign(X, C)[0]
    d2 = ((X - C[labels]) ** 2).sum(axis=1)
    return float(d2.sum() if w is None else d2 @ w)


class KMeansScoreMixin:
    """scikit-learn's ``KMeans.score`` for a fitted ``cluster_centers_``."""

    def score(self, X: Any, y: None = None, sample_weight: Any = None) -> float:
        """Negative k-means cost of X on the fitted centers, -sum_i w_i min_j ||x_i - c_j||^2
        (scikit-learn's ``KMeans.score``): larger is better, so ``GridSearchCV`` needs no
        scorer. The cost always falls as k grows; compare k by it only on held-out rows and
        expect the largest k to win unless the gain flattens."""
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; "
                                 "call fit first")
        X = check_query(X, self)
        return -kmeans_cost(X, self.cluster_centers_, sample_weight)


class CenterEstimatorMixin(KMeansScoreMixin, DeviceLabelsMixin):
    """``labels_``, ``predict`` (nearest final center) and ``score`` (negative k-means cost)
    for a fitted model."""

    def _check_fitted(self) -> None:
        if not hasattr(self, "cluster_centers_"):
            raise NotFittedError(f"this {type(self).__name__} instance is not fitted yet; "
                                 "call fit(devices) first")

    def predict(self, X: Any) -> np.ndarray:
        """Nearest final center of every row of X (n, d)."""
        self._check_fitted()
        X = check_query(X, self)
        return assign(X, self.cluster_centers_.astype(X.dtype, copy=False))[0]
