"""Exact unlearning: forgetting a device or some rows vs retraining without them.

Cases (full mode; ``--quick`` shrinks them to seconds):

``kfed``
    k-FED (default server: weighted k-means++ restarts + weighted Lloyd over the
    device centers, its k-means++ draws keyed by device so that a forget follows the
    fit's trace, :mod:`fedclust.kfed.keyed`), 1,000 devices x 1,000 points, d = 50,
    k = 20, each device holding k' = 5 of the 20 components (k-FED's heterogeneous
    setting).
``kfed-paper``
    the same federation with the paper's server (farthest-first + one Lloyd
    round, ``server="farthest-lloyd1"``).
``gauss``
    FedGaussClustering (evolving Gaussians, one round, the default flat server) on the
    same kind of federation with fewer devices (``--gauss-devices``, default 50): its
    server step, a BIC merge over every cluster the owners send, grows with the square
    of the number of clusters, and an exact forget runs it again.
``gauss-tree``
    FedGaussClustering(server="tree") on the full federation (``--devices``): the
    server merges along a fixed trie over the owners' ids and keeps every node's
    result, so a forget recomputes the departed owner's path (``server nodes``: how
    many trie nodes it computed again, of how many).

Measured in one process, per case:

* ``retrain``: a fresh ``fit`` on the federation without one device (same
  ``random_state``, same device ids): what forgetting costs without this module;
* ``forget``: ``model.forget(devices=[z], relabel=False)``: the server drops the
  device's kept summaries and runs its step again over the rest (the devices
  stay offline); ``forget+relabel`` adds every remaining device's pass over its
  own rows to relabel them (in a deployment each device does its own, in parallel);
* ``rows``: ``model.forget(rows={z: 10 rows})``: that device's step again, then its
  new summary enters the server's result (the keyed server follows its trace, ``rows
  path`` downdate; the other servers run their step again, replay); ``rows speedup``
  against a fresh fit without those rows; ``local step``: the same device's step alone,
  for comparison.

Times are CPU seconds of this process (``OMP_NUM_THREADS=1``: every step runs on one
thread), so that other jobs on a shared machine inflate them less than the wall clock
(also written to the JSON). Retrains are timed once. ``forget`` is the median over
``--repeats`` (default 7) later forgets of the same model (each time, the worst and the
starts run again are in the JSON); ``first forget`` is a model's first one (checked
against the retrain), which under the paper's server also works out what its downdates
need (a farthest-first pass and every device center's label margin), as does the first
forget after a full server step. Row deletions and local steps: the median over
``--repeats`` devices for k-FED, 3 for the Gaussians (one row deletion each, 10 rows).

Every forget is checked against the retrain (``exact`` column): bit for bit after the
server's step in full (``path`` replay); after a downdate of the paper's server
(``path`` downdate: no center of the leaving device was picked by farthest-first) the
centers within 1e-12 relative and every remaining device center's label equal.
``rechecked``: how many remaining device centers that downdate assigned again (the
others kept their label by a margin certificate). ``full-step forget`` is the speedup for
a device holding a picked center (the server's step in full).
References: MUFC (Pan et al., ICLR 2023) reports about 84x faster than
retraining k-means++; DC-k-means (Ginart et al., NeurIPS 2019) over 100x per
deletion; both are approximate or randomized in what they keep, this is exact.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _common import finish_args, make_parser, print_table, write_json  # noqa: E402

from fedclust import FedGaussClustering, KFed  # noqa: E402
from fedclust.core.protocol import Request  # noqa: E402
from fedclust.unlearning.forget import DOWNDATE_RTOL  # noqa: E402

MUFC_SPEEDUP = 84.0
GINART_SPEEDUP = 100.0


def federation(n_devices: int, n_points: int, d: int, k: int, k_local: int, seed: int):
    """Every device holds ``k_local`` of the ``k`` unit-variance Gaussian components."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d)) * (12.0 / np.sqrt(2 * d)) * np.sqrt(d) / 2
    devices = []
    for _ in range(n_devices):
        own = rng.choice(k, size=k_local, replace=False)
        devices.append(means[own[rng.integers(k_local, size=n_points)]]
                       + rng.normal(size=(n_points, d)))
    return devices


