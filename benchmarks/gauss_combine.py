"""The evolving Gaussians with and without a combining step (``combine=``).

``FedGaussClustering()`` (the default) beside ``combine="entropy"`` (the same round; the
server then combines its components by the entropy of the posteriors, Baudry et al. 2010,
down to the change point of the entropy against the number of clusters) and
``combine="unimodal"`` (it combines pairs whose two-component mixture has one mode on the
ridgeline, Hennig 2010), on:

* S2 and S4 (SIPU, 3 random owners, 5 owner splits) and held-out sets (3 owner splits):
  ARI and clusters (mean, min-max), and the best any combination of the default's
  components can do: every component labelled by the reference label most of its rows
  carry (an oracle that knows the answer; no combining step can beat it, since
  combining only joins components);
* the natural federations of ``real_federations.py``: ARI beside scikit-learn's
  GaussianMixture with BIC over 1..8 components on the pooled rows;
* plain data (one Gaussian 2-D / 10-D, a uniform square; 3 owners): clusters found.

``--quick``: S2/S4 and the natural federations, 2 seeds.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.metrics import adjusted_rand_score

import _common as C
import gauss_clustering as G
import real_federations as R
from fedclust import FedGaussClustering

HELD_OUT = ["s3", "s1", "r15", "a1", "d31", "aggregation", "unbalance", "blobs_20_2_1",
            "blobs_15_3_4", "gen_20_2_0", "mb_30_5_1", "gen_15_8_4"]


def _oracle(y, labels):
    """ARI and count when every component takes its rows' majority reference label."""
    out = np.empty_like(y)
    for k in np.unique(labels):
        rows = labels == k
        vals, counts = np.unique(y[rows], return_counts=True)
        out[rows] = vals[np.argmax(counts)]
    return adjusted_rand_score(y, out), len(np.unique(out))


def owner_splits(args, names, seeds):
    rows = []
    for name in names:
        data = G.load(args, name)
        if data is None:
            print(f"{name}: skipped (no data)")
            continue
        X, y = data
        r = {"set": name, "reference_k": int(len(np.unique(y[y > 0]))), "ari": [], "k": [],
             "ari_comb": [], "k_comb": [], "ari_uni": [], "k_uni": [], "ari_oracle": [],
             "k_oracle": []}
        for s in seeds:
            parts = np.array_split(np.random.default_rng(s).permutation(len(X)), 3)
            owners = [X[p] for p in parts]
            a = FedGaussClustering(random_state=s).fit(owners)
            b = FedGaussClustering(random_state=s, combine="entropy").fit(owners)
            la = a.predict(X)
            r["ari"].append(adjusted_rand_score(y, la))
            r["k"].append(a.n_clusters_)
            r["ari_comb"].append(adjusted_rand_score(y, b.predict(X)))
            r["k_comb"].append(b.n_clusters_)
            c = FedGaussClustering(random_state=s, combine="unimodal").fit(owners)
            r["ari_uni"].append(adjusted_rand_score(y, c.predict(X)))
            r["k_uni"].append(c.n_clusters_)
            o_ari, o_k = _oracle(y, la)
            r["ari_oracle"].append(o_ari)
            r["k_oracle"].append(o_k)
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
        r = {"federation": name, "sites": len(devices), "ari": [], "k": [], "ari_comb": [],
             "k_comb": [], "ari_uni": [], "k_uni": [], "gmm_bic_ari": []}
        for s in seeds:
            a = FedGaussClustering(random_state=s).fit(devices)
            b = FedGaussClustering(random_state=s, combine="entropy").fit(devices)
            r["ari"].append(adjusted_rand_score(y, a.labels_))
            r["k"].append(a.n_clusters_)
            r["ari_comb"].append(adjusted_rand_score(y, b.labels_))
            r["k_comb"].append(b.n_clusters_)
            c = FedGaussClustering(random_state=s, combine="unimodal").fit(devices)
            r["ari_uni"].append(adjusted_rand_score(y, c.labels_))
            r["k_uni"].append(c.n_clusters_)
            r["gmm_bic_ari"].append(R._gmm_bic_ari(X, y, s))
        rows.append(r)
        print(f"{name}: done", flush=True)
    return rows


def plain():
    rng = np.random.default_rng(0)
    sets = {"one Gaussian 2-D": rng.normal(size=(5000, 2)),
            "one Gaussian 10-D": rng.normal(size=(5000, 10)),
            "uniform square": rng.uniform(size=(2500, 2))}
    rows = []
    for name, X in sets.items():
        owners = np.array_split(X, 3)
        rows.append({"data": name,
                     "k": FedGaussClustering(random_state=0).fit(owners).n_clusters_,
                     "k_comb": FedGaussClustering(random_state=0, combine="entropy")
                     .fit(owners).n_clusters_,
                     "k_uni": FedGaussClustering(random_state=0, combine="unimodal")
                     .fit(owners).n_clusters_})
    return rows


def _mm(v):
    return f"{np.mean(v):.1f} ({int(np.min(v))}-{int(np.max(v))})"


def main():
    p = C.make_parser(__doc__.splitlines()[0])
    args = C.finish_args(p.parse_args())
    seeds = [args.seed + r for r in range(2 if args.quick else 5)]
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        have_data = G.load(args, "s2") is not None
        out["s2_s4"] = owner_splits(args, ["s2", "s4"] if have_data
                                    else ["blobs_15_3_4", "gen_15_3_3"], seeds)
        out["natural"] = natural(args, seeds)
        if not args.quick:
            out["held_out"] = owner_splits(args, HELD_OUT, seeds[:3])
            out["plain"] = plain()
    for key, title in (("s2_s4", f"S2 / S4, 3 owners, {len(seeds)} owner splits"),
                       ("held_out", "Held-out sets, 3 owners, 3 owner splits")):
        if key in out:
            C.print_table(
                ["set", "reference k", "ARI", "clusters", "ARI, entropy", "clusters, entropy",
                 "ARI, unimodal", "clusters, unimodal", "best combination (oracle) ARI",
                 "its clusters"],
                [[r["set"], r["reference_k"], C.fmt(np.mean(r["ari"]), 3), _mm(r["k"]),
                  C.fmt(np.mean(r["ari_comb"]), 3), _mm(r["k_comb"]),
                  C.fmt(np.mean(r["ari_uni"]), 3), _mm(r["k_uni"]),
                  C.fmt(np.mean(r["ari_oracle"]), 3), _mm(r["k_oracle"])] for r in out[key]],
                title=f"{title}: default vs combine='entropy' / 'unimodal'")
    C.print_table(
        ["federation", "sites", "ARI", "clusters", "ARI, entropy", "clusters, entropy",
         "ARI, unimodal", "clusters, unimodal", "GMM-BIC ARI"],
        [[r["federation"], r["sites"], C.fmt(np.mean(r["ari"]), 3), f"{np.mean(r['k']):.1f}",
          C.fmt(np.mean(r["ari_comb"]), 3), f"{np.mean(r['k_comb']):.1f}",
          C.fmt(np.mean(r["ari_uni"]), 3), f"{np.mean(r['k_uni']):.1f}",
          C.fmt(np.mean(r["gmm_bic_ari"]), 3)] for r in out["natural"]],
        title=f"Natural federations ({len(seeds)} seeds): default vs combine=")
    if "plain" in out:
        C.print_table(["data", "clusters", "clusters, entropy", "clusters, unimodal"],
                      [[r["data"], r["k"], r["k_comb"], r["k_uni"]] for r in out["plain"]],
                      title="Plain data, 3 owners")
    C.write_json(args, "gauss_combine", out)


if __name__ == "__main__":
    main()
