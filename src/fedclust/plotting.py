"""Figures (needs the ``plot`` extra: matplotlib). Imported lazily by the CLI.

Data with more than two features is drawn in its 2-D PCA view (scikit-learn's
:class:`~sklearn.decomposition.PCA`), the axes labelled with the share of the
variance each principal component explains; points are coloured by cluster.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .core.atomic import atomic_open
__all__ = ["have_matplotlib", "save_figure", "plot_federated_clustering", "clustering_figure",
           "plot_gaussian_clusters", "PlaneView", "plane_view", "wrap_title"]


@dataclass
class PlaneView:
    """A linear map of D-dimensional data onto the plane of a figure.

    ``components`` (2, D) are orthonormal rows, ``mean`` (D,) the centre;
    ``labels`` the axis labels (``"PC1 (62.3 % var)"``, or the feature names
    when D <= 2).
    """

    mean: np.ndarray
    components: np.ndarray
    labels: tuple[str, str]

    def points(self, X: np.ndarray) -> np.ndarray:
        """(n, D) -> (n, 2)."""
        return (np.asarray(X, dtype=float) - self.mean) @ self.components.T

    def covariances(self, covs: np.ndarray) -> np.ndarray:
        """(k, D, D) -> (k, 2, 2): the covariance of the projected Gaussian, W S W^T."""
        W = self.components
        return np.einsum("ad,kde,be->kab", W, np.asarray(covs, dtype=float), W)


def plane_view(X: np.ndarray, *, max_points: int = 20000, random_state: int = 0) -> PlaneView:
    """The 2-D view of ``X`` (n, D): PCA when D > 2, the features themselves otherwise.

    PCA is fitted on at most ``max_points`` rows drawn with ``random_state``.
    """
    X = np.asarray(X, dtype=float)
    n, d = X.shape
    if d <= 2:
        comps = np.eye(2)[:, :d] if d == 2 else np.array([[1.0], [0.0]])
        names = ("feature 1", "feature 2") if d == 2 else ("feature 1", "")
        return PlaneView(np.zeros(d), comps, names)
    from sklearn.decomposition import PCA

    rows = np.random.default_rng(random_state).choice(n, size=min(max_points, n), replace=False)
    pca = PCA(n_components=2, random_state=random_state).fit(X[rows])
    share = 100.0 * pca.explained_variance_ratio_
    return PlaneView(pca.mean_, pca.components_,
                     (f"PC1 ({share[0]:.1f} % var)", f"PC2 ({share[1]:.1f} % var)"))


def wrap_title(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points."""
    per_line = max(20, int(width_in * 72.0 / (0.6 * fontsize)))
    return "\n".join(line for part in text.split("\n")
                     for line in (textwrap.wrap(part, per_line) or [""]))


def _cluster_legend(ax: Any, scatter: Any, n_labels: int, extra: Sequence[Any] = ()) -> None:
    """Legend: one entry per cluster up to 10 clusters, else one for the colouring."""
    from matplotlib.lines import Line2D

    if n_labels <= 10:
        handles, names = scatter.legend_elements(num=None)
        names = [f"cluster {t.split('{')[-1].rstrip('}$').strip()}" for t in names]
    else:
        handles = [Line2D([], [], marker="o", ls="", color="tab:blue", ms=4)]
        names = [f"points ({n_labels} clusters, by colour)"]
    for h in extra:
        handles.append(h)
        names.append(h.get_label())
    ax.legend(handles, names, fontsize=7, loc="best", framealpha=0.8)


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_federated_clustering(devices: Sequence[np.ndarray], device_labels: Sequence[Any],
                              centers: np.ndarray, result: dict[str, Any],
                              path: str | Path, max_points: int = 5000) -> Path:
    """Two panels: the pooled data (its 2-D PCA view when d > 2), coloured by the
    induced clustering, final centers as crosses; and the cost and bytes of the
    algorithm next to the baselines in ``result['baselines']``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = clustering_figure(devices, device_labels, centers, result, max_points=max_points)
    path = save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig`` written atomically (the format from the suffix, PNG by default)."""
    path = Path(path)
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".") or "png", **kwargs)
    return path


