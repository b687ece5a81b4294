"""k-means cost against communication for disPCA + distributed coreset (Liang et al. 2014, Fig. 2).

For every dataset, topology, projection dimension ``n_components`` in
{5, 10, 20, 40, 80, none} and three coreset sizes (MNIST 1000, 2500, 5000; the
DSA-like set, 9,120 points, 500, 1000, 2000), fit
``DistributedKMeans(method="coreset")`` and the COMBINE baseline
(``method="combine"``, same target size) over the nodes of a random graph
G(n, 0.3) and a grid, data split by the papers' "weighted" partition (node
weights |N(0,1)|). Reported: the k-means cost of the final centers on the
full original data divided by the cost of scikit-learn ``KMeans`` (k-means++,
``--ref-init`` inits) on the pooled data, against the bytes (and 8-byte words)
that crossed the graph's edges (flooding: every message crosses every edge
once or twice).

Datasets (full mode): MNIST (70,000 x 784, pixels / 255, k=10) and a
synthetic set shaped like Daily and Sports Activities (9,120 x 5,625, k=19,
a 30-dimensional signal plus isotropic noise; the real DSA is not available
here; :func:`fedclust.coreset.make_low_rank_mixture`). The paper's claim: a
few percent more cost at dimension ~40 (DSA 5625 -> 40: < 4%), with
communication independent of n and d; the distributed coreset beats COMBINE
at equal communication.

``--quick``: sklearn digits (1,797 x 64, k=10) and a 1,500 x 300 low-rank
mixture (k=8), dimensions {5, 20, none}, sizes {100, 300}, G(6, 0.3) only;
no data folder needed (also the fallback when
MNIST is missing, said in the output).
"""

from __future__ import annotations

import time

import _common as C
from fedclust import DistributedKMeans
from fedclust.coreset import make_graph, make_low_rank_mixture
from fedclust.metrics import kmeans_cost
from fedclust.sim.partition import weighted_partition

PAPER = {"mnist": "a few % above centralized at t~40 (Fig. 2)",
         "dsa-like": "DSA 5625 -> 40 dims: < 4% more cost (Fig. 2)",
         "digits": "(quick stand-in for MNIST)", "low-rank": "(quick stand-in for DSA)"}


def datasets(args):
    if args.quick:
        from sklearn.datasets import load_digits

        X, _ = load_digits(return_X_y=True)
        yield "digits", X / 16.0, 10, [5, 20, None], [100, 300]
        X, _ = make_low_rank_mixture(1500, 300, 8, signal_dim=10, random_state=args.seed)
        yield "low-rank", X, 8, [5, 20, None], [100, 300]
        return
    try:
        from fedclust.datasets import load_mnist

        X, _ = load_mnist(args.data_dir)
        yield "mnist", X, 10, [5, 10, 20, 40, 80, None], [1000, 2500, 5000]
    except Exception as exc:  # noqa: BLE001
        print(f"note: MNIST not available ({exc}); using sklearn digits instead", flush=True)
        from sklearn.datasets import load_digits

        X, _ = load_digits(return_X_y=True)
        yield "digits", X / 16.0, 10, [5, 10, 20, 40, None], [200, 500, 1000]
    X, _ = make_low_rank_mixture(9120, 5625, 19, random_state=args.seed)
    yield "dsa-like", X, 19, [5, 10, 20, 40, 80, None], [500, 1000, 2000]


def main() -> None:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=None, help="G(n, 0.3) nodes (default 10, quick 6)")
    p.add_argument("--ref-init", type=int, default=3, help="n_init of the pooled reference")
    p.add_argument("--graphs", default=None,
                   help="comma list of topologies (default gnp,grid; quick: gnp)")
    args = C.finish_args(p.parse_args())
    n_nodes = args.nodes or (6 if args.quick else 10)
    args.graphs = args.graphs or ("gnp" if args.quick else "gnp,grid")
    topologies = [g for g in args.graphs.split(",") if g]
    rows = []
    with C.blas_limit(args):
        from sklearn.cluster import KMeans

        for name, X, k, dims, sizes in datasets(args):
            t0 = time.perf_counter()
            ref = KMeans(k, n_init=args.ref_init, random_state=args.seed).fit(X)
            ref_cost = kmeans_cost(X, ref.cluster_centers_)
            print(f"{name}: {X.shape[0]} x {X.shape[1]}, k={k}; pooled sklearn cost "
                  f"{ref_cost:.6g} ({time.perf_counter() - t0:.1f} s)", flush=True)
            for topo in topologies:
                # the grid has 9 nodes (3 x 3) in full mode, as in the paper
                n = 9 if (topo == "grid" and not args.quick) else n_nodes
                graph = make_graph(topo, n, random_state=args.seed)
                devices = [X[i] for i in weighted_partition(len(X), n, random_state=args.seed)]
                for t in dims:
                    for size in sizes:
                        for method in ("coreset", "combine"):
                            t1 = time.perf_counter()
                            km = DistributedKMeans(k, size, n_components=t, graph=graph,
                                                   method=method, random_state=args.seed
                                                   ).fit(devices)
                            ratio = kmeans_cost(X, km.cluster_centers_) / ref_cost
                            comm = km.communication_
                            rows.append({
                                "dataset": name, "graph": topo, "nodes": n, "edges":
                                graph.number_of_edges(), "method": method,
                                "n_components": t if t is not None else "none",
                                "coreset_size": size, "coreset_rows": len(km.coreset_[1]),
                                "bytes": comm["bytes_total"], "words": comm["words_total"],
                                "cost_ratio": ratio, "time_s": time.perf_counter() - t1})
                            print(f"  {topo:4s} {method:7s} t={str(t):4s} size={size:5d} "
                                  f"bytes={comm['bytes_total']:>12,d} ratio={ratio:.4f} "
                                  f"({rows[-1]['time_s']:.1f} s)", flush=True)
    _report(args, rows)