def _same(a, b) -> bool:
    """Equal models: the kept summaries bit for bit, the centers bit for bit after a full
    server step, within DOWNDATE_RTOL (of their largest magnitude) after a downdate."""
    if a._unlearning_.store.digest() != b._unlearning_.store.digest():
        return False
    if hasattr(a, "center_labels_") and (a.device_ids_ != b.device_ids_ or not all(
            np.array_equal(x, y) for x, y in zip(a.center_labels_, b.center_labels_))):
        return False   # every remaining device center's label, certified or reassigned
    if a.forget_log_ and a.forget_log_[-1].path == "downdate":
        scale = float(np.abs(b.cluster_centers_).max())
        return bool(np.abs(a.cluster_centers_ - b.cluster_centers_).max()
                    <= DOWNDATE_RTOL * scale)
    return np.array_equal(a.cluster_centers_, b.cluster_centers_)


def _timed(fn):
    """``(result, seconds)``: this process's CPU time (every step runs on one thread), which a
    machine shared with other jobs inflates less than the wall clock; the wall clock is kept
    in ``WALL``."""
    t, w = time.process_time(), time.perf_counter()
    out = fn()
    WALL.append(time.perf_counter() - w)
    return out, time.process_time() - t


WALL: list[float] = []


def _starts_again(model):
    """The keyed server's starts the last forget ran again, and why (None: another server)."""
    tr = model._unlearning_.trace
    return (None if tr is None or getattr(tr, "reruns", None) is None
            else {str(s): why for s, why in tr.reruns.items()})


