"""k-FED Fig. 3: one shot vs many rounds — k-FED vs naive distributed Lloyd.

Dennis, Li & Smith, ICML 2021, §4.2.1, Fig. 3: on the same federations,
one-shot k-FED reaches a k-means cost similar to naive distributed Lloyd,
which needs many rounds. We add centralised scikit-learn k-means (k-means++,
``n_init=1``) on the pooled data as the reference cost.

Federations (each with the same seed for all three methods):

* ``gaussians``: the Table-1 construction (d=100, k=16, k'=4, m0=5) at
  separation c=10 (hard enough that the methods differ; c=100 is trivial);
* the real data set of Fig. 2 (``--dataset mnist`` or ``digits``) with the
  k=10 k-means oracle, cut over Z devices structured (k' = 2 and 5) and IID
  (devices run k-FED with k'=5 there).

Reported per method: k-means cost on all data, cost / centralised, rounds,
bytes up and down (payload bytes counted by the in-process transport; the
centralised baseline ships every point once: n d 8 bytes up), wall time. The
plot shows cost vs total bytes: Lloyd as a curve (the cost of the centers
broadcast in each round against the bytes spent up to that round: sample
round + r Lloyd rounds, from the message-size formula), k-FED as one point.
"""

from __future__ import annotations

import time

import numpy as np

import _common as C
from fedclust import KFed
from fedclust.baselines import DistributedLloyd
from fedclust.datasets import make_federated_gaussians
from fedclust.metrics import kmeans_cost, matched_accuracy
from fedclust.sim.partition import apply_partition, iid_partition, structured_partition

from fig2_heterogeneity import load


def federations(args):
    """Yield (name, devices, labels, k, k_local)."""
    d = 50 if args.quick else 100
    n_per = 40 if args.quick else None
    fd = make_federated_gaussians(n_features=d, n_clusters=16, n_local_clusters=4, m0=5,
                                  separation=10.0, n_per_component=n_per,
                                  random_state=args.seed)
    yield (f"gaussians d={d} k=16 k'=4 c=10", fd.devices, fd.labels, 16, 4)
    n_samples = args.n_samples
    if n_samples is None and args.quick and args.dataset == "mnist":
        n_samples = 10000
    X, y, _ = load(args.dataset, args.data_dir, n_samples, args.seed)
    from sklearn.cluster import KMeans

    k = 10
    oracle = KMeans(k, n_init=3, random_state=args.seed).fit(X).labels_
    Z = args.devices or (100 if args.dataset == "mnist" else 20)
    for kp in (2, 5):
        part = structured_partition(oracle, kp, n_devices=Z, random_state=args.seed)
        devs, labs = apply_partition(X, y, part)
        yield (f"{args.dataset} structured k'={kp} Z={Z}", devs, labs, k, kp)
    part = iid_partition(len(X), Z, random_state=args.seed)
    devs, labs = apply_partition(X, y, part)
    yield (f"{args.dataset} IID k'=5 Z={Z}", devs, labs, k, 5)


