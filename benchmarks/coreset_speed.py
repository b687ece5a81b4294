"""Speed of distributed PCA + distributed coreset k-means against pooled scikit-learn.

The check: on MNIST (70,000 x 784, pixels / 255) split over 10 nodes
(star, IID split), ``DistributedKMeans(k=10, coreset_size=5000,
n_components=40).fit`` end to end (every node step in this process, the
in-process transport with its message codec, the coreset solve, centers lifted
back, labels sent down) takes <= 0.5x the time of scikit-learn
``KMeans(n_init=1)`` on the pooled data, at k-means cost <= 1.05x of it, both
ratios from one run. Naive distributed Lloyd
(:class:`fedclust.baselines.DistributedLloyd`) on the same nodes is reported
beside it: bytes and cost.

Costs are k-means costs of the final centers on all original points. Peak
memory is the extra high-water mark of each phase over the resident size
before it (Linux ``VmHWM``).

``--quick`` uses scikit-learn's bundled digits (1,797 x 64) with
coreset_size=500 and n_components=20, and needs no data folder; without
MNIST the full run falls back to it too and says so.
"""

from __future__ import annotations

import gc
import time

import numpy as np

import _common as C
from fedclust import DistributedKMeans
from fedclust.baselines import DistributedLloyd
from fedclust.metrics import kmeans_cost
from fedclust.sim.partition import iid_partition


def load(args):
    if not args.quick:
        try:
            from fedclust.datasets import load_mnist

            X, _ = load_mnist(args.data_dir)
            return X, "MNIST 70k x 784 (pixels / 255)", dict(coreset_size=5000, n_components=40)
        except Exception as exc:  # noqa: BLE001  (missing data: fall back, say so)
            print(f"note: MNIST not available ({exc}); using sklearn digits instead", flush=True)
    from sklearn.datasets import load_digits

    X, _ = load_digits(return_X_y=True)
    return X / 16.0, "sklearn digits 1797 x 64 (pixels / 16)", dict(coreset_size=500,
                                                                    n_components=20)


def phase(fn):
    gc.collect()
    before = C.rss_mb()
    C.reset_peak_rss()
    t0 = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t0
    hwm = C.vm_hwm_mb()
    return out, elapsed, (None if hwm is None else max(hwm - before, 0.0))


def main() -> None:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--k", type=int, default=10)
    args = C.finish_args(p.parse_args())
    X, source, params = load(args)
    devices = [X[i] for i in iid_partition(len(X), args.nodes, random_state=args.seed)]
    k = args.k
    print(f"data: {source}; {args.nodes} nodes (IID split), k={k}, star, {params}", flush=True)
    with C.blas_limit(args):
        from sklearn.cluster import KMeans

        (pooled, t_pool, _) = phase(lambda: np.concatenate(devices))
        sk, t_sk, m_sk = phase(lambda: KMeans(k, n_init=1, random_state=args.seed).fit(pooled))
        cost_sk = kmeans_cost(pooled, sk.cluster_centers_)
        km, t_km, m_km = phase(lambda: DistributedKMeans(k, random_state=args.seed, **params)
                               .fit(devices))
        cost_km = kmeans_cost(pooled, km.cluster_centers_)
        dl, t_dl, m_dl = phase(lambda: DistributedLloyd(k, random_state=args.seed).fit(devices))
        cost_dl = kmeans_cost(pooled, dl.cluster_centers_)
    data_mb = pooled.nbytes / 2**20
    rows = [
        ("sklearn KMeans(n_init=1), pooled", t_sk, 1.0, cost_sk, 1.0, "all data", "-", "-", m_sk),
        ("DistributedKMeans (disPCA+coreset)", t_km, t_km / t_sk, cost_km, cost_km / cost_sk,
         km.communication_["bytes_up"], km.communication_["bytes_down"],
         km.communication_["rounds"], m_km),
        ("DistributedLloyd (naive)", t_dl, t_dl / t_sk, cost_dl, cost_dl / cost_sk,
         dl.communication_["bytes_up"], dl.communication_["bytes_down"],
         dl.communication_["rounds"], m_dl),
    ]
    C.print_table(["method", "time s", "time / sklearn", "cost", "cost / sklearn", "bytes up",
                   "bytes down", "rounds", "peak extra MiB"], rows,
                  title=f"Speed, {source}, {args.nodes} nodes (pooling took {t_pool:.2f} s; "
                        f"data {data_mb:.0f} MiB)")
    ok_time = t_km <= 0.5 * t_sk
    ok_cost = cost_km <= 1.05 * cost_sk
    print(f"check: time <= 0.5x sklearn -> {t_km / t_sk:.3f}x "
          f"({'met' if ok_time else 'NOT met'}); cost <= 1.05x -> {cost_km / cost_sk:.4f}x "
          f"({'met' if ok_cost else 'NOT met'})", flush=True)
    payload = {
        "params": {"source": source, "nodes": args.nodes, "k": k, **params},
        "rows": [dict(zip(["method", "time_s", "time_ratio", "cost", "cost_ratio", "bytes_up",
                           "bytes_down", "rounds", "peak_extra_mib"], r)) for r in rows],
        "target": {"time_ratio_max": 0.5, "cost_ratio_max": 1.05,
                   "time_ratio": t_km / t_sk, "cost_ratio": cost_km / cost_sk,
                   "time_met": ok_time, "cost_met": ok_cost},
        "data_mib": data_mb,
    }
    C.write_json(args, "coreset_speed", payload)

    def draw(plt):
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        names = ["sklearn", "coreset", "dist. Lloyd"]
        a1.bar(names, [r[1] for r in rows], color=["grey", "C0", "C1"])
        a1.set_ylabel("seconds")
        a1.set_title("fit time")
        a2.bar(names, [r[4] for r in rows], color=["grey", "C0", "C1"])
        a2.axhline(1.05, ls="--", c="k", lw=1)
        a2.set_ylabel("cost / sklearn")
        a2.set_ylim(0.9, max(1.1, max(r[4] for r in rows) * 1.02))
        a2.set_title(source)

    C.save_plot(args, "coreset_speed", draw)


if __name__ == "__main__":
    main()
