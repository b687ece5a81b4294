"""k-FED Fig. 1: accuracy vs the separation constant c.

Dennis, Li & Smith, ICML 2021, §4.1, Fig. 1: the Table-1 construction
(m0 = 5, k' = sqrt(k)) at decreasing separation c; the paper's claim is that
k-FED "recovers highly accurate clusterings even for relatively small c" (the
figure gives no table of numbers, so the "paper" column states the claim).

``separation`` c is mapped to means as in
:func:`fedclust.datasets.make_federated_gaussians`: the expected distance of
two component means is c sigma (a point lies about sigma sqrt(d) from its own
mean). Centralised scikit-learn k-means (k-means++, n_init=1) on the pooled
data is shown beside k-FED for reference.

Settings: (d=100, k=16) and (d=100, k=64); c in {1, 2, 5, 10, 20, 50, 100};
10 runs (full, 2d samples per component) or 3 runs (``--quick``, 25 per
component, only (d=100, k=16)).
"""

from __future__ import annotations

import math
import time

import numpy as np

import _common as C
from fedclust import KFed
from fedclust.datasets import make_federated_gaussians
from fedclust.metrics import matched_accuracy

SEPARATIONS = [1, 2, 5, 10, 20, 50, 100]
SETTINGS_FULL = [(100, 16), (100, 64)]
SETTINGS_QUICK = [(100, 16)]
M0 = 5


def one(d, k, c, n_per, seed):
    from sklearn.cluster import KMeans

    kp = max(1, int(round(math.sqrt(k))))
    fd = make_federated_gaussians(n_features=d, n_clusters=k, n_local_clusters=kp, m0=M0,
                                  separation=c, n_per_component=n_per, random_state=seed)
    t0 = time.perf_counter()
    model = KFed(k, kp, server="farthest-lloyd1", random_state=seed).fit(fd.devices)
    t = time.perf_counter() - t0
    y = fd.y
    acc = matched_accuracy(y, model.labels_)
    km = KMeans(k, n_init=1, random_state=seed % 2**32).fit(fd.X)
    return acc, matched_accuracy(y, km.labels_), t, fd.meta["n_per_component"]


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=None, help="runs per point (default 10, quick 3)")
    args = C.finish_args(p.parse_args(argv))
    runs = args.runs or (3 if args.quick else 10)
    n_per = 25 if args.quick else None
    settings = SETTINGS_QUICK if args.quick else SETTINGS_FULL

    results, table = [], []
    with C.blas_limit(args):
        for d, k in settings:
            for c in SEPARATIONS:
                accs, central, times = [], [], []
                for r in range(runs):
                    a, b, t, n_used = one(d, k, float(c), n_per, args.seed + r)
                    accs.append(a)
                    central.append(b)
                    times.append(t)
                m, s = C.mean_std(accs)
                cm, cs = C.mean_std(central)
                results.append({"d": d, "k": k, "k_local": int(round(math.sqrt(k))),
                                "separation": c, "n_per_component": n_used, "runs": runs,
                                "accuracy": accs, "accuracy_mean": m, "accuracy_std": s,
                                "centralized_accuracy": central, "centralized_mean": cm,
                                "centralized_std": cs, "fit_time_mean_s": float(np.mean(times))})
                table.append([f"d={d}, k={k}", c, f"{100 * m:.2f} ± {100 * s:.2f}",
                              f"{100 * cm:.2f} ± {100 * cs:.2f}",
                              f"{np.mean(times):.2f}"])
    C.print_table(["setting", "c", "k-FED acc %", "sklearn pooled acc %", "fit s"], table,
                  title=f"Fig. 1 — accuracy vs separation c (m0=5, k'=sqrt(k), {runs} runs"
                        f"{', quick' if args.quick else ''}); paper: accuracy stays high "
                        "for c << 100 (figure only, no numbers)")

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6, 4))
        for d, k in settings:
            rs = [r for r in results if r["d"] == d and r["k"] == k]
            cs = [r["separation"] for r in rs]
            ax.errorbar(cs, [100 * r["accuracy_mean"] for r in rs],
                        yerr=[100 * r["accuracy_std"] for r in rs], marker="o", capsize=3,
                        label=f"k-FED d={d} k={k}")
            ax.plot(cs, [100 * r["centralized_mean"] for r in rs], ls="--", marker="x",
                    label=f"sklearn pooled d={d} k={k}")
        ax.set_xscale("log")
        ax.set_xlabel("separation c")
        ax.set_ylabel("accuracy (%)")
        ax.set_title("Fig. 1: accuracy vs separation")
        ax.legend(fontsize=8)

    C.save_plot(args, "fig1_separation", draw)
    out = {"params": {"m0": M0, "separations": SEPARATIONS, "runs": runs,
                      "settings": settings,
                      "n_per_component": n_per if n_per else "max(10*m0, 2*d)"},
           "paper": "accuracy stays high for c much smaller than 100 (no numbers given)",
           "rows": results}
    C.write_json(args, "fig1_separation", out)
    return out


if __name__ == "__main__":
    main()
