"""Smoke runs of the gauss benchmarks in --quick mode (no real data needed)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# benchmark smoke runs (a subprocess each): behind the slow marker, run by make test-slow
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["gauss_clustering", "gauss_classification"])
def test_quick_benchmark_runs_and_writes_json(name, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{name}.py"), "--quick", "--no-plot",
         "--out", str(tmp_path), "--data-dir", str(tmp_path / "no-data")],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["quick"] is True
    if name == "gauss_classification":
        assert "Table 1" in proc.stdout and "iris" in doc["table1"]
        assert 80 < doc["table1"]["iris"]["fedgauss"]["acc"][0] <= 100
    else:
        assert "synthetic" in proc.stdout and doc["stream"]["ms_per_sample_cpu"]


def test_em_benchmark_quick_runs_without_data(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gauss_em.py"), "--quick", "--no-plot",
         "--out", str(tmp_path), "--data-dir", str(tmp_path / "no-data")],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((tmp_path / "gauss_em.json").read_text())
    rows = {r["set"]: r for r in doc["s2_s4"]}
    assert set(rows) == {"blobs_15_3_4", "gen_15_3_3"}
    for r in rows.values():
        assert len(r["ari"]) == len(r["ari_em"]) == 2
        assert all(0.9 < a <= 1.0 for a in r["ari"] + r["ari_em"])
        assert all(1 <= n <= 30 for n in r["em_rounds"])
