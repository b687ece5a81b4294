"""What the CLI needs from this wing: a 2-D data source, the figure, result fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..core.registry import Federation
from ..core.validation import check_float, check_int

__all__ = ["gauss_blobs", "plot_gauss", "gauss_result_fields", "gauss_report", "fit_classifier",
           "gauss_export", "GaussPredictor", "gauss_classifier_report"]


def gauss_blobs(seed: int, *, n_clusters: int = 15, n_per_cluster: int = 200,
                n_features: int = 2, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Pooled Gaussian blobs with random anisotropic covariances (S-set-like).

    Means uniform in a box of side 30 (rejecting means closer than 6), each
    cluster a random covariance of scale ``spread``. Returns (X, y).
    """
    k = check_int(n_clusters, "n_clusters", min_value=1)
    n = check_int(n_per_cluster, "n_per_cluster", min_value=1)
    d = check_int(n_features, "n_features", min_value=1)
    spread = check_float(spread, "spread", min_value=0.0, min_inclusive=False)
    rng = np.random.default_rng(seed)
    means: list[np.ndarray] = []
    while len(means) < k:
        m = rng.uniform(0, 30 * max(1.0, (k / 15) ** (1 / d)), d)
        if all(np.linalg.norm(m - o) > 6 * spread for o in means) or len(means) > 50 * k:
            means.append(m)
    X, y = [], []
    for c, m in enumerate(means):
        A = rng.normal(size=(d, d)) * 0.5 + np.eye(d)
        X.append(m + spread * rng.normal(size=(n, d)) @ A.T * 0.6)
        y.append(np.full(n, c))
    X = np.concatenate(X)
    y = np.concatenate(y)
    p = rng.permutation(len(X))
    return X[p], y[p]


def gauss_result_fields(model: Any) -> dict[str, Any]:
    return {"cluster_centers": np.asarray(model.means_).tolist(),
            "cluster_counts": np.asarray(model.counts_).tolist(),
            "n_clusters": int(model.n_clusters_)}


def plot_gauss(model: Any, fed: Federation, result: dict[str, Any], path: Path) -> Path | None:
    """Data coloured by cluster and the global clusters as 2-sigma ellipses (PCA view when D > 2)."""
    from ..plotting import have_matplotlib, plot_gaussian_clusters, save_figure

    if not have_matplotlib():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    got = [(X, lab) for X, lab in zip(fed.devices, getattr(model, "device_labels_", None)
                                      or [None] * len(fed.devices)) if lab is not None]
    X = np.concatenate([X for X, _ in got] if got else fed.devices)
    labels = np.concatenate([lab for _, lab in got]) if got else None
    if X.shape[1] < 2:
        return None
    result.setdefault("metrics", {})["n_clusters"] = int(model.n_clusters_)
    fig, ax = plt.subplots(figsize=(6.5, 6))
    ari = result.get("metrics", {}).get("ari")
    title = f"{result.get('algorithm', 'gauss')}: {model.n_clusters_} clusters"
    if ari is not None:
        title += f", ARI {ari:.3f}"
    if result.get("title"):
        title = f"{result['title']}\n{title}"
    plot_gaussian_clusters(ax, X, model.means_, model.covariances_,
                           labels if labels is not None else model.predict(X), title=title)
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def gauss_report(model: Any, fed: Federation, cfg: Any) -> dict[str, Any]:
    """k-means cost, accuracy/ARI/NMI (as for every clustering) plus the cluster count."""
    from ..clustering import clustering_report

    out = clustering_report(model, fed, cfg)
    out["n_clusters"] = int(model.n_clusters_)
    if fed.labels is not None:
        out["n_clusters_reference"] = int(len(np.unique(np.concatenate(fed.labels))))
    return out


# -- saved model (model.npz) and the classifier on a Federation --------------------------
_RESULT_ARRAYS = ("means", "scatters", "counts", "ages", "classes", "global_mean", "global_m2",
                  "class_count", "class_mean", "class_m2", "features")


def fit_classifier(model: Any, fed: Federation, transport: Any) -> None:
    """``fed.labels`` are the owners' class labels."""
    model.fit(fed.devices, fed.labels, transport=transport, device_ids=fed.device_ids)


def gauss_classifier_report(model: Any, fed: Federation, cfg: Any) -> dict[str, Any]:
    """Cluster count and accuracy on the owners' training rows (test figures: per site)."""
    out: dict[str, Any] = {"n_clusters": int(model.n_clusters_)}
    if fed.labels is not None:
        pred = np.concatenate([model.predict(X) for X in fed.devices])
        out["train_accuracy"] = float(np.mean(pred == np.concatenate(fed.labels)))
    return out


def gauss_export(model: Any, fed: Federation) -> Any:
    """``model.npz`` form: the global model (the server's result arrays) and the settings."""
    from ..core.registry import Exported
    from .protocol import SETTING_NAMES

    res = model._result
    arrays = {k: np.asarray(getattr(res, k)) for k in _RESULT_ARRAYS}
    meta: dict[str, Any] = {"estimator": type(model).__name__,
                            "settings": {k: getattr(model, k) for k in SETTING_NAMES},
                            "global_count": int(res.global_count)}
    if hasattr(model, "classes_"):
        arrays["classes_"] = np.asarray(model.classes_)
    return Exported("gauss", arrays, meta)


class GaussPredictor:
    """A saved evolving-Gaussian model: the clustering's or the classifier's ``predict``."""

    def __init__(self, estimator: Any, task: str):
        self.estimator = estimator
        self.task = task

    @classmethod
    def load(cls, arrays: Any, meta: Any) -> "GaussPredictor":
        from types import SimpleNamespace

        from .estimator import FedGaussClassifier, FedGaussClustering
        from .protocol import GaussResult

        supervised = meta["estimator"] == "FedGaussClassifier"
        est = (FedGaussClassifier if supervised else FedGaussClustering)(**meta["settings"])
        res = GaussResult(global_count=int(meta["global_count"]),
                          **{k: np.asarray(arrays[k]) for k in _RESULT_ARRAYS})
        out = SimpleNamespace(result=res, device_outputs={},
                              meter=SimpleNamespace(summary=lambda: {}))
        n_classes = len(arrays["classes_"]) if supervised else 0
        est._store(out, [], n_classes)
        if supervised:
            est.classes_ = np.asarray(arrays["classes_"])
        return cls(est, "classification" if supervised else "clustering")

    def predict(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        return np.asarray(self.estimator.predict(X))
