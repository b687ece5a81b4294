"""Smoke test of the FL benchmarks' --quick paths (scikit-learn digits, no data folder)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest


BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# benchmark smoke runs (a subprocess each): behind the slow marker, run by make test-slow
pytestmark = pytest.mark.slow


def _run(name, tmp_path):
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--no-plot", "--out",
           str(tmp_path), "--data-dir", str(tmp_path / "no-data")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "using scikit-learn digits" in proc.stdout
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["benchmark"] == name and doc["quick"] is True
    return doc


def test_table2_quick(tmp_path):
    doc = _run("fl_table2", tmp_path)
    assert doc["speed"]["mlp_epoch_250_ms"] > 0
    for row in doc["rows"]:
        m = row["methods"]
        assert {"global", "ifca", "kfed"} <= set(m)
        # IFCA downloads k = 4 models per device and round, k-FED + FedAvg one per local
        # cluster (k' = 2: two, plus the final models for the device's gate)
        assert m["ifca"]["bytes_down"] > (3.5 if row["k_local"] == 1 else 1.5) * m["kfed"]["bytes_down"]
        if row["k_local"] > 1:
            assert "kfed_paper" in m
            assert set(m["kfed"]["routing_accuracy"]) == {"centers", "confidence", "gate",
                                                          "soft-gate"}
        assert all(0.0 <= v["test_accuracy"] <= 100.0 for v in m.values())
    assert doc["rows"][0]["methods"]["kfed"]["cluster_accuracy"] == 1.0


def test_fig4_quick(tmp_path):
    doc = _run("fl_fig4_selection", tmp_path)
    assert set(doc["summary"]) == {"random", "pow-d", "kfed-pow-d"}
    for runs in doc["runs"].values():
        assert all(len(r["curve"]) == doc["params"]["rounds"] for r in runs)
    assert all(r["setup_bytes_up"] > 0 for r in doc["runs"]["kfed-pow-d"])
    assert doc["params"]["kfed_server"] == "kmeans++"
    for runs in doc["runs"].values():  # the last-rounds summary: per-device scores of snapshots
        assert all(0.0 <= r["tail_accuracy"] <= 1.0 and r["tail_variance"] >= 0.0 for r in runs)
    assert doc["summary"]["random"]["tail_variance_change_vs_random"] == 0.0
