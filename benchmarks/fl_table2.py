"""k-FED Table 2: rotated MNIST, Global FedAvg vs IFCA vs k-FED + FedAvg (+ MLP speed).

Dennis, Li & Smith, ICML 2021, §4.2.2, Table 2: MNIST rotated by 0/90/180/270
degrees (4 clusters); 100 or 200 devices; k' = 1 (each device one rotation) or
k' = 2 (two rotations per device); MLP 784-200-10; test accuracy averaged over
devices, each tested on held-out images of its own rotation mix.

Our construction (:func:`fedclust.fl.rotated_federation`): the 60000 training
images are dealt without replacement, 60000 / Z per device (600 for Z = 100,
300 for Z = 200), split evenly over the device's rotations; every device gets
``--n-test`` held-out test images (MNIST test split) with its rotation mix.
All methods share one training setting: ``--rounds`` rounds, every device
every round, ``--local-epochs`` epochs of SGD, batch ``--batch-size``, lr
``--lr``; IFCA with k = 4 random starts (one restart), k-FED with k = 4 on the
raw pixels (plus, on the first row, a random projection to 50 dims and the
hidden layer after one FedAvg round are compared for clustering quality only:
``--feature-maps``).

k-FED + FedAvg is run with the k-means++ server step on the local centers
(``kfed_server="kmeans++"``, our default) and, at k' = 2, also with the paper's
farthest-first + one Lloyd step (``"farthest-lloyd1"``; at k' = 1 both give the
same device clusters). At k' = 2 every device's prediction routing is scored
four ways on the same trained models: nearest local k-FED center (the paper),
lowest-entropy model, the device's local gate (``routing="gate"``) and the gate's
mixture of the models (``"soft-gate"``, the reported k-FED + FedAvg number).

Reported: test accuracy averaged over devices (paper's number beside it),
k-FED / IFCA cluster recovery at k' = 1 (matched accuracy of device clusters vs
rotations), bytes up / down, wall time. Speed: one local epoch of 250 MNIST
images through the numpy MLP (bound: 20 ms) and the wall time of the
100-device rows. ``--quick``: scikit-learn's 8x8 digits (no data needed) when
MNIST is missing, 20 devices, 10 rounds.
"""

from __future__ import annotations

import time

import numpy as np

import _common as C
from fedclust.fl import IFCA, MLP, ClusteredFedAvg, FedAvg, rotated_federation
from fedclust.metrics import matched_accuracy

PAPER = {(100, 1): (95.0, 98.0, 98.0), (200, 1): (94.5, 97.2, 97.8),
         (100, 2): (95.3, 95.6, 97.1), (200, 2): (94.5, 95.1, 96.4)}


def mlp_epoch_ms(dataset, data_dir, repeats=20):
    """Median wall time (ms) of one local epoch of 250 images, batch 32, one BLAS thread."""
    from threadpoolctl import threadpool_limits

    from fedclust.fl.data import load_images

    X, y, *_ = load_images(dataset, data_dir)
    X, y = X[:250].astype(np.float64), y[:250]
    m = MLP(X.shape[1], 200, 10)
    rng = np.random.default_rng(0)
    m.set_params(m.init_params(rng))
    times = []
    with threadpool_limits(1, user_api="blas"):
        for _ in range(repeats):
            t = time.perf_counter()
            m.local_sgd(X, y, epochs=1, batch_size=32, lr=0.05, rng=rng)
            times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def run_method(name, est, fed):
    t = time.perf_counter()
    est.fit(fed.devices, fed.labels, test_X=fed.test_devices, test_y=fed.test_labels)
    wall = time.perf_counter() - t
    extra = {}
    if isinstance(est, ClusteredFedAvg):
        truth = np.concatenate(fed.extra["point_rotations"])
        extra["point_agreement"] = matched_accuracy(truth, np.concatenate(est.device_labels_))
        if est.n_local_clusters > 1:
            extra["routing_accuracy"] = {
                r: 100 * float(np.mean(est.score_devices(fed.test_devices, fed.test_labels,
                                                         routing=r)))
                for r in (("centers", "confidence", "gate", "soft-gate")
                          if est.routing in ("gate", "soft-gate") else ("centers", "confidence"))}
    out = {"test_accuracy": 100 * float(np.mean(est.device_test_accuracy_)),
           "test_accuracy_std": 100 * float(np.std(est.device_test_accuracy_)),
           "curve": [h.get("test_accuracy") for h in est.history_],
           "bytes_up": est.communication_["bytes_up"],
           "bytes_down": est.communication_["bytes_down"], "time_s": wall, **extra}
    rots = fed.extra["rotations"]
    if not isinstance(est, FedAvg) and all(len(r) == 1 for r in rots):
        out["cluster_accuracy"] = matched_accuracy(np.array([r[0] for r in rots]),
                                                   np.array(est.device_clusters_))
    print(f"  {name:24s} acc {out['test_accuracy']:.2f}%  {wall:.1f}s  "
          f"down {out['bytes_down'] / 1e6:.1f} MB  {extra}", flush=True)
    return out


