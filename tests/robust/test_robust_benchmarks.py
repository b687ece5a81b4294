"""Smoke test of the robust wing's benchmarks (--quick, synthetic data only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

# benchmark smoke runs (a subprocess each): behind the slow marker, run by make test-slow
pytestmark = pytest.mark.slow


def _run(name, tmp_path, *extra):
    proc = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), "--quick", "--no-plot",
                           "--out", str(tmp_path), *extra], capture_output=True, text=True,
                          timeout=900, cwd=BENCH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((tmp_path / f"{name}.json").read_text()), proc.stdout


def test_fig2a_quick(tmp_path):
    doc, out = _run("robust_fig2a", tmp_path)
    assert "plateaus near alpha" in out
    T = doc["params"]["iterations"]
    rows = {(r["alpha"], r["method"]): r for r in doc["rows"]}
    for (alpha, method), r in rows.items():
        assert len(r["mean"]) == T + 1 and all(0.0 <= v <= 1.0 for v in r["mean"])
        if method != "Lloyd (k-means)":
            assert r["final_mean"] < r["mean"][0]


def test_fig2b_quick(tmp_path):
    doc, _ = _run("robust_fig2b", tmp_path)
    assert doc["rows"]
    for row in doc["rows"]:
        assert {"KM+SM", "TKM+TM", "KGM+TM", "FA+TM", "gain_vs_KM+SM"} <= set(row)
        assert row["TKM+TM"]["error_mean"] > 0
        assert row["TKM+TM"]["error_mean"] <= row["KM+SM"]["error_mean"]


def test_logistic_quick_falls_back_to_digits(tmp_path):
    doc, out = _run("robust_logistic", tmp_path, "--data-dir", str(tmp_path))
    assert "falling back to scikit-learn's digits" in out
    assert doc["params"]["dataset"] == "digits"
    for row in doc["rows"]:
        assert {"KM+SM", "TKM+SM", "TKM+TM", "KGM+TM", "gain_vs_KM+SM"} <= set(row)
        assert 0.5 < row["TKM+TM"]["accuracy_mean"] <= 1.0
        assert row["TKM+TM"]["error_mean"] > 0


def test_attack_matrix_quick(tmp_path):
    doc, out = _run("attack_matrix", tmp_path)
    assert "k-FED" in out and "3-stage pipeline" in out
    rows = doc["rows"]
    assert {r["part"] for r in rows} == {"kfed", "clustering", "pipeline"}
    kfed = {r["attack"]: r for r in rows if r["part"] == "kfed"}
    assert "label-flip" not in kfed                       # no labels in k-FED
    for attack in ("large-norm", "scattered"):            # far lies: the paper's server collapses
        assert kfed[attack]["plain_mean"] < 0.9 <= 0.98 <= kfed[attack]["robust_mean"]
    pipe = {r["attack"]: r for r in rows if r["part"] == "pipeline"}
    assert pipe["coordinated"]["gain"] >= 0.53 and pipe["coordinated"]["miscl_max"] <= 0.02
    for attack in ("large-norm", "scale", "collude", "scattered", "coordinated"):
        # far liars left out: within a factor 2 of the run on the honest machines alone
        assert pipe[attack]["TKM+TM_mean"] <= 2 * pipe[attack]["bound (honest only)_mean"]
    assert {f["part"] for f in doc["failing"]} <= {"kfed", "pipeline"}
    assert doc["params"]["pipeline_shape"] == [120, 40, 12, 3]