def run_case(name, make, devices, ids, n_rows: int, seed: int, repeats: int = 3,
             later: int = 7):
    forget_id, rows_id = ids[len(ids) // 2], ids[len(ids) // 3]
    model, fit_s = _timed(lambda: make().fit(devices, device_ids=ids))
    keep = [i for i, z in enumerate(ids) if z != forget_id]
    retrained, retrain_s = _timed(
        lambda: make().fit([devices[i] for i in keep], device_ids=[ids[i] for i in keep]))
    # the downdate trace is worked out at a model's first forget: read it off another fit,
    # so the timed first forget below pays for it as a user's would
    # (only where the model downdates at all: k-FED's trace_of)
    trace = (make().fit(devices, device_ids=ids)._unlearning_.trace
             if model._unlearning_.trace_of is not None else None)
    # devices whose forget can downdate the paper's server: none of their centers picked
    # (the keyed server: also the devices holding a k-means++ seed)
    held = set() if trace is None else {trace.seed, *trace.picked.tolist()} if hasattr(
        trace, "picked") else {trace.seed_device, *trace.ff_owners.tolist(),
                               *trace.owner[trace.seeds.ravel()].tolist()}
    downdate_share = 0.0 if trace is None else 1 - len(held) / len(ids)
    _, forget_s = _timed(lambda: model.forget(devices=[forget_id], relabel=False))
    exact_device = _same(model, retrained)
    bit_equal_device = bool(np.array_equal(model.cluster_centers_, retrained.cluster_centers_))
    # device centers assigned again after a downdate (the others kept a certified label)
    rechecked = [model.forget_log_[-1].rechecked]
    path = model.forget_log_[-1].path
    max_diff = float(np.abs(model.cluster_centers_ - retrained.cluster_centers_).max())
    fallback_s = None
    if trace is not None:   # a device holding a picked center: the server's step in full
        held_id = next(z for z in ids if z in held and z != forget_id)
        model3 = make().fit(devices, device_ids=ids)
        _, fallback_s = _timed(lambda: model3.forget(devices=[held_id], relabel=False))
        assert model3.forget_log_[-1].path == "replay" or not hasattr(trace, "picked")
    # the same forget with the devices relabelling their rows (a second model)
    model2 = make().fit(devices, device_ids=ids)
    _, relabel_s = _timed(lambda: model2.forget(devices=[forget_id]))
    exact_labels = all(np.array_equal(x, y) for x, y in
                       zip(model2.device_labels_, retrained.device_labels_))
    # row deletion on the model that already forgot the device
    pos = ids.index(rows_id)
    rows = np.random.default_rng(seed).choice(len(devices[pos]), size=n_rows, replace=False)
    _, rows_s = _timed(lambda: model.forget(rows={rows_id: rows}, relabel=False))
    rows_paths = [model.forget_log_[-1].path]
    rows_again = [_starts_again(model)]
    reduced = [np.delete(devices[i], rows, axis=0) if ids[i] == rows_id else devices[i]
               for i in keep]
    retrained_rows, retrain_rows_s = _timed(
        lambda: make().fit(reduced, device_ids=[ids[i] for i in keep]))
    exact_rows = _same(model, retrained_rows)
    proto = model._unlearning_.protocol
    request = proto.next_request(proto.start([rows_id], model.seed_))
    _, local_s = _timed(lambda: proto.client_steps(
        request, {rows_id: reduced[keep.index(pos)]}, seed=model.seed_, states={rows_id: {}}))
    store = model._unlearning_.store
    recomputed = model.forget_log_[-1].recomputed
    # more timings on other devices (this machine is shared: report the median). The first
    # forget of a model, and the first after a full step (the row deletion above), work
    # out what a downdate needs (the paper's server); the later ones reuse it: the median
    # is over those, the first forget is reported apart
    first_forget_s = forget_s
    others = [z for z in ids if z not in (forget_id, rows_id)][:later + 1]
    forget_times, paths = [forget_s], [path]
    starts_again = []
    for z in others:
        forget_times.append(_timed(lambda: model.forget(devices=[z], relabel=False))[1])
        paths.append(model.forget_log_[-1].path)
        rechecked.append(model.forget_log_[-1].rechecked)
        starts_again.append(_starts_again(model))
    rows_times, local_times = [rows_s], [local_s]
    for z in [z for z in ids if z not in (forget_id, rows_id) and z not in others][:repeats - 1]:
        X = devices[ids.index(z)]
        rows_times.append(_timed(lambda: model.forget(rows={z: rows}, relabel=False))[1])
        rows_paths.append(model.forget_log_[-1].path)
        rows_again.append(_starts_again(model))
        request = proto.next_request(proto.start([z], model.seed_))
        local_times.append(_timed(lambda: proto.client_steps(
            request, {z: np.delete(X, rows, axis=0)}, seed=model.seed_, states={z: {}}))[1])
    forget_s, rows_s, local_s = (float(np.median(t)) for t in (forget_times[2:], rows_times,
                                                               local_times))
    worst_s = float(max(forget_times[2:]))
    return {
        "case": name, "devices": len(ids), "points_per_device": len(devices[0]),
        "fit_s": fit_s, "retrain_s": retrain_s, "forget_s": forget_s,
        "first_forget_s": first_forget_s, "first_forget_speedup": retrain_s / first_forget_s,
        "forget_relabel_s": relabel_s, "speedup": retrain_s / forget_s,
        "speedup_with_relabel": retrain_s / relabel_s,
        "rows_deleted": n_rows, "forget_rows_s": rows_s, "retrain_rows_s": retrain_rows_s,
        "local_step_s": local_s, "rows_over_local_step": rows_s / local_s,
        "rows_speedup": retrain_rows_s / rows_s,
        "exact_device": exact_device, "bit_equal_centers": bit_equal_device,
        "exact_labels": exact_labels, "exact_rows": exact_rows,
        "forget_paths": paths, "max_center_diff": max_diff, "rechecked_centers": rechecked,
        "device_centers": int(sum(len(c) for c in getattr(retrained, "local_centers_", []))),
        "downdate_share_of_devices": downdate_share, "fallback_forget_s": fallback_s,
        "fallback_speedup": None if fallback_s is None else retrain_s / fallback_s,
        "kept_summary_bytes": store.nbytes,
        "recomputed_rows": recomputed, "forget_times_s": forget_times,
        "later_forgets": len(forget_times[2:]), "worst_later_forget_s": worst_s,
        "worst_later_speedup": retrain_s / worst_s, "starts_run_again": starts_again,
        "server_work": [r.server_work for r in model.forget_log_],
        "server_nodes": _nodes(proto),
        "rows_times_s": rows_times, "local_step_times_s": local_times,
        "rows_paths": rows_paths, "rows_starts_again": rows_again,
    }


def _nodes(protocol) -> int | None:
    """Nodes of the Gaussians' trie server (None for the other servers)."""
    tree = getattr(protocol, "_tree", None)
    return None if tree is None else len(tree._kept) + 1


def main(argv=None) -> int:
    p = make_parser(__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--points", type=int, default=1000)
    p.add_argument("--gauss-devices", type=int, default=50)
    p.add_argument("--repeats", type=int, default=7,
                   help="later forgets of a k-FED model behind its median")
    p.add_argument("--cases", default="kfed,kfed-paper,gauss,gauss-tree",
                   help="comma-separated cases to run")
    args = finish_args(p.parse_args(argv))
    cases = args.cases.split(",")
    if args.quick:
        args.devices, args.points, args.gauss_devices = 60, 200, 8
    d, k, k_local = (50, 20, 5) if not args.quick else (10, 8, 3)
    devices = federation(args.devices, args.points, d, k, k_local, args.seed)
    ids = list(range(args.devices))
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("note: set OMP_NUM_THREADS=1 so that CPU time is the time of one thread")
    rows = []
    if "kfed" in cases:
        rows.append(run_case("kfed", lambda: KFed(k, k_local, random_state=args.seed),
                             devices, ids, 10, args.seed, repeats=args.repeats,
                             later=args.repeats))
    if "kfed-paper" in cases:
        rows.append(run_case("kfed-paper", lambda: KFed(k, k_local, server="farthest-lloyd1",
                                                        random_state=args.seed),
                             devices, ids, 10, args.seed, repeats=args.repeats,
                             later=args.repeats))
    g = args.gauss_devices
    if "gauss" in cases:
        rows.append(run_case("gauss", lambda: FedGaussClustering(random_state=args.seed),
                             devices[:g], ids[:g], 10, args.seed))
    if "gauss-tree" in cases:
        rows.append(run_case("gauss-tree", lambda: FedGaussClustering(
            server="tree", random_state=args.seed), devices, ids, 10, args.seed))
    print_table(
        ["case", "devices", "retrain CPU s", "forget s", "speedup", "first forget", "path",
         "rechecked", "server nodes", "full-step forget",
         "+relabel", "rows s", "rows path", "rows speedup", "local step s", "rows/local",
         "exact", "MUFC", "DC-k-means"],
        [(r["case"], r["devices"], f"{r['retrain_s']:.3f}", f"{r['forget_s']:.4f}",
          f"{r['speedup']:.0f}x", f"{r['first_forget_speedup']:.0f}x",
          "/".join(sorted(set(r["forget_paths"]))),
          "-" if r["rechecked_centers"][0] is None
          else f"{r['rechecked_centers'][0]}/{r['device_centers']}",
          "-" if r["server_nodes"] is None or r["server_work"][0] is None else
          f"{len(r['server_work'][0])}/{r['server_nodes']}",
          "-" if r["fallback_speedup"] is None else f"{r['fallback_speedup']:.0f}x",
          f"{r['speedup_with_relabel']:.0f}x",
          f"{r['forget_rows_s']:.4f}", "/".join(sorted(set(r["rows_paths"]))),
          f"{r['rows_speedup']:.0f}x", f"{r['local_step_s']:.4f}",
          f"{r['rows_over_local_step']:.2f}",
          str(r["exact_device"] and r["exact_rows"] and r["exact_labels"]),
          f"{MUFC_SPEEDUP:.0f}x", f"{GINART_SPEEDUP:.0f}x") for r in rows],
        title=f"forget one device / 10 rows vs retrain (d={d}, k={k}, k'={k_local})")
    write_json(args, "unlearning", {
        "params": {"devices": args.devices, "points": args.points, "d": d, "k": k,
                   "k_local": k_local, "gauss_devices": g, "quick": args.quick,
                   "seed": args.seed},
        "references": {"mufc_speedup": MUFC_SPEEDUP, "dc_kmeans_speedup": GINART_SPEEDUP},
        "rows": rows, "wall_s": WALL})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
