"""Differentially private k-means: cost ÷ pooled scikit-learn cost against ε.

Settings (δ = 1e-6 throughout; the cost is always measured on the raw,
unclipped data; the reference is scikit-learn ``KMeans(k, n_init=10)`` on the
pooled data, in the same process):

* ``gauss-point`` — FedDP-KMeans' Gaussian setting: k = 10 means drawn from
  U[0, 1]^100, covariance 0.5·I, 100 devices × 1,000 points, point-level DP,
  ``data_bound = 11`` (the references' norm bound);
* ``gauss-noniid`` — the same mixture over 100 devices × 1,000 points, each
  device holding 2 of the 10 components (label skew), point level;
* ``gauss-device`` — the same mixture over 2,000 devices × 50 points,
  device-level DP, ``data_bound = 11``, ``clip_norm = 100`` (a device weighs at
  most 100/11 ≈ 9 points of maximal norm);
* ``s1-2sites`` — S1 (5,000 points, k = 15) split uniformly at random over 2
  sites, point-level DP; the data are centred on their public domain
  [0, 10^6]^2 and bounded by its half-diagonal (DP does not read the data to
  set its bound);
* ``mnist-rp50`` — the 60,000 MNIST training images through a fixed Gaussian
  random projection to 50 dimensions (data-independent), k = 10, split at
  random over 100 devices, point level, ``data_bound = 12`` (see below).

Methods: DP distributed Lloyd (central DP: moments + candidates
initialisation, 3 Lloyd rounds, the defaults) and DP k-FED
(point level: each device's moments and candidate sums noised on the device,
k' = k, the k-means++ server weighted by the noisy counts; device level is
refused). ε = ∞ runs the same mechanisms without noise.

References (cost ÷ pooled scikit-learn cost, quoted from runs of their code on
the same settings): FastLloyd (Diaa, Humphries & Kerschbaum, USENIX Security
2025) 1.125 / 1.076 / 1.070 / 1.068 at ε = 0.1 / 0.5 / 1 / 2 (gauss-point),
2.35 at ε = 1 on S1 over 2 sites; FedDP-KMeans (Scott, Lampert & Saulpic, ICML
2025) 1.0113 at total ε = 0.31 and 1.00015 at total ε = 3.13 (gauss-point,
with 1,100 public points on the server, which fedclust does not use).

Supervised tables (accuracy on held-out data against ε, δ = 1e-6): the DP
Gaussian classifier (one noisy diagonal Gaussian per class) and DP-FedAvg (device
level, softmax model, ``clip_norm = 1``), on MNIST through a fixed Gaussian
random projection to 50 dimensions (data-independent, so DP stays honest;
``data_bound = 12``: a digit image has about 150 inked pixels of at most 1,
norm about 10, after a norm-preserving projection), 60,000 training images
over 10 owners (classifier) or 1,000 devices (FedAvg); ``--quick`` uses
scikit-learn's digits.

Small federations on FastLloyd's own protocol (``small``: iris, S1, the four
heart hospitals, autism screening by country, ε = 0.1 to 2, 10 runs): see
``_privacy_small.py``. The heart hospitals (``heart``; private preprocessing, then the k-means and
supervised families): see ``_privacy_heart.py``. The private evolving-Gaussian
clustering (``gauss``: ARI against ε beside the non-private one and DP Lloyd
with the true k): see ``_privacy_gauss.py``. DP-FedAvg with client sampling
(``sampling``; amplification by subsampling): see ``_privacy_sampling.py``.

    python benchmarks/privacy.py            # 3 runs per cell (several minutes)
    python benchmarks/privacy.py --quick    # small federation, 1 run (seconds)
"""

from __future__ import annotations

import math
import time

import numpy as np

import _common as C
from fedclust import KFed
from fedclust.core.exceptions import ValidationError
from fedclust.datasets import load_benchmark
from fedclust.lloyd import DistributedLloyd
from fedclust.metrics import kmeans_cost
from fedclust.privacy import DifferentialPrivacy

EPSILONS = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, math.inf]
DELTA = 1e-6
FASTLLOYD = {"gauss-point": {0.1: 1.125, 0.5: 1.076, 1.0: 1.070, 2.0: 1.068},
             "s1-2sites": {1.0: 2.35}}
FEDDP = {"gauss-point": "1.0113 at ε=0.31, 1.00015 at ε=3.13 (1,100 public points)"}


def gaussian_mixture(seed: int, n_devices: int, n_per: int, k: int = 10, d: int = 100,
                     per_device: int | None = None):
    """The mixture over devices; ``per_device`` components per device (non-IID) or all."""
    rng = np.random.default_rng(seed)
    means = rng.uniform(0.0, 1.0, (k, d))
    devs = []
    for _ in range(n_devices):
        if per_device is None:
            y = rng.integers(0, k, n_per)
        else:
            y = rng.choice(k, per_device, replace=False)[rng.integers(0, per_device, n_per)]
        devs.append(means[y] + rng.normal(0.0, math.sqrt(0.5), (n_per, d)))
    return devs


