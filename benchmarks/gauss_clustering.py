"""Federated evolving Gaussian clustering: the paper's Figure 2, unseen sets, a 100k stream.

Ožbot & Škrjanc, "Federated learning with self-evolving Gaussian clusters",
Fig. 2: S1, S2, S4, R15 (Gaussian-like) and Aggregation, Flame, Jain, Spiral
(non-Gaussian), data split randomly over 3 owners, one round, fedclust
defaults (one setting for every set). We report the ARI against the reference
labels (0 = noise counts as its own label), the number of clusters found vs the
reference, and — for context — the ARI of a centralised scikit-learn
GaussianMixture started at the true cluster means (an "oracle" that knows k
and the answer: on S3/S4 the clusters overlap so much that even it stays
far below 0.9). The paper shows the figure only (no numbers): the "paper"
column states what its figure shows. The check: S1, S2, S4, R15 ARI
>= 0.9 and cluster count within 20%. Unseen Gaussian-like sets with 8-50
clusters (A1-A3, D31, S3, Unbalance, the G2 sets in 2-D and 8-D, generated
``blobs_k_D_seed`` sets: k = 15-50 blobs of 4x-varying widths in D = 2-5 placed at
random, so some overlap, and ``gen_k_D_seed`` sets: k = 15-50 blobs of 4x-varying
widths in D = 2, 3, 5 placed at least 2.5 (sigma_i + sigma_j) apart by
:func:`fedclust.gauss.datasets.separated_blobs`, oracle ARI >= 0.98) check that the
defaults carry over. Seeds: 3 random owner splits (mean ARI). Every set is also run
with the paper's volume merge criterion (``merge_test="volume"``) for comparison.

Plain data: one Gaussian (2-D and 10-D, 5,000 points), a uniform square and cube, two
elongated overlapping Gaussians, one owner with 20,000 rows of one Gaussian (1-D, 2-D) or
6,000 rows of two unit Gaussians 4 apart, and the four heart-disease hospitals
(standardised, one owner each), beside scikit-learn's ``BayesianGaussianMixture`` (Dirichlet-process
prior, 30 components) and ``GaussianMixture`` with the number of components chosen by
BIC over 1..30, both on the pooled data: clusters found (components that hold a sample)
and ARI where labels exist. Reference methods on Aggregation and S4: k-means with the
true k, GaussianMixture with BIC-chosen k, the oracle GaussianMixture.

Mechanisms (``--ablation``): the default with one piece removed at a time, one split.

Servers (``--servers``): the flat server against ``server="tree"`` on S2, S4, R15, A1 and
D31 split at random over 3, 10, 30 and 100 owners (one split, ``--seed``): ARI of each,
and the clusters found where they differ (``--quick``: two generated sets, 3 to 30 owners);
the natural federations of ``real_federations.py`` with more than 8 sites (3 seeds); one
Gaussian (2-D and 10-D) over 3 to 30 owners.

Stream: Birch1 (100,000 x 2, 100 clusters; rows shuffled once) learnt by one
:class:`~fedclust.EvolvingGaussians` in blocks of 1,000 rows; the time per
sample of every 10,000-row stretch should stay flat as the stream grows
(bounded cluster count, O(c D^2) per sample).

``--quick``: synthetic blobs instead of the sipu files, a 20,000-row stream.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

import _common as C
from fedclust import EvolvingGaussians, FedGaussClustering
from fedclust.gauss.datasets import separated_blobs
from fedclust.gauss.hooks import gauss_blobs

FIG2 = ["s1", "s2", "s4", "r15", "aggregation", "flame", "jain", "spiral"]
UNSEEN = ["a1", "a2", "a3", "d31", "s3", "unbalance"]
GAUSSIAN = {"s1", "s2", "s4", "r15"}
#: well-separated generated sets (k, D, seed): "Gaussian-like sets with 15-50 clusters"
GENERATED = [f"gen_{k}_{D}_{s}" for k, D, s in [(20, 2, 0), (30, 2, 1), (50, 2, 2), (15, 3, 3),
                                               (35, 3, 4), (25, 5, 5), (40, 5, 6), (50, 5, 7)]]
GEN_SEPARATION = 2.5
#: higher-dimensional sets: scikit-learn make_blobs defaults (unit blobs, centres in
#: [-10, 10]^D, 200 per blob: ``mb_k_D_seed``), DIM-like sets (64 per blob in 32-64 D:
#: ``dim_k_D_seed``) and separated blobs of 4x-varying widths in 8-10 D
HIGH_D = ["mb_30_5_1", "mb_50_8_3", "mb_40_10_2", "dim_16_32_0", "dim_16_64_1",
          "gen_20_8_1", "gen_15_8_4", "gen_30_10_2"]
PAPER = {"s1": "good", "s2": "good", "s4": "good", "r15": "good",
         "aggregation": "one Gaussian cannot describe a cluster", "flame": "idem",
         "jain": "idem", "spiral": "idem"}


def loaded(args, names):
    """``(name, X, y)`` for each set of ``names`` that :func:`load` finds."""
    for name in names:
        data = load(args, name)
        if data is not None:
            yield (name, *data)


def load(args, name):
    if name.startswith(("mb_", "dim_")):
        from sklearn.datasets import make_blobs

        kind, k, D, s = name.split("_")
        per = 200 if kind == "mb" else 64
        X, y = make_blobs(n_samples=per * int(k), n_features=int(D), centers=int(k),
                          random_state=int(s))
        return X, y + 1
    if name.startswith("blobs_"):
        return synthetic(name)
    if name.startswith("gen_"):
        _, k, D, s = name.split("_")
        return separated_blobs(int(s), int(k), int(D), separation=GEN_SEPARATION)
    base = Path(args.data_dir) / "clustering-benchmarks-v1"
    f = base / "sipu" / f"{name}.npz"
    if not f.exists():
        f = base / "g2mg" / f"{name}.npz"
    if not f.exists():
        return None
    d = np.load(f, allow_pickle=False)
    return d["X"].astype(float), d["y"]


def oracle_ari(X, y):
    labs = np.unique(y[y > 0]) if (y > 0).any() else np.unique(y)
    means = np.array([X[y == c].mean(axis=0) for c in labs])
    gm = GaussianMixture(len(labs), means_init=means, random_state=0).fit(X)
    return float(adjusted_rand_score(y, gm.predict(X)))


def synthetic(name):
    """blobs_k_D_seed: k Gaussian blobs in D dimensions, 100-400 points each, widths
    0.5-2 (a 4x range), centres uniform in a box that grows like k^(1/D); a stand-in for
    "Gaussian-like sets with 15-50 clusters we have not seen"."""
    from sklearn.datasets import make_blobs

    _, k, D, s = name.split("_")
    k, D, s = int(k), int(D), int(s)
    rng = np.random.default_rng(s)
    box = 10 * k ** (1 / D)
    X, y = make_blobs(n_samples=rng.integers(100, 400, k), n_features=D,
                      cluster_std=rng.uniform(0.5, 2.0, k), center_box=(-box, box),
                      random_state=s)
    return X, y + 1


def run_set(X, y, seeds, **kw):
    aris, ks, models = [], [], []
    for s in seeds:
        parts = np.array_split(np.random.default_rng(s).permutation(len(X)), 3)
        t0 = time.perf_counter()
        fc = FedGaussClustering(random_state=s, **kw).fit([X[p] for p in parts])
        dt = time.perf_counter() - t0
        aris.append(adjusted_rand_score(y, fc.predict(X)))
        ks.append(fc.n_clusters_)
        models.append((fc, dt))
    return aris, ks, models


def clustering(args, names, seeds, title):
    out, rows, figs = {}, [], {}
    for name, X, y in loaded(args, names):
        k_ref = len(np.unique(y[y > 0]))
        aris, ks, models = run_set(X, y, seeds)
        old_aris, old_ks, _ = run_set(X, y, seeds, merge_test="volume")  # the paper's rule
        orc = oracle_ari(X, y)
        within = abs(np.mean(ks) - k_ref) <= 0.2 * k_ref
        out[name] = {"ari": aris, "ari_mean": float(np.mean(aris)), "clusters": ks,
                     "paper_volume_rule": {"ari_mean": float(np.mean(old_aris)),
                                           "clusters": old_ks},
                     "reference_clusters": k_ref, "oracle_gmm_ari": orc,
                     "bytes_up_per_owner": [m.communication_["bytes_up"] / 3 for m, _ in models],
                     "fit_seconds": [dt for _, dt in models]}
        target = "-"
        if name in GAUSSIAN or name in UNSEEN or name.startswith(("blobs_", "gen_", "mb_", "dim_")):
            target = "yes" if (np.mean(aris) >= 0.9 and within) else "NO"
        rows.append([name, X.shape[0], k_ref, f"{np.mean(aris):.3f}", f"{np.min(aris):.3f}",
                     f"{np.mean(ks):.1f}", "yes" if within else "no", f"{orc:.3f}", target,
                     f"{np.mean(old_aris):.3f}", f"{np.mean(old_ks):.1f}",
                     PAPER.get(name, "(unseen)")])
        figs[name] = (X, y, models[0][0])
    C.print_table(["set", "n", "ref k", "ARI mean", "ARI min", "clusters", "k within 20%",
                   "oracle GMM ARI", "check met", "ARI, paper's volume rule",
                   "clusters, volume rule",
                   "paper (Fig. 2)"], rows, title=title)
    return out, figs


def plain_sets(args, quick):
    """The plain-data block: (name, X, labels or None, list of owners' rows)."""
    rng = np.random.default_rng(args.seed)
    n = 1500 if quick else 5000
    out = [("one Gaussian 2-D", rng.standard_normal((n, 2)), None),
           ("one Gaussian 10-D", rng.standard_normal((n, 10)), None),
           ("uniform square", rng.uniform(size=(n // 2, 2)), None),
           ("uniform cube", rng.uniform(size=(n // 2, 3)), None)]
    A = np.diag([4.0, 0.5])
    rot = np.array([[0.8, 0.6], [-0.6, 0.8]])
    X = np.vstack([rng.standard_normal((n // 4, 2)) @ A,
                   rng.standard_normal((n // 4, 2)) @ A @ rot + [0.0, 1.5]])
    out.append(("two elongated overlapping", X, np.repeat([0, 1], n // 4)))
    # three owners with random rows each
    out = [(name, X, y, [X[i] for i in np.array_split(rng.permutation(len(X)), 3)])
           for name, X, y in out]
    # one owner holding many rows of one Gaussian (1-D and 2-D, random covariance)
    big = 5000 if quick else 20000
    for D in (1, 2):
        L = rng.standard_normal((D, D)) + np.eye(D)
        X = rng.standard_normal((big, D)) @ L.T + 3.0
        out.append((f"one Gaussian {D}-D, one owner", X, None, [X]))
    # one owner streaming two equal unit Gaussians 4 apart (a wide cluster formed early
    # must not swallow the other's tail)
    half = 1000 if quick else 3000
    X = np.vstack([rng.standard_normal((half, 2)), rng.standard_normal((half, 2)) + [4.0, 0.0]])
    order = rng.permutation(len(X))
    X, y = X[order], np.repeat([0, 1], half)[order]
    out.append(("two unit Gaussians 4 apart, one owner", X, y, [X]))
    heart = Path(args.data_dir) / "uci-extra" / "heart-disease"
    if (heart / "heart_cleveland.npz").exists() and not quick:
        hs = [np.load(heart / f"heart_{h}.npz", allow_pickle=False)["X"]
              for h in ("cleveland", "hungarian", "switzerland", "va")]
        X = np.vstack(hs)
        X = np.where(np.isnan(X), np.nanmean(X, axis=0), X)
        sd = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
        cuts = np.cumsum([len(h) for h in hs])[:-1]
        out.append(("heart hospitals (standardised)", X, None, np.split(X, cuts)))
    return out


def plain(args, quick):
    """Clusters found on plain data, ours beside two scikit-learn references."""
    from sklearn.mixture import BayesianGaussianMixture

    rows, out = [], {}
    kmax = 10 if quick else 30
    for name, X, y, owners in plain_sets(args, quick):
        fc = FedGaussClustering(random_state=args.seed).fit(owners)
        ours = fc.predict(X)
        dp = BayesianGaussianMixture(
            n_components=30, weight_concentration_prior_type="dirichlet_process",
            max_iter=500, random_state=args.seed).fit(X).predict(X)
        bics = [GaussianMixture(k, random_state=args.seed).fit(X) for k in range(1, kmax + 1)]
        best = min(bics, key=lambda g: g.bic(X))
        bic = best.predict(X)
        top2 = float(np.sort(fc.counts_)[::-1][:2].sum() / len(X))
        single = EvolvingGaussians().fit(X)  # one owner, the rows in order
        ari = (lambda lab: f"{adjusted_rand_score(y, lab):.3f}") if y is not None else (
            lambda lab: "-")
        out[name] = {"n": len(X), "D": X.shape[1], "owners": len(owners),
                     "clusters": int(fc.n_clusters_), "share_in_two_largest": top2,
                     "counts_sum": int(fc.counts_.sum()), "removed": int(fc.removed_samples_),
                     "single_owner_clusters": int(single.n_clusters_),
                     "dp_clusters": int(np.unique(dp).size), "bic_k": int(best.n_components),
                     "ari": None if y is None else float(adjusted_rand_score(y, ours)),
                     "dp_ari": None if y is None else float(adjusted_rand_score(y, dp)),
                     "bic_ari": None if y is None else float(adjusted_rand_score(y, bic))}
        rows.append([name, len(X), X.shape[1], len(owners), fc.n_clusters_, f"{top2:.2f}",
                     f"{int(fc.counts_.sum())} + {fc.removed_samples_}", ari(ours),
                     single.n_clusters_,
                     np.unique(dp).size, ari(dp), best.n_components, ari(bic)])
    C.print_table(["data", "n", "D", "owners", "clusters (ours)", "share in 2 largest",
                   "counts + removed", "ARI (ours)", "EvolvingGaussians.fit clusters",
                   "DP-GMM clusters", "DP-GMM ARI",
                   "GMM BIC k", "GMM BIC ARI"], rows,
                  title=f"Plain data (ours: defaults; references on the pooled data, "
                        f"BIC over k = 1..{kmax})")
    return out


def references(args, names):
    """k-means with the true k and GaussianMixture with BIC-chosen k, pooled data."""
    from sklearn.cluster import KMeans

    rows, out = [], {}
    for name, X, y in loaded(args, names):
        k = len(np.unique(y[y > 0]))
        km = KMeans(k, n_init=10, random_state=args.seed).fit_predict(X)
        fits = [GaussianMixture(j, random_state=args.seed).fit(X) for j in range(1, 31)]
        best = min(fits, key=lambda g: g.bic(X))
        out[name] = {"kmeans_ari": float(adjusted_rand_score(y, km)),
                     "gmm_bic_k": int(best.n_components),
                     "gmm_bic_ari": float(adjusted_rand_score(y, best.predict(X))),
                     "oracle_gmm_ari": oracle_ari(X, y)}
        rows.append([name, k, f"{out[name]['kmeans_ari']:.3f}", best.n_components,
                     f"{out[name]['gmm_bic_ari']:.3f}", f"{out[name]['oracle_gmm_ari']:.3f}"])
    C.print_table(["set", "ref k", "k-means ARI (true k)", "GMM BIC k", "GMM BIC ARI",
                   "oracle GMM ARI"], rows, title="Reference methods (pooled data)")
    return out


def ablation(args, names):
    """The default with one mechanism removed at a time (one owner split)."""
    from fedclust.gauss import consolidate as CO
    from fedclust.gauss import estimator as E
    from fedclust.gauss import lazy_merge as LM
    from fedclust.gauss import model as M
    from fedclust.gauss import server as SV

    variants = {
        "default": {},
        "no neighbour birth scale": {"patch": ("set_birth_scale", lambda self, X: None)},
        "no owner split": {"patch": ("split_by_rows", lambda self, X, labels, **kw: 0)},
        "BIC with full covariances only": {"patch": (
            "_bic_logdets", lambda self, n, S, f=M.ClusterSet._bic_logdets: f(self, n, S)[-1:]),
            # the server's merge scores every pair exactly (its bounds assume both families)
            "exact_merge": True},
        "no regrouping": {"regroup": True},
        "no piece consolidation": {"module_patch": "consolidate"},
        "plain BIC (merge_tol=0)": {"kw": {"merge_tol": 0.0}},
        "paper's volume rule instead of BIC": {"kw": {"merge_test": "volume"}},
    }
    rows, out = [], {}
    for name, X, y in loaded(args, names):
        row = [name]
        for label, v in variants.items():
            patch = v.get("patch")
            old = getattr(M.ClusterSet, patch[0]) if patch else None
            if patch:
                setattr(M.ClusterSet, patch[0], patch[1])
            fn = v.get("module_patch")
            if fn:  # the server and compact() call it by module name
                old_fn = getattr(SV, fn)
                setattr(SV, fn, lambda cs, pieces: 0)
                setattr(E, fn, lambda cs, pieces: 0)
            old_regroup, old_scores = CO.regroup, LM._scores
            if v.get("exact_merge"):
                LM._scores = lambda cs, bound, p, q: cs._merge_scores(p, q)[0]
            if v.get("regroup"):   # the consolidation's regrouping step changes nothing
                CO.regroup = lambda cs, z, *a, **kw: (0, z)
            try:
                aris, ks, _ = run_set(X, y, [args.seed], **v.get("kw", {}))
            finally:
                CO.regroup, LM._scores = old_regroup, old_scores
                if patch:
                    setattr(M.ClusterSet, patch[0], old)
                if fn:
                    setattr(SV, fn, old_fn)
                    setattr(E, fn, old_fn)
            out.setdefault(name, {})[label] = {"ari": aris[0], "clusters": ks[0]}
            row.append(f"{aris[0]:.3f} / {ks[0]}")
        rows.append(row)
    C.print_table(["set"] + [f"{k}: ARI / clusters" for k in variants], rows,
                  title="Mechanisms of the default, one removed at a time (one split)")
    return out


def servers(args, names, owner_counts):
    """ARI / clusters of the flat and the trie server, one random split per owner count."""
    rows, out = [], {}
    for name, X, y in loaded(args, names):
        row = [name]
        for m in owner_counts:
            parts = np.array_split(np.random.default_rng(args.seed).permutation(len(X)), m)
            res = {}
            for server in ("flat", "tree"):
                fc = FedGaussClustering(random_state=args.seed, server=server).fit(
                    [X[p] for p in parts])
                res[server] = (float(adjusted_rand_score(y, fc.predict(X))), fc.n_clusters_)
            out.setdefault(name, {})[str(m)] = {k: {"ari": a, "clusters": c}
                                                for k, (a, c) in res.items()}
            (af, kf), (at, kt) = res["flat"], res["tree"]
            row.append(f"{af:.3f} / {at:.3f}" + (f" ({kf} / {kt})" if kf != kt else ""))
        rows.append(row)
    C.print_table(["set"] + [f"{m} owners: flat / tree" for m in owner_counts], rows,
                  title="ARI, flat / tree server (clusters where they differ; one split)")
    return out


def servers_one_gaussian(args, owner_counts=(3, 10, 30)):
    """Clusters found by the flat and the trie server on one Gaussian (5,000 rows, 2-D and
    10-D) split at random over 3 to 30 owners."""
    rows, out = [], {}
    rng = np.random.default_rng(args.seed)
    for D in (2, 10):
        X = rng.normal(size=(5000, D))
        row = [f"one Gaussian {D}-D"]
        for m in owner_counts:
            parts = np.array_split(np.random.default_rng(args.seed).permutation(len(X)), m)
            ks = [FedGaussClustering(random_state=args.seed, server=server).fit(
                [X[p] for p in parts]).n_clusters_ for server in ("flat", "tree")]
            out[f"{D}-D/{m}"] = ks
            row.append(f"{ks[0]} / {ks[1]}")
        rows.append(row)
    C.print_table(["data"] + [f"{m} owners: flat / tree clusters" for m in owner_counts],
                  rows, title="One Gaussian, flat / tree server")
    return out


def servers_natural(args, seeds):
    """Mean ARI / clusters of the flat and the trie server on the natural federations
    of ``real_federations.py`` with more sites than a trie leaf holds (8)."""
    import real_federations as R

    rows, out = [], {}
    for name, load_fed in R.FEDERATIONS.items():
        try:
            devices, ys = load_fed(args.data_dir)
        except FileNotFoundError:
            continue
        if ys is None or len(devices) <= 8:   # up to 8 sites the trie is one leaf: flat
            continue
        y = np.concatenate(ys)
        res = {}
        for server in ("flat", "tree"):
            fits = [FedGaussClustering(random_state=s, server=server).fit(devices)
                    for s in seeds]
            res[server] = {"ari": [float(adjusted_rand_score(y, f.labels_)) for f in fits],
                           "clusters": [f.n_clusters_ for f in fits]}
        out[name] = res
        rows.append([name, len(devices)] + [
            f"{np.mean(res[k]['ari']):.3f} / {np.mean(res[k]['clusters']):.1f}"
            for k in ("flat", "tree")])
    C.print_table(["federation", "sites", "flat: ARI / clusters", "tree: ARI / clusters"],
                  rows, title=f"Natural federations over 8 sites ({len(seeds)} seeds)")
    return out


def stream(args, X, block=1000, stretch=10000, passes=3):
    """Median over ``passes`` fresh passes of the wall and CPU time per sample of every stretch."""
    walls, cpus = [], []
    for _ in range(passes):
        m = EvolvingGaussians()
        wall, cpu, clusters = [], [], []
        tw = tc = 0.0
        for start in range(0, len(X), block):
            t0, c0 = time.perf_counter(), time.process_time()
            m.partial_fit(X[start:start + block])
            tw += time.perf_counter() - t0
            tc += time.process_time() - c0
            if (start + block) % stretch == 0:
                wall.append(1e3 * tw / stretch)
                cpu.append(1e3 * tc / stretch)
                clusters.append(m.n_clusters_)
                tw = tc = 0.0
        walls.append(wall)
        cpus.append(cpu)
    wall = np.median(walls, axis=0)
    cpu = np.median(cpus, axis=0)
    rows = [[f"{(i + 1) * stretch}", f"{w:.4f}", f"{c:.4f}", k]
            for i, (w, c, k) in enumerate(zip(wall, cpu, clusters))]
    C.print_table(["samples seen", "ms/sample wall", "ms/sample CPU", "clusters"], rows,
                  title=f"Stream: {len(X)} samples, one owner, blocks of {block} "
                        f"(median of {passes} passes)")
    half = len(cpu) // 2
    ratio = float(np.mean(cpu[half:]) / np.mean(cpu[1:half])) if half > 1 else float("nan")
    print(f"flatness: CPU time per sample, second half / first half (without the first "
          f"stretch, where the clusters form) = {ratio:.2f}")
    from fedclust.gauss import fast_scan

    loop = "numba" if fast_scan.HAVE_NUMBA else "numpy (numba did not import)"
    print(f"compiled loop: {loop}")
    return {"ms_per_sample_wall": wall.tolist(), "ms_per_sample_cpu": cpu.tolist(),
            "clusters": clusters, "late_over_early_cpu": ratio, "loop": loop}


def main() -> None:
    parser = C.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--ablation", action="store_true",
                        help="also run the default with one mechanism removed at a time")
    parser.add_argument("--ablation-only", action="store_true",
                        help="only the mechanisms' table (--ablation without the rest)")
    parser.add_argument("--servers", action="store_true",
                        help="only the flat server against server='tree' at 3 to 100 owners")
    parser.add_argument("--plain-only", action="store_true",
                        help="only the plain-data block and the reference methods")
    args = C.finish_args(parser.parse_args())
    seeds = [args.seed] if args.quick else [args.seed + r for r in range(3)]
    payload = {}
    with C.blas_limit(args):
        have_data = load(args, "s1") is not None and not args.quick
        if args.servers:
            payload["servers"] = (servers(args, ["s2", "s4", "r15", "a1", "d31"],
                                          [3, 10, 30, 100]) if have_data else
                                  servers(args, ["gen_15_2_3", "gen_20_3_4"], [3, 10, 30]))
            payload["servers_natural"] = servers_natural(args, seeds)
            payload["servers_one_gaussian"] = servers_one_gaussian(args)
            C.write_json(args, "gauss_clustering_servers", payload)
            return
        if args.ablation_only:
            args.ablation, args.plain_only = True, True
        else:
            payload["plain"] = plain(args, args.quick)
        if have_data and not args.ablation_only:
            payload["references"] = references(args, ["aggregation", "s4"])
        if args.ablation and have_data:
            payload["ablation"] = ablation(args, ["s1", "s2", "r15", "a1", "a3", "d31", "s4",
                                                  "aggregation", "gen_40_5_6", "gen_50_5_7",
                                                  "mb_40_10_2",
                                                  "gen_30_10_2", "dim_16_64_1"])
        if args.plain_only:
            C.write_json(args, "gauss_clustering_ablation" if args.ablation_only
                         else "gauss_clustering", payload)
            return
        if have_data:
            payload["fig2"], figs = clustering(args, FIG2, seeds, "Figure 2 sets (3 owners, one round, defaults)")
            g2 = [f"g2mg_2_{o}" for o in (10, 30, 50, 70)] + ["g2mg_8_30", "g2mg_8_50"]
            g2 += ["blobs_20_2_1", "blobs_30_2_2", "blobs_50_2_3", "blobs_15_3_4",
                   "blobs_25_5_5", "blobs_40_4_6"]
            payload["unseen"], _ = clustering(args, UNSEEN + g2, seeds,
                                              "Unseen Gaussian-like sets (same defaults)")
            payload["generated"], _ = clustering(
                args, GENERATED, seeds, f"Generated well-separated sets (separated_blobs, "
                                        f"separation {GEN_SEPARATION}; same defaults)")
            payload["high_d"], _ = clustering(args, HIGH_D, seeds,
                                              "Higher-dimensional sets (5-64 D; same defaults)")
            X = load(args, "birch1")[0]
        else:
            print("note: no sipu data (or --quick): synthetic 2-D blobs instead")
            figs, out = {}, {}
            for k in (15, 30):
                X, y = gauss_blobs(args.seed, n_clusters=k, n_per_cluster=100)
                aris, ks, models = run_set(X, y, seeds)
                out[f"blobs{k}"] = {"ari_mean": float(np.mean(aris)), "clusters": ks}
                figs[f"blobs{k}"] = (X, y, models[0][0])
                print(f"blobs{k}: ARI {np.mean(aris):.3f}, clusters {ks} (reference {k})")
            payload["synthetic"] = out
            gen, _ = clustering(args, ["gen_15_3_3"], seeds, "Generated well-separated set")
            payload["generated"] = gen
            X = gauss_blobs(args.seed, n_clusters=50, n_per_cluster=400)[0]
        # a stationary stream: Birch1's file order walks the grid of clusters, so the cost
        # of a stretch there follows how many new regions it enters, not the stream length
        X = X[np.random.default_rng(args.seed).permutation(len(X))]
        payload["stream"] = stream(args, X if not args.quick else X[:20000],
                                   stretch=10000 if len(X) >= 50000 else 2000)

    def draw(plt):
        from fedclust.plotting import plot_gaussian_clusters

        n = len(figs)
        cols = 4 if n > 2 else n
        rows = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 4 * rows), squeeze=False)
        for ax, (name, (X, y, fc)) in zip(axes.ravel(), figs.items()):
            ari = adjusted_rand_score(y, fc.predict(X))
            plot_gaussian_clusters(ax, X, fc.means_, fc.covariances_, fc.predict(X),
                                   title=f"{name}: {fc.n_clusters_} clusters, ARI {ari:.2f}")
        for ax in axes.ravel()[n:]:
            ax.axis("off")

    C.save_plot(args, "gauss_clustering", draw)
    C.write_json(args, "gauss_clustering", payload)


if __name__ == "__main__":
    main()