def _report(args, rows) -> None:
    C.print_table(
        ["dataset", "graph", "method", "dim", "size", "bytes", "words", "cost / pooled"],
        [(r["dataset"], r["graph"], r["method"], str(r["n_components"]), r["coreset_size"],
          r["bytes"], r["words"], r["cost_ratio"]) for r in rows],
        title="Cost vs communication (Liang et al. 2014 Fig. 2; weighted partition)")
    # coreset vs COMBINE at (about) equal communication: same target size, same graph
    pairs = {}
    for r in rows:
        key = (r["dataset"], r["graph"], str(r["n_components"]), r["coreset_size"])
        pairs.setdefault(key, {})[r["method"]] = r
    comp = [(*key, v["coreset"]["bytes"], v["coreset"]["cost_ratio"], v["combine"]["bytes"],
             v["combine"]["cost_ratio"],
             "yes" if v["coreset"]["cost_ratio"] <= v["combine"]["cost_ratio"] else "no")
            for key, v in pairs.items() if {"coreset", "combine"} <= set(v)]
    C.print_table(["dataset", "graph", "dim", "size", "coreset bytes", "coreset cost",
                   "COMBINE bytes", "COMBINE cost", "coreset <= COMBINE"], comp,
                  title="Distributed coreset vs COMBINE (paper: coreset no worse, usually better)")
    wins = sum(c[-1] == "yes" for c in comp)
    print(f"coreset <= COMBINE in {wins} of {len(comp)} settings", flush=True)
    claim = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for topo in dict.fromkeys(r["graph"] for r in rows if r["dataset"] == ds):
            sel = [r for r in rows if r["dataset"] == ds and r["graph"] == topo
                   and r["method"] == "coreset"]
            biggest = max(r["coreset_size"] for r in sel)
            by_dim = {str(r["n_components"]): r for r in sel if r["coreset_size"] == biggest}
            for dim, r in by_dim.items():
                claim.append((ds, topo, dim, biggest, r["bytes"], r["cost_ratio"],
                              PAPER.get(ds, "")))
    C.print_table(["dataset", "graph", "dim", "size", "bytes", "cost / pooled", "paper"],
                  claim, title="Projection dimension at the largest coreset size, beside the claim")
    C.write_json(args, "coreset_cost_vs_comm", {
        "params": {"graphs": args.graphs, "ref_init": args.ref_init, "partition": "weighted"},
        "rows": rows, "coreset_vs_combine": [dict(zip(
            ["dataset", "graph", "dim", "size", "coreset_bytes", "coreset_cost", "combine_bytes",
             "combine_cost", "coreset_no_worse"], c)) for c in comp],
        "coreset_no_worse": [wins, len(comp)], "paper": PAPER})

    def draw(plt):
        keys = list(dict.fromkeys((r["dataset"], r["graph"]) for r in rows))
        fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
        for ax, (ds, topo) in zip(axes[0], keys):
            sel = [r for r in rows if r["dataset"] == ds and r["graph"] == topo]
            for i, dim in enumerate(dict.fromkeys(str(r["n_components"]) for r in sel)):
                for method, ls in (("coreset", "-"), ("combine", ":")):
                    pts = sorted((r["bytes"], r["cost_ratio"]) for r in sel
                                 if str(r["n_components"]) == dim and r["method"] == method)
                    ax.plot(*zip(*pts), ls, marker="o", ms=3, color=f"C{i}",
                            label=f"t={dim}" if method == "coreset" else None)
            ax.set_xscale("log")
            ax.set_xlabel("bytes over all edges")
            ax.set_ylabel("k-means cost / pooled sklearn")
            ax.set_title(f"{ds}, {topo} (solid: coreset, dotted: COMBINE)", fontsize=9)
            ax.legend(fontsize=7)

    C.save_plot(args, "coreset_cost_vs_comm", draw)


if __name__ == "__main__":
    main()
