"""The heart-hospital federation under differential privacy (part of ``privacy.py``).

Four hospital files (``uci-extra/heart-disease/heart_*.npz``: Cleveland,
Hungary, Switzerland, VA Long Beach) read with :func:`fedclust.sites.load_sites`
(``cp``, ``restecg``, ``slope``, ``thal`` one-hot: 22 columns, heavy missing
values), a 25 % per-hospital test split drawn from the seed, as
``benchmarks/heart_sites.py``. Point level, δ = 1e-6, total ε per run:

* the preprocessing is private: ``FederatedPreprocessor(privacy=dp,
  bounds=HEART_RANGES, budget_share=0.2)`` (public clinical ranges, not read
  from the data), and the algorithm gets ``dp.after(preprocessor.privacy_plan_)``,
  so the accountant composes both within ε;
* a reference row runs DP Lloyd with the whole ε after the exact,
  non-private preprocessing (what the private preprocessing costs);
* the algorithm's ``data_bound`` is 2√d on the standardised columns (a
  standardised row has norm about √d);
* k-means cost ratio: the centers are mapped back to raw units with the
  private preprocessing and scored on the training rows standardised with the
  exact pooled preprocessing, divided by scikit-learn ``KMeans(k, n_init=10)``
  on those exact rows;
* accuracy: pooled over the four test sets; the DP Gaussian classifier
  (diagonal) after the private preprocessing; DP-FedAvg (logistic, 50 rounds,
  device level = one hospital, ``clip_norm = 1``) after the exact
  preprocessing, since the private preprocessing is point level only.
"""

from __future__ import annotations

import math
import time

import numpy as np
from sklearn.cluster import KMeans

from fedclust import FedAvg, FedGaussClassifier, KFed
from fedclust.lloyd import DistributedLloyd
from fedclust.metrics import kmeans_cost
from fedclust.sites.preprocess import FederatedPreprocessor
from fedclust.privacy import DifferentialPrivacy
from fedclust.sites import load_sites
from fedclust.sites.federation import to_federation

CATEGORICAL = ["cp", "restecg", "slope", "thal"]
#: public ranges of the numeric columns (clinical limits); binary and one-hot columns: [0, 1]
HEART_RANGES = {"age": (18, 100), "trestbps": (80, 220), "chol": (0, 700),
                "thalach": (60, 220), "oldpeak": (-3, 7), "ca": (0, 3)}
BUDGET_SHARE = 0.2
#: reference row: DP Lloyd with the whole ε after the exact (non-private) preprocessing
EXACT_PRE = "dp-lloyd, exact preprocessing (not DP)"


def heart_federation(folder, seed: int):
    sf = load_sites([str(folder / "heart_*.npz")], label="y_binary", categorical=CATEGORICAL)
    fed = to_federation(sf, seed, test_fraction=0.25)
    bounds = [HEART_RANGES.get(c, (0, 1)) for c in sf.columns]
    return fed, bounds


def _private_pre(devs, bounds, eps, delta, bound):
    dp = DifferentialPrivacy(eps, delta, data_bound=bound)
    pre = FederatedPreprocessor(privacy=dp, bounds=bounds, budget_share=BUDGET_SHARE).fit(devs)
    return pre, dp.after(pre.privacy_plan_)


def clustering_rows(folder, epsilons, delta, runs, seed, ks=(2, 5)):
    rows, records = [], []
    for k in ks:
        for method in ("dp-lloyd", "dp-kfed", EXACT_PRE):
            for eps in epsilons:
                ratios, times = [], []
                for r in range(runs):
                    fed, bounds = heart_federation(folder, seed + r)
                    devs = fed.devices
                    exact = FederatedPreprocessor().fit(devs)
                    Z = np.vstack(exact.transform(devs))
                    ref = kmeans_cost(Z, KMeans(k, n_init=10, random_state=seed).fit(Z)
                                      .cluster_centers_)
                    B = 2.0 * math.sqrt(Z.shape[1])
                    t0 = time.perf_counter()
                    if method == EXACT_PRE:   # reference: the whole ε to Lloyd
                        pre, dp = exact, DifferentialPrivacy(eps, delta, data_bound=B)
                    else:
                        pre, dp = _private_pre(devs, bounds, eps, delta, B)
                    Zs = pre.transform(devs)
                    if method == "dp-kfed":
                        model = KFed(k, k, server="kmeans++", weighted=True, privacy=dp,
                                     random_state=seed + r).fit(Zs)
                    else:
                        model = DistributedLloyd(k, privacy=dp, random_state=seed + r).fit(Zs)
                    times.append(time.perf_counter() - t0)
                    raw = model.cluster_centers_ * pre.scale_ + pre.mean_
                    C = (raw - exact.mean_) / exact.scale_
                    ratios.append(kmeans_cost(Z, C) / ref)
                    assert model.privacy_["epsilon_spent"] <= eps
                rows.append([f"heart (k={k})", method, eps, float(np.mean(ratios)),
                             float(np.max(ratios)), "", float(np.mean(times))])
                records.append({"setting": f"heart-k{k}", "method": method, "epsilon": eps,
                                "unit": "point", "cost_ratio": ratios, "time_s": times,
                                "preprocessing_share": BUDGET_SHARE})
    return rows, records


def supervised_rows(folder, epsilons, delta, runs, seed):
    rows, records = [], []
    for method in ("gauss-classifier (diag)", "dp-fedavg (hospital level)"):
        for eps in epsilons:
            accs = []
            for r in range(runs):
                fed, bounds = heart_federation(folder, seed + r)
                devs, ys = fed.devices, fed.labels
                if method.startswith("gauss"):
                    B = 2.0 * math.sqrt(devs[0].shape[1])
                    pre, dp = _private_pre(devs, bounds, eps, delta, B)
                    model = FedGaussClassifier(covariance="diag", privacy=dp,
                                               random_state=seed + r)
                else:
                    pre = FederatedPreprocessor().fit(devs)
                    dp = DifferentialPrivacy(eps, delta, unit="device", clip_norm=1.0)
                    model = FedAvg("logistic", rounds=50, lr=0.1, privacy=dp,
                                   random_state=seed + r)
                model.fit(pre.transform(devs), ys)
                Xte = np.vstack(pre.transform(fed.test_devices))
                yte = np.concatenate(fed.test_labels)
                accs.append(float(np.mean(model.predict(Xte) == yte)))
            rows.append(["heart (4 hospitals)", method, eps, float(np.mean(accs)),
                         float(np.std(accs))])
            records.append({"setting": "heart", "method": method, "epsilon": eps,
                            "accuracy": accs})
    return rows, records