def s1_sites(seed: int, data_dir, n_sites: int = 2):
    X, _ = load_benchmark("sipu/s1", data_dir)
    X = X - 5e5                                  # public domain [0, 1e6]^2 centred
    parts = np.array_split(np.random.default_rng(seed).permutation(len(X)), n_sites)
    return [X[p] for p in parts], 15, 5e5 * math.sqrt(2)


def settings(args):
    if args.quick:
        yield "gauss-point", lambda s: (gaussian_mixture(s, 20, 500, k=5, d=20), 5, 8.0), "point", None
        return
    yield "gauss-point", lambda s: (gaussian_mixture(s, 100, 1000), 10, 11.0), "point", None
    yield "gauss-noniid", lambda s: (gaussian_mixture(s, 100, 1000, per_device=2), 10, 11.0), \
        "point", None
    yield "gauss-device", lambda s: (gaussian_mixture(s, 2000, 50), 10, 11.0), "device", 100.0
    try:
        load_benchmark("sipu/s1", args.data_dir)
        yield "s1-2sites", lambda s: s1_sites(s, args.data_dir), "point", None
    except Exception as exc:   # no data folder: say so, keep going
        print(f"S1 skipped: {exc}")
    if C.mnist_path(args.data_dir) is not None:
        yield "mnist-rp50", lambda s: mnist_devices(args, s), "point", None
    else:
        print("MNIST skipped: no mnist_70k.npz under the data folder")


def mnist_devices(args, seed: int, n_devices: int = 100):
    Xtr = supervised_data(args, seed)[0]
    parts = np.array_split(np.random.default_rng(seed).permutation(len(Xtr)), n_devices)
    return [Xtr[p] for p in parts], 10, 12.0


def supervised_data(args, seed: int):
    """(train X, train y, test X, test y, bound, name): MNIST random projection, or digits."""
    path = C.mnist_path(args.data_dir)
    if args.quick or path is None:
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
        perm = np.random.default_rng(seed).permutation(len(X))
        X, y = X[perm], y[perm]
        return X[:1400], y[:1400], X[1400:], y[1400:], 8.0, "digits (8x8, /16)"
    data = np.load(path, allow_pickle=False)
    X, y = data["X"].astype(np.float64) / 255.0, data["y"].astype(np.int64)
    R = np.random.default_rng(12345).standard_normal((X.shape[1], 50)) / math.sqrt(50)
    Z = X @ R
    n = int(data["n_train"]) if "n_train" in data else 60000
    return Z[:n], y[:n], Z[n:], y[n:], 12.0, "MNIST, random projection to 50"


def supervised_tables(args, runs: int, rows_out: list) -> None:
    from fedclust import FedAvg, FedGaussClassifier

    Xtr, ytr, Xte, yte, bound, name = supervised_data(args, args.seed)
    rows = []
    n_owners, n_devices = (5, 100) if args.quick else (10, 1000)
    for method in ("gauss-classifier", "dp-fedavg"):
        for eps in EPSILONS:
            accs, times = [], []
            for r in range(runs):
                perm = np.random.default_rng(args.seed + r).permutation(len(Xtr))
                t0 = time.perf_counter()
                if method == "gauss-classifier":
                    parts = np.array_split(perm, n_owners)
                    dp = DifferentialPrivacy(eps, DELTA, data_bound=bound)
                    model = FedGaussClassifier(covariance="diag", privacy=dp,
                                               classes=list(range(10)),   # public: digits
                                               random_state=args.seed + r).fit(
                        [Xtr[p] for p in parts], [ytr[p] for p in parts])
                else:
                    parts = np.array_split(perm, n_devices)
                    dp = DifferentialPrivacy(eps, DELTA, unit="device", clip_norm=1.0)
                    model = FedAvg("softmax", rounds=20, lr=0.5, privacy=dp, classes=10,
                                   random_state=args.seed + r).fit(
                        [Xtr[p] for p in parts], [ytr[p] for p in parts])
                times.append(time.perf_counter() - t0)
                accs.append(float(np.mean(model.predict(Xte) == yte)))
            rows.append([name, method, eps, float(np.mean(accs)), float(np.mean(times))])
            rows_out.append({"setting": name, "method": method, "epsilon": eps,
                             "accuracy": accs, "time_s": times})
    C.print_table(["data", "method", "ε", "test accuracy", "time s"], rows,
                  title=f"DP supervised families, δ={DELTA:g}, {runs} run(s) per cell "
                        f"({n_owners} owners for the classifier, {n_devices} devices for "
                        "FedAvg, 20 rounds)")


METHODS = ("dp-lloyd", "dp-kfed")


def fit(method: str, devs, k: int, dp: DifferentialPrivacy, seed: int):
    if method == "dp-lloyd":
        return DistributedLloyd(k, privacy=dp, random_state=seed).fit(devs)
    return KFed(k, k, server="kmeans++", weighted=True, privacy=dp, random_state=seed).fit(devs)


