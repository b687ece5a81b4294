"""How fine k-FED's device summaries must be: basin ranking on natural federations.

The default server minimises the count-weighted cost of the device centers plus their
scatter. At final centers C that equals the pooled k-means cost with every local
cluster sent whole to one center: at least the pooled cost at C, more where a final
boundary cuts a local cluster. This script measures, on the natural federations of
``real_federations.py`` (k = 3, ``FEDCLUST_DATA`` names the data folder):

* the summary's hidden cost: the local clusters' scatter ÷ the pooled ``KMeans(n_init=10)``
  cost (what the server cannot see);
* straddle: the share of rows whose local cluster's majority lies in another cluster of
  the pooled ``KMeans`` labelling;
* basin ranking: the server's own objective at k-FED's answer and at the pooled basin
  (weighted Lloyd on the summary from the pooled centers), and in how many seeds the
  summary ranks k-FED's basin below the pooled one;

for several per-device summary sizes:

* ``default``: ``n_local_clusters="auto"``: 2k centers doubled until the local clusters'
  scatter is at most a quarter of the device's total scatter about its mean
  (``fedclust.kfed.summary.SUMMARY_HIDDEN_SHARE``), at most 8 KiB per device;
* ``2k``: the same with the hidden share set to 1 (every device stops at 2k);
* ``hidden<=1/4 32KiB``: the default's rule with a 32 KiB cap;
* ``own-gap<=1%``: 2k doubled until the summary's cost at the device's own k centers
  (its local k-means at k) is within 1 % of its true cost there, 32 KiB cap (the device
  works out its size with its own local k-means on its seeded stream and it is sent as
  one ``n_local_clusters`` per device, the hidden share set to 1);
* ``finest``: the 32 KiB cap (hidden share 0);

every cap at most ``n_z // 5`` centers and at least 2k. Cost ÷ pooled and ARI as in ``real_federations.py``; 20 seeds
(``--quick``: 3 seeds; heart-hospital, autism-age and the bundled diabetes-sex).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.cluster import KMeans

import _common as C
import real_federations as R
from fedclust import KFed
from fedclust.core.kmeans import assign
from fedclust.core.random import device_rng
import fedclust.kfed.summary as summary
from fedclust.kfed.local import local_kmeans, local_scatter

K = R.K
CAP_BYTES = 32768


def _cap(n, d):
    return max(1, min(n - 1, n // 5, max(2 * K, CAP_BYTES // ((d + 2) * 8))))


def _ladder_size(X, seed, z, stop):
    """The first of 2k, 4k, ... (capped) at which ``stop(X, centers, counts, labels)``."""
    n, d = X.shape
    cap = _cap(n, d)
    kz = min(2 * K, cap)
    while True:
        r = local_kmeans(X, kz, device_rng(seed, z))
        if kz >= cap or stop(X, r.message.centers, r.message.counts, r.labels):
            return kz
        kz = min(2 * kz, cap)


def _own_gap_factory(seed, z):
    def stop(X, centers, counts, labels):
        own = local_kmeans(X, K, device_rng(seed, z)).message.centers
        true = assign(X, own)[1].sum()
        summ = local_scatter(X, centers, labels).sum() + counts @ assign(centers, own)[1]
        return summ - true <= 0.01 * true
    return stop


def _auto(devs, seed):
    return "auto"


#: rule -> (n_local_clusters for the devices, module settings of fedclust.kfed.summary)
RULES = {
    "default": (_auto, {}),
    "2k": (_auto, {"SUMMARY_HIDDEN_SHARE": 1.0}),
    "hidden<=1/4 32KiB": (_auto, {"SUMMARY_MAX_BYTES": CAP_BYTES}),
    "own-gap<=1%": (lambda devs, seed: [_ladder_size(X, seed, z, _own_gap_factory(seed, z))
                                        for z, X in enumerate(devs)],
                    {"SUMMARY_HIDDEN_SHARE": 1.0, "SUMMARY_MAX_BYTES": CAP_BYTES}),
    "finest": (_auto, {"SUMMARY_HIDDEN_SHARE": 0.0, "SUMMARY_MAX_BYTES": CAP_BYTES}),
}


def _fit(devices, seed, rule):
    sizes, settings = RULES[rule]
    old = {name: getattr(summary, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(summary, name, value)
        return KFed(K, sizes(devices, seed), random_state=seed).fit(devices)
    finally:
        for name, value in old.items():
            setattr(summary, name, value)


def _summary_lloyd(LC, w, start, max_iter=300):
    """Weighted Lloyd on the device centers from ``start``."""
    Cs = start.copy()
    for _ in range(max_iter):
        lab = assign(LC, Cs)[0]
        new = np.array([np.average(LC[lab == j], axis=0, weights=w[lab == j])
                        if (lab == j).any() else Cs[j] for j in range(len(Cs))])
        if np.allclose(new, Cs):
            break
        Cs = new
    return Cs


def diagnose(devices, ys, model, ref):
    """Hidden cost, straddle and the server's objective at its answer and at the pooled
    basin, all ÷ the pooled cost."""
    X = np.concatenate(devices)
    LC = np.concatenate(list(model.local_centers_))
    w = np.concatenate(list(model.local_counts_)).astype(float)
    hidden = straddle = 0.0
    start = 0
    for Xd, c in zip(devices, model.local_centers_):
        lab, dist = assign(Xd, c)
        hidden += dist.sum()
        pooled = ref.labels_[start:start + len(Xd)]
        for j in range(len(c)):
            pj = pooled[lab == j]
            if len(pj):
                straddle += len(pj) - np.bincount(pj).max()
        start += len(Xd)

    def objective(centers):
        return (hidden + w @ assign(LC, centers)[1]) / ref.inertia_

    basin = _summary_lloyd(LC, w, ref.cluster_centers_)
    pooled_basin_cost = assign(X, basin)[1].sum() / ref.inertia_
    return {"hidden": hidden / ref.inertia_, "straddle": straddle / len(X),
            "objective_at_kfed": objective(model.cluster_centers_),
            "objective_at_pooled_basin": objective(basin),
            "pooled_basin_cost": float(pooled_basin_cost)}


def run(name, devices, ys, seeds):
    X = np.concatenate(devices)
    y = None if ys is None else np.concatenate(ys)
    acc = {}
    for seed in seeds:
        ref = KMeans(K, n_init=10, random_state=seed).fit(X)
        for rule in RULES:
            model = _fit(devices, seed, rule)
            diag = diagnose(devices, ys, model, ref)
            r = acc.setdefault(rule, {k: [] for k in (
                "cost", "ari", "pooled_ari", "bytes", "hidden", "straddle", "prefers_own")})
            r["cost"].append(R._cost(X, model.cluster_centers_) / ref.inertia_)
            r["ari"].append(R._ari(y, model.labels_))
            r["pooled_ari"].append(R._ari(y, ref.labels_))
            r["bytes"].append(model.communication_["bytes_up"] / len(devices))
            r["hidden"].append(diag["hidden"])
            r["straddle"].append(diag["straddle"])
            r["prefers_own"].append(diag["objective_at_kfed"]
                                    <= diag["objective_at_pooled_basin"] + 1e-12)
    return [{"federation": name, "rule": rule, "sites": len(devices),
             "rows": [len(d) for d in devices], "d": int(X.shape[1]),
             "cost_ratio": float(np.mean(r["cost"])), "worst_cost_ratio": float(np.max(r["cost"])),
             "ari": float(np.mean(r["ari"])), "ari_sd": float(np.std(r["ari"])),
             "pooled_ari": float(np.mean(r["pooled_ari"])),
             "bytes_up_per_site": float(np.mean(r["bytes"])),
             "hidden_over_pooled": float(np.mean(r["hidden"])),
             "straddle": float(np.mean(r["straddle"])),
             "summary_prefers_own_basin": int(np.sum(r["prefers_own"])), "runs": len(seeds)}
            for rule, r in acc.items()]


def main():
    p = C.make_parser(__doc__.splitlines()[0])
    args = C.finish_args(p.parse_args())
    seeds = [args.seed + r for r in range(3 if args.quick else 20)]
    feds = {**R.FEDERATIONS, **R.HELD_OUT, **R.NEW_HELD_OUT}
    if args.quick:
        feds = {n: feds[n] for n in ("heart-hospital", "autism-age", "diabetes-sex")}
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, load in feds.items():
            try:
                devices, ys = load(args.data_dir)
            except FileNotFoundError as exc:
                print(f"{name}: skipped ({exc})")
                continue
            rows += run(name, devices, ys, seeds)
            print(f"{name}: done", flush=True)
    C.print_table(
        ["federation", "sites", "d", "rule", "cost ÷ pooled", "worst", "ARI", "pooled ARI",
         "bytes up/site", "hidden ÷ pooled", "straddle", "prefers own basin"],
        [[r["federation"], r["sites"], r["d"], r["rule"], C.fmt(r["cost_ratio"], 4),
          C.fmt(r["worst_cost_ratio"], 4), C.fmt(r["ari"], 3), C.fmt(r["pooled_ari"], 3),
          int(r["bytes_up_per_site"]), C.fmt(r["hidden_over_pooled"], 3),
          C.fmt(r["straddle"], 3), f"{r['summary_prefers_own_basin']}/{r['runs']}"]
         for r in rows],
        title=f"k-FED summary size per device, k = {K}, {len(seeds)} seeds")
    C.write_json(args, "kfed_summary_basins", {"k": K, "seeds": seeds, "rows": rows})


if __name__ == "__main__":
    main()
