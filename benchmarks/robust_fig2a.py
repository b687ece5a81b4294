"""Robust FL Fig. 2a: misclustering vs iteration — Lloyd vs trimmed k-means vs k-geomedians.

Ghosh, Hong, Yin & Ramchandran, "Robust federated learning in a heterogeneous
environment" (2019), §6.1, Figure 2(a). A mixture of linear regressions over m
machines (``x ~ N(0, I_d)``, ``y = x·w*_j + noise``, k clusters); a fraction
alpha of the machines are Byzantine, their ERMs drawn far away
(``w ~ N(0, byzantine_scale²)``). Every machine's least-squares ERM is
clustered (stage 2 of the pipeline) starting from labels with a fraction
``--correct`` of the honest machines right (the rest wrong, uniformly; the
Byzantine machines random). We plot the misclustering rate of the honest
machines (their label differs from their true cluster; the start fixes the
label correspondence) against the iteration, for

* Lloyd (k-means; mean centres) — the paper: it *plateaus near alpha*;
* trimmed k-means (Algorithm 2; geometric median, radius 3 x median distance,
  mean of the kept points) — the paper: *decays fast* (exponentially);
* k-geomedians — the same without the trimming.

The paper's constants (m, d, n, alpha, the Byzantine law) did not survive in
the seed text; ours are printed with the table and stored in the JSON.
"""

from __future__ import annotations

import numpy as np

import _common as C
from fedclust.robust import KGeomedians, KMeansLloyd, TrimmedKMeans, make_mixture_regression
from fedclust.robust.local import local_erm

METHODS = {
    "Lloyd (k-means)": lambda k, T: KMeansLloyd(k, max_iter=T),
    "trimmed k-means": lambda k, T: TrimmedKMeans(k, max_iter=T),
    "k-geomedians": lambda k, T: KGeomedians(k, max_iter=T),
}
PAPER = {"Lloyd (k-means)": "plateaus near alpha", "trimmed k-means": "decays fast",
         "k-geomedians": "decays fast"}


def initial_labels(truth: np.ndarray, k: int, correct: float, rng) -> np.ndarray:
    """Honest machines keep their label with probability ``correct``, else a wrong one
    (uniform); Byzantine machines (truth -1) get a uniform label."""
    lab = truth.copy()
    honest = truth >= 0
    wrong = honest & (rng.random(len(truth)) >= correct)
    lab[wrong] = (truth[wrong] + rng.integers(1, k, wrong.sum())) % k
    lab[~honest] = rng.integers(0, k, (~honest).sum())
    return lab


def curve(history, truth, T: int) -> np.ndarray:
    """Misclustering of the honest machines at iterations 0..T (padded after convergence)."""
    honest = truth >= 0
    rates = [float(np.mean(h[honest] != truth[honest])) for h in history]
    rates += [rates[-1]] * (T + 1 - len(rates))
    return np.array(rates[:T + 1])


def run(args) -> dict:
    k, d, n, m = args.clusters, args.features, args.samples, args.machines
    T = args.iterations
    out = {"params": {"machines": m, "samples": n, "features": d, "clusters": k,
                      "noise": args.noise, "byzantine_scale": args.byzantine_scale,
                      "correct": args.correct, "iterations": T, "trials": args.trials,
                      "alphas": args.alphas}, "rows": []}
    for alpha in args.alphas:
        curves = {name: [] for name in METHODS}
        for t in range(args.trials):
            seed = args.seed + t
            mr = make_mixture_regression(m, n, d, k, alpha=alpha, noise=args.noise,
                                         byzantine_scale=args.byzantine_scale, random_state=seed)
            W = np.array([local_erm(X, y, fit_intercept=False)[:d] for X, y in zip(mr.Xs, mr.ys)])
            init = initial_labels(mr.clusters, k, args.correct, np.random.default_rng(seed))
            for name, make in METHODS.items():
                est = make(k, T).fit(W, init_labels=init)
                curves[name].append(curve(est.labels_history_, mr.clusters, T))
        for name in METHODS:
            c = np.array(curves[name])
            out["rows"].append({"alpha": alpha, "method": name, "mean": c.mean(axis=0),
                                "std": c.std(axis=0), "final_mean": float(c[:, -1].mean()),
                                "paper": PAPER[name]})
    return out


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--machines", type=int, default=None)
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--clusters", type=int, default=4)
    p.add_argument("--noise", type=float, default=2.5)
    p.add_argument("--byzantine-scale", type=float, default=10.0)
    p.add_argument("--correct", type=float, default=0.4,
                   help="fraction of honest machines correctly labelled at the start")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--trials", type=int, default=None)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.2])
    args = C.finish_args(p.parse_args(argv))
    args.machines = args.machines or (100 if args.quick else 400)
    args.trials = args.trials or (2 if args.quick else 10)
    with C.blas_limit(args):
        res = run(args)
    T = args.iterations
    shown = sorted({0, 1, 2, 3, 5, T})
    rows = []
    for r in res["rows"]:
        rows.append([f"{r['alpha']:.2f}", r["method"], *[r["mean"][i] for i in shown if i <= T],
                     r["paper"]])
    C.print_table(["alpha", "method", *[f"it {i}" for i in shown if i <= T], "paper"], rows,
                  title=f"misclustering of honest machines (mean of {args.trials} trials; "
                        f"m={args.machines}, d={args.features}, k={args.clusters}, "
                        f"n={args.samples}, start {args.correct:.0%} correct)")

    def draw(plt):
        alphas = args.alphas
        fig, axes = plt.subplots(1, len(alphas), figsize=(4.2 * len(alphas), 3.4), squeeze=False)
        for ax, alpha in zip(axes[0], alphas):
            for r in res["rows"]:
                if r["alpha"] == alpha:
                    ax.errorbar(np.arange(T + 1), r["mean"], yerr=r["std"], marker=".",
                                capsize=2, label=r["method"])
            ax.axhline(alpha, color="grey", ls=":", lw=1, label="alpha")
            ax.set_xlabel("iteration")
            ax.set_ylabel("misclustering rate")
            ax.set_title(f"alpha = {alpha}", fontsize=9)
            ax.legend(fontsize=7)

    C.save_plot(args, "robust_fig2a", draw)
    C.write_json(args, "robust_fig2a", res)
    return res


if __name__ == "__main__":
    main()
