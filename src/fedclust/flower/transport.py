"""Run a protocol on Flower's simulation engine: ``FlowerSimulationTransport``.

Same interface and result as :class:`~fedclust.sim.InProcessTransport`
(``run(protocol, devices, random_state) -> RunOutput``), so any estimator's
``fit(devices, transport=FlowerSimulationTransport())`` and ``fedclust run
CONFIG --transport flower`` need no other change. What it does:

1. writes each device to ``data/part-<i>.npz`` (``X`` and its ``device_id``;
   ``numpy.savez``, no pickle) in a temporary folder;
2. starts ``python -m fedclust.flower.simulation`` in a subprocess, which runs
   the fedclust ``ServerApp`` and ``ClientApp`` (:mod:`fedclust.flower.apps`)
   with ``flwr.simulation.run_simulation`` — one virtual SuperNode per device,
   Ray actors executing the ClientApp; each client loads its own file by
   ``partition-id``;
3. the ServerApp writes ``result.npz`` (:mod:`fedclust.flower.results`) and the
   transport reads it back: result object, device outputs, meter and log,
   identical to an in-process run with the same seed.

Faults (``dropout``, ``late``, explicit ids) are drawn from the seed exactly as
in-process; clients that raise or time out are dropped and named
(``log.failed``); malformed replies are rejected by name (``log.rejected``).
Most of the time is Ray starting (≈10 s on 2 cores; see docs/flower.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..core.random import root_seed
from ..core.validation import check_float
from ..core.exceptions import FedClustError
from ..core.policy import DevicePolicy
from ..core.protocol import Protocol
from ..core.secure_sum import SecureAggregation
from ..sim.byzantine import ByzantineTamper
from ..sim.transport import RunOutput

__all__ = ["FlowerSimulationTransport", "flower_env", "require_flwr"]

#: environment for every Flower process we start (FLOWER.md)
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    "RAY_DEDUP_LOGS": "0",
}


def require_flwr() -> None:
    """Raise a one-line ImportError when the ``flower`` extra is missing."""
    hint = "the Flower transport needs the 'flower' extra: pip install 'fedclust[flower]'"
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ImportError(hint) from None
    if importlib.util.find_spec("ray") is None:
        raise ImportError(hint + " (ray is missing)")


def flower_env(home: str | Path, ray_tmp: str | Path | None = None) -> dict[str, str]:
    """``os.environ`` plus FLWR_HOME / RAY_TMPDIR under temporary folders and quiet settings."""
    env = dict(os.environ)
    env.update(QUIET_ENV)
    env["FLWR_HOME"] = str(home)
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    src = str(Path(__file__).resolve().parents[2])  # the folder holding the fedclust package
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@dataclass
class FlowerSimulationTransport:
    """Run a protocol with ``flwr.simulation.run_simulation`` (Ray backend) in a subprocess.

    Parameters
    ----------
    dropout, late : float, default=0
        Simulated faults, drawn from the seed exactly as by ``InProcessTransport``.
    dropped, late_devices : sequence of int
        Explicit device ids, in addition to the fractions.
    round_timeout_s : float or None, default=600
        How long a round waits for replies; a device with no reply is dropped
        and named in ``log.failed``.
    num_cpus : int or None
        CPUs per ClientApp actor (default: all cores, i.e. one actor — the
        fastest on small machines, see FLOWER.md).
    collect_outputs : bool, default=True
        Bring each device's output (point labels) back to the caller.
    timeout_s : float or None, default=1800
        Wall-clock limit of the whole simulation.
    keep_dir : str or None
        Keep the working folder (device files, job, logs, result) here.
    tamper : ByzantineTamper or None
        Byzantine devices lying on the wire, as with ``InProcessTransport``: the
        client process rebuilds the hook from its config (the same liars and lies).
    progress : bool, default=False
        A tqdm bar over the rounds (devices that replied of those asked), read
        from the ServerApp's log as the simulation runs.
    secure_aggregation : bool or SecureAggregation, default=False
        Summed rounds as secure sums, as with ``InProcessTransport``.
    policy : DevicePolicy or None
        Every simulated SuperNode's policy (default: ``collect_outputs`` and a
        noise seed allowed — the simulated devices' owner runs the simulation).
    ray_address : str or None
        Run the virtual SuperNodes on an existing Ray cluster (``"auto"``, or
        ``"ray://head:10001"``) instead of starting Ray here. ``num_cpus`` is
        then the CPUs per ClientApp actor (default 1), the cluster decides how
        many actors run; ``keep_dir`` must be a folder every Ray node mounts at
        the same path (the device files are read there) and fedclust must be
        installed on every node (``docs/flower.md``).

    Attributes
    ----------
    last_run_ : dict
        After ``run``: wall time, the server's extra info and the log path.
    """

    dropout: float = 0.0
    late: float = 0.0
    dropped: Sequence[int] = ()
    late_devices: Sequence[int] = ()
    round_timeout_s: float | None = 600.0
    num_cpus: int | None = None
    collect_outputs: bool = True
    timeout_s: float | None = 1800.0
    keep_dir: str | None = None
    verbose: bool = False
    tamper: ByzantineTamper | None = None
    progress: bool = False
    secure_aggregation: Any = False
    policy: Any = None
    ray_address: str | None = None
    #: ``run(..., graph=)`` relays a general communication graph
    runs_graphs = True

    def run(self, protocol: Protocol, devices: Mapping[int, np.ndarray],
            random_state: Any = None, *, graph: Any = None) -> RunOutput:
        """Run ``protocol`` over ``devices`` (device id -> (n_z, d) array) on Flower.

        ``graph`` (networkx graph or edge list over the device ids): the server
        only relays messages between neighbours (:mod:`fedclust.flower.relay`).
        """

        require_flwr()
        from .relay import GraphMeter, graph_edges

        check_float(self.dropout, "dropout", min_value=0.0, max_value=1.0)
        check_float(self.late, "late", min_value=0.0, max_value=1.0)
        from .spec import ServerSpec
        from .grid import secure_spec
        from .dataio import save_device_file
        from .results import load_run_output

        seed = root_seed(random_state)
        ids = sorted(int(z) for z in devices)
        if not ids:
            raise FedClustError("no devices to run on")
        work = (Path(self.keep_dir).resolve() if self.keep_dir
                else Path(tempfile.mkdtemp(prefix="fedclust-flwr-")))
        work.mkdir(parents=True, exist_ok=True)
        # Ray puts unix sockets under RAY_TMPDIR: keep that path short.
        ray_tmp = Path(tempfile.mkdtemp(prefix="fcray-", dir="/tmp" if os.path.isdir("/tmp") else None))
        try:
            data_dir = work / "data"
            data_dir.mkdir(exist_ok=True)
            for i, z in enumerate(ids):
                save_device_file(data_dir / f"part-{i}.npz", devices[z], device_id=z)
            sa = SecureAggregation.coerce(self.secure_aggregation)
            if sa is not None and sa.signed:  # node i holds device ids[i]: key files by partition
                from .pki import write_secagg_identities

                ident = write_secagg_identities(data_dir, ids)
                for i, z in enumerate(ids):
                    Path(ident["private"][i]).rename(data_dir / f"secagg-{i}.pem")
            result_dir = work / "result"
            shutil.rmtree(result_dir, ignore_errors=True)
            spec = ServerSpec.for_protocol(
                protocol, seed, dropout=self.dropout, late=self.late,
                dropped=[int(z) for z in self.dropped],
                late_devices=[int(z) for z in self.late_devices], min_nodes=len(ids),
                node_wait_s=120.0, round_timeout_s=self.round_timeout_s,
                result_dir=str(result_dir), collect_outputs=self.collect_outputs,
                graph_edges=[] if graph is None else graph_edges(graph),
                **secure_spec(self.secure_aggregation))
            if self.ray_address:  # an existing cluster: it has its own resources
                ncpu = int(self.num_cpus or 1)
                init_args = {"address": str(self.ray_address),
                             "log_to_driver": bool(self.verbose)}
            else:
                ncpu = int(self.num_cpus or os.cpu_count() or 1)
                init_args = {"num_cpus": ncpu, "num_gpus": 0, "include_dashboard": False,
                             "log_to_driver": bool(self.verbose)}
            job = {"server": asdict(spec), "data_dir": str(data_dir), "num_supernodes": len(ids),
                   "backend_config": {
                       "client_resources": {"num_cpus": ncpu, "num_gpus": 0.0},
                       "init_args": init_args},
                   "verbose": self.verbose,
                   "tamper": None if self.tamper is None else self.tamper.config(),
                   "policy": (self.policy or DevicePolicy(
                       allow_collect=bool(self.collect_outputs),
                       allow_noise_seed=True)).to_node_config()}
            job_path = work / "job.json"
            job_path.write_text(json.dumps(job, indent=1))
            log_path = work / "simulation.log"
            env = flower_env(work / "flwr-home", ray_tmp)
            t0 = time.perf_counter()
            with open(log_path, "wb") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "fedclust.flower.simulation", str(job_path)],
                    stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(work))
                rc = _wait(proc, log_path, self.timeout_s, protocol.name if self.progress
                           else None)
            wall = time.perf_counter() - t0
            if not (result_dir / "result.npz").exists():
                from .results import raise_saved_error

                raise_saved_error(result_dir)
                tail = log_path.read_text(errors="replace")[-2000:]
                what = "timed out" if rc is None else f"exited with status {rc}"
                raise FedClustError(f"the Flower simulation {what} without a result; "
                                    f"log tail:\n{tail}")
            out, extra = load_run_output(result_dir)
            if graph is not None:
                out.meter = GraphMeter.from_summary(extra["graph"])
            self.last_run_ = {"wall_s": wall, "extra": extra,
                              "log": str(log_path) if self.keep_dir else None}
            return out
        finally:
            shutil.rmtree(ray_tmp, ignore_errors=True)
            if not self.keep_dir:
                shutil.rmtree(work, ignore_errors=True)


_ROUND_LINE = re.compile(r"fedclust: round (-?\d+) \((\w+)\): (\d+) of (\d+) devices replied")


def _wait(proc: subprocess.Popen, log_path: Path, timeout_s: float | None,
          progress: str | None) -> int | None:
    """Wait for the simulation (None: killed at ``timeout_s``); with ``progress`` (the
    protocol's name), advance a tqdm bar per round line of the ServerApp's log."""
    bar = None
    seen = 0
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=f"{progress} rounds (flower)", unit="round")
    t0 = time.perf_counter()
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                rc = None
            if bar is not None:
                lines = _ROUND_LINE.findall(log_path.read_text(errors="replace"))
                for _, action, got, asked in lines[seen:]:
                    bar.set_postfix_str(f"{action}: {got}/{asked} devices")
                    bar.update(1)
                seen = len(lines)
            if rc is not None:
                return rc
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                proc.kill()
                proc.wait()
                return None
    finally:
        if bar is not None:
            bar.close()
