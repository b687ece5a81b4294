"""Secure aggregation's cost against plaintext sums: federated Lloyd and FedAvg rounds.

One summed round at 10, 100 and 1,000 devices (``--quick``: 10 and 100), measured on the four stages of :mod:`fedclust.core.secure_sum`
run in this process (every device's step timed on its own, the server's apart):

* ``lloyd``: a federated Lloyd round's reply, per-cluster sums (k=10, d=20),
  counts and cost: 211 numbers (1,688 B in plaintext);
* ``fedavg``: a FedAvg update in its summable form
  (:class:`fedclust.fl.messages.SummedUpdate`) for a 784x10 softmax model:
  7,854 numbers (62,832 B in plaintext);
* ``dp-lloyd``: a DP Lloyd round with distributed noise
  (:class:`fedclust.lloyd.messages.NoisyClusterSums`, k=10, d=20, ε=1,
  δ=1e-6, data_bound 30, 3 rounds): each device adds ``σ/√n_min`` of the
  noise; the table adds the std of the noise in the unmasked sum against
  ``σ √(n / n_min)`` (every device stayed) — at least ``σ`` with any allowed
  dropout (:mod:`fedclust.privacy.distributed`);
* ``lloyd-signed``: the ``lloyd`` reply under the malicious-server variant
  (``SecureAggregation(signed=True)``: Ed25519-signed keys, a fifth exchange
  in which every survivor signs the survivor set).

A second table runs :class:`fedclust.FederatedPreprocessor` end to end (d=20,
60 rows per site, 10% missing) plain (one round) and with secure aggregation
(two summed rounds of four exchanges each; ``--quick``: 10 sites, else also
100): bytes per site, wall time of the whole fit in this process, and the
largest difference of the scale from scikit-learn's pooled
``SimpleImputer + StandardScaler``.

Groups: every other device (SecAgg) up to 100 devices; at 1,000 devices each
device masks with and shares to ``neighbors`` peers on a random circulant graph
(SecAgg+, Bell et al. 2020), 3 log2(n) ≈ 30. Columns: bytes up / down per
device (mean over devices, all four stages; plaintext: the reply up),
device time (mean per device, all stages), server time (all stages, including
unmasking), exchanges (plaintext 1, secure 4), and the largest error of the
unmasked sum against the float64 sum (bound ``n 2**-21``).

A third table runs the same rounds (same seeds, same process tree, same
machine) on the secure-sum code of another commit (``--baseline-commit``,
default ``95c14ef``: the code without the device-side state machine, the
device's own threshold and the checked reconstruction), extracted with ``git
archive`` and run in a subprocess, alternating with this code; it gives bytes
and times of both and their ratios (``--no-baseline`` skips it, as does a
checkout without git history).

Beside them: Flower's legacy SecAgg+ workflow settings (``SecAggPlusWorkflow``,
flwr 1.42 defaults and its example app) and what the FastLloyd paper reports.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from fedclust.core.secure_sum import (SecureAggregation, SecureSumServer,  # noqa: E402
                                      make_identities)
from fedclust.core.secure_sum_device import secure_sum_client  # noqa: E402

WORKLOADS = {
    "lloyd": lambda rng: {"sums": rng.normal(scale=30.0, size=(10, 20)),
                          "counts": rng.integers(0, 500, size=10).astype(np.int64),
                          "cost": np.asarray(rng.uniform(0, 1e4))},
    # fedclust.fl.messages.SummedUpdate of a 784x10 softmax model, 120 samples
    "fedavg": lambda rng: {"weighted_params": rng.normal(scale=0.1, size=7850) * 120.0,
                           "weight": np.asarray(120.0), "loss_sum": np.asarray(120 * 2.3),
                           "n_samples": np.asarray(120, dtype=np.int64),
                           "n_devices": np.asarray(1, dtype=np.int64)},
}


def _dp_sigma() -> float:
    """σ of a middle round of a DP Lloyd fit (k=10, d=20, ε=1, δ=1e-6, B=30, 3 rounds)."""
    from fedclust.lloyd.protocol import DistributedLloydProtocol
    from fedclust.privacy import DifferentialPrivacy

    dp = DifferentialPrivacy(epsilon=1.0, delta=1e-6, data_bound=30.0)
    return DistributedLloydProtocol(10, init="candidates", max_rounds=3, n_features=20,
                                    privacy=dp).plan.releases[2].noise_std


def _dp_lloyd(n: int, sigma: float, rng) -> tuple[dict, dict]:
    """Per device: (noisy reply, noiseless reply) of a distributed-noise Lloyd round."""
    from fedclust.privacy.distributed import min_noise_devices

    std = sigma / math.sqrt(min_noise_devices(n))
    clean = {"sums": rng.normal(scale=30.0, size=(10, 20)),
             "counts": rng.integers(0, 500, size=10).astype(np.float64),
             "cost": np.asarray(0.0), "n_devices": np.asarray(1, dtype=np.int64)}
    noisy = {**clean, "sums": clean["sums"] + rng.normal(0.0, std, (10, 20)),
             "counts": clean["counts"] + rng.normal(0.0, std * math.sqrt(20) / 30.0, 10)}
    return noisy, clean

REFERENCE = [
    ["Flower SecAggPlusWorkflow (legacy API)", "modulus 2^32: 4 B per masked entry",
     "values clipped to +-8, quantized to 2^22 levels (step 3.8e-6)",
     "num_shares / reconstruction_threshold: user-set (example app: 3 / 2)",
     "masks: numpy MT19937 seeded with 32 bits folded from the agreed key"],
    ["fedclust secure sums", "modulus 2^64: 8 B per masked entry",
     "no clipping; step 2^-20 (9.5e-7), |value| < 2^43 / n",
     "group: all (SecAgg) or neighbors=k (SecAgg+); t = g - floor(g/3)",
     "masks: ChaCha20 keyed by X25519 + HKDF-SHA256 (256-bit)"],
    ["FastLloyd (Diaa, Humphries & Kerschbaum, USENIX Security 2025)",
     "secure-aggregation-based federated Lloyd with computational DP",
     "reports five orders of magnitude speed-up over prior secure federated k-means",
     "per-setting overhead tables: see the paper",
     "-"],
]


def _nb(arrays) -> int:
    return sum(np.asarray(a).nbytes for a in arrays.values())


def one_round(workload: str, n: int, neighbors: int | None, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    clean = None
    if workload == "dp-lloyd":
        from fedclust.privacy.distributed import min_noise_devices

        sigma = _dp_sigma()
        pairs = [_dp_lloyd(n, sigma, rng) for _ in range(n)]
        values = {z: pairs[z][0] for z in range(n)}
        clean = sum(pairs[z][1]["sums"] for z in range(n))
    else:
        values = {z: WORKLOADS[workload.replace("-signed", "")](rng) for z in range(n)}
    signed = workload.endswith("-signed")
    settings = SecureAggregation(neighbors=neighbors, signed=signed)
    identities = make_identities(range(n)) if signed else {}
    t_server = 0.0
    t0 = time.perf_counter()
    srv = SecureSumServer(range(n), 1, settings, seed)
    t_server += time.perf_counter() - t0
    states = {z: {} for z in range(n)}
    up = np.zeros(n)
    down = np.zeros(n)
    t_dev = np.zeros(n)
    for stage in srv.stages:
        t0 = time.perf_counter()
        inbound = srv.requests(stage)
        t_server += time.perf_counter() - t0
        replies = {}
        for z, msg in inbound.items():
            down[z] += _nb(msg)
            t0 = time.perf_counter()
            rep = secure_sum_client(stage, msg, states[z], device_id=z,
                                    reply=values[z] if stage == "mask" else None,
                                    identity=identities.get(z))
            t_dev[z] += time.perf_counter() - t0
            up[z] += _nb(rep)
            replies[z] = rep
        t0 = time.perf_counter()
        srv.take(stage, replies)
        t_server += time.perf_counter() - t0
    got = srv.result()
    err = 0.0
    for f in got:
        ref = sum(np.asarray(values[z][f], dtype=np.float64) for z in range(n))
        err = max(err, float(np.max(np.abs(np.asarray(got[f], dtype=np.float64) - ref))))
    plain = _nb(values[0])
    group = len(srv.group[0])
    noise = {}
    if clean is not None:
        n_min = min_noise_devices(n)
        noise = {"sigma": sigma, "n_min": n_min,
                 "sum_noise_std": float(np.std(np.asarray(got["sums"]) - clean)),
                 "expected_std": sigma * math.sqrt(n / n_min)}
    return {**noise, "workload": workload, "n_devices": n, "group": group,
            "neighbors": neighbors, "threshold": srv.threshold[0],
            "plain_up_bytes": plain, "secure_up_bytes": float(up.mean()),
            "secure_down_bytes": float(down.mean()), "up_ratio": float(up.mean()) / plain,
            "device_time_s": float(t_dev.mean()), "server_time_s": t_server,
            "exchanges_plain": 1, "exchanges_secure": len(srv.stages), "max_abs_error": err,
            "error_bound": n * 2.0 ** -21}


def preprocess_fit(n: int, seed: int, d: int = 20) -> dict:
    """A whole FederatedPreprocessor fit over ``n`` sites, plain and secure."""
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from fedclust.sites.preprocess import FederatedPreprocessor

    rng = np.random.default_rng(seed)
    sites = []
    for _ in range(n):
        X = rng.normal(rng.uniform(-50, 50, d), rng.uniform(0.1, 10, d), size=(60, d))
        X[rng.random(X.shape) < 0.1] = np.nan
        sites.append(X)
    ref = make_pipeline(SimpleImputer(), StandardScaler()).fit(np.vstack(sites))[-1]
    out = {"n_sites": n}
    for name, secure in (("plain", False), ("secure", True)):
        t0 = time.perf_counter()
        pre = FederatedPreprocessor(secure_aggregation=secure).fit(sites)
        out[f"{name}_time_s"] = time.perf_counter() - t0
        c = pre.communication_
        out[f"{name}_up_bytes"] = c["bytes_up"] / n
        out[f"{name}_down_bytes"] = c["bytes_down"] / n
        out[f"rounds_{name}"] = c["rounds"]
        out[f"exchanges_{name}"] = c["rounds"] + c.get("secure_exchanges", 0)
        if secure:
            out["scale_rel_error"] = float(np.max(np.abs(pre.scale_ / ref.scale_ - 1)))
    return out


_BASELINE_FLAG = "--baseline-rows"  # internal: run the given cases, print their rows as JSON
_KEEP = ("workload", "n_devices", "secure_up_bytes", "secure_down_bytes", "device_time_s",
         "server_time_s", "max_abs_error", "error_bound")


def baseline_rows(cases: list, seed: int, commit: str) -> list[dict] | None:
    """The same cases on the fedclust source of ``commit`` (git archive), in a subprocess."""
    repo = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="secagg-baseline-"))
    try:
        tar = subprocess.run(["git", "-C", str(repo), "archive", commit, "src/fedclust"],
                             capture_output=True, check=False)
        if tar.returncode != 0:
            print(f"  no baseline: git archive {commit} failed "
                  f"({tar.stderr.decode(errors='replace').strip()[:200]})", flush=True)
            return None
        subprocess.run(["tar", "-x", "-C", str(work)], input=tar.stdout, check=True)
        env = dict(os.environ, PYTHONPATH=str(work / "src"))
        out = subprocess.run([sys.executable, __file__, _BASELINE_FLAG, json.dumps(cases),
                              str(seed)], capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            print(f"  no baseline: the {commit} run failed:\n{out.stderr[-2000:]}", flush=True)
            return None
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _baseline_main(cases_json: str, seed: str) -> int:
    rows = [one_round(w, n, k, int(seed) + i) for i, (w, n, k) in enumerate(json.loads(cases_json))]
    print(json.dumps([{k: r[k] for k in _KEEP} for r in rows]))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == _BASELINE_FLAG:
        return _baseline_main(argv[1], argv[2])
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--baseline-commit", default="95c14ef",
                   help="commit whose secure-sum code runs beside (default: %(default)s)")
    p.add_argument("--no-baseline", action="store_true", help="skip the baseline table")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of every case, this code and the baseline's alternating; "
                        "times are the fastest (default: %(default)s)")
    args = C.finish_args(p.parse_args(argv))
    cases = []
    for workload in ("lloyd", "fedavg", "dp-lloyd", "lloyd-signed"):
        for n in (10, 100, 1000):
            if args.quick and (n == 1000 or (workload in ("dp-lloyd", "lloyd-signed")
                                             and n > 10)):
                continue
            neighbors = None if n <= 100 else 3 * math.ceil(math.log2(n))
            cases.append((workload, n, neighbors))
    rows: list[dict] = []
    old: list[dict] | None = None
    for rep in range(max(1, args.repeats)):  # alternate, so both see the same machine load
        for i, (workload, n, neighbors) in enumerate(cases):
            r = one_round(workload, n, neighbors, args.seed + i)
            assert r["max_abs_error"] <= r["error_bound"], r
            if rep == 0:
                rows.append(r)
            else:
                for key in ("device_time_s", "server_time_s"):
                    rows[i][key] = min(rows[i][key], r[key])
            print(f"  {workload} n={n}: device {r['device_time_s'] * 1e3:.1f} ms, "
                  f"server {r['server_time_s']:.2f} s", flush=True)
        if not args.no_baseline and (rep == 0 or old is not None):
            got = baseline_rows(cases, args.seed, args.baseline_commit)
            if got is None:
                old = None
            elif old is None:
                old = got
            else:
                for o, g in zip(old, got):
                    for key in ("device_time_s", "server_time_s"):
                        o[key] = min(o[key], g[key])
    table = C.print_table(
        ["workload", "devices", "group", "t", "plain B up", "secure B up", "secure B down",
         "x up", "device ms", "server s", "exchanges", "max |err|"],
        [[r["workload"], r["n_devices"], r["group"], r["threshold"], r["plain_up_bytes"],
          f"{r['secure_up_bytes']:,.0f}", f"{r['secure_down_bytes']:,.0f}",
          f"{r['up_ratio']:.1f}", f"{r['device_time_s'] * 1e3:.1f}",
          f"{r['server_time_s']:.2f}", f"1 -> {r['exchanges_secure']}",
          f"{r['max_abs_error']:.1e}"] for r in rows],
        title="One securely summed round vs plaintext (this machine, one process)")
    base_table = None
    if old is not None:
        for r, o in zip(rows, old):
            assert o["max_abs_error"] <= o["error_bound"], o
            r["baseline"] = o
        base_table = C.print_table(
            ["workload", "devices", "B up", "B up old", "B down", "B down old", "device ms",
             "device ms old", "x device", "server s", "server s old", "x server"],
            [[r["workload"], r["n_devices"], f"{r['secure_up_bytes']:,.0f}",
              f"{o['secure_up_bytes']:,.0f}", f"{r['secure_down_bytes']:,.0f}",
              f"{o['secure_down_bytes']:,.0f}", f"{r['device_time_s'] * 1e3:.1f}",
              f"{o['device_time_s'] * 1e3:.1f}",
              f"{r['device_time_s'] / o['device_time_s']:.2f}", f"{r['server_time_s']:.2f}",
              f"{o['server_time_s']:.2f}", f"{r['server_time_s'] / o['server_time_s']:.2f}"]
             for r, o in zip(rows, old)],
            title=f"\nHardened state machine vs {args.baseline_commit} (same cases, same run)")
    dp = [r for r in rows if r["workload"] == "dp-lloyd"]
    dp_table = C.print_table(
        ["devices", "n_min", "sigma", "device std", "sum noise std", "sigma sqrt(n/n_min)"],
        [[r["n_devices"], r["n_min"], f"{r['sigma']:.1f}",
          f"{r['sigma'] / math.sqrt(r['n_min']):.1f}", f"{r['sum_noise_std']:.1f}",
          f"{r['expected_std']:.1f}"] for r in dp],
        title="\nDistributed DP noise in the unmasked sum (dp-lloyd rows)")
    pre = [preprocess_fit(n, args.seed) for n in ((10,) if args.quick else (10, 100))]
    pre_table = C.print_table(
        ["sites", "plain B up", "secure B up", "secure B down", "rounds", "exchanges",
         "plain s", "secure s", "max |scale - sklearn| / scale"],
        [[r["n_sites"], f"{r['plain_up_bytes']:,.0f}", f"{r['secure_up_bytes']:,.0f}",
          f"{r['secure_down_bytes']:,.0f}", f"{r['rounds_plain']} -> {r['rounds_secure']}",
          f"{r['exchanges_plain']} -> {r['exchanges_secure']}", f"{r['plain_time_s']:.2f}",
          f"{r['secure_time_s']:.2f}", f"{r['scale_rel_error']:.1e}"] for r in pre],
        title="\nFederatedPreprocessor fit (d=20): plain vs secure aggregation")
    ref = C.print_table(["", "wire", "precision", "shares", "mask generator"], REFERENCE,
                        title="\nReference settings")
    C.write_json(args, "secagg", {"rows": rows, "preprocess": pre, "reference": REFERENCE,
                                  "table": table, "dp_table": dp_table,
                                  "baseline_commit": None if old is None
                                  else args.baseline_commit, "baseline_table": base_table,
                                  "preprocess_table": pre_table, "reference_table": ref})
    return 0


if __name__ == "__main__":
    sys.exit(main())
