"""Privacy audit of every DP estimator: empirical ε lower bounds beside the accounted ε.

For each estimator: neighbouring datasets (one extra record at the data bound, or
one extra device for device-level DP-FedAvg), many fits with fresh noise (the
cryptographic sampler, no seed), every public fitted attribute tried as a statistic
(:mod:`fedclust.privacy.audit`), and a Clopper–Pearson lower bound on ε. Two
deliberately broken variants show that the audit bites: the noise switched off
(the accountant still reports its ε) and an exact count added to the fitted
attributes.

    python benchmarks/privacy_audit.py [--quick] [--fits N] [--out DIR]

Prints the table (estimator, release, accounted ε, empirical lower bound) and writes
``privacy_audit.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

EPSILON, DELTA, BOUND = 1.0, 1e-6, 3.0


@contextlib.contextmanager
def noise_off():
    """Broken variant: every mechanism releases its input exactly (the plan still says ε)."""
    from fedclust.privacy import mechanisms

    saved = mechanisms._grid_noise
    mechanisms._grid_noise = lambda x, std, rng: np.asarray(x, dtype=np.float64)
    try:
        yield
    finally:
        mechanisms._grid_noise = saved


def _points(seed: int = 0, Z: int = 3, n: int = 30, d: int = 2):
    rng = np.random.default_rng(seed)
    Xs = [np.clip(rng.normal(0, 1, (n, d)), -2, 2) for _ in range(Z)]
    ys = [(X[:, 0] > 0).astype(int) for X in Xs]
    return Xs, ys


def _add_point(Xs, ys, x, label=1):
    Xs = [X.copy() for X in Xs]
    ys = [y.copy() for y in ys]
    Xs[0] = np.vstack([Xs[0], x])
    ys[0] = np.append(ys[0], label)
    return Xs, ys


def cases(epsilon: float = EPSILON) -> list[dict[str, Any]]:
    """Each: name, release, fit(dataset) -> estimator, D, D', attributes not audited."""
    from fedclust import DistributedLloyd, FedAvg, FedGaussClassifier, FedGaussClustering, KFed
    from fedclust.sites.preprocess import FederatedPreprocessor
    from fedclust.privacy import DifferentialPrivacy

    dp = DifferentialPrivacy(epsilon, DELTA, data_bound=BOUND)
    dpd = DifferentialPrivacy(epsilon, DELTA, unit="device", clip_norm=1.0)
    Xs, ys = _points()
    edge = np.array([[BOUND, 0.0]])          # one record at the data bound
    Xs1, ys1 = _add_point(Xs, ys, edge)
    corner = np.array([[BOUND, BOUND]])      # at the top of both public ranges
    Xp1, _ = _add_point(Xs, ys, corner)
    # device level: one extra device whose labels disagree with everyone's
    rng = np.random.default_rng(7)
    Xd = [rng.normal(0, 1, (20, 2)) for _ in range(8)]
    yd = [(X[:, 0] > 0).astype(int) for X in Xd]
    Xextra = 3.0 * np.ones((20, 2))
    Xd1, yd1 = Xd + [Xextra], yd + [np.zeros(20, int)]
    participation = ("run_log_", "communication_", "history_", "device_clusters_")
    return [
        # the moments start, named: at this n the automatic choice is the box start, whose
        # shrunk steps stay at 0 here even with the noise off, so nothing could bite
        dict(name="DistributedLloyd", release="centres (moments, candidates, 2 Lloyd rounds)",
             fit=lambda d: DistributedLloyd(2, max_rounds=2, init="candidates", privacy=dp,
                                            random_state=0).fit(d[0]),
             D=(Xs, ys), D1=(Xs1, ys1), skip=()),
        dict(name="KFed", release="local centres and counts (on the devices)",
             fit=lambda d: KFed(2, 2, privacy=dp, random_state=0).fit(d[0]),
             D=(Xs, ys), D1=(Xs1, ys1), skip=()),
        dict(name="FedGaussClassifier", release="per-class count, sum, squares (diag)",
             fit=lambda d: FedGaussClassifier(covariance="diag", privacy=dp, classes=[0, 1],
                                              random_state=0).fit(d[0], d[1]),
             D=(Xs, ys), D1=(Xs1, ys1), skip=()),
        dict(name="FedGaussClustering", release="ball, candidates, 3 refinement rounds (diag)",
             fit=lambda d: FedGaussClustering(covariance="diag", privacy=dp,
                                              random_state=0).fit(d[0]),
             D=(Xs, ys), D1=(Xs1, ys1), skip=()),
        dict(name="FederatedPreprocessor", release="pooled column moments",
             fit=lambda d: FederatedPreprocessor(privacy=dp, bounds=[(-BOUND, BOUND)] * 2
                                                 ).fit(d[0]),
             D=(Xs, ys), D1=(Xp1, ys1), skip=()),
        dict(name="FedAvg (device level)", release="3 rounds of clipped update sums and counts",
             fit=lambda d: FedAvg("logistic", rounds=3, lr=0.5, privacy=dpd,
                                  random_state=0).fit(d[0], d[1]),
             D=(Xd, yd), D1=(Xd1, yd1), skip=participation),
    ]


def exact_count(est: Any, dataset: Any) -> Any:
    """Broken variant: the fit also exposes the exact number of rows."""
    est.n_rows_exact_ = int(sum(len(X) for X in dataset[0]))
    return est


def run_case(case: dict, fits: int, variant: str = "honest"):
    from fedclust.privacy.audit import audit

    fit: Callable = case["fit"]
    if variant == "exact count":
        base = fit
        fit = lambda d: exact_count(base(d), d)  # noqa: E731
    ctx = noise_off() if variant == "noise off" else contextlib.nullcontext()
    with ctx:
        res = audit(case["name"], case["release"] if variant == "honest"
                    else f"{case['release']} [{variant}]", fit, case["D"], case["D1"], fits,
                    DELTA, skip=case["skip"])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few fits (a smoke run)")
    ap.add_argument("--fits", type=int, default=None, help="fits per dataset (default 400)")
    ap.add_argument("--out", default="results", help="folder for privacy_audit.json")
    ap.add_argument("--epsilons", type=float, nargs="+", default=[EPSILON, 8.0],
                    help="accounted ε of the honest fits (a large one shows the audit's power)")
    args = ap.parse_args(argv)
    fits = args.fits or (40 if args.quick else 400)
    rows = []
    t0 = time.perf_counter()
    for eps in args.epsilons:
        for case in cases(eps):
            rows.append(run_case(case, fits).row())
    for variant in ("noise off", "exact count"):
        rows.append(run_case(cases()[0], fits, variant).row())
    print(f"Privacy audit: δ = {DELTA:g}, {fits} fits per dataset, "
          "Clopper–Pearson at α = 0.01 per interval")
    head = ("estimator", "release", "accounted ε", "empirical lower bound", "statistic")
    print(" | ".join(head))
    for r in rows:
        print(f"{r['estimator']} | {r['release']} | {r['accounted_epsilon']:.3f} | "
              f"{r['empirical_lower_bound']:.3f} | {r['statistic']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "privacy_audit.json").write_text(json.dumps(
        {"benchmark": "privacy_audit", "quick": bool(args.quick), "fits": fits,
         "epsilons": args.epsilons, "delta": DELTA, "rows": rows,
         "time_s": time.perf_counter() - t0}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
