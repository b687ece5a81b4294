"""One definition of a run's test accuracy: pooled over every test row (the headline of
every family, in result.json and the CLI table), the mean over devices labelled as such."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.cli import format_table
from fedclust.config import check_config
from fedclust.core.registry import Federation
from fedclust.experiment import run_experiment
from fedclust.metrics import summarize_test_accuracy


def test_test_accuracies_by_hand():
    # a device without test rows is left out
    got = summarize_test_accuracy([1.0, 0.5, 0.0], [10, 2, 0])
    assert got["test_accuracy"] == pytest.approx(11 / 12)
    assert got["test_accuracy_device_mean"] == pytest.approx(0.75)
    assert got["test_accuracy_std"] == pytest.approx(0.25)


def _uneven_federation(seed=0):
    """Two-class devices whose test sets differ in size by a factor of 20, so that the
    pooled accuracy and the mean over devices differ."""
    rng = np.random.default_rng(seed)

    def draw(n, shift):
        y = rng.integers(0, 2, n)
        X = rng.normal(size=(n, 3)) + (2 * y[:, None] - 1) * shift
        return X, y

    sizes = [(60, 200, 0.3), (60, 10, 3.0), (60, 10, 3.0)]
    train = [draw(n, s) for n, _, s in sizes]
    test = [draw(t, s) for _, t, s in sizes]
    return Federation([X for X, _ in train], [y for _, y in train], "uneven test sets",
                      test_devices=[X for X, _ in test], test_labels=[y for _, y in test])


@pytest.mark.parametrize("name", ["fedavg", "ifca"])
def test_fl_headline_is_pooled_over_test_rows_and_the_mean_is_labelled(name):
    fed = _uneven_federation()
    extra = {"n_clusters": 2} if name == "ifca" else {}
    cfg = check_config({"seed": 1, "data": {"source": "gaussians"},
                        "algorithm": {"name": name, "rounds": 3, "model": "logistic",
                                      "classes": 2, **extra}})
    exp = run_experiment(cfg, federation=fed)
    m = exp.result["metrics"]
    # independent: each device's rows scored by the model that serves it
    hits = [np.sum(exp.model.predict_device(i, X) == y)
            for i, (X, y) in enumerate(zip(fed.test_devices, fed.test_labels))]
    sizes = [len(y) for y in fed.test_labels]
    assert m["test_accuracy"] == pytest.approx(sum(hits) / sum(sizes))
    per_device = [h / n for h, n in zip(hits, sizes)]
    assert m["test_accuracy_device_mean"] == pytest.approx(np.mean(per_device))
    assert abs(m["test_accuracy"] - m["test_accuracy_device_mean"]) > 0.02  # they differ here
    table = format_table(exp.result)
    head, _, row = table.splitlines()[:3]
    assert "test accuracy" in head and "mean over devices" in head
    assert f"{100 * m['test_accuracy']:.2f}%" in row
    assert f"{100 * m['test_accuracy_device_mean']:.2f}%" in row


def test_the_fl_history_figure_labels_its_curve_as_the_mean_over_devices(tmp_path):
    pytest.importorskip("matplotlib")
    from unittest import mock

    import matplotlib.axes

    from fedclust.fl.report import plot_history

    fed = _uneven_federation()
    cfg = check_config({"seed": 1, "data": {"source": "gaussians"},
                        "algorithm": {"name": "fedavg", "rounds": 2, "model": "logistic",
                                      "classes": 2}})
    exp = run_experiment(cfg, federation=fed)
    # the plotted curve is the per-round mean over devices, a different figure than the
    # pooled headline: its axis says so
    per_round = [h["test_accuracy"] for h in exp.model.history_]
    assert per_round[-1] == pytest.approx(exp.result["metrics"]["test_accuracy_device_mean"])
    with mock.patch.object(matplotlib.axes.Axes, "set_ylabel", autospec=True) as ylabel:
        assert plot_history(exp.model, fed, exp.result, tmp_path / "h.png") is not None
    assert ylabel.call_args.args[1] == "test accuracy (mean over devices)"
