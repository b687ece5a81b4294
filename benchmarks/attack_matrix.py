"""Attack matrix: k-FED, the robust clustering and the 3-stage pipeline against every attack shape.

Each defence is judged on attacks it was not tuned on. A fraction α of the
devices (drawn from the seed, :func:`fedclust.sim.byzantine.choose_byzantine`)
attack in one of these shapes:

* on the wire (:class:`fedclust.sim.byzantine.ByzantineTamper`, every reply):
  ``large-norm`` (N(0, s²) entries), ``sign-flip`` (−1 × the honest reply),
  ``scale`` (5 × it), ``collude`` (every liar sends one common point of norm s),
  ``between`` (points between two true cluster centres);
* in the data (:func:`fedclust.sim.byzantine.poison_devices`; the liars then
  follow the protocol honestly): ``scattered`` (each device's data moved by its
  own vector of length s), ``coordinated`` (all of them agree on one point at
  distance s, keeping honest-looking noise, so no two reports coincide),
  ``near`` (coordinated, on a point at 3 honest spreads from one true cluster),
  ``label-flip`` (regression: the response negated, y → −y).

s is the attack's scale in units of the data's spread ("near": 3; "far": 100
in the full run, or the values of ``--scales``). Columns: the non-robust
method, the robust one, and the *bound no server can beat*, the same robust
method on the honest devices alone. k-FED: accuracy on the honest devices'
points (check: ≥ 0.98 at α ≤ 0.2 where the honest-only run reaches 1.0);
clustering: misclustered honest points and the worst centre error; pipeline:
gain = 1 − error(TKM+TM)/error(KM+SM) and honest machines misclustered
(check: ≥ 53 % gain with ≤ 2 % misclustered at α ≤ 0.2). A cell fails when
its check is missed; a cell is marked "bound" when, in some run, a group of
liars who report consistently (the same transform of the same data, points on
one short segment, or one
shared point with honest-looking noise) is at least as large as the honest
holders of some true cluster: from what they send, the two look the same.
"""

from __future__ import annotations

import math
import time

import numpy as np

import _common as C
from fedclust import KFed
from fedclust.datasets import make_federated_gaussians
from fedclust.metrics import matched_accuracy
from fedclust.robust import (KGeomedians, KMeansLloyd, RobustClusteredRegression, TrimmedKMeans,
                             estimation_error, make_mixture_regression, misclustering_rate)
from fedclust.sim.byzantine import ByzantineTamper, choose_byzantine, poison_devices
from fedclust.sim.transport import InProcessTransport

WIRE = ("large-norm", "sign-flip", "scale", "collude", "between")
DATA = ("scattered", "coordinated", "near", "label-flip")
ALPHAS = (0.05, 0.1, 0.2, 0.3)


def _unit(rng, d):
    v = rng.normal(size=d)
    return v / np.linalg.norm(v)


# -- the attacks ---------------------------------------------------------------------------
def wire_hook(attack: str, ids, alpha: float, seed: int, spread: float, scale: float,
              truth: np.ndarray) -> ByzantineTamper:
    """A tamper hook for ``attack``; ``truth`` (k, p): true centres (for ``between``/``collude``)."""
    rng = np.random.default_rng(seed + 991)
    if attack == "large-norm":
        return ByzantineTamper(ids, alpha, seed, attack=attack, scale=scale * spread)
    if attack == "sign-flip":
        return ByzantineTamper(ids, alpha, seed, attack=attack, scale=1.0)
    if attack == "scale":
        return ByzantineTamper(ids, alpha, seed, attack=attack, scale=5.0)
    if attack == "collude":
        return ByzantineTamper(ids, alpha, seed, attack=attack,
                               target=truth.mean(0) + scale * spread * _unit(rng, truth.shape[1]))
    return ByzantineTamper(ids, alpha, seed, attack="between", between=(truth[0], truth[1]))


