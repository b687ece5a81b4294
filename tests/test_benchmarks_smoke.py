"""Smoke test: every benchmark's ``--quick`` path runs and writes sane JSON.

Each script runs in a subprocess (the interpreter running the tests) into
``tmp_path``; the real-data benchmarks use scikit-learn's bundled ``digits``
so nothing under ``../shared`` is needed. No timing thresholds here: only
that the JSON exists, has the expected keys and plausible values.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

# benchmark smoke runs (a subprocess each): behind the slow marker, run by make test-slow
pytestmark = pytest.mark.slow


def _check_table1(doc):
    assert len(doc["rows"]) == 5
    for row in doc["rows"]:
        assert {"d", "k", "accuracy_mean", "accuracy_std", "paper_accuracy", "passed"} <= set(row)
        assert 0.9 <= row["accuracy_mean"] <= 1.0
        assert all(0.0 <= a <= 1.0 for a in row["accuracy"])


def _check_fig1(doc):
    seps = {r["separation"] for r in doc["rows"]}
    assert {1, 100} <= seps
    for row in doc["rows"]:
        assert 0.0 <= row["accuracy_mean"] <= 1.0
        assert 0.0 <= row["centralized_mean"] <= 1.0
    top = max(doc["rows"], key=lambda r: r["separation"])
    assert top["accuracy_mean"] >= 0.9


def _check_fig2(doc):
    assert doc["params"]["dataset"] == "digits"
    assert doc["oracle"]["phi_star"] > 0
    assert doc["rows"]
    for row in doc["rows"]:
        for key in ("structured_mean", "iid_mean"):
            assert math.isfinite(row[key]) and row[key] > 0.5
    kmin = min(doc["rows"], key=lambda r: r["k_local"])
    assert kmin["structured_mean"] <= kmin["iid_mean"]


def _check_fig3(doc):
    assert len(doc["federations"]) >= 2
    for fed in doc["federations"]:
        m = fed["methods"]
        assert {"kfed", "distributed_lloyd", "centralized"} <= set(m)
        assert m["kfed"]["rounds"] == 1
        assert m["distributed_lloyd"]["rounds"] > 1
        assert m["kfed"]["bytes_up"] < m["distributed_lloyd"]["bytes_up"]
        for v in m.values():
            assert v["cost"] > 0 and 0.0 <= v["accuracy"] <= 1.0


def _check_kfed_sampled_server(doc):
    assert len(doc["rows"]) == 2
    for row in doc["rows"]:
        assert row["device_centers"] > 2 * row["coreset_expected"]   # the coreset path ran
        assert 0 < row["all_cost"] <= 1.05 and row["coreset_over_all"] <= 1.01


def _check_speed(doc):
    assert len(doc["rows"]) == 3
    for row in doc["rows"]:
        t = row["time_s"]
        assert {"kfed_fit", "sklearn", "authors", "kfed_server_farthest-lloyd1"} <= set(t)
        assert all(v["min"] > 0 for v in t.values())
        assert 0.0 < row["quality"]["kfed_cost_ratio"] < 10.0
        assert 0.0 <= row["quality"]["kfed_accuracy"] <= 1.0
        # the default server's run: a cost no worse than the paper server's on separated data,
        # and a summary of at most 8 KiB per device unless 2k centers take more
        q = row["quality"]
        assert q["kfed_default_cost_ratio"] <= q["kfed_cost_ratio"] * 1.05
        assert q["kfed_default_bytes_up_per_device"] <= max(8192, 2 * row["k"] * (row["d"] + 2) * 8)
        assert row["ratios"]["kfed_default_over_sklearn_1thread_cpu"] > 0
    curve = doc["streamed_curve"]
    assert [c["n_devices"] for c in curve] == [1000, 10000]
    for c in curve:
        assert c["fit_s"] > 0 and c["cost_over_generating_means"] <= 1.05
    # kept: the device centers (2 per device, d = 20, float64), nothing per row
    assert curve[1]["centers_mib"] * 2**20 == 10000 * 2 * 20 * 8


def _check_kfed_byzantine(doc):
    rows = doc["rows"]
    assert {r["attack"] for r in rows} >= {"large-norm", "collude"}
    for r in rows:
        assert 0.0 <= r["plain_mean"] <= 1.0 and 0.0 <= r["robust_mean"] <= 1.0
    # where the paper's server collapses under large-norm lies, the robust one does not
    worst = [r for r in rows if r["attack"] == "large-norm" and r["alpha"] == 0.2][0]
    assert worst["plain_mean"] < 0.9 and worst["robust_mean"] >= 0.98


def _check_secagg(doc):
    rows = doc["rows"]
    assert {(r["workload"], r["n_devices"]) for r in rows} == {
        ("lloyd", 10), ("lloyd", 100), ("fedavg", 10), ("fedavg", 100), ("dp-lloyd", 10),
        ("lloyd-signed", 10)}
    for r in rows:
        assert r["max_abs_error"] <= r["n_devices"] * 2.0 ** -21
        assert r["secure_up_bytes"] > r["plain_up_bytes"]
        assert r["exchanges_secure"] == (5 if r["workload"] == "lloyd-signed" else 4)
        assert r["device_time_s"] > 0 and r["server_time_s"] > 0
    for r in rows:  # the baseline commit's code in the same run (absent without git history)
        if "baseline" in r:
            o = r["baseline"]
            assert o["workload"] == r["workload"] and o["n_devices"] == r["n_devices"]
            # the same wire format up; the share request no longer carries a threshold
            assert r["secure_up_bytes"] == o["secure_up_bytes"]
            assert r["secure_down_bytes"] == o["secure_down_bytes"] - 8  # one int64 per device
    dp = [r for r in rows if r["workload"] == "dp-lloyd"][0]
    # 200 noisy sums: their std within ~20 % of sigma sqrt(n / n_min), never below sigma's reach
    assert 0.8 < dp["sum_noise_std"] / dp["expected_std"] < 1.2
    (pre,) = doc["preprocess"]
    assert pre["rounds_plain"] == 1 and pre["rounds_secure"] == 2 and pre["exchanges_secure"] == 8
    assert pre["secure_up_bytes"] > pre["plain_up_bytes"] and pre["scale_rel_error"] < 1e-6


def _check_real_federations(doc):
    # without the data folder only scikit-learn's bundled diabetes federation runs
    rows = {(r["federation"], r["method"]) for r in doc["rows"]}
    assert ("diabetes-sex", "kfed default") in rows and ("diabetes-sex", "kfed paper") in rows
    for r in doc["rows"]:
        if r["method"].startswith("kfed") or r["method"] == "distributed lloyd":
            assert 0.99 <= r["cost_ratio"] <= r["worst_cost_ratio"] < 2.0
        assert r["bytes_up_per_site"] > 0 and r["runs"] == 2


def _check_kfed_summary_basins(doc):
    # without the data folder only scikit-learn's bundled diabetes federation runs
    rows = {r["rule"]: r for r in doc["rows"] if r["federation"] == "diabetes-sex"}
    assert set(rows) == {"default", "2k", "hidden<=1/4 32KiB", "own-gap<=1%", "finest"}
    for r in rows.values():
        assert 0.99 <= r["cost_ratio"] <= r["worst_cost_ratio"] < 1.5 and r["runs"] == 3
        assert 0.0 < r["hidden_over_pooled"] < 1.0 and 0.0 <= r["straddle"] < 1.0
    # a finer summary hides less of the pooled cost and sends more bytes
    assert rows["finest"]["hidden_over_pooled"] < rows["2k"]["hidden_over_pooled"]
    assert rows["finest"]["bytes_up_per_site"] > rows["2k"]["bytes_up_per_site"]
    assert rows["2k"]["bytes_up_per_site"] == 6 * (10 + 2) * 8   # 2k centers of d = 10
    assert rows["default"]["bytes_up_per_site"] <= 8192


def _check_kfed_warning(doc):
    # without the data folder: scikit-learn's diabetes federation and the generated ones
    rows = doc["rows"]
    assert {r["data"] for r in rows if r["family"] == "natural"} == {"diabetes-sex", "diabetes-age"}
    assert {3, 6, 24, "auto"} <= {r["k_local"] for r in rows}   # k, 2k, 8k, auto at k = 3
    for r in rows:
        assert r["cost"] >= 0.99 and r["flag"] in ("", "merged", "unsettled", "too few")
        if r["server"] == "weighted-kmeans++" and r["cost"] <= doc["good"]:
            assert not r["flag"]   # the default server's good answers: no false alarm
    poor = [r for r in rows if r["cost"] >= doc["poor"]]
    assert poor and sum(bool(r["flag"]) for r in poor) >= 0.8 * len(poor)


def _check_unlearning(doc):
    assert {r["case"] for r in doc["rows"]} == {"kfed", "kfed-paper", "gauss", "gauss-tree"}
    for row in doc["rows"]:
        assert row["exact_device"] and row["exact_rows"] and row["exact_labels"]
        assert row["forget_s"] > 0 and row["retrain_s"] > 0 and row["local_step_s"] > 0
        assert row["kept_summary_bytes"] > 0
        assert {z for _, z in row["recomputed_rows"]} == {row["devices"] // 3}
        # the default k-FED server follows its keyed trace (bit for bit), the paper's
        # server forgets an unpicked device by a downdate, the Gaussians run the server
        # step again
        assert set(row["forget_paths"]) == {"kfed": {"trace"}, "kfed-paper": {"downdate"}}.get(
            row["case"], {"replay"})
        assert row["max_center_diff"] <= 1e-12 * 1e3
        if row["case"] == "gauss-tree":   # one owner's path of the trie, not every node
            assert all(w[-1] == "root" and len(w) < row["server_nodes"]
                       for w in row["server_work"])


CASES = {
    "table1": ([], _check_table1),
    "fig1_separation": ([], _check_fig1),
    "fig2_heterogeneity": (["--dataset", "digits"], _check_fig2),
    "fig3_rounds": (["--dataset", "digits"], _check_fig3),
    "speed": (["--repeats", "1", "--curve-max", "1e4"], _check_speed),
    "kfed_byzantine": ([], _check_kfed_byzantine),
    "secagg": (["--repeats", "1"], _check_secagg),
    "real_federations": ([], _check_real_federations),
    "kfed_summary_basins": ([], _check_kfed_summary_basins),
    "kfed_warning": ([], _check_kfed_warning),
    "unlearning": ([], _check_unlearning),
    "kfed_sampled_server": ([], _check_kfed_sampled_server),
}


@pytest.mark.parametrize("name", list(CASES))
def test_benchmark_quick(name, tmp_path):
    extra, check = CASES[name]
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--out", str(tmp_path),
           "--data-dir", str(tmp_path / "no-data"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / f"{name}.json").read_text())
    assert doc["benchmark"] == name and doc["quick"] is True
    assert {"numpy", "sklearn", "cpu_count"} <= set(doc["machine"])
    check(doc)