def clustering_figure(devices: Sequence[np.ndarray], device_labels: Sequence[Any],
                      centers: np.ndarray, result: dict[str, Any], *,
                      max_points: int = 5000) -> Any:
    """The figure of :func:`plot_federated_clustering` (a matplotlib ``Figure``, not saved)."""
    import matplotlib.pyplot as plt

    X = np.concatenate([x for x, lab in zip(devices, device_labels) if lab is not None])
    lab = np.concatenate([lab for lab in device_labels if lab is not None])
    rng = np.random.default_rng(0)
    show = rng.choice(len(X), size=min(max_points, len(X)), replace=False)
    view = plane_view(X)
    P = view.points(X[show])
    C = view.points(centers)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.8))
    dots = ax1.scatter(P[:, 0], P[:, 1], c=lab[show], s=4, cmap="tab20", alpha=0.6)
    crosses = ax1.scatter(C[:, 0], C[:, 1], marker="x", c="black", s=60, label="final centers")
    ax1.set_xlabel(view.labels[0])
    ax1.set_ylabel(view.labels[1])
    _cluster_legend(ax1, dots, len(np.unique(lab)), extra=[crosses])
    where = "PCA view" if X.shape[1] > 2 else "data"
    ax1.set_title(wrap_title(f"{result['algorithm']}: points coloured by cluster ({where}, "
                             f"d={X.shape[1]})", 5.0, 10), fontsize=10)
    names = [result["algorithm"]]
    costs = [result["metrics"]["kmeans_cost"]]
    comm = [result["communication"]["bytes_total"]]
    for name, base in result["baselines"].items():
        names.append(name)
        costs.append(base["kmeans_cost"])
        comm.append(base.get("bytes_up", 0) + base.get("bytes_down", 0))
    x = np.arange(len(names))
    # only measured values: the ratio needs a centralized run; without one, the costs
    ref = result["baselines"].get("centralized", {}).get("kmeans_cost")
    what = "k-means cost" if ref is None else "k-means cost / centralized"
    ax2.bar(x - 0.2, np.array(costs) / (1.0 if ref is None else ref), 0.4, label=what)
    ax2b = ax2.twinx()
    ax2b.bar(x + 0.2, np.array(comm) / 1e3, 0.4, color="tab:orange", label="kB sent")
    ax2.set_xticks(x, names)
    ax2.set_ylabel(what if ref is None else "k-means cost / centralized k-means")
    handles = ax2.get_legend_handles_labels()[0] + ax2b.get_legend_handles_labels()[0]
    ax2.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    ax2b.set_ylabel("kB communicated (centralized: data not counted)")
    ax2.set_title("cost and communication", fontsize=10)
    if result.get("title"):
        fig.suptitle(wrap_title(result["title"], 10.5, 10), fontsize=10)
    fig.tight_layout()
    return fig


def plot_gaussian_clusters(ax: Any, X: np.ndarray, means: np.ndarray, covariances: np.ndarray,
                           labels: np.ndarray | None = None, *, title: str = "",
                           n_std: float = 2.0, max_points: int = 5000) -> Any:
    """Draw data (blue, or coloured by cluster ``labels``) and Gaussian clusters as
    ``n_std``-sigma ellipses (red), on a matplotlib axis ``ax``.

    ``X`` is (n, D); ``means`` (K, D); ``covariances`` (K, D, D) or (K, D)
    diagonals. With D > 2 everything is drawn in the 2-D PCA view of ``X``
    (an ellipse is the projected Gaussian, covariance W S W^T). Axes are
    labelled, the legend names the clusters and the ellipses. Returns ``ax``.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Ellipse

    X = np.asarray(X, dtype=float)
    view = plane_view(X)
    rng = np.random.default_rng(0)
    show = rng.choice(len(X), size=min(max_points, len(X)), replace=False)
    P = view.points(X[show])
    if labels is None:
        dots = ax.scatter(P[:, 0], P[:, 1], s=2, c="tab:blue", alpha=0.5)
    else:
        dots = ax.scatter(P[:, 0], P[:, 1], s=2, c=np.asarray(labels)[show], cmap="tab20",
                          alpha=0.5)
    means = np.atleast_2d(np.asarray(means, dtype=float))
    covs = np.asarray(covariances, dtype=float)
    if covs.ndim == 2:
        covs = np.einsum("kd,de->kde", covs, np.eye(covs.shape[1]))
    for mu, S in zip(view.points(means), view.covariances(covs)):
        vals, vecs = np.linalg.eigh(S)
        vals = np.maximum(vals, 0.0)
        angle = float(np.degrees(np.arctan2(vecs[1, 1], vecs[0, 1])))
        ax.add_patch(Ellipse(mu, 2 * n_std * np.sqrt(vals[1]), 2 * n_std * np.sqrt(vals[0]),
                             angle=angle, fill=False, color="tab:red", lw=1.2))
        ax.plot(mu[0], mu[1], "r+", ms=5)
    ax.set_xlabel(view.labels[0])
    ax.set_ylabel(view.labels[1])
    ring = Line2D([], [], color="tab:red", lw=1.2, label=f"{n_std:g}-sigma ellipse, + mean")
    if labels is None:
        ax.legend([dots, ring], ["points", ring.get_label()], fontsize=7, loc="best")
    else:
        _cluster_legend(ax, dots, len(np.unique(np.asarray(labels))), extra=[ring])
    width = ax.figure.get_size_inches()[0] * ax.get_position().width
    ax.set_title(wrap_title(title, width, 9), fontsize=9)
    ax.set_aspect("equal", adjustable="datalim")
    return ax
