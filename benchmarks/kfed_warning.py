"""k-FED's "answer likely poor" warning: how often it fires on good and on poor fits.

Fits: every natural federation of ``real_federations.py`` (held-out splits included), k = 3,
and generated federations (scikit-learn ``make_blobs`` with overlapping groups, small
non-IID sites holding 2 or 3 of the groups each; never used to set the warning's thresholds)
× k' in {k, 2k, 8k, "auto"} (the default server's "auto" is its summary ladder; the paper
server's is the X-means BIC k_z) (capped at half a site's rows) × servers {default, ``farthest-lloyd1``} × 5 seeds
(``--quick``: 2). Cost = k-means cost of the pooled rows at the final centers ÷ pooled
scikit-learn ``KMeans(n_init=10)``. A fit is good at cost ≤ 1.05, poor at ≥ 1.15. The table:
per data family and server, how many fits of each kind the warning flagged. The paper's
server's devices send no scatter: its rows give the warning worked out as if they had
(each local cluster's scatter from the device's rows nearest its center).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs

import _common as C
import real_federations as R
from fedclust import KFed
from fedclust.core.kmeans import assign
from fedclust.kfed.explain import explanation_warning

GOOD, POOR = 1.05, 1.15


def generated(seed, n_groups, d, n_sites, rows, std):
    """Overlapping blobs; each site draws its rows from 2 or 3 of the groups."""
    rng = np.random.default_rng(seed)
    X, y = make_blobs(n_sites * rows * 3, centers=n_groups, n_features=d, cluster_std=std,
                      center_box=(-6, 6), random_state=seed)
    devs = []
    for _ in range(n_sites):
        held = rng.choice(n_groups, size=int(rng.integers(2, 4)), replace=False)
        pool = np.flatnonzero(np.isin(y, held))
        devs.append(X[rng.choice(pool, size=int(rng.integers(rows // 2, rows + 1)),
                                 replace=False)])
    return devs


GENERATED = {f"blobs-g{g}-d{d}-s{s}-std{std}": (g, d, s, r, std)
             for g, d, s, r, std in [(3, 2, 12, 30, 1.5), (4, 5, 20, 25, 2.0),
                                     (5, 3, 30, 20, 1.2), (6, 8, 16, 40, 2.5)]}


def _warnings(model, devices):
    """The fit's warnings; for the paper's server, whose devices send no scatter, the
    warning worked out as if they had sent it (each local cluster's scatter about its
    center, from the device's rows nearest to it)."""
    if model.server == "weighted-kmeans++":
        return model.run_log_.warnings
    scatter, counts = [], []
    for D, c in zip(devices, model.local_centers_):
        lab, d2 = assign(D, c)
        scatter.append(np.bincount(lab, weights=d2, minlength=len(c)))
        counts.append(np.bincount(lab, minlength=len(c)).astype(float))
    w = explanation_warning(model.local_centers_, counts, scatter, model.cluster_centers_,
                            model.center_labels_, list(range(len(devices))))
    return [] if w is None else [w]


def _kind(warning):
    if "merged groups" in warning:
        return "merged"
    return "unsettled" if "settled" in warning else "too few"


def fits(devices, k, seeds):
    X = np.concatenate(devices)
    out = []
    for seed in seeds:
        pooled = KMeans(k, n_init=10, random_state=seed).fit(X).inertia_
        for kp in [k, 2 * k, 8 * k, "auto"]:
            for server in ["weighted-kmeans++", "farthest-lloyd1"]:
                # a fixed k' is capped at half a small site's rows (no raw points sent)
                kz = kp if kp == "auto" else [min(kp, max(1, len(D) // 2)) for D in devices]
                m = KFed(k, kz, server=server, random_state=seed).fit(devices)
                cost = R._cost(X, m.cluster_centers_) / pooled
                kinds = [_kind(w) for w in _warnings(m, devices) if w.startswith("k-FED")]
                out.append({"k_local": kp, "server": server, "seed": seed, "cost": cost,
                            "flag": kinds[0] if kinds else ""})
    return out


def main():
    p = C.make_parser(__doc__.splitlines()[0])
    args = C.finish_args(p.parse_args())
    seeds = [args.seed + r for r in range(2 if args.quick else 5)]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, load in {**R.FEDERATIONS, **R.HELD_OUT, **R.NEW_HELD_OUT}.items():
            try:
                devices, _ = load(args.data_dir)
            except FileNotFoundError as exc:
                print(f"{name}: skipped ({exc})")
                continue
            rows += [{"data": name, "family": "natural", **f} for f in fits(devices, R.K, seeds)]
            print(f"{name}: done", flush=True)
        for i, (name, (g, d, s, r, std)) in enumerate(GENERATED.items()):
            devices = generated(100 + i, g, d, s, r, std)
            rows += [{"data": name, "family": "generated", **f} for f in fits(devices, g, seeds)]
            print(f"{name}: done", flush=True)
    table = []
    for family in ["natural", "generated"]:
        for server in ["weighted-kmeans++", "farthest-lloyd1"]:
            sel = [r for r in rows if r["family"] == family and r["server"] == server]
            good = [r for r in sel if r["cost"] <= GOOD]
            poor = [r for r in sel if r["cost"] >= POOR]
            mid = [r for r in sel if GOOD < r["cost"] < POOR]
            table.append([family, server, len(sel),
                          f"{sum(bool(r['flag']) for r in good)} / {len(good)}",
                          f"{sum(bool(r['flag']) for r in mid)} / {len(mid)}",
                          f"{sum(bool(r['flag']) for r in poor)} / {len(poor)}",
                          " / ".join(str(sum(r["flag"] == f for r in sel))
                                     for f in ("merged", "unsettled", "too few"))])
    C.print_table(["data", "server", "fits", "flagged among good (≤ 1.05)",
                   "flagged in between", "flagged among poor (≥ 1.15)",
                   "merged / unsettled / too few"],
                  table, title=f"k-FED's warning, {len(seeds)} seeds, k' in {{k, 2k, 8k, auto}}")
    missed = [r for r in rows if r["cost"] >= POOR and not r["flag"]]
    false = [r for r in rows if r["cost"] <= GOOD and r["flag"]]
    C.print_table(["data", "k'", "server", "seed", "cost ÷ pooled", "flag"],
                  [[r["data"], r["k_local"], r["server"], r["seed"], C.fmt(r["cost"], 3),
                    r["flag"] or "-"] for r in false + missed],
                  title="False alarms on good fits, then poor fits not flagged")
    C.write_json(args, "kfed_warning", {"seeds": seeds, "good": GOOD, "poor": POOR,
                                        "rows": rows, "table": table})


if __name__ == "__main__":
    main()
