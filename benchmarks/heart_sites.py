"""Four heart-disease hospitals as a site federation, from their files to per-hospital figures.

The hospitals' files (``uci-extra/heart-disease/heart_*.npz``: Cleveland,
Hungary, Switzerland, VA Long Beach; heavy missing values) are read with
:func:`fedclust.datasets.load_sites` (``cp``, ``restecg``, ``slope``, ``thal``
one-hot over the union of the hospitals' categories), a per-hospital 25 %
test split is drawn from the seed, and the federated preprocessing (pooled
mean imputation + standardisation, one round) runs before every federated
method — exactly what ``fedclust run examples/heart_sites.toml`` does.

Classification (``y_binary``, disease): test accuracy per hospital and pooled
over the four test sets, for the federated classifiers (evolving-Gaussian
classifier, FedAvg logistic regression, IFCA with 2 models, k-FED + FedAvg with 2
models, the Byzantine-robust pipeline with one logistic model) beside each
hospital alone (imputer + scaler + logistic regression fitted on its own
training rows only) and a pooled scikit-learn pipeline (the same, on all
hospitals' training rows, i.e. what one would do if the data could be pooled).

Clustering (k = 2, scored by ARI against ``y_binary`` on the training rows):
k-FED, distributed Lloyd and evolving Gaussians beside k-means on each
hospital alone and k-means on the pooled preprocessed rows.

``--quick``: one split; otherwise 5 splits (seed + r), mean ± std.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.cluster import KMeans
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import adjusted_rand_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import _common as C
from fedclust.config import check_config
from fedclust.experiment import run_experiment

CATEGORICAL = ["cp", "restecg", "slope", "thal"]
CLASSIFIERS = {
    "fed: gauss-classifier": {"name": "gauss-classifier"},
    "fed: fedavg (logistic)": {"name": "fedavg", "model": "logistic", "rounds": 50, "lr": 0.1},
    "fed: ifca (2 logistic)": {"name": "ifca", "n_clusters": 2, "model": "logistic",
                               "rounds": 50, "lr": 0.1},
    "fed: k-FED + FedAvg (2 logistic)": {"name": "clustered-fedavg", "n_clusters": 2,
                                         "model": "logistic", "rounds": 50, "lr": 0.1},
    "fed: robust pipeline (1 logistic)": {"name": "robust-classification", "n_clusters": 1,
                                          "rounds": 50},
}
CLUSTERINGS = {
    "fed: kfed (k=2)": {"name": "kfed", "n_clusters": 2, "n_local_clusters": 2,
                        "server": "farthest-lloyd1"},
    "fed: distributed-lloyd (k=2)": {"name": "distributed-lloyd", "n_clusters": 2},
    "fed: gauss (no k)": {"name": "gauss"},
}


def _config(pattern: str, algo: dict, seed: int, test_fraction: float | None) -> dict:
    data = {"source": "files", "paths": [pattern], "label": "y_binary",
            "categorical": CATEGORICAL}
    if test_fraction:
        data["test_fraction"] = test_fraction
    return check_config({"seed": seed, "data": data, "algorithm": dict(algo),
                         "preprocess": {"impute": "mean", "scale": "standard"}})


def _sk_pipeline():
    return make_pipeline(SimpleImputer(strategy="mean"), StandardScaler(),
                         LogisticRegression(max_iter=2000))


def _classification(pattern: str, seed: int) -> dict[str, list[float]]:
    """method -> [acc per hospital..., pooled] on one split."""
    out: dict[str, list[float]] = {}
    exp = None
    for label, algo in CLASSIFIERS.items():
        exp = run_experiment(_config(pattern, algo, seed, 0.25))
        r = exp.result
        out[label] = [s["test_accuracy"] for s in r["sites"]] + [
            r["metrics"]["test_accuracy_pooled"]]
    sites = exp.federation.extra["sites"]
    raw = [X for X in sites.rows]  # encoded, NaN where missing, same split as above
    y = sites.targets
    tr, te = sites.train, sites.test
    alone, hits, n = [], 0, 0
    for X, yz, a, b in zip(raw, y, tr, te):
        if len(np.unique(yz[a])) < 2:  # one class only: the hospital can only predict it
            pred = np.full(len(b), yz[a][0])
        else:
            pred = _sk_pipeline().fit(X[a], yz[a]).predict(X[b])
        alone.append(float(np.mean(pred == yz[b])))
        hits += int(np.sum(pred == yz[b]))
        n += len(b)
    out["each hospital alone (sklearn)"] = alone + [hits / n]
    pooled = _sk_pipeline().fit(np.vstack([X[a] for X, a in zip(raw, tr)]),
                                np.concatenate([yz[a] for yz, a in zip(y, tr)]))
    accs = [float(np.mean(pooled.predict(X[b]) == yz[b])) for X, yz, b in zip(raw, y, te)]
    pooled_all = float(np.mean(np.concatenate([pooled.predict(X[b]) == yz[b]
                                               for X, yz, b in zip(raw, y, te)])))
    out["pooled sklearn pipeline"] = accs + [pooled_all]
    return out, sites.names


def _clustering(pattern: str, seed: int) -> dict[str, list[float]]:
    """method -> [ARI per hospital..., pooled] on every hospital's rows."""
    out: dict[str, list[float]] = {}
    exp = None
    for label, algo in CLUSTERINGS.items():
        exp = run_experiment(_config(pattern, algo, seed, None))
        preds = exp.site_predictions
        ys = exp.federation.extra["sites"].targets
        out[label] = [adjusted_rand_score(y, p) for y, p in zip(ys, preds)] + [
            adjusted_rand_score(np.concatenate(ys), np.concatenate(preds))]
    sites = exp.federation.extra["sites"]
    ys = sites.targets
    alone = []
    for X, y in zip(sites.rows, ys):
        Z = make_pipeline(SimpleImputer(strategy="mean"), StandardScaler()).fit_transform(X)
        alone.append(adjusted_rand_score(y, KMeans(2, n_init=10, random_state=seed)
                                         .fit_predict(Z)))
    out["each hospital alone (k-means)"] = alone + [float("nan")]
    Zs = exp.federation.extra["site_rows"]  # the federated preprocessing = the pooled one
    km = KMeans(2, n_init=10, random_state=seed).fit(np.vstack(Zs))
    preds = [km.predict(Z) for Z in Zs]
    out["pooled k-means (sklearn)"] = [adjusted_rand_score(y, p) for y, p in zip(ys, preds)] + [
        adjusted_rand_score(np.concatenate(ys), np.concatenate(preds))]
    return out, sites.names