def cluster_quality(fed, kp, fm, n_hidden, args):
    """k-FED's recovery of the rotations with feature map ``fm`` (a one-round run)."""
    t = time.perf_counter()
    est = ClusteredFedAvg(n_clusters=4, n_local_clusters=kp, feature_map=fm, rounds=1,
                          lr=args.lr, n_hidden=n_hidden, random_state=args.seed)
    est.fit(fed.devices, fed.labels)
    rots = fed.extra["rotations"]
    truth = np.concatenate(fed.extra["point_rotations"])
    pred = np.concatenate(est.device_labels_)
    dev = (matched_accuracy(np.array([r[0] for r in rots]), np.array(est.device_clusters_))
           if kp == 1 else None)
    return {"device_accuracy": dev, "point_accuracy": matched_accuracy(truth, pred),
            "time_s": time.perf_counter() - t}


def write(args, dataset, rounds, n_test, n_hidden, note, epoch_ms, rows, maps_rows):
    C.write_json(args, "fl_table2", {
        "params": {"dataset": dataset, "rounds": rounds, "lr": args.lr, "n_test": n_test,
                   "local_epochs": args.local_epochs, "batch_size": args.batch_size,
                   "n_hidden": n_hidden, "note": note},
        "speed": {"mlp_epoch_250_ms": epoch_ms, "target_ms": 20.0}, "rows": rows,
        "feature_maps": maps_rows})


