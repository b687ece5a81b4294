"""Figures (needs the ``plot`` extra: matplotlib). Imported lazily by the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["have_matplotlib", "plot_federated_clustering", "plot_gaussian_clusters"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_federated_clustering(devices: Sequence[np.ndarray], device_labels: Sequence[Any],
                              centers: np.ndarray, result: dict[str, Any],
                              path: str | Path, max_points: int = 5000) -> Path:
    """Two panels: the pooled data projected on its top-2 principal axes, coloured
    by the induced k-FED clustering (final centers as crosses); and cost and
    bytes of k-FED next to the baselines in ``result['baselines']``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    X = np.concatenate([x for x, lab in zip(devices, device_labels) if lab is not None])
    lab = np.concatenate([lab for lab in device_labels if lab is not None])
    rng = np.random.default_rng(0)
    show = rng.choice(len(X), size=min(max_points, len(X)), replace=False)
    mean = X.mean(axis=0)
    _, _, Vt = np.linalg.svd(X[show] - mean, full_matrices=False)
    P = (X[show] - mean) @ Vt[:2].T
    C = (centers - mean) @ Vt[:2].T
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.scatter(P[:, 0], P[:, 1], c=lab[show], s=4, cmap="tab20", alpha=0.6)
    ax1.scatter(C[:, 0], C[:, 1], marker="x", c="black", s=60)
    ax1.set_title(f"{result['algorithm']}: induced clustering (PCA view)")
    names = [result["algorithm"]]
    costs = [result["metrics"]["kmeans_cost"]]
    comm = [result["communication"]["bytes_total"]]
    for name, base in result["baselines"].items():
        names.append(name)
        costs.append(base["kmeans_cost"])
        comm.append(base.get("bytes_up", 0) + base.get("bytes_down", 0))
    x = np.arange(len(names))
    ref = result["baselines"].get("centralized", {}).get("kmeans_cost", costs[0])
    ax2.bar(x - 0.2, np.array(costs) / ref, 0.4, label="k-means cost / centralized")
    ax2b = ax2.twinx()
    ax2b.bar(x + 0.2, np.array(comm) / 1e3, 0.4, color="tab:orange", label="kB sent")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("k-means cost / centralized k-means")
    handles = ax2.get_legend_handles_labels()[0] + ax2b.get_legend_handles_labels()[0]
    ax2.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    ax2b.set_ylabel("kB communicated (centralized: data not counted)")
    ax2.set_title("cost and communication")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gaussian_clusters(ax: Any, X: np.ndarray, means: np.ndarray, covariances: np.ndarray,
                           labels: np.ndarray | None = None, *, title: str = "",
                           n_std: float = 2.0, max_points: int = 5000) -> Any:
    """Draw 2-D data (blue, or coloured by ``labels``) and Gaussian clusters as
    ``n_std``-sigma ellipses (red), on a matplotlib axis ``ax``.

    ``covariances`` is (K, 2, 2) or (K, 2) diagonals. Returns ``ax``.
    """
    from matplotlib.patches import Ellipse

    X = np.asarray(X)
    rng = np.random.default_rng(0)
    show = rng.choice(len(X), size=min(max_points, len(X)), replace=False)
    if labels is None:
        ax.scatter(X[show, 0], X[show, 1], s=2, c="tab:blue", alpha=0.5)
    else:
        ax.scatter(X[show, 0], X[show, 1], s=2, c=np.asarray(labels)[show], cmap="tab20",
                   alpha=0.5)
    covs = np.asarray(covariances)
    if covs.ndim == 2:
        covs = np.einsum("kd,de->kde", covs, np.eye(2))
    for mu, S in zip(np.asarray(means), covs):
        vals, vecs = np.linalg.eigh(S[:2, :2])
        vals = np.maximum(vals, 0.0)
        angle = float(np.degrees(np.arctan2(vecs[1, 1], vecs[0, 1])))
        ax.add_patch(Ellipse(mu[:2], 2 * n_std * np.sqrt(vals[1]), 2 * n_std * np.sqrt(vals[0]),
                             angle=angle, fill=False, color="tab:red", lw=1.2))
        ax.plot(mu[0], mu[1], "r+", ms=5)
    ax.set_title(title, fontsize=9)
    ax.set_aspect("equal", adjustable="datalim")
    return ax
