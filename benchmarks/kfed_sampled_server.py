"""The default k-FED server on many device centers: starts on a keyed coreset vs on all centers.

Above ``fedclust.kfed.keyed.SAMPLED_ABOVE`` device centers the default server
(``"weighted-kmeans++"``) runs its keyed k-means++ starts and their weighted Lloyd on a
keyed lightweight coreset of about ``max(10,000, 200 k)`` device centers and finishes with
weighted Lloyd on all of them from the best start. This benchmark measures what that costs
in quality and saves in time on generated overlapping federations that no setting was
chosen on: for each, a random k (5-60), d (5-40), cluster spread (Gaussian components
with standard deviation 2-4 around means drawn in [-10, 10]^d, so that they overlap) and
2,000-10,000 devices of 20-80 points (20,000-100,000 device centers), each holding 1-4 of the components in random
proportions. The devices run the default ``KFed(k)`` device step once; the server step
then runs on the same device centers twice, on the coreset (forced for every size) and
on all centers (forced), and the pooled rows' k-means cost at each is divided by that of
scikit-learn ``KMeans(k, n_init=1)`` on the pooled rows (what ``speed.py`` compares with).

Columns: device centers, coreset size, server CPU s (one thread) on the coreset and on
all centers, cost / pooled KMeans for both, and coreset cost / all-centers cost.
``--quick``: 2 federations of 3,000 devices.
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

import _common as C
from fedclust import KFed
from fedclust.core.kmeans import assign
from fedclust.kfed import keyed
from fedclust.kfed.server import aggregate_centers
from fedclust.sim.transport import InProcessTransport


def overlapping_federation(rng: np.random.Generator, n_devices: int):
    """(devices, k, d, std): Gaussian components that overlap, 1-4 per device."""
    k = int(rng.integers(5, 61))
    d = int(rng.integers(5, 41))
    std = float(rng.uniform(2.0, 4.0))
    means = rng.uniform(-10.0, 10.0, size=(k, d))
    devices = []
    for _ in range(n_devices):
        n = int(rng.integers(20, 81))
        own = rng.choice(k, size=int(rng.integers(1, 5)), replace=False)
        share = rng.dirichlet(np.ones(len(own)))
        comp = own[rng.choice(len(own), size=n, p=share)]
        devices.append(means[comp] + std * rng.normal(size=(n, d)))
    return devices, k, d, std


def pooled_cost(X: np.ndarray, centers: np.ndarray) -> float:
    return float(assign(X, centers)[1].sum())


def server(model, k: int, sampled_above: int):
    keep = keyed.SAMPLED_ABOVE
    keyed.SAMPLED_ABOVE = sampled_above
    try:
        t0 = time.process_time()
        agg = aggregate_centers(model.local_centers_, k, counts=model.local_counts_,
                                method="weighted-kmeans++", device_ids=model.device_ids_,
                                seed=model.seed_)
        return agg, time.process_time() - t0
    finally:
        keyed.SAMPLED_ABOVE = keep


def main() -> None:
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--federations", type=int, default=6)
    args = C.finish_args(p.parse_args())
    rng = np.random.default_rng(args.seed + 1_000_003)   # not a seed any setting was chosen on
    n_fed = 2 if args.quick else args.federations
    rows = []
    with threadpool_limits(limits=1):
        for f in range(n_fed):
            n_devices = 3_000 if args.quick else int(rng.integers(2_000, 10_001))
            devices, k, d, std = overlapping_federation(rng, n_devices)
            model = KFed(k, random_state=args.seed + f).fit(
                devices, transport=InProcessTransport(n_jobs=1))
            n_centers = int(sum(len(c) for c in model.local_centers_))
            m = max(keyed.SAMPLE_MIN, keyed.SAMPLE_PER_CLUSTER * k)
            X = np.concatenate(devices)
            t0 = time.process_time()
            km = KMeans(k, n_init=1, random_state=args.seed + f).fit(X)
            sk_cpu = time.process_time() - t0
            ref = pooled_cost(X, km.cluster_centers_)
            row = {"federation": f, "devices": n_devices, "k": k, "d": d, "std": std,
                   "device_centers": n_centers, "coreset_expected": m,
                   "default_samples": keyed.sample_size(n_centers, k) is not None,
                   "sklearn_cpu_s": sk_cpu}
            if n_centers > 2 * m:   # the coreset path needs more than 2 m device centers
                agg, t = server(model, k, 0)
                row.update(coreset_server_cpu_s=t, coreset_cost=pooled_cost(X, agg.centers) / ref)
            agg, t = server(model, k, 10**15)
            row.update(all_server_cpu_s=t, all_cost=pooled_cost(X, agg.centers) / ref)
            if "coreset_cost" in row:
                row["coreset_over_all"] = row["coreset_cost"] / row["all_cost"]
            rows.append(row)
            print(f"federation {f}: done", flush=True)
    C.print_table(
        ["fed", "devices", "k", "d", "std", "device centers", "coreset m", "coreset server s",
         "all-centers server s", "sklearn s", "cost/sk coreset", "cost/sk all",
         "coreset/all"],
        [[r["federation"], r["devices"], r["k"], r["d"], C.fmt(r["std"], 2),
          r["device_centers"], r["coreset_expected"],
          C.fmt(r.get("coreset_server_cpu_s"), 3), C.fmt(r["all_server_cpu_s"], 3),
          C.fmt(r["sklearn_cpu_s"], 3), C.fmt(r.get("coreset_cost"), 4),
          C.fmt(r["all_cost"], 4), C.fmt(r.get("coreset_over_all"), 4)] for r in rows],
        title="Default k-FED server: starts on a keyed coreset vs on all device centers "
              "(one thread, CPU s)")
    C.write_json(args, "kfed_sampled_server", {"rows": rows})


if __name__ == "__main__":
    main()
