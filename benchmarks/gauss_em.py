"""The evolving Gaussians with and without federated EM rounds (``em_rounds``).

``FedGaussClustering()`` (one round, the default) beside
``FedGaussClustering(em_rounds=30)`` (the same round, then up to 30 federated EM rounds
that keep merges, drops and splits by the row-level BIC summed over owners; they stop
early when nothing changes), on:

* S2 and S4 (SIPU, 3 random owners, 5 owner splits): ARI, clusters (mean, min-max);
* held-out sets (3 owner splits): SIPU A1, D31, R15, S1, S3, Aggregation, Unbalance and
  generated ``blobs_*``, ``gen_*``, ``mb_*`` sets (as in ``gauss_clustering.py``);
* the natural federations of ``real_federations.py`` (5 seeds): ARI beside scikit-learn's
  GaussianMixture with BIC over 1..8 components on the pooled rows, bytes up per site;
* plain data: one Gaussian (1-, 2-, 10-D; 3 owners or one owner with 20,000 rows),
  a uniform square and cube: clusters found;
* the pooled GaussianMixture's own BIC over k = 13..20 on S2 and S4 (6 starts each,
  ``max_iter=500``, ``tol=1e-6``): what a row-level BIC prefers, and the ARI there.

EM rounds used and bytes up are reported. ``--icl``: S2 / S4 (5 owner splits) and the
natural federations with ``em_criterion="icl"`` instead (the other blocks left out).
``--quick``: S2/S4 and the natural federations only, 2 seeds, the BIC curve over
k = 14..17 with 2 starts. Without the SIPU files, the generated ``blobs_15_3_4`` and
``gen_15_3_3`` stand in for S2 / S4.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

import _common as C
import gauss_clustering as G
import real_federations as R
from fedclust import FedGaussClustering

EM_ROUNDS = 30
HELD_OUT = ["a1", "d31", "r15", "s1", "s3", "aggregation", "unbalance", "blobs_20_2_1",
            "blobs_30_2_2", "blobs_15_3_4", "blobs_25_5_5", "gen_20_2_0", "mb_30_5_1",
            "gen_15_8_4"]


#: the EM rounds' model criterion (``--icl``: "icl")
CRITERION = "bic"


def _pair(devices, seed):
    a = FedGaussClustering(random_state=seed).fit(devices)
    b = FedGaussClustering(random_state=seed, em_rounds=EM_ROUNDS,
                           em_criterion=CRITERION).fit(devices)
    return a, b


def owner_splits(args, names, seeds):
    rows = []
    for name in names:
        data = G.load(args, name)
        if data is None:
            print(f"{name}: skipped (no data)")
            continue
        X, y = data
        r = {"set": name, "ari": [], "k": [], "ari_em": [], "k_em": [], "em_rounds": []}
        for s in seeds:
            parts = np.array_split(np.random.default_rng(s).permutation(len(X)), 3)
            a, b = _pair([X[p] for p in parts], s)
            r["ari"].append(adjusted_rand_score(y, a.predict(X)))
            r["ari_em"].append(adjusted_rand_score(y, b.predict(X)))
            r["k"].append(a.n_clusters_)
            r["k_em"].append(b.n_clusters_)
            r["em_rounds"].append(len(b.em_trace_))
        r["reference_k"] = int(len(np.unique(y)))
        rows.append(r)
        print(f"{name}: done", flush=True)
    return rows


def natural(args, seeds):
    rows = []
    for name, load in R.FEDERATIONS.items():
        try:
            devices, ys = load(args.data_dir)
        except FileNotFoundError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        if ys is None:
            continue
        X, y = np.concatenate(devices), np.concatenate(ys)
        r = {"federation": name, "sites": len(devices), "ari": [], "ari_em": [], "k": [],
             "k_em": [], "gmm_bic_ari": [], "bytes": [], "bytes_em": [], "em_rounds": []}
        for s in seeds:
            a, b = _pair(devices, s)
            r["ari"].append(adjusted_rand_score(y, a.labels_))
            r["ari_em"].append(adjusted_rand_score(y, b.labels_))
            r["k"].append(a.n_clusters_)
            r["k_em"].append(b.n_clusters_)
            r["gmm_bic_ari"].append(R._gmm_bic_ari(X, y, s))
            r["bytes"].append(a.communication_["bytes_up"] / len(devices))
            r["bytes_em"].append(b.communication_["bytes_up"] / len(devices))
            r["em_rounds"].append(len(b.em_trace_))
        rows.append(r)
        print(f"{name}: done", flush=True)
    return rows


def plain():
    rng = np.random.default_rng(0)
    cases = {
        "one Gaussian 2-D, 3 owners": np.array_split(rng.normal(size=(5000, 2))
                                                     @ [[1, 0.5], [0, 1]], 3),
        "one Gaussian 10-D, 3 owners": np.array_split(rng.normal(size=(5000, 10)), 3),
        "one Gaussian 1-D, one owner": [rng.normal(size=(20000, 1))],
        "one Gaussian 2-D, one owner": [rng.normal(size=(20000, 2))],
        "uniform square, 3 owners": np.array_split(rng.uniform(size=(2500, 2)), 3),
        "uniform cube, 3 owners": np.array_split(rng.uniform(size=(2500, 3)), 3),
    }
    rows = []
    for name, devices in cases.items():
        a, b = _pair(devices, 0)
        rows.append({"data": name, "k": a.n_clusters_, "k_em": b.n_clusters_,
                     "em_rounds": len(b.em_trace_)})
    return rows


def bic_curve(args, names, ks, starts):
    rows = []
    for name in names:
        data = G.load(args, name)
        if data is None:
            continue
        X, y = data
        for k in ks:
            best = min((GaussianMixture(k, random_state=s, max_iter=500, tol=1e-6).fit(X)
                        for s in range(starts)), key=lambda g: g.bic(X))
            rows.append({"set": name, "k": k, "bic": float(best.bic(X)),
                         "ari": float(adjusted_rand_score(y, best.predict(X)))})
    return rows


def _mm(v):
    return f"{int(np.min(v))}-{int(np.max(v))}"


def main():
    global CRITERION
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--icl", action="store_true",
                   help="S2 / S4 and the natural federations with em_criterion='icl'")
    args = C.finish_args(p.parse_args())
    if args.icl:
        CRITERION = "icl"
    seeds = [args.seed + r for r in range(2 if args.quick else 5)]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        have_data = G.load(args, "s2") is not None
        # without the SIPU files: two generated sets of the same kind
        out["s2_s4"] = owner_splits(args, ["s2", "s4"] if have_data
                                    else ["blobs_15_3_4", "gen_15_3_3"], seeds)
        out["natural"] = natural(args, seeds)
        if not args.quick and not args.icl:
            out["held_out"] = owner_splits(args, HELD_OUT, seeds[:3])
            out["plain"] = plain()
        out["bic_curve"] = [] if args.icl else bic_curve(
            args, ["s2", "s4"], range(14, 18) if args.quick else range(13, 21),
            2 if args.quick else 6)
    for key, title in (("s2_s4", f"S2 / S4, 3 owners, {len(seeds)} owner splits"),
                       ("held_out", "Held-out sets, 3 owners, 3 owner splits")):
        if key in out:
            C.print_table(
                ["set", "reference k", "ARI", "clusters", "ARI, EM", "clusters, EM",
                 "EM rounds used"],
                [[r["set"], r["reference_k"], C.fmt(np.mean(r["ari"]), 3),
                  f"{np.mean(r['k']):.1f} ({_mm(r['k'])})", C.fmt(np.mean(r["ari_em"]), 3),
                  f"{np.mean(r['k_em']):.1f} ({_mm(r['k_em'])})",
                  f"{np.mean(r['em_rounds']):.1f}"] for r in out[key]],
                title=f"{title}: default vs em_rounds={EM_ROUNDS}, {CRITERION}")
    C.print_table(
        ["federation", "sites", "ARI", "clusters", "ARI, EM", "clusters, EM", "GMM-BIC ARI",
         "bytes up/site", "bytes up/site, EM", "EM rounds used"],
        [[r["federation"], r["sites"], C.fmt(np.mean(r["ari"]), 3), f"{np.mean(r['k']):.1f}",
          C.fmt(np.mean(r["ari_em"]), 3), f"{np.mean(r['k_em']):.1f}",
          C.fmt(np.mean(r["gmm_bic_ari"]), 3), int(np.mean(r["bytes"])),
          int(np.mean(r["bytes_em"])), f"{np.mean(r['em_rounds']):.1f}"]
         for r in out["natural"]],
        title=f"Natural federations ({len(seeds)} seeds): default vs em_rounds={EM_ROUNDS}, "
              f"{CRITERION}")
    if args.icl:
        C.write_json(args, "gauss_em_icl", out)
        return
    if "plain" in out:
        C.print_table(["data", "clusters", "clusters, EM", "EM rounds used"],
                      [[r["data"], r["k"], r["k_em"], r["em_rounds"]] for r in out["plain"]],
                      title="Plain data")
    C.print_table(["set", "k", "BIC", "ARI"],
                  [[r["set"], r["k"], f"{r['bic']:.0f}", C.fmt(r["ari"], 3)]
                   for r in out["bic_curve"]],
                  title="Pooled GaussianMixture: BIC and ARI by number of components")
    C.write_json(args, "gauss_em", out)


if __name__ == "__main__":
    main()