def _summarise(runs: list[dict[str, list[float]]]) -> dict[str, list[tuple[float, float]]]:
    return {m: [C.mean_std([r[m][j] for r in runs]) for j in range(len(runs[0][m]))]
            for m in runs[0]}


def _cells(ms: list[tuple[float, float]], pct: bool) -> list[str]:
    out = []
    for m, s in ms:
        if np.isnan(m):
            out.append("-")
        elif pct:
            out.append(f"{100 * m:.1f}" + (f" ± {100 * s:.1f}" if s else ""))
        else:
            out.append(f"{m:.3f}" + (f" ± {s:.3f}" if s else ""))
    return out


def main() -> None:
    p = C.make_parser(__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help="splits (default 5, quick 1)")
    args = C.finish_args(p.parse_args())
    folder = args.data_dir / "uci-extra" / "heart-disease"
    if not (folder / "heart_va.npz").exists():
        note = f"heart-disease files not found under {args.data_dir}; skipped"
        print(f"note: {note} (set FEDCLUST_DATA or --data-dir)", flush=True)
        C.write_json(args, "heart_sites", {"skipped": note})
        return
    pattern = str(folder / "heart_*.npz")
    runs = args.runs or (1 if args.quick else 5)
    warnings.filterwarnings("ignore", category=UserWarning)
    cls_runs, clu_runs = [], []
    names = []
    with C.blas_limit(args):
        for r in range(runs):
            res, names = _classification(pattern, args.seed + r)
            cls_runs.append(res)
            res, _ = _clustering(pattern, args.seed + r)
            clu_runs.append(res)
    short = [n.replace("heart_", "") for n in names]
    cls, clu = _summarise(cls_runs), _summarise(clu_runs)
    C.print_table(["method", *short, "pooled"], [[m, *_cells(v, True)] for m, v in cls.items()],
                  title=f"Test accuracy (%) per hospital, y_binary, 25% per-hospital test split, "
                        f"{runs} split(s)")
    C.print_table(["method", *short, "pooled"], [[m, *_cells(v, False)] for m, v in clu.items()],
                  title="ARI vs y_binary per hospital (k = 2; gauss chooses its own k)")
    C.write_json(args, "heart_sites", {"runs": runs, "sites": names,
                                       "classification": cls_runs, "clustering": clu_runs,
                                       "classification_summary": cls,
                                       "clustering_summary": clu})


if __name__ == "__main__":
    main()