def poison(attack: str, devices, alpha: float, seed: int, spread: float, scale: float,
           truth: np.ndarray, honest_spread: float):
    """Poisoned devices for a data attack: (new devices, poisoned ids)."""
    rng = np.random.default_rng(seed + 997)
    if attack == "scattered":
        if isinstance(devices[0], tuple):
            return poison_devices(devices, alpha, seed, attack="regression",
                                  scale=scale * spread / math.sqrt(truth.shape[1]))
        return poison_devices(devices, alpha, seed, attack="shift", scale=scale * spread)
    if attack in ("coordinated", "near"):
        dist = scale * spread if attack == "coordinated" else 3.0 * honest_spread
        base = truth.mean(0) if attack == "coordinated" else truth[0]
        target = base + dist * _unit(rng, truth.shape[1])
        if isinstance(devices[0], tuple):
            target = target[:-1]         # regression: the coefficients (no intercept column)
        return poison_devices(devices, alpha, seed, attack="coordinated", target=target)
    # label-flip (regression): the response negated
    bad = choose_byzantine(range(len(devices)), alpha, seed)
    out = [(X, -y) if z in bad else (X, y) for z, (X, y) in enumerate(devices)]
    return out, bad


# -- k-FED ---------------------------------------------------------------------------------
def kfed_cell(attack, alpha, c, scale, *, d, k, m0, runs, seed, n_per):
    kp = max(1, int(round(math.sqrt(k))))
    acc = {"plain": [], "robust": [], "honest_only": []}
    bound = 0
    for r in range(runs):
        s = seed + r
        fd = make_federated_gaussians(n_features=d, n_clusters=k, n_local_clusters=kp, m0=m0,
                                      separation=c, n_per_component=n_per, random_state=s)
        ids = list(range(len(fd.devices)))
        spread = float(np.linalg.norm(fd.means - fd.means.mean(0), axis=1).max())
        honest_spread = math.sqrt(d)   # sigma = 1: a point lies about sqrt(d) from its mean
        devices, tamper = fd.devices, None
        if attack in WIRE:
            tamper = wire_hook(attack, ids, alpha, s, spread, scale, fd.means)
            bad = tamper.byzantine
        else:
            devices, bad = poison(attack, fd.devices, alpha, s, spread, scale, fd.means,
                                  honest_spread)
        honest = [z for z in ids if z not in set(bad)]
        # liars of one device group who report consistent centers (the same transform of
        # the same data, or one shared point with honest-looking noise) corroborate each other:
        # as many of them as the honest devices of some group look like a true cluster
        group_of = {z: tuple(np.unique(fd.labels[z])) for z in ids}
        n_honest, n_liars = {}, {}
        for z in ids:
            side = n_liars if z in set(bad) else n_honest
            side[group_of[z]] = side.get(group_of[z], 0) + 1
        fewest = min(n_honest.get(g, 0) for g in set(group_of.values()))
        consistent = attack in ("sign-flip", "scale", "coordinated", "near", "between")
        bound += int(fewest == 0 or (consistent and max(n_liars.values(), default=0) >= fewest))
        y = np.concatenate([fd.labels[z] for z in honest])
        for key, trim in (("plain", 0.0), ("robust", alpha)):
            m = KFed(k, kp, trim=trim, server="farthest-lloyd1", random_state=s).fit(
                devices, transport=InProcessTransport(tamper=tamper))
            acc[key].append(matched_accuracy(y, np.concatenate([m.device_labels_[z]
                                                                for z in honest])))
        m = KFed(k, kp, server="farthest-lloyd1", random_state=s).fit([fd.devices[z] for z in honest])
        acc["honest_only"].append(matched_accuracy(y, np.concatenate(m.device_labels_)))
    out = {"part": "kfed", "attack": attack, "alpha": alpha, "c": c, "scale": scale,
           "runs_at_bound": bound, **{f"{k_}_mean": float(np.mean(v)) for k_, v in acc.items()},
           "robust_min": float(np.min(acc["robust"])), "accuracy": acc}
    ok = [rb >= 0.98 for rb, ho in zip(acc["robust"], acc["honest_only"]) if ho >= 1.0]
    out["status"] = ("-" if alpha > 0.2 else "pass" if all(ok) else
                     "bound" if bound else "FAIL")
    return out


