"""Speed and scale: k-FED vs scikit-learn on pooled data vs the authors' design.

Cases (full mode; ``--quick`` shrinks every one to seconds):

``authors-40x800``
    40 devices x 800 points, d=100, k=64, k'=8 (reference: the
    authors' code took 20.8 s there, scikit-learn on the pooled data 1.7 s).
``large-1000x1000``
    1,000 devices x 1,000 points (10^6 points), d=100, k=100, k'=10; goal
    k-FED <= 0.05x scikit-learn's time at cost <= 1.05x.
``many-small-1e5x20``
    100,000 devices x 20 points (2 x 10^6 points), d=100, k=100, k'=2; the
    server step here aggregates 2 x 10^5 device centers.
``tiny-5e4x20``
    50,000 devices x 20 points, d=20, k=50, k'=2: cross-device scale, where
    per-device overhead (random streams, codec, validation) rather than maths
    dominates; goal k-FED <= 0.25x scikit-learn's time at cost <= 1.05x.
``mnist-iid-100x700``
    real, high-dimensional data: MNIST (70,000 x 784, pixels / 255) split IID
    over 100 devices, k=10, k'=5 (skipped with a note when MNIST is absent).

Synthetic data: :func:`fedclust.datasets.make_federated_gaussians` at separation c=100
(separable; every device holds exactly k' components), ``m0`` chosen to give
the device counts above.

Measured in one process, each ``--repeats`` times (min and median reported,
this machine's timings are noisy):

* ``kfed_fit``: ``KFed(k, k').fit(devices)`` end to end: every device step run
  in this process (devices of one shape batched: up to 1,024 small devices, or
  about 8 MiB of large ones, per stacked chunk), the in-process transport with its
  message codec, the server step, the label maps back (one gather per batch);
* ``kfed_local_kmeans_loop``: the public one-device function
  :func:`fedclust.local.local_kmeans` called once per device in a Python loop
  (what a caller gets without ``KFed``'s own device scheduling; JSON only);
  the table's ``fit−server`` column is ``kfed_fit`` minus the server step,
  i.e. all device steps plus the transport;
* ``kfed_server``: :func:`fedclust.kfed.server.aggregate_centers` on the
  collected local centers (paper's ``farthest-lloyd1``; ``farthest-lloyd``
  also timed);
* ``sklearn``: ``sklearn.cluster.KMeans(k, n_init=1)`` (k-means++, Lloyd) on the
  pooled data (``np.concatenate`` time reported separately as ``pool``);
* ``kfed_fit_1thread`` / ``sklearn_1thread``: the same two fits with one thread each
  (``threadpool_limits(1)`` for OpenMP and BLAS, k-FED's device pool ``n_jobs=1``),
  the ``1-thread`` column (wall clock) and ``1-thread CPU`` (this process's CPU time,
  which other jobs on a shared machine inflate less); ``--no-one-thread`` skips
  them; the other columns let
  both use every core (scikit-learn's OpenMP Lloyd, k-FED's device threads);
* ``kfed_default_fit_1thread``: ``KFed(k, k')`` with the default server (keyed weighted
  k-means++ starts over each device's summary ladder) on one thread, once per case
  (``--no-default-server`` skips it): the timed fits above name the paper's server
  ``farthest-lloyd1``, which the time goals are stated for; this table says what a user
  who changes nothing gets at these scales (CPU time, cost, bytes up per device).
  Measured (one run, ``--cases 1,3 --no-authors --curve-max 0 --repeats 1``, 2-core
  machine at load average 4, CPU s): large-1000x1000 6.97 s against scikit-learn's
  35.44 s (0.197x), tiny-5e4x20 6.00 s against 3.97 s (1.51x). Where the CPU goes
  (cProfile, one thread): on large-1000x1000 the server's 10 keyed k-means++ starts over
  the 10,000 pieces (about 40%: every step one BLAS product of the pieces with its 6
  candidates and one with its pick, about 1.9 ms together), the devices' steps (about
  40%: Gram matrices, seeds, Lloyd, and the summary's two scatter passes over the rows)
  and the final labelling of the 10^6 rows (about 15%); on tiny-5e4x20 (200,000 device
  centers, above ``fedclust.kfed.keyed.SAMPLED_ABOVE``: the starts run on a keyed coreset
  of about 10,000) the devices' steps (about half: LAPACK ``eigh`` of the 50,000 20 x 20
  Gram matrices alone about 1.8 s, since subspace iteration, tried on each batch's first
  64 devices, converges on none at k_z = 4 for devices of 2 groups), the server (about
  15%), the explanation check of the final centers (about 10%) and the final labelling
  (about 7%);
* ``authors``: :mod:`authors_kfed`, a re-creation of the authors' design (a
  per-device loop around scikit-learn ``KMeans``). On the many-small case its
  device loop runs on a random sample of ``--authors-devices`` devices and is
  extrapolated linearly (marked ``~``); its server step is skipped there (its
  farthest-point loop recomputes all distances to the growing set every step:
  O(N k^2 d) for N = 2 x 10^5 centers).

Peak memory: the kernel's per-process high-water mark (``VmHWM``, reset before
every phase through ``/proc/self/clear_refs``) minus the resident size before
the phase, i.e. the extra memory the phase needed on top of the data.

Where the time goes (one thread, ``docs/reproducing.md`` has the measured table): on
``large-1000x1000`` the devices' dense maths, about 1.2 ms of CPU per device (Gram
matrix 0.25 ms, subspace iteration 0.1 ms, k-means++ on the projection 0.22 ms,
projection and filtered seeds 0.25 ms, Lloyd 0.4 ms), plus the input checks' reads of
the rows and the stacking copy; on ``tiny-5e4x20`` about 8 µs of batched maths per
device (projection 3 µs, seeds 2 µs, Lloyd 2.5 µs), the input checks, the server step
on 10^5 device centers (0.11-0.2 s) and the per-device Python of states, labels and the
byte meter (the server reads each batch of replies column-wise, with no message object
per device). Measured (``--cases 1,3 --no-authors --no-default-server --curve-max 0
--repeats 5``, 2-core machine with no other job, load average 1.0-1.6, one
thread, CPU seconds, minimum of 5 repeats): large-1000x1000 k-FED 1.57 s against
scikit-learn's 28.38 s (0.055x, cost 0.7779), tiny-5e4x20 1.03 s against 4.15 s
(0.248x, cost 1.0000); the medians give 1.75 s against 33.93 s (0.051x) and 1.08 s
against 4.49 s (0.240x).

Streamed curve (``--cases none``; :mod:`_stream_curve`): ``KFed(k).fit(generator)``
over 10^3..10^7 devices of 20 points, d=20, k=50; ``--curve-server default``. Measured
on the shared 2-core machine: 10^3..10^6 devices with ``--curve-max 1e6`` (0.4 s, 2.4 s,
5.4 s, 53.1 s; cost / generating means 0.9975..1.0000), 10^7 devices alone with
``--curve-min 1e7 --curve-max 1e7`` under ``nice -n 19`` beside a test run: fit 844.2 s
wall, 817.8 s CPU, peak RSS 7628 MiB for 4 x 10^7 device centers (6104 MiB), cost
1.0000 (docs/kfed.md has the tables).

Checks: k-FED end to end no slower than scikit-learn on the
pooled data, k-means cost within 5% of it; server step for 10^5 devices'
centers under 2 s; memory linear in the data.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

import _common as C
from authors_kfed import authors_kfed, awasthi_sheffet_device
from fedclust import KFed
from fedclust.core.random import device_rng
from fedclust.datasets import make_federated_gaussians
from fedclust.kfed.local import local_kmeans
from fedclust.metrics import kmeans_cost, matched_accuracy
from fedclust.kfed.server import aggregate_centers


@dataclass
class Case:
    name: str
    n_devices: int
    n_per_device: int
    d: int
    k: int
    k_local: int
    authors_devices: int | None = None  # None: all devices
    authors_server: bool = True
    repeats: int | None = None
    dataset: str | None = None  # "mnist": real data, IID over n_devices (k'-agnostic)
    time_goal: float | None = None  # k-FED fit / pooled scikit-learn time to reach

    def make(self, seed: int, data_dir=None):
        if self.dataset == "mnist":
            from fedclust.datasets import FederatedData, load_mnist
            from fedclust.sim.partition import apply_partition, iid_partition

            X, y = load_mnist(data_dir)
            devs, labs = apply_partition(X, y, iid_partition(len(X), self.n_devices,
                                                             random_state=seed))
            return FederatedData(devices=devs, labels=labs)
        groups = math.ceil(self.k / self.k_local)
        m0 = self.n_devices // groups
        n_per = self.n_per_device * m0 // self.k_local
        return make_federated_gaussians(n_features=self.d, n_clusters=self.k,
                                        n_local_clusters=self.k_local, m0=m0,
                                        separation=100.0, n_per_component=n_per,
                                        random_state=seed)


FULL = [
    Case("authors-40x800", 40, 800, 100, 64, 8),
    Case("large-1000x1000", 1000, 1000, 100, 100, 10, repeats=2, time_goal=0.05),
    Case("many-small-1e5x20", 100_000, 20, 100, 100, 2, authors_devices=2000,
         authors_server=False, repeats=2),
    # cross-device: very many tiny devices in low dimension (goal: <= 0.25x scikit-learn)
    Case("tiny-5e4x20", 50_000, 20, 20, 50, 2, authors_devices=2000, authors_server=False,
         repeats=2, time_goal=0.25),
    # real, high-dimensional data (skipped with a note when MNIST is absent)
    Case("mnist-iid-100x700", 100, 700, 784, 10, 5, dataset="mnist", repeats=2),
]
QUICK = [
    Case("authors-40x800 (quick: 40x200, d=50)", 40, 200, 50, 64, 8),
    Case("large (quick: 100x200, d=50)", 100, 200, 50, 20, 5),
    Case("many-small (quick: 2000x20, d=20)", 2000, 20, 20, 20, 2, authors_devices=100,
         authors_server=False),
]


class Phase:
    """Time one phase and the extra peak memory it needs (MiB)."""

    def __init__(self):
        self.time = None
        self.cpu = None
        self.mem = None

    def __enter__(self):
        gc.collect()
        self._ok = C.reset_peak_rss()
        self._base = C.rss_mb()
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()
        return self

    def __exit__(self, *exc):
        self.time = time.perf_counter() - self._t0
        self.cpu = time.process_time() - self._c0
        hwm = C.vm_hwm_mb() if self._ok else None
        self.hwm = hwm   # the process's peak RSS in the phase (MiB)
        self.mem = None if hwm is None else max(hwm - self._base, 0.0)
        return False


def run_case(case: Case, repeats: int, seed: int, authors: bool, data_dir=None,
             one_thread: bool = True, default_server: bool = True) -> dict:
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    from fedclust.sim.transport import InProcessTransport

    t0 = time.perf_counter()
    fd = case.make(seed, data_dir)
    devices, y = fd.devices, fd.y
    gen_time = time.perf_counter() - t0
    data_mb = sum(X.nbytes for X in devices) / 2**20
    n = sum(len(X) for X in devices)
    print(f"\n[{case.name}] {len(devices):,} devices, {n:,} points, d={case.d}, k={case.k}, "
          f"k'={case.k_local}, data {data_mb:.0f} MiB (generated in {gen_time:.1f} s)",
          flush=True)
    T: dict[str, list[float]] = {}
    M: dict[str, float] = {}

    def rec(key, ph):
        T.setdefault(key, []).append(ph.time)
        if key.endswith("_1thread"):   # one thread: CPU time is its time, less the load
            T.setdefault(key + "_cpu", []).append(ph.cpu)
        if ph.mem is not None:
            M[key] = max(M.get(key, 0.0), ph.mem)

    out: dict = {}
    X = None
    for rep in range(repeats):
        with Phase() as ph:
            model = KFed(case.k, case.k_local, server="farthest-lloyd1", random_state=seed).fit(devices)
        rec("kfed_fit", ph)
        with Phase() as ph:
            for z, Xz in enumerate(devices):
                local_kmeans(Xz, case.k_local, device_rng(seed, z, 0))
        rec("kfed_local_kmeans_loop", ph)
        local = model.local_centers_
        for method in ("farthest-lloyd1", "farthest-lloyd"):
            with Phase() as ph:
                aggregate_centers(local, case.k, method=method)
            rec(f"kfed_server_{method}", ph)
        with Phase() as ph:
            X = np.concatenate(devices)
        rec("pool", ph)
        with Phase() as ph:
            km = KMeans(case.k, n_init=1, random_state=seed).fit(X)
        rec("sklearn", ph)
        if one_thread:   # the same single thread for both: OpenMP and BLAS of scikit-learn,
            # the device pool and BLAS of k-FED
            with threadpool_limits(limits=1):
                with Phase() as ph:
                    KFed(case.k, case.k_local, server="farthest-lloyd1", random_state=seed).fit(
                        devices, transport=InProcessTransport(n_jobs=1))
                rec("kfed_fit_1thread", ph)
                with Phase() as ph:
                    KMeans(case.k, n_init=1, random_state=seed).fit(X)
                rec("sklearn_1thread", ph)
                if default_server and rep == 0:   # the default server, once: what KFed() does
                    with Phase() as ph:
                        dflt = KFed(case.k, case.k_local, random_state=seed).fit(
                            devices, transport=InProcessTransport(n_jobs=1))
                    rec("kfed_default_fit_1thread", ph)
        if authors:
            if case.authors_devices is None or case.authors_devices >= len(devices):
                with Phase() as ph:
                    _, a_final, a_labels = authors_kfed(devices, case.k_local, case.k, seed=seed)
                rec("authors", ph)
                out["authors_sampled"] = False
            else:
                rng = np.random.default_rng(seed)
                sample = np.sort(rng.choice(len(devices), case.authors_devices, replace=False))
                with Phase() as ph:
                    for z in sample:
                        rs = np.random.RandomState((seed * 1_000_003 + int(z)) % (2**32))
                        awasthi_sheffet_device(devices[z], case.k_local, rs)
                ph.time *= len(devices) / len(sample)
                rec("authors", ph)
                out["authors_sampled"] = True
                out["authors_sample_devices"] = int(len(sample))
                a_final = None
        if rep < repeats - 1:
            del X
            X = None
    # quality (last repeat's models)
    ref = kmeans_cost(X, km.cluster_centers_)
    kcost = kmeans_cost(X, model.cluster_centers_)
    q = {"sklearn_cost": ref, "kfed_cost": kcost, "kfed_cost_ratio": kcost / ref,
         "kfed_accuracy": matched_accuracy(y, model.labels_),
         "sklearn_accuracy": matched_accuracy(y, km.labels_),
         "kfed_server_farthest_lloyd_cost_ratio": None}
    if authors and a_final is not None:
        acost = kmeans_cost(X, a_final)
        q.update(authors_cost=acost, authors_cost_ratio=acost / ref,
                 authors_accuracy=matched_accuracy(y, np.concatenate(a_labels)))
    if "kfed_default_fit_1thread" in T:
        q["kfed_default_cost_ratio"] = kmeans_cost(X, dflt.cluster_centers_) / ref
        q["kfed_default_bytes_up_per_device"] = dflt.communication_["bytes_up"] / len(devices)
        q["kfed_default_device_centers"] = int(sum(len(c) for c in dflt.local_centers_))
    agg2 = aggregate_centers(model.local_centers_, case.k, method="farthest-lloyd")
    q["kfed_server_farthest_lloyd_cost_ratio"] = kmeans_cost(X, agg2.centers) / ref
    del X
    times = {key: {"min": min(v), "median": statistics.median(v), "all": v}
             for key, v in T.items()}
    best = {key: v["min"] for key, v in times.items()}
    ratios = {
        "kfed_fit_over_sklearn": best["kfed_fit"] / best["sklearn"],
        "kfed_local_kmeans_loop_over_sklearn": best["kfed_local_kmeans_loop"] / best["sklearn"],
    }
    if "kfed_fit_1thread" in best:
        ratios["kfed_fit_over_sklearn_1thread"] = best["kfed_fit_1thread"] / best["sklearn_1thread"]
        ratios["kfed_fit_over_sklearn_1thread_cpu"] = (best["kfed_fit_1thread_cpu"]
                                                       / best["sklearn_1thread_cpu"])
    if "kfed_default_fit_1thread" in best:
        ratios["kfed_default_over_sklearn_1thread_cpu"] = (best["kfed_default_fit_1thread_cpu"]
                                                           / best["sklearn_1thread_cpu"])
    if "authors" in best:
        ratios["authors_over_kfed_fit"] = best["authors"] / best["kfed_fit"]
        ratios["authors_over_sklearn"] = best["authors"] / best["sklearn"]
    out.update({
        "case": case.name, "n_devices": len(devices), "n_points": n, "d": case.d, "k": case.k,
        "k_local": case.k_local, "n_local_centers": int(sum(len(c) for c in model.local_centers_)),
        "data_mib": data_mb, "generate_s": gen_time, "repeats": repeats,
        "time_s": times, "peak_extra_mib": M,
        "peak_extra_over_data": {k2: v / data_mb for k2, v in M.items()},
        "ratios": ratios, "quality": q,
        "targets": {
            "kfed_not_slower_than_sklearn": ratios["kfed_fit_over_sklearn"] <= 1.0,
            "kfed_cost_within_5pct": kcost <= 1.05 * ref,
            "kfed_time_goal": case.time_goal,
            "kfed_time_within_goal": (None if case.time_goal is None
                                      else ratios["kfed_fit_over_sklearn"] <= case.time_goal),
        },
    })
    return out


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=None, help="timing repeats (default 3; quick 2)")
    p.add_argument("--cases", default=None,
                   help="comma-separated case indices to run (default: all), e.g. 0,1; "
                        "'none': only the streamed curve")
    p.add_argument("--no-authors", action="store_true", help="skip the authors' design")
    p.add_argument("--no-one-thread", action="store_true",
                   help="skip the one-thread comparison (k-FED and scikit-learn both limited "
                        "to one thread: OpenMP, BLAS and the device pool)")
    p.add_argument("--curve-max", type=float, default=None,
                   help="largest device count of the streamed curve (default 1e7; quick 1e5; "
                        "0 skips the curve)")
    p.add_argument("--curve-server", default="kmeans++",
                   help="the streamed curve's server: 'kmeans++' (KFed(k, k', "
                        "server='kmeans++')) or 'default' (KFed(k): the default server and "
                        "its summary ladder)")
    p.add_argument("--curve-min", type=float, default=1e3,
                   help="smallest device count of the streamed curve (default 1e3)")
    p.add_argument("--authors-devices", type=int, default=None,
                   help="devices the authors' design runs on in the many-small case "
                        "(extrapolated; default 2000, quick 100)")
    p.add_argument("--no-default-server", action="store_true",
                   help="skip the one-thread fit with the default server (KFed() as a user "
                        "gets it; one repeat)")
    args = C.finish_args(p.parse_args(argv))
    cases = QUICK if args.quick else FULL
    if args.cases == "none":
        cases = []
    elif args.cases:
        cases = [cases[int(i)] for i in args.cases.split(",")]
    if args.authors_devices:
        for c in cases:
            if c.authors_devices is not None:
                c.authors_devices = args.authors_devices
    rows = []
    with C.blas_limit(args):
        # warm up imports / BLAS / sklearn so the first case is not charged for them
        warm = make_federated_gaussians(n_features=20, n_clusters=4, n_local_clusters=2, m0=2,
                                        n_per_component=40, random_state=0)
        KFed(4, 2, server="farthest-lloyd1", random_state=0).fit(warm.devices)
        if cases:
            authors_kfed(warm.devices, 2, 4)
        for case in cases:
            if case.dataset == "mnist":
                from fedclust.datasets import DataNotFoundError

                try:
                    d = args.data_dir
                    if not ((d / "mnist_70k.npz").is_file()
                            or (d / "mnist" / "mnist_70k.npz").is_file()):
                        raise DataNotFoundError(str(d))
                except DataNotFoundError:
                    print(f"note: no MNIST under {args.data_dir}; skipping case {case.name}",
                          flush=True)
                    continue
            reps = args.repeats or case.repeats or (2 if args.quick else 3)
            rows.append(run_case(case, reps, args.seed, authors=not args.no_authors,
                                 data_dir=args.data_dir, one_thread=not args.no_one_thread,
                                 default_server=not args.no_default_server))
    curve = []
    cmax = int(args.curve_max if args.curve_max is not None else (1e5 if args.quick else 1e7))
    if cmax:
        import _stream_curve as S

        with C.blas_limit(args):
            for z in S.points(cmax, int(args.curve_min)):
                curve.append(S.run_point(z, args.seed, Phase, server=args.curve_server))
                print(f"  streamed curve: {z:,} devices in {curve[-1]['fit_s']:.1f} s", flush=True)
    table = []
    for r in rows:
        t = {k: v["min"] for k, v in r["time_s"].items()}
        a = t.get("authors")
        table.append([
            r["case"], f"{t['kfed_fit']:.2f}",
            f"{max(t['kfed_fit'] - t['kfed_server_farthest-lloyd1'], 0.0):.2f}",
            f"{t['kfed_server_farthest-lloyd1']:.3f}", f"{t['sklearn']:.2f}",
            "-" if a is None else (("~" if r.get("authors_sampled") else "") + f"{a:.2f}"),
            f"{r['ratios']['kfed_fit_over_sklearn']:.2f}",
            "-" if "kfed_fit_over_sklearn_1thread" not in r["ratios"]
            else f"{r['ratios']['kfed_fit_over_sklearn_1thread']:.2f}",
            "-" if "kfed_fit_over_sklearn_1thread_cpu" not in r["ratios"]
            else f"{r['ratios']['kfed_fit_over_sklearn_1thread_cpu']:.3f}",
            "-" if r["targets"]["kfed_time_goal"] is None
            else f"<= {r['targets']['kfed_time_goal']:g}",
            "-" if a is None else f"{r['ratios']['authors_over_kfed_fit']:.1f}x",
            f"{r['quality']['kfed_cost_ratio']:.4f}",
            "-" if "authors_cost_ratio" not in r["quality"]
            else f"{r['quality']['authors_cost_ratio']:.4f}",
            f"{r['peak_extra_mib'].get('kfed_fit', float('nan')):.0f}",
            f"{r['peak_extra_mib'].get('sklearn', float('nan')):.0f}",
            f"{r['data_mib']:.0f}",
        ])
    C.print_table(["case", "k-FED fit s", "fit−server s", "server s", "sklearn s", "authors s",
                   "kfed/sk time", "1-thread", "1-thread CPU", "goal", "authors/kfed", "kfed/sk cost", "authors/sk cost",
                   "kfed +MiB", "sklearn +MiB", "data MiB"], table,
                  title="Speed — min over repeats; reference for authors-40x800: "
                        "authors' code 20.8 s, sklearn pooled 1.7 s"
                        f"{' — quick' if args.quick else ''}")
    srv = [[r["case"], r["n_local_centers"],
            f"{r['time_s']['kfed_server_farthest-lloyd1']['min']:.3f}",
            f"{r['time_s']['kfed_server_farthest-lloyd']['min']:.3f}",
            f"{r['quality']['kfed_server_farthest_lloyd_cost_ratio']:.4f}",
            f"{r['peak_extra_mib'].get('kfed_server_farthest-lloyd1', float('nan')):.0f}"]
           for r in rows]
    C.print_table(["case", "device centers", "farthest-lloyd1 s", "farthest-lloyd s",
                   "farthest-lloyd cost/sk", "server +MiB"], srv,
                  title="Server step alone (bound: < 2 s for 10^5 devices' centers)")
    dflt_rows = [[r["case"], r["quality"]["kfed_default_device_centers"],
                  f"{r['quality']['kfed_default_bytes_up_per_device']:.0f}",
                  f"{r['time_s']['kfed_default_fit_1thread_cpu']['min']:.2f}",
                  f"{r['time_s']['sklearn_1thread_cpu']['min']:.2f}",
                  f"{r['ratios']['kfed_default_over_sklearn_1thread_cpu']:.3f}",
                  f"{r['quality']['kfed_default_cost_ratio']:.4f}"]
                 for r in rows if "kfed_default_over_sklearn_1thread_cpu" in r["ratios"]]
    if dflt_rows:
        C.print_table(["case", "device centers", "bytes up/device", "KFed() CPU s",
                       "sklearn CPU s", "ratio", "cost/sk"], dflt_rows,
                      title="The default server (weighted k-means++ with keyed starts, the "
                            "summary ladder), one thread, one run")
    if curve:
        C.print_table(["devices", "points", "fit s", "fit CPU s", "peak +MiB", "peak RSS MiB",
                       "centers MiB", "cost / generating means"],
                      [[f"{c['n_devices']:,}", f"{c['n_points']:,}", f"{c['fit_s']:.1f}",
                        f"{c['fit_cpu_s']:.1f}",
                        "-" if c["peak_extra_mib"] is None else f"{c['peak_extra_mib']:.0f}",
                        "-" if c["peak_rss_mib"] is None else f"{c['peak_rss_mib']:.0f}",
                        f"{c['centers_mib']:.0f}", f"{c['cost_over_generating_means']:.4f}"]
                       for c in curve],
                      title="Streamed k-FED (generator; 20 points, d=20, k=50, k'=2, "
                            f"server {args.curve_server})")
    out = {"streamed_curve": curve,
           "params": {"separation": 100.0, "cases": [vars(c) for c in cases],
                      "memory": "VmHWM after reset minus RSS before the phase (MiB)"},
           "reference": {"authors_40x800_s": 20.8, "sklearn_40x800_s": 1.7},
           "rows": rows}
    C.write_json(args, "speed", out)
    return out


if __name__ == "__main__":
    main()
