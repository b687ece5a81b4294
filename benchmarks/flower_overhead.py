"""Flower simulation overhead against the in-process run at 10, 100 and 1,000 devices.

k-FED (k = 10, k' = 2, d = 20, 100 points per device, ``make_federated_gaussians``)
fitted twice on the same federation and seed: with the in-process transport
and with :class:`fedclust.flower.FlowerSimulationTransport` (``run_simulation``
on Ray, in a subprocess, one Ray actor with all cores). The centers must be
identical. Columns: the wall time of each fit; for Flower also the ServerApp's
own split (``hello``: until every virtual SuperNode answered who it is;
``rounds``: the k-FED round, send and receive; ``total``: the ServerApp's main
loop including the final label maps) and what is left of the wall time outside
the ServerApp (the subprocess, Ray start-up and shutdown, writing device files
and reading the result). ``--quick``: 10 and 100 devices.
"""

from __future__ import annotations

import time

import numpy as np

import _common as C
from fedclust import KFed
from fedclust.datasets import make_federated_gaussians


def run(n_devices: int, seed: int) -> dict:
    from fedclust.flower import FlowerSimulationTransport

    data = make_federated_gaussians(n_features=20, n_clusters=10, n_local_clusters=2,
                                    m0=max(1, n_devices // 5), n_per_component=100 * max(
                                        1, n_devices // 5) // 2, separation=100.0,
                                    random_state=seed)
    devs = data.devices[:n_devices]
    t0 = time.perf_counter()
    a = KFed(10, 2, random_state=seed).fit(devs)
    t_in = time.perf_counter() - t0
    tr = FlowerSimulationTransport()
    t0 = time.perf_counter()
    b = KFed(10, 2, random_state=seed).fit(devs, transport=tr)
    t_fl = time.perf_counter() - t0
    srv = tr.last_run_["extra"]["time_s"]
    return {"n_devices": len(devs), "n_points": int(sum(len(X) for X in devs)),
            "inprocess_s": t_in, "flower_s": t_fl, "flower_server_s": srv,
            "outside_serverapp_s": t_fl - srv["total"],
            "identical": bool(np.array_equal(a.cluster_centers_, b.cluster_centers_))}


def main(argv=None) -> dict:
    p = C.make_parser(__doc__.split("\n")[0])
    args = C.finish_args(p.parse_args(argv))
    sizes = [10, 100] if args.quick else [10, 100, 1000]
    rows = []
    with C.blas_limit(args):
        for z in sizes:
            rows.append(run(z, args.seed))
            print(f"  {z} devices: flower {rows[-1]['flower_s']:.1f} s", flush=True)
    C.print_table(
        ["devices", "in-process s", "Flower sim s", "hello s", "k-FED round s", "ServerApp s",
         "outside ServerApp s", "per device (ServerApp) ms", "identical"],
        [[r["n_devices"], f"{r['inprocess_s']:.2f}", f"{r['flower_s']:.1f}",
          f"{r['flower_server_s']['hello']:.1f}", f"{r['flower_server_s']['rounds']:.1f}",
          f"{r['flower_server_s']['total']:.1f}", f"{r['outside_serverapp_s']:.1f}",
          f"{1000 * r['flower_server_s']['total'] / r['n_devices']:.0f}", r["identical"]]
         for r in rows],
        title="Flower simulation (Ray) against in-process, k-FED one round")
    out = {"rows": rows}
    C.write_json(args, "flower_overhead", out)
    return out


if __name__ == "__main__":
    main()
