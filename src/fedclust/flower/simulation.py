"""Entry point of one Flower simulation run in its own process.

``python -m fedclust.flower.simulation JOB.json`` builds the ServerApp and
ClientApp from the job (a :class:`~fedclust.flower.apps.ServerSpec`, a data
folder of ``part-<i>.npz`` files, the number of SuperNodes, Ray's backend
config, the Byzantine devices' tamper config if any) and calls ``flwr.simulation.run_simulation``. The ServerApp writes its
result to ``spec.result_dir``. Running in a subprocess keeps Ray (its
threads, signal handlers, ≈0.5 GB) out of the caller's process.
"""

from __future__ import annotations

import json
import sys
import warnings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as fh:
        job = json.load(fh)
    from ..sim.byzantine import ByzantineTamper
    from .apps import make_client_app, make_server_app
    from .spec import ServerSpec

    spec = ServerSpec(**job["server"])
    server_app = make_server_app(spec)
    tamper = job.get("tamper")
    from ..core.policy import DevicePolicy

    policy = job.get("policy")
    client_app = make_client_app(data_dir=job["data_dir"], tamper=None if tamper is None
                                 else ByzantineTamper.from_config(tamper),
                                 policy=None if policy is None
                                 else lambda ctx: DevicePolicy.from_node_config(policy))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from flwr.simulation import run_simulation

        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=int(job["num_supernodes"]),
                       backend_config=job["backend_config"],
                       verbose_logging=bool(job.get("verbose", False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
