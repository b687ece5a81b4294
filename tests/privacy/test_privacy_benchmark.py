"""Smoke test of ``benchmarks/privacy.py --quick`` (subprocess; generated data and digits)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.slow
def test_privacy_benchmark_quick(tmp_path):
    cmd = [sys.executable, str(BENCH / "privacy.py"), "--quick", "--out", str(tmp_path),
           "--data-dir", str(tmp_path / "no-data")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "privacy.json").read_text())
    assert doc["benchmark"] == "privacy" and doc["quick"] is True
    rows = doc["rows"]
    assert {r["method"] for r in rows} == {"dp-lloyd", "dp-kfed"}
    for r in rows:
        assert all(math.isfinite(c) and c >= 0.99 for c in r["cost_ratio"])
        eps = float(r["epsilon"])
        assert all(s <= eps for s in r["epsilon_spent"])
    inf = [r for r in rows if r["method"] == "dp-lloyd" and r["epsilon"] == "inf"]
    assert inf and max(inf[0]["cost_ratio"]) < 1.01
    accs = {(r["method"], r["epsilon"]): r["accuracy"][0] for r in doc["supervised"]}
    assert all(0.0 <= a <= 1.0 for a in accs.values())
    assert accs[("gauss-classifier", "inf")] > 0.8 and accs[("dp-fedavg", "inf")] > 0.8
    small = doc["small_federations"]        # no data folder: iris (scikit-learn's) only
    assert {r["setting"] for r in small} == {"iris"}
    assert {r["epsilon"] for r in small} == {0.1, 0.5, 1.0, 2.0}
    for r in small:
        assert all(math.isfinite(c) and c >= 0.99 for c in r["cost_ratio"])
        assert all(s <= r["epsilon"] for s in r["epsilon_spent"])
        assert r["delta"] == pytest.approx(1 / (150 * math.log(150)))
    gauss = doc["gauss_clustering"]
    assert {r["method"] for r in gauss} == {"gauss", "dp-gauss", "dp-lloyd (true k)"}
    for r in gauss:
        assert all(-1.0 <= a <= 1.0 for a in r["ari"])
        if r["epsilon"] is not None:
            assert all(s <= float(r["epsilon"]) for s in r["epsilon_spent"])
    best = {r["method"]: max(r["ari"]) for r in gauss if r["epsilon"] in ("inf", None)}
    assert best["dp-gauss"] > 0.9 and best["gauss"] > 0.9
