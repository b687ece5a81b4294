"""Small federations under point-level DP, on FastLloyd's own protocol (part of ``privacy.py``).

Protocol (Diaa, Humphries & Kerschbaum, USENIX Security 2025, as their code runs
it): every column min-max scaled to [-1, 1] on the pooled data, ``data_bound =
√d`` (the cube's half-diagonal), δ = 1/(n ln n), point-level DP, cost of the
returned centers on the scaled data ÷ the cost of scikit-learn ``KMeans(k,
n_init=10)`` on the same pooled data, mean of ``runs`` fits with fresh noise
(OS entropy) and a fresh split.

* ``iris`` (150 × 4, k = 3) and ``s1`` (5,000 × 2, k = 15): two sites by an
  equal random split (FastLloyd's setting; its figures beside ours);
* ``heart`` — the four hospitals of the UCI heart-disease data (Cleveland,
  Hungary, Switzerland, VA Long Beach: 920 × 13, k = 2), one site each; a
  missing value is put at 0 (the middle of its scaled range);
* ``autism`` — the adult autism screening data split by country of residence
  (the five largest countries: 434 × 15, k = 2): the ten screening answers,
  age, gender, jaundice, family history and prior use of the app (the
  ``result`` column, the sum of the answers, is left out).

The scaling reads the pooled data (it is the reference protocol, not a private
preprocessing: ``_privacy_heart.py`` runs the private one).
"""

from __future__ import annotations

import math
import time

import numpy as np
from sklearn.cluster import KMeans

from fedclust.lloyd import DistributedLloyd
from fedclust.metrics import kmeans_cost
from fedclust.privacy import DifferentialPrivacy

EPSILONS = [0.1, 0.5, 1.0, 2.0]
#: FastLloyd's measured cost ratios (its code, this protocol, mean of 10 runs)
FASTLLOYD = {"iris": {0.5: 2.24, 1.0: 1.49, 2.0: 1.23}, "s1": {0.5: 2.91, 1.0: 2.35, 2.0: 2.39}}
AUTISM_COLUMNS = ["A1_Score", "A2_Score", "A3_Score", "A4_Score", "A5_Score", "A6_Score",
                  "A7_Score", "A8_Score", "A9_Score", "A10_Score", "age", "gender", "jundice",
                  "austim", "used_app_before"]


def scale(X: np.ndarray) -> np.ndarray:
    """Columns min-max scaled to [-1, 1] (constant columns to 0); NaN becomes 0."""
    lo, hi = np.nanmin(X, axis=0), np.nanmax(X, axis=0)
    Z = 2.0 * (X - lo) / np.where(hi > lo, hi - lo, 1.0) - 1.0
    return np.nan_to_num(Z, nan=0.0)


def _split(X: np.ndarray, seed: int, n_sites: int = 2) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(len(X))
    return [X[p] for p in np.array_split(perm, n_sites)]


def federations(data_dir, quick: bool):
    """(name, k, make(seed) -> list of (n_z, d) sites) for the sets that are present."""
    from sklearn.datasets import load_iris

    iris = scale(load_iris().data)
    yield "iris", 3, lambda s: _split(iris, s)
    try:
        from fedclust.datasets import load_benchmark
        s1 = scale(load_benchmark("sipu/s1", data_dir)[0])
        yield "s1", 15, lambda s: _split(s1, s)
    except Exception as exc:       # no data folder: say so, keep going
        print(f"S1 skipped: {exc}")
    if quick:
        return
    heart = data_dir / "uci-extra" / "heart-disease"
    files = [heart / f"heart_{h}.npz" for h in ("cleveland", "hungarian", "switzerland", "va")]
    if all(f.exists() for f in files):
        parts = [np.load(f, allow_pickle=False)["X"].astype(np.float64) for f in files]
        Z = scale(np.vstack(parts))
        sites = np.split(Z, np.cumsum([len(p) for p in parts])[:-1])
        yield "heart", 2, lambda s: sites
    else:
        print(f"heart skipped: no heart-disease files under {data_dir}")
    autism = data_dir / "uci-extra" / "autism-adult" / "autism_adult.npz"
    if autism.exists():
        a = np.load(autism, allow_pickle=False)
        names = [str(c) for c in a["feature_names"]]
        X = a["X"].astype(np.float64)
        country = X[:, names.index("contry_of_res")]
        top = [c for c, _ in sorted(zip(*np.unique(country, return_counts=True)),
                                    key=lambda t: -t[1])[:5]]
        keep = np.isin(country, top)
        Z = scale(X[keep][:, [names.index(c) for c in AUTISM_COLUMNS]])
        sites = [Z[country[keep] == c] for c in top]
        yield "autism", 2, lambda s: sites
    else:
        print(f"autism skipped: no {autism}")


def rows(args, runs: int):
    out, records = [], []
    for name, k, make in federations(args.data_dir, args.quick):
        sites0 = make(args.seed)
        X = np.vstack(sites0)
        n, d = X.shape
        ref = kmeans_cost(X, KMeans(k, n_init=10, random_state=args.seed).fit(X).cluster_centers_)
        delta = 1.0 / (n * math.log(n))
        for eps in EPSILONS:
            ratios, times, spent, start = [], [], [], ""
            for r in range(runs):
                sites = make(args.seed + r)
                dp = DifferentialPrivacy(eps, delta, data_bound=math.sqrt(d))
                t0 = time.perf_counter()
                model = DistributedLloyd(k, privacy=dp, random_state=args.seed + r).fit(sites)
                times.append(time.perf_counter() - t0)
                ratios.append(kmeans_cost(X, model.cluster_centers_) / ref)
                spent.append(model.privacy_["epsilon_spent"])
                start = "moments" if model.privacy_["releases"][0]["what"].startswith(
                    "moments") else "box"
            fl = FASTLLOYD.get(name, {}).get(eps)
            out.append([f"{name} ({n}×{d}, k={k}, {len(sites0)} sites)", eps,
                        float(np.mean(ratios)), float(np.max(ratios)), start,
                        "" if fl is None else fl, float(np.mean(times))])
            records.append({"setting": name, "n": n, "d": d, "k": k, "sites": len(sites0),
                            "epsilon": eps, "delta": delta, "cost_ratio": ratios,
                            "epsilon_spent": spent, "start": start, "fastlloyd": fl,
                            "time_s": times})
    return out, records