# -- robust clustering of points ------------------------------------------------------------
def clustering_cell(attack, alpha, scale, *, n, d, k, runs, seed):
    methods = {"Lloyd": KMeansLloyd, "TrimmedKMeans": TrimmedKMeans, "KGeomedians": KGeomedians}
    res = {name: {"miscl": [], "err": []} for name in methods}
    res["bound (honest only)"] = {"miscl": [], "err": []}
    at_bound = 0
    for r in range(runs):
        s = seed + r
        rng = np.random.default_rng(s)
        means = 10.0 * rng.normal(size=(k, d)) / math.sqrt(2)   # pairwise distance ~ 10 sqrt(d)
        lab = rng.integers(0, k, n)
        X = means[lab] + rng.normal(size=(n, d))
        bad = np.zeros(n, dtype=bool)
        bad[rng.choice(n, int(round(alpha * n)), replace=False)] = True
        spread = float(np.linalg.norm(means - means.mean(0), axis=1).max())
        nb = int(bad.sum())
        u = _unit(rng, d)
        if attack in ("large-norm", "scattered"):
            X[bad] = means.mean(0) + scale * spread * rng.normal(size=(nb, d)) / math.sqrt(d)
        elif attack == "sign-flip":
            X[bad] = -X[bad]
        elif attack == "scale":
            X[bad] = 5.0 * X[bad]
        elif attack == "collude":
            X[bad] = means.mean(0) + scale * spread * u
        elif attack == "coordinated":
            X[bad] = means.mean(0) + scale * spread * u + rng.normal(size=(nb, d))
        elif attack == "near":
            X[bad] = means[0] + 3.0 * math.sqrt(d) * u + rng.normal(size=(nb, d))
        elif attack == "between":
            X[bad] = means[0] + rng.uniform(0.25, 0.75, (nb, 1)) * (means[1] - means[0])
        else:
            continue
        # a tight colluding group at least as large as a true cluster is a cluster to any server
        at_bound += int(attack in ("coordinated", "near") and nb >= np.bincount(lab[~bad]).min())
        for name, cls in methods.items():
            est = cls(k, random_state=s).fit(X)
            res[name]["miscl"].append(misclustering_rate(est.labels_, np.where(bad, -1, lab)))
            res[name]["err"].append(estimation_error(est.cluster_centers_, means))
        est = TrimmedKMeans(k, random_state=s).fit(X[~bad])
        res["bound (honest only)"]["miscl"].append(misclustering_rate(est.labels_, lab[~bad]))
        res["bound (honest only)"]["err"].append(estimation_error(est.cluster_centers_, means))
    out = {"part": "clustering", "attack": attack, "alpha": alpha, "scale": scale,
           "runs_at_bound": at_bound}
    for name, v in res.items():
        out[name] = {"miscl_max": float(np.max(v["miscl"])), "err_mean": float(np.mean(v["err"]))}
    return out