def main() -> None:
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--only", default=None,
                   help="comma-separated settings (gauss-point, gauss-device, s1-2sites, "
                        "mnist-rp50, heart, supervised, gauss, sampling, small)")
    args = C.finish_args(p.parse_args())
    only = None if args.only is None else set(args.only.split(","))
    runs = args.runs or (1 if args.quick else 3)
    rows, records = [], []
    for name, make, unit, clip in settings(args):
        if only is not None and name not in only:
            continue
        data = [make(args.seed + r) for r in range(runs)]
        refs = []
        for devs, k, _ in data:
            from sklearn.cluster import KMeans
            X = np.concatenate(devs)
            km = KMeans(k, n_init=10, random_state=args.seed).fit(X)
            refs.append(kmeans_cost(X, km.cluster_centers_))
        for method in METHODS:
            for eps in EPSILONS:
                ratios, times, spent, err = [], [], [], ""
                for r, ((devs, k, bound), ref) in enumerate(zip(data, refs)):
                    dp = DifferentialPrivacy(eps, DELTA, unit=unit, data_bound=bound,
                                             clip_norm=clip)
                    t0 = time.perf_counter()
                    try:
                        model = fit(method, devs, k, dp, args.seed + r)
                    except ValidationError as exc:
                        err = str(exc)
                        break
                    times.append(time.perf_counter() - t0)
                    X = np.concatenate(devs)
                    ratios.append(kmeans_cost(X, model.cluster_centers_) / ref)
                    spent.append(model.privacy_["epsilon_spent"])
                ref_fl = FASTLLOYD.get(name, {}).get(eps)
                if err:
                    rows.append([name, method, eps, "refused", "", "", ""])
                    records.append({"setting": name, "method": method, "epsilon": eps,
                                    "refused": err})
                    continue
                rows.append([name, method, eps, float(np.mean(ratios)), float(np.max(ratios)),
                             "" if ref_fl is None else ref_fl, float(np.mean(times))])
                records.append({"setting": name, "method": method, "epsilon": eps,
                                "unit": unit, "cost_ratio": ratios, "epsilon_spent": spent,
                                "time_s": times, "fastlloyd": ref_fl,
                                "feddp_kmeans": FEDDP.get(name)})
    heart_sup: list = []
    folder = args.data_dir / "uci-extra" / "heart-disease"
    if (only is None or "heart" in only) and (folder / "heart_va.npz").exists():
        import _privacy_heart as H

        hrows, hrec = H.clustering_rows(folder, EPSILONS, DELTA, runs, args.seed)
        rows += hrows
        records += hrec
        srows, heart_sup = H.supervised_rows(folder, EPSILONS, DELTA, runs, args.seed)
        C.print_table(["data", "method", "ε", "test accuracy", "std"], srows,
                      title=f"DP supervised on the heart hospitals, δ={DELTA:g}, {runs} split(s)")
    elif only is None or "heart" in only:
        print(f"heart skipped: no heart-disease files under {args.data_dir}")
    sampling_records: list = []
    if only is None or "sampling" in only:
        import _privacy_sampling as S

        srows, sampling_records = S.rows(runs)
        C.print_table(["data", "DP-FedAvg", "ε", "test accuracy", "noise multiplier",
                       "ε if full participation"], srows,
                      title=f"DP-FedAvg with client sampling, δ={S.DELTA:g}, {runs} run(s)")
    small_records: list = []
    if only is None or "small" in only:
        import _privacy_small as SM

        srows, small_records = SM.rows(args, args.runs or (3 if args.quick else 10))
        C.print_table(["data", "ε", "cost ÷ sklearn (mean)", "worst", "start", "FastLloyd",
                       "time s"], srows,
                      title="DP Lloyd on small federations, FastLloyd's protocol (scaled to "
                            "[-1, 1]^d, data_bound √d, δ = 1/(n ln n), point level)")
    gauss_records: list = []
    if only is None or "gauss" in only:
        import _privacy_gauss as G

        grows, gauss_records = G.rows(args, EPSILONS, DELTA, runs)
        if (folder / "heart_va.npz").exists() and not args.quick:
            hrows, hrec = G.heart_rows(folder, EPSILONS, DELTA, runs, args.seed)
            grows += hrows
            gauss_records += hrec
        C.print_table(["setting", "method", "ε", "ARI (mean)", "worst", "clusters", "time s"],
                      grows, title=f"DP evolving Gaussians vs DP Lloyd (true k), δ={DELTA:g}, "
                                   f"{runs} run(s) per cell")
    C.print_table(["setting", "method", "ε", "cost ÷ sklearn (mean)", "worst", "FastLloyd",
                   "time s"], rows,
                  title=f"DP k-means, δ={DELTA:g}, {runs} run(s) per cell; FedDP-KMeans "
                        "(gauss-point): 1.0113 at ε=0.31, 1.00015 at ε=3.13 with public data")
    supervised: list = []
    if only is None or "supervised" in only:
        supervised_tables(args, runs, supervised)
    C.write_json(args, "privacy", {"runs": runs, "delta": DELTA, "rows": records,
                                   "supervised": supervised, "heart_supervised": heart_sup,
                                   "gauss_clustering": gauss_records,
                                   "small_federations": small_records,
                                   "client_sampling": sampling_records})


if __name__ == "__main__":
    main()