def main():
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--rows", default="100:1,200:1,100:2,200:2",
                   help="devices:k' pairs, comma separated")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.4)
    p.add_argument("--local-epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--methods", default="global,ifca,kfed,kfed_paper",
                   help="which methods to run (kfed_paper: only at k' > 1)")
    p.add_argument("--n-test", type=int, default=100)
    p.add_argument("--feature-maps", default="raw,random-projection,hidden",
                   help="k-FED inputs compared (one-round runs: clustering quality); "
                        "the training runs use raw")
    args = C.finish_args(p.parse_args())
    dataset, note = C.mnist_or_digits(args)
    rows_spec = [tuple(int(v) for v in r.split(":")) for r in args.rows.split(",")]
    rounds, n_test, n_hidden = args.rounds, args.n_test, 200
    if args.quick:
        rows_spec = [(20, 1), (20, 2)]
        rounds, n_test, n_hidden = 8, 40, 50
    n_train_pool = 60000 if dataset == "mnist" else 1297
    maps = args.feature_maps.split(",")
    epoch_ms = mlp_epoch_ms(dataset, args.data_dir)
    print(f"MLP {('784' if dataset == 'mnist' else '64')}-200-10: one epoch of 250 images "
          f"{epoch_ms:.1f} ms (bound: 20 ms)", flush=True)
    kw = dict(rounds=rounds, local_epochs=args.local_epochs, batch_size=args.batch_size,
              lr=args.lr, n_hidden=n_hidden, random_state=args.seed)
    todo = set(args.methods.split(","))
    rows, maps_rows = [], []
    with C.blas_limit(args):
        for i, (Z, kp) in enumerate(rows_spec):
            n_train = n_train_pool // Z if dataset == "mnist" else 60
            fed = rotated_federation(args.seed, n_devices=Z, n_local_clusters=kp,
                                     n_train=n_train, n_test=n_test, dataset=dataset,
                                     data_dir=str(args.data_dir))
            print(f"{fed.description}", flush=True)
            for fm in maps:  # what k-FED clusters: one-round runs, clustering quality only
                maps_rows.append({"devices": Z, "k_local": kp, "feature_map": fm,
                                  **cluster_quality(fed, kp, fm, n_hidden, args)})
            makers = {
                "global": ("global FedAvg", lambda: FedAvg(**kw)),
                "ifca": ("IFCA", lambda: IFCA(n_clusters=4, **kw)),
                "kfed": ("k-FED + FedAvg", lambda: ClusteredFedAvg(
                    n_clusters=4, n_local_clusters=kp, routing="soft-gate", **kw)),
                "kfed_paper": ("k-FED + FedAvg (paper)", lambda: ClusteredFedAvg(
                    n_clusters=4, n_local_clusters=kp, kfed_server="farthest-lloyd1",
                    routing="centers", **kw))}
            methods = {}
            for key, (label, make) in makers.items():
                if key in todo and not (key == "kfed_paper" and kp == 1):
                    methods[key] = run_method(label, make(), fed)
            rows.append({"devices": Z, "k_local": kp, "n_train_per_device": n_train,
                         "paper": PAPER.get((Z, kp)), "methods": methods})
            write(args, dataset, rounds, n_test, n_hidden, note, epoch_ms, rows, maps_rows)
    table = []
    nan = {"test_accuracy": float("nan"), "bytes_down": float("nan"), "time_s": float("nan")}
    for r in rows:
        m, pp = r["methods"], r["paper"] or (None, None, None)
        g, i, k = (m.get(key, nan) for key in ("global", "ifca", "kfed"))
        kp = m.get("kfed_paper", {})
        table.append([f"{r['devices']} dev k'={r['k_local']}",
                      g["test_accuracy"], pp[0], i["test_accuracy"], pp[1],
                      k["test_accuracy"], kp.get("test_accuracy"), pp[2],
                      k.get("cluster_accuracy"), k.get("point_agreement"),
                      kp.get("point_agreement"), i["bytes_down"] / max(k["bytes_down"], 1),
                      g["time_s"], i["time_s"], k["time_s"]])
    C.print_table(["row", "global", "paper", "IFCA", "paper", "k-FED+FA", "k-FED+FA (paper's)",
                   "paper", "k-FED clusters", "points", "points (paper's)", "IFCA/k-FED down",
                   "t global", "t IFCA", "t k-FED"],
                  table, title=f"Table 2 ({dataset}, {rounds} rounds x {args.local_epochs} "
                               f"local epochs, lr {args.lr}; test accuracy %)")
    route_rows = [[f"{r['devices']} dev k'={r['k_local']}", key, *(
        v.get("routing_accuracy", {}).get(x) for x in ("centers", "confidence", "gate", "soft-gate"))]
        for r in rows for key, v in r["methods"].items() if "routing_accuracy" in v]
    if route_rows:
        C.print_table(["row", "method", "centers", "confidence", "gate", "soft gate"], route_rows,
                      title="k' = 2: prediction routing of the same trained models (accuracy %)")
    C.print_table(["row", "feature map", "device clusters", "point clusters", "k-FED s"],
                  [[f"{r['devices']} dev k'={r['k_local']}", r["feature_map"],
                    r["device_accuracy"], r["point_accuracy"], r["time_s"]] for r in maps_rows],
                  title="k-FED's clustering of the rotations by feature map (matched accuracy)")
    write(args, dataset, rounds, n_test, n_hidden, note, epoch_ms, rows, maps_rows)

    def draw(plt):
        fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.2), squeeze=False)
        for ax, r in zip(axes[0], rows):
            for k, v in r["methods"].items():
                ax.plot(range(1, len(v["curve"]) + 1), [100 * a for a in v["curve"]], label=k)
            ax.set_title(f"{r['devices']} devices, k'={r['k_local']}", fontsize=9)
            ax.set_xlabel("round")
            ax.set_ylabel("test accuracy %")
        axes[0][0].legend(fontsize=7)

    C.save_plot(args, "fl_table2", draw)


if __name__ == "__main__":
    main()
