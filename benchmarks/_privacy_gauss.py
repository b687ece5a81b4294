"""Private evolving-Gaussian clustering: ARI against ε (part of ``privacy.py``, ``--only gauss``).

Settings (point level, δ = 1e-6; the bound is public knowledge of the domain,
never read from the data):

* ``blobs`` — 10 Gaussian blobs (unit variance) in 5-D with centers uniform in
  [-15, 15]^5, 20 owners × 1,000 rows (``--quick``: 6 blobs in 3-D, 5 × 600),
  ``data_bound`` = the box's half-diagonal plus 4 standard deviations;
* ``s1-2sites`` — S1 (5,000 points, 15 clusters) split at random over 2 sites,
  centred on its public domain [0, 10^6]^2, ``data_bound`` = its half-diagonal;
* ``heart`` — the four heart hospitals (690 training rows, 22 columns), private
  preprocessing (public ranges, 0.2 of ε, see ``_privacy_heart.py``), ARI
  against the diagnosis (the data have no cluster truth; k = 2 for Lloyd); the
  private clustering also with ``covariance="diag"`` (22 columns, 690 rows).

Methods: ``FedGaussClustering(privacy=dp)`` (no preset k, default settings and
3 refinement rounds), the non-private ``FedGaussClustering`` on the same data
(ε column "non-private") and DP distributed Lloyd given the true k (its
defaults). ε = ∞ runs the private mechanisms without noise.
"""

from __future__ import annotations

import math
import time

import numpy as np
from sklearn.datasets import make_blobs
from sklearn.metrics import adjusted_rand_score

from fedclust import FedGaussClustering
from fedclust.datasets import load_benchmark
from fedclust.lloyd import DistributedLloyd
from fedclust.sites.preprocess import FederatedPreprocessor
from fedclust.privacy import DifferentialPrivacy

METHODS = ("dp-gauss", "dp-lloyd (true k)")


def blobs(seed: int, quick: bool):
    k, d, Z, n = (6, 3, 5, 600) if quick else (10, 5, 20, 1000)
    X, y = make_blobs(Z * n, n_features=d, centers=k, cluster_std=1.0, random_state=seed,
                      center_box=(-15, 15))
    parts = np.array_split(np.arange(Z * n), Z)
    return [X[p] for p in parts], [y[p] for p in parts], k, 15 * math.sqrt(d) + 4 * math.sqrt(d)


def s1(seed: int, data_dir):
    X, y = load_benchmark("sipu/s1", data_dir)
    X = X - 5e5
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), 2)
    return [X[p] for p in parts], [np.asarray(y)[p] for p in parts], 15, 5e5 * math.sqrt(2)


def _ari(ys, labels) -> float:
    return float(adjusted_rand_score(np.concatenate(ys), np.concatenate(labels)))


def _lloyd_labels(model, devs):
    return [model.predict(X) for X in devs]


def rows(args, epsilons, delta, runs):
    """(table rows, JSON records) for every setting found."""
    makers = [("blobs", lambda s: blobs(s, args.quick))]
    try:
        load_benchmark("sipu/s1", args.data_dir)
        if not args.quick:
            makers.append(("s1-2sites", lambda s: s1(s, args.data_dir)))
    except Exception as exc:   # no data folder: say so, keep going
        print(f"S1 skipped: {exc}")
    out, records = [], []
    for name, make in makers:
        data = [make(args.seed + r) for r in range(runs)]
        base = [FedGaussClustering().fit(devs) for devs, _, _, _ in data]
        aris = [_ari(ys, m.device_labels_) for m, (_, ys, _, _) in zip(base, data)]
        ks = [m.n_clusters_ for m in base]
        out.append([name, "gauss (non-private)", "non-private", np.mean(aris), np.min(aris),
                    np.mean(ks), ""])
        records.append({"setting": name, "method": "gauss", "epsilon": None, "ari": aris,
                        "n_clusters": ks})
        for method in METHODS:
            for eps in epsilons:
                aris, ks, times, spent = [], [], [], []
                for r, (devs, ys, k, bound) in enumerate(data):
                    dp = DifferentialPrivacy(eps, delta, data_bound=bound)
                    t0 = time.perf_counter()
                    if method == "dp-gauss":
                        m = FedGaussClustering(privacy=dp, random_state=args.seed + r).fit(devs)
                        labels, kk = m.device_labels_, m.n_clusters_
                    else:
                        m = DistributedLloyd(k, privacy=dp, random_state=args.seed + r).fit(devs)
                        labels, kk = _lloyd_labels(m, devs), k
                    times.append(time.perf_counter() - t0)
                    aris.append(_ari(ys, labels))
                    ks.append(kk)
                    spent.append(m.privacy_["epsilon_spent"])
                out.append([name, method, eps, float(np.mean(aris)), float(np.min(aris)),
                            float(np.mean(ks)), float(np.mean(times))])
                records.append({"setting": name, "method": method, "epsilon": eps, "ari": aris,
                                "n_clusters": ks, "epsilon_spent": spent, "time_s": times})
    return out, records


def heart_rows(folder, epsilons, delta, runs, seed):
    """ARI against the diagnosis on the heart hospitals (private preprocessing)."""
    import _privacy_heart as H

    out, records = [], []
    for method in ("gauss (non-private)", "dp-gauss", "dp-gauss (diag)", "dp-lloyd (true k)"):
        for eps in (["non-private"] if "non-private" in method else epsilons):
            aris, ks = [], []
            for r in range(runs):
                fed, bounds = H.heart_federation(folder, seed + r)
                devs, ys = fed.devices, fed.labels
                if method == "gauss (non-private)":
                    Zs = FederatedPreprocessor().fit(devs).transform(devs)
                    m = FedGaussClustering().fit(Zs)
                    labels, kk = m.device_labels_, m.n_clusters_
                else:
                    B = 2.0 * math.sqrt(devs[0].shape[1])
                    pre, dp = H._private_pre(devs, bounds, eps, delta, B)
                    Zs = pre.transform(devs)
                    if method.startswith("dp-gauss"):
                        cov = "diag" if "diag" in method else "full"
                        m = FedGaussClustering(covariance=cov, privacy=dp,
                                               random_state=seed + r).fit(Zs)
                        labels, kk = m.device_labels_, m.n_clusters_
                    else:
                        m = DistributedLloyd(2, privacy=dp, random_state=seed + r).fit(Zs)
                        labels, kk = _lloyd_labels(m, Zs), 2
                    assert m.privacy_["epsilon_spent"] <= eps
                aris.append(_ari(ys, labels))
                ks.append(kk)
            out.append(["heart", method, eps, float(np.mean(aris)), float(np.min(aris)),
                        float(np.mean(ks)), ""])
            records.append({"setting": "heart", "method": method, "epsilon": eps, "ari": aris,
                            "n_clusters": ks})
    return out, records
