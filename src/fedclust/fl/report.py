"""Registry hooks of the FL family: fit on a Federation, report, result fields, figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..core.registry import Federation

__all__ = ["fit_supervised", "fl_report", "fl_result_fields", "plot_history", "fl_rounds_note",
           "FLPredictor", "fl_export"]


def fit_supervised(model: Any, fed: Federation, transport: Any) -> None:
    """``fed.labels`` are the targets; per-device test sets fill the accuracy history."""
    model.fit(fed.devices, fed.labels, test_X=fed.test_devices, test_y=fed.test_labels,
              transport=transport, device_ids=fed.device_ids)


def fl_report(model: Any, fed: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Test accuracy pooled over every test row (each device's rows scored by the model
    serving it) and its mean over devices, train loss, and, where the source knows each
    device's group (rotations), how well clusters match it."""
    from .. import metrics

    out: dict[str, Any] = {"train_loss": model.history_[-1]["train_loss"] if model.history_
                           else None}
    acc = getattr(model, "device_test_accuracy_", None)
    if acc is not None:
        out.update(metrics.summarize_test_accuracy(acc, [len(y) for y in fed.test_labels]))
    groups = fed.extra.get("rotations")
    clusters = getattr(model, "device_clusters_", None)
    if groups is not None and clusters is not None and all(len(g) == 1 for g in groups):
        got = [(g[0], c) for g, c in zip(groups, clusters) if c >= 0]
        if got and type(model).__name__ != "FedAvg":
            t, p = zip(*got)
            out["cluster_accuracy"] = metrics.matched_accuracy(np.array(t), np.array(p))
    return out


def _setup_phases(model: Any) -> list[str]:
    """What the protocol exchanges before the first training round (see ``_setup_requests``)."""
    if type(model).__name__ == "ClusteredFedAvg":
        hidden = ["feature map"] if getattr(model, "feature_map", None) == "hidden" else []
        return hidden + ["k-FED"]
    selection = getattr(model, "selection", "random")
    return {"kfed-pow-d": ["k-FED"], "pow-d": ["size probe"]}.get(selection, [])


def fl_rounds_note(model: Any, communication: Mapping[str, Any]) -> str | None:
    """Why the table's transport rounds differ from the training rounds set, e.g.
    ``1 k-FED round + 15 training rounds x 4 clusters = 61 transport rounds``.

    A training round of a clustered model is one exchange per cluster (each
    cluster's devices get their cluster's model); power-of-choice adds a loss
    probe before each round's training.
    """
    total = int(communication.get("rounds", 0))
    trained = int(communication.get("fl_rounds", 0))
    if not trained or total == trained:
        return None
    setup = _setup_phases(model)
    per, rest = divmod(total - len(setup), trained)
    head = " + ".join(f"1 {name} round" for name in setup)
    head = f"{head} + " if head else ""
    if rest or per < 1:
        return (f"{total} transport rounds: {head}{trained} training rounds whose exchanges "
                "vary (clusters with no selected device are skipped)")
    unit = "exchanges (loss probe, training)" if getattr(model, "selection", "") in (
        "pow-d", "kfed-pow-d") and per == 2 else (
        "clusters" if per == getattr(model, "n_clusters", None) else "exchanges")
    return f"{head}{trained} training rounds × {per} {unit} = {total} transport rounds"


def fl_result_fields(model: Any) -> dict[str, Any]:
    return {"history": model.history_,
            "device_clusters": [int(c) for c in model.device_clusters_]}


def plot_history(model: Any, fed: Federation, result: dict[str, Any], path: Path) -> Path | None:
    """Test accuracy (or train loss) per round."""
    from ..plotting import have_matplotlib, save_figure, wrap_title

    if not have_matplotlib() or not model.history_:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "test_accuracy" if "test_accuracy" in model.history_[0] else "train_loss"
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([h["round"] for h in model.history_], [np.nan if h[key] is None else h[key] for h in model.history_], marker=".")
    ax.set_xlabel("round")
    # the curve is the per-round mean over devices, not the run's pooled headline
    ax.set_ylabel("test accuracy (mean over devices)" if key == "test_accuracy" else
                  key.replace("_", " "))
    ax.set_title(wrap_title(result.get("title") or type(model).__name__, 4.5, 9), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
    return path


# -- saved model (model.npz) -------------------------------------------------------------
class FLPredictor:
    """A saved FL model: the cluster models, and which one serves each training site.

    A training site uses its own cluster's model (as in training); a new site
    takes, per row, the prediction of the most confident model (IFCA's routing;
    the one model of FedAvg).
    """

    def __init__(self, models: np.ndarray, site_models: np.ndarray, meta: Mapping[str, Any]):
        from .models import build_model

        self.models = np.asarray(models, np.float64)
        self.site_models = np.asarray(site_models, np.int64)
        self._m = build_model(meta["model"], int(meta["n_features"]),
                              max(int(meta["n_classes"]), 2), n_hidden=int(meta["n_hidden"]),
                              l2=float(meta["l2"]))
        self.task = "classification" if self._m.classifier else "regression"

    @classmethod
    def load(cls, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> "FLPredictor":
        return cls(arrays["models"], arrays["site_models"], meta)

    def predict(self, X: np.ndarray, site: int | None = None) -> np.ndarray:
        X = np.asarray(X, np.float64)
        c = int(self.site_models[site]) if site is not None and site < len(self.site_models) \
            else -1
        if c >= 0 or len(self.models) == 1 or not self._m.classifier:
            self._m.set_params(self.models[max(c, 0)])
            return self._m.predict(X)
        best = np.full(len(X), -np.inf)
        pred = np.zeros(len(X), dtype=np.int64)
        for theta in self.models:
            self._m.set_params(theta)
            S = self._m.decision_function(X)
            if S.ndim == 1:
                S = np.stack([np.zeros_like(S), S], axis=1)
            P = np.exp(S - S.max(axis=1, keepdims=True))
            conf = (P / P.sum(axis=1, keepdims=True)).max(axis=1)
            better = conf > best
            best[better] = conf[better]
            pred[better] = S.argmax(axis=1)[better]
        return pred


def fl_export(model: Any, fed: Federation) -> Any:
    """``model.npz`` form of FedAvg / IFCA / k-FED + FedAvg: parameters of every cluster model."""
    from ..core.registry import Exported

    p = model._protocol_
    n_models = len(model.models_)
    sites = [c if 0 <= c < n_models else -1 for c in model.device_clusters_]
    if n_models == 1:
        sites = [0] * len(sites)
    meta = {"model": p.model, "n_features": int(p.n_features), "n_classes": int(p.n_classes),
            "n_hidden": int(p.n_hidden), "l2": float(p.l2)}
    return Exported("fl-models", {"models": np.asarray(model.models_, np.float64),
                                  "site_models": np.asarray(sites, np.int64)}, meta)