def lloyd_curve(devices, dl, k):
    """(cumulative bytes, cost) after each Lloyd round, from the message sizes."""
    d = devices[0].shape[1]
    Z = len(devices)
    ppd = dl.points_per_device_used
    sample_up = sum(min(len(X), ppd) * d * 8 + 8 for X in devices)
    per_round = Z * (k * d * 8 + k * (d + 1) * 8 + 8)  # centers down, sums+counts+cost up
    return [(sample_up + (r + 1) * per_round, c) for r, c in enumerate(dl.cost_history_)]


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--n-samples", type=int, default=None)
    p.add_argument("--devices", type=int, default=None)
    args = C.finish_args(p.parse_args(argv))
    from sklearn.cluster import KMeans

    results, table = [], []
    with C.blas_limit(args):
        for name, devices, labels, k, kp in federations(args):
            X = np.concatenate(devices)
            y = np.concatenate(labels)
            n, d = X.shape
            entry = {"federation": name, "n_points": n, "n_features": d, "devices": len(devices),
                     "k": k, "k_local": kp, "methods": {}}
            t0 = time.perf_counter()
            km = KMeans(k, n_init=1, random_state=args.seed).fit(X)
            t = time.perf_counter() - t0
            ref = kmeans_cost(X, km.cluster_centers_)
            entry["methods"]["centralized"] = {
                "cost": ref, "rounds": 1, "bytes_up": n * d * 8, "bytes_down": 0,
                "time_s": t, "accuracy": matched_accuracy(y, km.labels_)}
            t0 = time.perf_counter()
            kf = KFed(k, kp, server="farthest-lloyd1", random_state=args.seed).fit(devices)
            t = time.perf_counter() - t0
            com = kf.communication_
            entry["methods"]["kfed"] = {
                "cost": kmeans_cost(X, kf.cluster_centers_), "rounds": com["rounds"],
                "bytes_up": com["bytes_up"], "bytes_down": com["bytes_down"], "time_s": t,
                "accuracy": matched_accuracy(y, kf.labels_)}
            t0 = time.perf_counter()
            dl = DistributedLloyd(k, random_state=args.seed).fit(devices)
            t = time.perf_counter() - t0
            dl.points_per_device_used = dl.points_per_device or max(
                1, int(np.ceil(20 * k / len(devices))))
            com = dl.communication_
            entry["methods"]["distributed_lloyd"] = {
                "cost": kmeans_cost(X, dl.cluster_centers_), "rounds": com["rounds"],
                "bytes_up": com["bytes_up"], "bytes_down": com["bytes_down"], "time_s": t,
                "accuracy": matched_accuracy(y, np.concatenate(dl.device_labels_)),
                "converged": bool(dl.converged_), "cost_history": dl.cost_history_,
                "curve_bytes_cost": lloyd_curve(devices, dl, k)}
            for mname, m in entry["methods"].items():
                m["cost_ratio_vs_centralized"] = m["cost"] / ref
                table.append([name, mname, m["cost"], f"{m['cost'] / ref:.4f}", m["rounds"],
                              m["bytes_up"], m["bytes_down"], f"{100 * m['accuracy']:.2f}",
                              f"{m['time_s']:.2f}"])
            results.append(entry)
    C.print_table(["federation", "method", "k-means cost", "cost/central", "rounds",
                   "bytes up", "bytes down", "acc %", "time s"], table,
                  title="Fig. 3 — one shot vs many rounds (paper: k-FED's cost similar to "
                        f"distributed Lloyd's with 1 round){' — quick' if args.quick else ''}")

    def draw(plt):
        n = len(results)
        fig, axes = plt.subplots(1, n, figsize=(4 * n, 3.6))
        for ax, e in zip(np.atleast_1d(axes), results):
            m = e["methods"]
            ref = m["centralized"]["cost"]
            curve = m["distributed_lloyd"]["curve_bytes_cost"]
            ax.plot([b for b, _ in curve], [c / ref for _, c in curve], marker=".",
                    label=f"distributed Lloyd ({m['distributed_lloyd']['rounds']} rounds)")
            kb = m["kfed"]["bytes_up"] + m["kfed"]["bytes_down"]
            ax.scatter([kb], [m["kfed"]["cost"] / ref], color="C3", zorder=3, s=40,
                       label="k-FED (1 round)")
            ax.axhline(1.0, color="gray", lw=0.8, ls=":", label="centralized")
            ax.set_xscale("log")
            ax.set_xlabel("bytes (up + down)")
            ax.set_ylabel("cost / centralized")
            ax.set_title(e["federation"], fontsize=8)
            ax.legend(fontsize=7)

    C.save_plot(args, "fig3_rounds", draw)
    out = {"params": {"dataset": args.dataset}, "paper": "k-FED with one round reaches "
           "k-means cost similar to multi-round distributed Lloyd (figure only)",
           "federations": results}
    C.write_json(args, "fig3_rounds", out)
    return out


if __name__ == "__main__":
    main()