# -- the 3-stage pipeline -----------------------------------------------------------------
def pipeline_cell(attack, alpha, scale, *, m, n, d, k, rounds, runs, seed):
    errs = {"KM+SM": [], "TKM+TM": [], "bound (honest only)": []}
    miscl = []
    at_bound = 0
    for r in range(runs):
        s = seed + r
        mr = make_mixture_regression(m, n, d, k, alpha=0.0, noise=0.5, random_state=s)
        truth = np.hstack([mr.coef, mr.intercept[:, None]])
        spread = float(np.linalg.norm(truth - truth.mean(0), axis=1).max())
        honest_spread = 0.5 * math.sqrt((d + 1) / n)        # ERM noise: noise sqrt(p / n)
        devices = list(zip(mr.Xs, mr.ys))
        tamper = None
        if attack in WIRE:
            tamper = wire_hook(attack, range(m), alpha, s, spread, scale, truth)
            bad = tamper.byzantine
        else:
            devices, bad = poison(attack, devices, alpha, s, spread, scale, truth,
                                  honest_spread)
        clusters = mr.clusters.copy()
        clusters[list(bad)] = -1
        at_bound += int(attack in ("coordinated", "near")
                        and len(bad) >= np.bincount(clusters[clusters >= 0]).min())
        Xs, ys = [a for a, _ in devices], [b for _, b in devices]
        beta = min(0.45, alpha + 0.1)
        for name, conf in (("KM+SM", dict(clustering="kmeans", aggregator="mean")),
                           ("TKM+TM", {})):
            est = RobustClusteredRegression(k, beta=beta, rounds=rounds, random_state=s,
                                            **conf).fit(
                Xs, ys, transport=InProcessTransport(tamper=tamper))
            errs[name].append(estimation_error(np.hstack([est.coef_, est.intercept_[:, None]]),
                                               truth))
            if name == "TKM+TM":
                miscl.append(misclustering_rate(est.device_clusters_, clusters))
        good = [i for i in range(m) if i not in set(bad)]
        est = RobustClusteredRegression(k, beta=beta, rounds=rounds, random_state=s).fit(
            [mr.Xs[i] for i in good], [mr.ys[i] for i in good])
        errs["bound (honest only)"].append(estimation_error(
            np.hstack([est.coef_, est.intercept_[:, None]]), truth))
    out = {"part": "pipeline", "attack": attack, "alpha": alpha, "scale": scale,
           **{f"{k_}_mean": float(np.mean(v)) for k_, v in errs.items()},
           "miscl_max": float(np.max(miscl)), "errors": errs, "runs_at_bound": at_bound}
    out["gain"] = 1.0 - out["TKM+TM_mean"] / out["KM+SM_mean"]
    out["status"] = ("-" if alpha > 0.2 else
                     "pass" if out["gain"] >= 0.53 and out["miscl_max"] <= 0.02 else
                     "bound" if at_bound else "FAIL")
    return out


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=None, help="seeds per cell (default 5, quick 1)")
    p.add_argument("--parts", nargs="+", default=["kfed", "clustering", "pipeline"])
    p.add_argument("--alphas", type=float, nargs="+", default=None)
    p.add_argument("--scales", type=float, nargs="+", default=None,
                   help="far attacks' scale in data spreads (default 100; quick 100)")
    p.add_argument("--separations", type=float, nargs="+", default=None,
                   help="k-FED separations c (default 10 14 30 100; quick 14)")
    p.add_argument("--kfed-shape", type=int, nargs=3, metavar=("D", "K", "M0"), default=None,
                   help="k-FED federation: dimension, clusters, devices per group "
                        "(default 50 16 10; quick 20 9 5)")
    p.add_argument("--points-shape", type=int, nargs=3, metavar=("N", "D", "K"), default=None,
                   help="robust clustering of points: points, dimension, clusters "
                        "(default 600 10 3; quick 200 10 3)")
    p.add_argument("--pipeline-shape", type=int, nargs=4, metavar=("M", "N", "D", "K"),
                   default=None, help="pipeline: machines, points each, dimension, clusters "
                                      "(default 240 40 12 3; quick 120 40 12 3)")
    args = C.finish_args(p.parse_args(argv))
    q = args.quick
    runs = args.runs or (1 if q else 5)
    alphas = args.alphas or ([0.2] if q else list(ALPHAS))
    scales = args.scales or [100.0]
    seps = args.separations or ([14.0] if q else [10.0, 14.0, 30.0, 100.0])
    attacks = WIRE + DATA
    kd, kk, km0 = args.kfed_shape or ((20, 9, 5) if q else (50, 16, 10))
    pn, pd, pk = args.points_shape or ((200, 10, 3) if q else (600, 10, 3))
    mm, mn, md, mk = args.pipeline_shape or ((120, 40, 12, 3) if q else (240, 40, 12, 3))
    rows = []
    t0 = time.perf_counter()
    with C.blas_limit(args):
        for alpha in alphas:
            for attack in attacks:
                for scale in scales:
                    if "kfed" in args.parts and attack != "label-flip":
                        for c in seps:
                            rows.append(kfed_cell(attack, alpha, c, scale, d=kd, k=kk, m0=km0,
                                                  runs=runs, seed=args.seed,
                                                  n_per=40 if q else None))
                    if "clustering" in args.parts and attack != "label-flip":
                        rows.append(clustering_cell(attack, alpha, scale, n=pn, d=pd, k=pk,
                                                    runs=runs, seed=args.seed))
                    if "pipeline" in args.parts:
                        rows.append(pipeline_cell(attack, alpha, scale, m=mm, n=mn, d=md, k=mk,
                                                  rounds=5 if q else 10, runs=runs,
                                                  seed=args.seed))
    kf = [r for r in rows if r["part"] == "kfed"]
    if kf:
        C.print_table(["attack", "α", "c", "scale", "trim=0", "trim=α", "trim=α min",
                       "honest only", "runs at bound", "≥ 0.98"],
                      [[r["attack"], r["alpha"], r["c"], r["scale"], r["plain_mean"],
                        r["robust_mean"], r["robust_min"], r["honest_only_mean"],
                        f"{r['runs_at_bound']}/{runs}", r["status"]] for r in kf],
                      title=f"k-FED: accuracy on honest devices (mean of {runs} runs)")
    cl = [r for r in rows if r["part"] == "clustering"]
    if cl:
        names = ["Lloyd", "TrimmedKMeans", "KGeomedians", "bound (honest only)"]
        C.print_table(["attack", "α", "scale", *[f"{n} miscl/err" for n in names],
                       "runs at bound"],
                      [[r["attack"], r["alpha"], r["scale"],
                        *[f"{r[n]['miscl_max']:.3f} / {r[n]['err_mean']:.3g}" for n in names],
                        f"{r['runs_at_bound']}/{runs}"]
                       for r in cl],
                      title="robust clustering: honest points misclustered (max) / centre error")
    pl = [r for r in rows if r["part"] == "pipeline"]
    if pl:
        C.print_table(["attack", "α", "scale", "KM+SM", "TKM+TM", "honest only", "gain",
                       "miscl. max", "runs at bound", "≥ 53%, ≤ 2%"],
                      [[r["attack"], r["alpha"], r["scale"], r["KM+SM_mean"], r["TKM+TM_mean"],
                        r["bound (honest only)_mean"], f"{100 * r['gain']:.1f}%",
                        r["miscl_max"], f"{r['runs_at_bound']}/{runs}", r["status"]]
                       for r in pl],
                      title=f"3-stage pipeline: max cluster error (mean of {runs} runs)")
    out = {"params": {"runs": runs, "alphas": alphas, "scales": scales, "separations": seps,
                      "quick": q, "seed": args.seed, "kfed_shape": [kd, kk, km0],
                      "points_shape": [pn, pd, pk], "pipeline_shape": [mm, mn, md, mk]}, "rows": rows, "seconds": time.perf_counter() - t0,
           "failing": [{k_: r[k_] for k_ in ("part", "attack", "alpha", "scale")}
                       | ({"c": r["c"]} if "c" in r else {})
                       for r in rows if r.get("status") == "FAIL"]}
    C.write_json(args, "attack_matrix", out)
    return out


if __name__ == "__main__":
    main()
