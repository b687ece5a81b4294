"""Registry hooks of the FL family: fit on a Federation, report, result fields, figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..core.registry import Federation

__all__ = ["fit_supervised", "fl_report", "fl_result_fields", "plot_history"]


def fit_supervised(model: Any, fed: Federation, transport: Any) -> None:
    """``fed.labels`` are the targets; per-device test sets fill the accuracy history."""
    model.fit(fed.devices, fed.labels, test_X=fed.test_devices, test_y=fed.test_labels,
              transport=transport)


def fl_report(model: Any, fed: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Test accuracy averaged over devices (each with the model serving it), train loss,
    and, where the source knows each device's group (rotations), how well clusters match it."""
    from .. import metrics

    out: dict[str, Any] = {"train_loss": model.history_[-1]["train_loss"] if model.history_
                           else None}
    acc = getattr(model, "device_test_accuracy_", None)
    if acc is not None:
        out["test_accuracy"] = float(np.mean(acc))
        out["test_accuracy_std"] = float(np.std(acc))
    groups = fed.extra.get("rotations")
    clusters = getattr(model, "device_clusters_", None)
    if groups is not None and clusters is not None and all(len(g) == 1 for g in groups):
        got = [(g[0], c) for g, c in zip(groups, clusters) if c >= 0]
        if got and type(model).__name__ != "FedAvg":
            t, p = zip(*got)
            out["cluster_accuracy"] = metrics.matched_accuracy(np.array(t), np.array(p))
    return out


def fl_result_fields(model: Any) -> dict[str, Any]:
    return {"history": model.history_,
            "device_clusters": [int(c) for c in model.device_clusters_]}


def plot_history(model: Any, fed: Federation, result: dict[str, Any], path: Path) -> Path | None:
    """Test accuracy (or train loss) per round."""
    from ..plotting import have_matplotlib

    if not have_matplotlib() or not model.history_:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "test_accuracy" if "test_accuracy" in model.history_[0] else "train_loss"
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([h["round"] for h in model.history_], [h[key] for h in model.history_], marker=".")
    ax.set_xlabel("round")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(result.get("title") or type(model).__name__, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
