"""Secure aggregation's cost against plaintext sums: federated Lloyd and FedAvg rounds.

One summed round at 10, 100 and 1,000 devices (``--quick``: 10 and 100), measured on the four stages of :mod:`fedclust.core.secure_sum`
run in this process (every device's step timed on its own, the server's apart):

* ``lloyd``: a federated Lloyd round's reply, per-cluster sums (k=10, d=20),
  counts and cost: 211 numbers (1,688 B in plaintext);
* ``fedavg``: a FedAvg update in its summable form
  (:class:`fedclust.fl.messages.SummedUpdate`) for a 784x10 softmax model:
  7,854 numbers (62,832 B in plaintext).

Groups: every other device (SecAgg) up to 100 devices; at 1,000 devices each
device masks with and shares to ``neighbors`` peers on a random circulant graph
(SecAgg+, Bell et al. 2020), 3 log2(n) ≈ 30. Columns: bytes up / down per
device (mean over devices, all four stages; plaintext: the reply up),
device time (mean per device, all stages), server time (all stages, including
unmasking), exchanges (plaintext 1, secure 4), and the largest error of the
unmasked sum against the float64 sum (bound ``n 2**-21``).

Beside them: Flower's legacy SecAgg+ workflow settings (``SecAggPlusWorkflow``,
flwr 1.42 defaults and its example app) and what the FastLloyd paper reports.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

from fedclust.core.secure_sum import SecureAggregation, SecureSumServer, secure_sum_client  # noqa: E402

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
    values = {z: WORKLOADS[workload](rng) for z in range(n)}
    settings = SecureAggregation(neighbors=neighbors)
    t_server = 0.0
    t0 = time.perf_counter()
    srv = SecureSumServer(range(n), 1, settings, seed)
    t_server += time.perf_counter() - t0
    states = {z: {} for z in range(n)}
    up = np.zeros(n)
    down = np.zeros(n)
    t_dev = np.zeros(n)
    for stage in ("keys", "share", "mask", "unmask"):
        t0 = time.perf_counter()
        inbound = srv.requests(stage)
        t_server += time.perf_counter() - t0
        replies = {}
        for z, msg in inbound.items():
            down[z] += _nb(msg)
            t0 = time.perf_counter()
            rep = secure_sum_client(stage, msg, states[z], device_id=z,
                                    reply=values[z] if stage == "mask" else None)
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
    return {"workload": workload, "n_devices": n, "group": group,
            "neighbors": neighbors, "threshold": srv.threshold[0],
            "plain_up_bytes": plain, "secure_up_bytes": float(up.mean()),
            "secure_down_bytes": float(down.mean()), "up_ratio": float(up.mean()) / plain,
            "device_time_s": float(t_dev.mean()), "server_time_s": t_server,
            "exchanges_plain": 1, "exchanges_secure": 4, "max_abs_error": err,
            "error_bound": n * 2.0 ** -21}


def main(argv=None) -> int:
    p = C.make_parser(__doc__.split("\n")[0])
    args = C.finish_args(p.parse_args(argv))
    cases = []
    for workload in ("lloyd", "fedavg"):
        for n in (10, 100, 1000):
            if args.quick and n == 1000:
                continue
            neighbors = None if n <= 100 else 3 * math.ceil(math.log2(n))
            cases.append((workload, n, neighbors))
    rows = []
    for i, (workload, n, neighbors) in enumerate(cases):
        r = one_round(workload, n, neighbors, args.seed + i)
        assert r["max_abs_error"] <= r["error_bound"], r
        rows.append(r)
        print(f"  {workload} n={n}: device {r['device_time_s'] * 1e3:.1f} ms, "
              f"server {r['server_time_s']:.2f} s", flush=True)
    table = C.print_table(
        ["workload", "devices", "group", "t", "plain B up", "secure B up", "secure B down",
         "x up", "device ms", "server s", "exchanges", "max |err|"],
        [[r["workload"], r["n_devices"], r["group"], r["threshold"], r["plain_up_bytes"],
          f"{r['secure_up_bytes']:,.0f}", f"{r['secure_down_bytes']:,.0f}",
          f"{r['up_ratio']:.1f}", f"{r['device_time_s'] * 1e3:.1f}",
          f"{r['server_time_s']:.2f}", "1 -> 4", f"{r['max_abs_error']:.1e}"] for r in rows],
        title="One securely summed round vs plaintext (this machine, one process)")
    ref = C.print_table(["", "wire", "precision", "shares", "mask generator"], REFERENCE,
                        title="\nReference settings")
    C.write_json(args, "secagg", {"rows": rows, "reference": REFERENCE, "table": table,
                                  "reference_table": ref})
    return 0


if __name__ == "__main__":
    sys.exit(main())
