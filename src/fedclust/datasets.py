"""Federated data: the k-FED Gaussian-mixture generator and real-data loaders.

Loaders take a path or a data directory (``data_dir=None`` reads the
``FEDCLUST_DATA`` environment variable); nothing here depends on a fixed
location. Files are ``.npz`` archives read with ``allow_pickle=False`` holding
``X`` (n, d) and ``y`` (n,).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .core.random import RandomState, root_seed
from .core.validation import check_array, check_choice, check_float, check_int
from .core.exceptions import ValidationError

__all__ = [
    "FederatedData",
    "DataNotFoundError",
    "make_federated_gaussians",
    "default_data_dir",
    "load_npz",
    "load_mnist",
    "load_benchmark",
    "load_sites",
    "load_table_sites",
    "SiteFederation",
]

DATA_ENV_VAR = "FEDCLUST_DATA"


class DataNotFoundError(ValidationError, FileNotFoundError):
    """A data file or data directory does not exist (both a ValueError and a
    FileNotFoundError, so either ``except`` catches it)."""


@dataclass(frozen=True)
class FederatedData:
    """A federation: per-device points and their true labels.

    Attributes
    ----------
    devices : list of ndarray, each of shape (n_z, d), float64
    labels : list of ndarray, each of shape (n_z,), int64
        True labels (mixture component or class) of every device's points.
    means : ndarray of shape (k, d) or None
        True component means, when known (generated data).
    meta : dict
        How the data was made (generator parameters, groups, seed).
    """

    devices: list[np.ndarray]
    labels: list[np.ndarray]
    means: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.devices) == 0:
            raise ValidationError("FederatedData needs at least one device")
        if len(self.devices) != len(self.labels):
            raise ValidationError(
                f"FederatedData has {len(self.devices)} devices but "
                f"{len(self.labels)} label arrays; give one per device")
        d = None
        for z, (Xz, yz) in enumerate(zip(self.devices, self.labels)):
            if np.ndim(Xz) != 2 or np.ndim(yz) != 1 or len(Xz) != len(yz):
                raise ValidationError(
                    f"device {z}: X must be 2-D and labels 1-D of the same length, got "
                    f"shapes {np.shape(Xz)} and {np.shape(yz)}")
            if d is None:
                d = np.shape(Xz)[1]
            elif np.shape(Xz)[1] != d:
                raise ValidationError(
                    f"device {z} has {np.shape(Xz)[1]} features but device 0 has {d}")

    @property
    def X(self) -> np.ndarray:
        """Pooled points, shape (sum n_z, d), devices in order."""
        return np.vstack(self.devices)

    @property
    def y(self) -> np.ndarray:
        """Pooled labels, shape (sum n_z,), aligned with :attr:`X`."""
        return np.concatenate(self.labels)

    @property
    def n_devices(self) -> int:
        """Number of devices."""
        return len(self.devices)

    @property
    def n_features(self) -> int:
        """Feature dimension d."""
        return int(self.devices[0].shape[1])


def make_federated_gaussians(
    n_features: int = 100,
    n_clusters: int = 16,
    n_local_clusters: int | None = None,
    m0: int = 5,
    separation: float = 100.0,
    n_per_component: int | None = None,
    sigma: float = 1.0,
    random_state: RandomState = None,
) -> FederatedData:
    """Separated Gaussian mixture split over devices as in k-FED's Table 1.

    Construction (Dennis, Li, Smith, "Heterogeneity for the win: one-shot
    federated clustering", ICML 2021, §4.1):

    1. Means ``mu_r = separation * sigma * g_r / sqrt(2 d)`` with
       ``g_r ~ N(0, I_d)`` i.i.d., ``r = 0..k-1``. Hence
       ``E ||mu_r - mu_s||^2 = separation^2 sigma^2``: ``separation`` (the
       paper's ``c``) is the typical distance between two component means in
       units of the noise standard deviation ``sigma``. (A point lies about
       ``sigma * sqrt(d)`` from its own mean.) This mapping of ``c`` is our
       decision; the paper does not spell one out.
    2. Component ``r`` gives ``n_per_component`` samples from
       ``N(mu_r, sigma^2 I_d)``.
    3. Components are cut into groups ``G_i`` of ``k'`` consecutive indices
       (``G_0 = {0..k'-1}``, ...); when ``k'`` does not divide ``k`` the last
       group holds the ``k mod k'`` remaining components.
    4. Each group's data goes to ``m0`` devices of its own: every component's
       samples are shuffled and dealt evenly (sizes differ by at most one) over
       the group's ``m0`` devices, so every device holds points of exactly the
       components of its group. Rows within a device are shuffled.

    Devices are ordered by group: devices ``i*m0 .. (i+1)*m0-1`` hold ``G_i``.
    There are ``ceil(k / k') * m0`` devices.

    Parameters
    ----------
    n_features : int, default=100
        Dimension d.
    n_clusters : int, default=16
        Number of components k.
    n_local_clusters : int, optional
        Components per group k' (default ``max(1, round(sqrt(k)))``, the
        paper's setting). Must satisfy ``1 <= k' <= k``.
    m0 : int, default=5
        Devices per group.
    separation : float, default=100.0
        The paper's ``c`` (see step 1); ``>= 0``.
    n_per_component : int, optional
        Samples per component (the paper's ``poly(d, k)``). Default
        ``max(10 * m0, 2 * n_features)``: 200 for d=100, 600 for d=300, so each
        device gets ``2d/m0`` points of each of its components.
    sigma : float, default=1.0
        Noise standard deviation (> 0).
    random_state : int, Generator or None
        The only source of randomness (means, samples, split).

    Returns
    -------
    FederatedData
        ``devices[z]`` of shape (n_z, d) float64, ``labels[z]`` the component
        of every row (int64 in 0..k-1), ``means`` (k, d), and ``meta`` with the
        parameters, ``groups`` (list of component lists), ``device_group``
        (group of every device) and ``seed``.
    """
    d = check_int(n_features, "n_features", min_value=1)
    k = check_int(n_clusters, "n_clusters", min_value=1)
    if n_local_clusters is None:
        kp = max(1, int(round(math.sqrt(k))))
    else:
        kp = check_int(n_local_clusters, "n_local_clusters", min_value=1, max_value=k)
    m0 = check_int(m0, "m0", min_value=1)
    c = check_float(separation, "separation", min_value=0.0)
    sigma = check_float(sigma, "sigma", min_value=0.0, min_inclusive=False)
    if n_per_component is None:
        n_per = max(10 * m0, 2 * d)
    else:
        n_per = check_int(n_per_component, "n_per_component", min_value=1)
    if n_per < m0:
        raise ValidationError(
            f"n_per_component={n_per} < m0={m0}: some device would miss a component "
            f"of its group; use n_per_component >= m0")
    groups = [list(range(s, min(s + kp, k))) for s in range(0, k, kp)]
    smallest = len(groups[-1]) * (n_per // m0)
    if smallest <= kp:
        raise ValidationError(
            f"the smallest device would get {smallest} points "
            f"({len(groups[-1])} components x {n_per // m0} points), not more than "
            f"n_local_clusters={kp}; raise n_per_component={n_per} or lower m0={m0}")

    seed = root_seed(random_state)
    rng = np.random.default_rng(seed)
    means = (c * sigma / math.sqrt(2.0 * d)) * rng.standard_normal((k, d))

    devices: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    device_group: list[int] = []
    for gi, comps in enumerate(groups):
        parts_X: list[list[np.ndarray]] = [[] for _ in range(m0)]
        parts_y: list[list[np.ndarray]] = [[] for _ in range(m0)]
        for r in comps:
            pts = means[r] + sigma * rng.standard_normal((n_per, d))
            # Rotate the start so leftover points do not pile on device 0.
            chunks = np.array_split(rng.permutation(n_per), m0)
            for j, idx in enumerate(chunks):
                dev = (j + r) % m0
                parts_X[dev].append(pts[idx])
                parts_y[dev].append(np.full(len(idx), r, dtype=np.int64))
        for j in range(m0):
            Xz = np.vstack(parts_X[j])
            yz = np.concatenate(parts_y[j])
            order = rng.permutation(len(yz))
            devices.append(Xz[order])
            labels.append(yz[order])
            device_group.append(gi)

    meta = {
        "generator": "make_federated_gaussians",
        "n_features": d, "n_clusters": k, "n_local_clusters": kp, "m0": m0,
        "separation": c, "sigma": sigma, "n_per_component": n_per,
        "groups": groups, "device_group": device_group, "seed": seed,
    }
    return FederatedData(devices=devices, labels=labels, means=means, meta=meta)


# ---------------------------------------------------------------- loaders

def default_data_dir() -> Path | None:
    """The data directory named by ``$FEDCLUST_DATA``, or None when unset/empty."""
    value = os.environ.get(DATA_ENV_VAR, "").strip()
    return Path(value).expanduser() if value else None


def _resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    if data_dir is None:
        data_dir = default_data_dir()
        if data_dir is None:
            raise DataNotFoundError(
                f"no data directory: pass data_dir=... or set the environment variable "
                f"{DATA_ENV_VAR} to the folder holding the datasets "
                "(see the README's Data section)")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataNotFoundError(
            f"data directory {str(path)!r} does not exist or is not a folder; "
            f"check data_dir or {DATA_ENV_VAR}")
    return path


def _as_int_labels(y: np.ndarray, path: Path, key: str) -> np.ndarray:
    if y.ndim != 1:
        raise ValidationError(f"{path}: {key!r} must be 1-D, got shape {y.shape}")
    if y.dtype.kind in "biu":
        return y.astype(np.int64)
    if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
        return y.astype(np.int64)
    raise ValidationError(
        f"{path}: labels {key!r} (dtype {y.dtype}) are not integers; "
        "store class labels as integers")


def load_npz(path: str | os.PathLike, *, x_key: str = "X",
             y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Read ``X`` and ``y`` from an ``.npz`` file (``allow_pickle=False``).

    Parameters
    ----------
    path : str or PathLike
        The ``.npz`` file.
    x_key, y_key : str
        Names of the arrays to read.

    Returns
    -------
    X : ndarray of shape (n, d), float64
    y : ndarray of shape (n,), int64

    Raises
    ------
    DataNotFoundError
        The file does not exist.
    ValidationError
        A key is missing, X is not 2-D numeric, X has NaN/inf (impute or drop
        such rows first), lengths differ or labels are not integers.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataNotFoundError(
            f"data file {str(path)!r} not found; check the path (or data_dir / "
            f"${DATA_ENV_VAR}, the folder holding the datasets)")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise ValidationError(f"{path} could not be read as an .npz archive: {exc}") from None
    with archive:
        for key in (x_key, y_key):
            if key not in archive.files:
                raise ValidationError(
                    f"{path} has no array {key!r}; it holds {sorted(archive.files)}")
        X = check_array(archive[x_key], f"{path}:{x_key}", dtype=np.float64)
        y = _as_int_labels(np.asarray(archive[y_key]), path, y_key)
    if X.shape[0] != y.shape[0]:
        raise ValidationError(
            f"{path}: {x_key!r} has {X.shape[0]} rows but {y_key!r} has {y.shape[0]} labels")
    return X, y


def load_mnist(path_or_dir: str | os.PathLike | None = None, subset: str = "all",
               scale: bool = True, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """MNIST from ``mnist_70k.npz`` (X uint8 70000x784, y, n_train).

    Parameters
    ----------
    path_or_dir : str, PathLike or None
        The ``.npz`` file, or a folder holding ``mnist_70k.npz`` or
        ``mnist/mnist_70k.npz``; None means :func:`default_data_dir`.
    subset : {"all", "train", "test"}
        Rows ``[:n_train]``, ``[n_train:]`` or all.
    scale : bool, default=True
        Divide pixels by 255 (values in [0, 1]).
    dtype : float dtype, default=float64
        float32 halves memory (70000x784 float64 is 439 MB).

    Returns
    -------
    X : ndarray of shape (n, 784)
    y : ndarray of shape (n,), int64 digits 0..9
    """
    check_choice(subset, "subset", ["all", "train", "test"])
    if path_or_dir is None:
        path = _resolve_data_dir(None)
    else:
        path = Path(path_or_dir).expanduser()
    if path.is_dir():
        for cand in (path / "mnist_70k.npz", path / "mnist" / "mnist_70k.npz"):
            if cand.is_file():
                path = cand
                break
        else:
            raise DataNotFoundError(
                f"no mnist_70k.npz in {str(path)!r} or its mnist/ folder; "
                "pass the file path or the data directory")
    if not path.is_file():
        raise DataNotFoundError(f"MNIST file {str(path)!r} not found")
    with np.load(path, allow_pickle=False) as archive:
        missing = {"X", "y"} - set(archive.files)
        if missing:
            raise ValidationError(f"{path} lacks arrays {sorted(missing)}")
        X_raw = archive["X"]
        y = _as_int_labels(np.asarray(archive["y"]), path, "y")
        n_train = int(archive["n_train"]) if "n_train" in archive.files else None
    if X_raw.ndim != 2 or X_raw.shape[0] != y.shape[0]:
        raise ValidationError(
            f"{path}: X of shape {X_raw.shape} does not match y of shape {y.shape}")
    if subset != "all":
        if n_train is None:
            raise ValidationError(
                f"{path} has no 'n_train' entry, so subset={subset!r} is undefined; "
                "use subset='all'")
        rows = slice(0, n_train) if subset == "train" else slice(n_train, None)
        X_raw, y = X_raw[rows], y[rows]
    X = X_raw.astype(dtype)
    if scale:
        X /= 255.0
    return X, y


_BENCH_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


def load_benchmark(name: str, data_dir: str | os.PathLike | None = None, *,
                   drop_noise: bool = True, labels: str = "y"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A set of Gagolewski's clustering-benchmarks-v1 collection.

    Reads ``<data_dir>/clustering-benchmarks-v1/<name>.npz``. In these files
    labels start at 1 and 0 marks noise points.

    Parameters
    ----------
    name : str
        ``"<battery>/<dataset>"``, e.g. ``"sipu/s1"`` or ``"uci/ecoli"``.
    data_dir : str, PathLike or None
        The folder holding ``clustering-benchmarks-v1``; None means
        :func:`default_data_dir`.
    drop_noise : bool, default=True
        Remove the label-0 (noise) rows. With False they are kept and get
        label -1 (scikit-learn's noise convention).
    labels : str, default="y"
        Which reference labelling to read (some sets also hold ``y1``, ``y2``...).

    Returns
    -------
    X : ndarray of shape (n, d), float64
    y : ndarray of shape (n,), int64
        Clusters renumbered 0..k-1 in the order of the original labels
        (noise -1 when kept). k = number of distinct non-zero labels.

    Notes
    -----
    Cite Gagolewski (2022), SoftwareX 20:101270, and the set's own reference.
    """
    if not isinstance(name, str) or not _BENCH_NAME.match(name) or ".." in name:
        raise ValidationError(
            f"name={name!r} must look like 'battery/dataset', e.g. 'sipu/s1' or 'uci/ecoli'")
    root = _resolve_data_dir(data_dir)
    path = root / "clustering-benchmarks-v1" / f"{name}.npz"
    if not path.is_file():
        raise DataNotFoundError(
            f"benchmark {name!r} not found at {str(path)!r}; data_dir must hold "
            "clustering-benchmarks-v1/<battery>/<dataset>.npz")
    X, y = load_npz(path, y_key=labels)
    if (y < 0).any():
        raise ValidationError(f"{path}: negative label {y.min()}; expected 0 (noise) or >= 1")
    noise = y == 0
    if drop_noise:
        X, y = X[~noise], y[~noise]
        if y.shape[0] == 0:
            raise ValidationError(f"{path}: every point is noise (label 0)")
    out = np.full(y.shape[0], -1, dtype=np.int64)
    keep = y != 0
    _, inv = np.unique(y[keep], return_inverse=True)
    out[keep] = inv.ravel()
    return X, out


# -- data sources of experiment configs ([data] source = ...) ---------------------------
def _gaussians_source(seed: int, *, n_features: int = 100, n_clusters: int = 16,
                      n_local_clusters: int | None = None, m0: int = 5,
                      separation: float = 100.0, n_per_component: int | None = None,
                      sigma: float = 1.0):
    from .core.registry import Federation

    fd = make_federated_gaussians(n_features, n_clusters, n_local_clusters, m0, separation,
                                  n_per_component, sigma, random_state=seed)
    return Federation(fd.devices, fd.labels,
                      f"Gaussian mixture ({fd.n_devices} devices, d={fd.n_features})")


def _mnist_source(seed: int, *, path: str | None = None, subset: str = "all", scale: bool = True):
    return load_mnist(path, subset=subset, scale=scale)


def _npz_source(seed: int, *, path: str, label: str = "y"):
    return load_npz(path, y_key=label)  # label: the labels array, e.g. "y_binary"


def _benchmark_source(seed: int, *, name: str, data_dir: str | None = None):
    return load_benchmark(name, data_dir)


def _register_sources() -> None:
    from .core.registry import DataSource, register_data_source

    register_data_source(DataSource("gaussians", _gaussians_source, federated=True))
    register_data_source(DataSource("mnist", _mnist_source))
    register_data_source(DataSource("npz", _npz_source))
    register_data_source(DataSource("benchmark", _benchmark_source))


_register_sources()


from .sites import SiteFederation, load_sites, load_table_sites  # noqa: E402  (site files)
