"""Smoke test of the coreset benchmarks' ``--quick`` runs (no real data needed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# benchmark smoke runs (a subprocess each): behind the slow marker, run by make test-slow
pytestmark = pytest.mark.slow


def _run(name, tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick", "--no-plot",
                           "--out", str(tmp_path), "--data-dir", str(tmp_path / "no-data")],
                          capture_output=True, text=True, timeout=900,
                          cwd=BENCH)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / f"{name}.json").read_text()), proc.stdout


def test_cost_vs_comm_quick(tmp_path):
    doc, out = _run("coreset_cost_vs_comm", tmp_path)
    assert doc["quick"] and "Distributed coreset vs COMBINE" in out
    rows = doc["rows"]
    assert {r["dataset"] for r in rows} == {"digits", "low-rank"}
    for r in rows:
        assert math.isfinite(r["cost_ratio"]) and 0.95 < r["cost_ratio"] < 2.0
        assert r["words"] * 8 == r["bytes"] > 0
    # fewer dimensions -> fewer bytes, at the same coreset size and method
    sel = {r["n_components"]: r["bytes"] for r in rows
           if r["dataset"] == "low-rank" and r["method"] == "coreset" and r["coreset_size"] == 300}
    assert sel[5] < sel[20] < sel["none"]


def test_speed_quick(tmp_path):
    doc, out = _run("coreset_speed", tmp_path)
    assert "check: time <= 0.5x sklearn" in out
    names = [r["method"] for r in doc["rows"]]
    assert names[0].startswith("sklearn") and "DistributedKMeans" in names[1]
    assert doc["target"]["cost_ratio"] < 1.1
    coreset, lloyd = doc["rows"][1], doc["rows"][2]
    assert coreset["rounds"] == 4 and lloyd["rounds"] > 4
