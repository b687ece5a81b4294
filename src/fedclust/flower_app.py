"""Write a deployable Flower app and per-device data files from a fedclust config.

``fedclust flower app DIR --config CONFIG.toml`` writes::

    DIR/pyproject.toml          # [tool.flwr.app] components + config (the run)
    DIR/fedclust_app/__init__.py
    DIR/fedclust_app/apps.py    # server_app = make_server_app(); client_app = make_client_app()

The run config (``[tool.flwr.app.config]``) holds the protocol name and
parameters (``params.*``, built exactly as ``fedclust run`` builds them), the
seed, the simulated faults of ``[simulation]``, ``min-nodes``, timeouts and the
folder where the ServerApp writes ``result.json`` / ``result.npz``. Each
SuperNode loads its own data from ``--node-config "data-path='...npz'"``.

With a wheel (the CLI's default: ``pip wheel --no-deps`` of the fedclust
source tree fedclust runs from, or ``--wheel PATH`` of one built before) it
also writes ``DIR/wheels/fedclust-<version>-py3-none-any.whl``, which every
SuperLink / SuperNode host installs with ``pip install
"DIR/wheels/fedclust-<version>-py3-none-any.whl[flower]"`` (flwr and the
other dependencies come from the usual package index; fedclust itself needs
none). ``DIR/DEPLOY.md`` lists the commands of a TLS + SuperNode-authentication
deployment for this app (``--insecure`` variant only when asked for).

``fedclust flower split CONFIG.toml --out DATA`` writes the config's federation
as ``DATA/dev-<id>.npz`` (``X`` and ``device_id``), one per SuperNode.
This module does not import flwr.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .core.exceptions import ValidationError
from .core.protocol import Protocol

__all__ = ["experiment_protocol", "split_devices", "write_app", "app_run_config", "build_wheel"]

PACKAGE = "fedclust_app"


def experiment_protocol(cfg: Mapping[str, Any], count_sites: bool = True
                        ) -> tuple[Protocol, dict[int, Any], int]:
    """The protocol, device data and seed that ``fedclust run`` would run for ``cfg``
    (:func:`fedclust.experiment.build_protocol`); on site files the schema round and the
    preprocessing round are the deployed run's first rounds, on the nodes, and no site
    file is read (the device data are the files' paths)."""
    from .experiment import build_protocol

    return build_protocol(cfg, preprocess_on_nodes=True, count_sites=count_sites)


def split_devices(cfg: Mapping[str, Any], out_dir: str | Path) -> list[tuple[int, Path]]:
    """Write each device of ``cfg``'s federation to ``out_dir/dev-<id>.npz`` (site files:
    a copy of each site's own file under its own name; the site is named by its stem)."""
    from .flower.dataio import save_device_file

    _, devices, _ = experiment_protocol(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for z, data in sorted(devices.items()):
        if isinstance(data, str):  # a site file: the node reads it as it is, under its name
            written.append((z, Path(shutil.copy2(data, out / Path(data).name))))
        else:
            written.append((z, save_device_file(out / f"dev-{z}.npz", data, device_id=z)))
    return written


def app_run_config(cfg: Mapping[str, Any], *, result_dir: str | Path,
                   min_nodes: int | None = None, round_timeout_s: float = 600.0,
                   node_wait_s: float = 120.0, collect_outputs: bool = False,
                   faults: bool = True) -> dict[str, Any]:
    """Flat ``[tool.flwr.app.config]`` for ``cfg`` (see :class:`fedclust.flower.apps.ServerSpec`)."""
    protocol, devices, seed = experiment_protocol(cfg, count_sites=min_nodes is None)
    if cfg.get("simulation", {}).get("secure_aggregation", False):
        from .core.secure_sum import check_summable

        check_summable(protocol.secure_form())
    sim = cfg.get("simulation", {}) if faults else {}
    lists = {k: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v
             for k, v in protocol.config().items()}
    rc: dict[str, Any] = {
        "algorithm": protocol.name, "seed": seed,
        "dropout": float(sim.get("dropout", 0.0)), "late": float(sim.get("late", 0.0)),
        "dropped": "[]", "late-devices": "[]",
        "min-nodes": int(min_nodes if min_nodes is not None else len(devices)),
        "node-wait-s": float(node_wait_s), "round-timeout-s": float(round_timeout_s),
        "result-dir": str(Path(result_dir).resolve()), "collect-outputs": bool(collect_outputs),
        # not a simulated fault: kept with --no-faults
        "secure-aggregation": bool(cfg.get("simulation", {}).get("secure_aggregation", False)),
        "secagg-frac-bits": 20, "secagg-neighbors": 0,
        "secagg-signed": cfg.get("simulation", {}).get("secure_aggregation") == "signed",
        # `fedclust flower run --resume` sets it: continue the checkpointed run
        "resume": False,
    }
    rc.update({f"params.{k}": _plain(v) for k, v in lists.items()})
    return rc


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bool, int, float, str)):
        return v
    raise ValidationError(f"run config value {v!r} is not a bool, int, float or str")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not np.isfinite(v):
            raise ValidationError(f"run config value {v} must be finite")
        return repr(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


_MODULE = '''"""Flower app generated by `fedclust flower app` (fedclust {version}).

The ServerApp reads the run from [tool.flwr.app.config] in pyproject.toml; each
ClientApp loads its device from its SuperNode's node config, e.g.
    flower-supernode ... --node-config "data-path='/data/dev-0.npz'"
"""

from fedclust.flower.apps import make_client_app, make_server_app

# results go only inside this folder, whatever a run config's result-dir says
server_app = make_server_app(result_root={result_root!r})
client_app = make_client_app()
'''


def build_wheel(dest: str | Path, source: str | Path | None = None) -> Path:
    """``pip wheel --no-deps`` of the fedclust source tree into ``dest``; returns the wheel.

    ``source`` defaults to the checkout fedclust is imported from (``src/``
    layout). pip fetches the build backend (setuptools) from the package index
    of the machine that builds; the nodes that install the wheel need none for
    fedclust itself.
    """
    import fedclust

    root = Path(source) if source is not None else Path(fedclust.__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "src" / "fedclust").is_dir():
        raise ValidationError(
            f"fedclust is not running from a source checkout ({root} has no pyproject.toml "
            "and src/fedclust): pass --wheel PATH of a built fedclust wheel, or --no-wheel")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("fedclust-*.whl"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest),
                        str(root)], capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "rror" in ln), lines[-1] if lines else "no output")
        raise ValidationError(f"building the fedclust wheel from {root} failed: {why}")
    wheels = sorted(set(dest.glob("fedclust-*.whl")) - before) or sorted(dest.glob("fedclust-*.whl"))
    if not wheels:
        raise ValidationError(f"pip wheel wrote no fedclust wheel to {dest}")
    return wheels[-1]


_DEPLOY = """# Deploying this app ({title})

Generated by `fedclust flower app`; docs/flower.md explains every step.

## 1. Every host (SuperLink and SuperNodes): install fedclust and Flower
    pip install "{wheel}[flower]"{wheel_note}

## 2. SuperLink host: certificates, start with TLS and SuperNode authentication
    fedclust flower certs certs --host SUPERLINK_HOST_OR_IP
    fedclust flower keys keys --nodes {n_nodes}
    flower-superlink --ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.pem \\
        --ssl-keyfile certs/server.key --enable-supernode-auth --database superlink.db \\
        --disable-runtime-dependency-installation --host 0.0.0.0 --port 8000
    # one TCP port (8000) serves SuperNodes (Fleet API) and flwr (Control API);
    # --database keeps the registered SuperNodes and the runs across a SuperLink restart

{nodes}    # secure aggregation's signed variant (run config secagg-signed = true): also copy
    # keys/secagg-<i>.pem and keys/secagg-identities.json (not through the server) and add
    #   secagg-identity-key='secagg-<i>.pem' secagg-directory='secagg-identities.json'
    # to --node-config

## 4. Operator host (holds ca.crt and keys/node-*.pub): the connection, the keys, the run
    # ~/.flwr/config.toml:
    #   [superlink.federation]
    #   address = "SUPERLINK_HOST_OR_IP:8000"
    #   root-certificates = "/path/to/ca.crt"
    flwr supernode register keys/node-<i>.pub federation    # once per SuperNode
    fedclust flower run {app_dir} federation     # exit status 1 and the cause if the run fails
    # override the run config for one run (Flower's --run-config), e.g. a shorter timeout:
    fedclust flower run {app_dir} federation --run-config "round-timeout-s=120"

## 5. Recovery: the ServerApp writes a checkpoint after every round into result-dir
    fedclust flower run {app_dir} federation --resume   # continue after the last complete round
    # keep every flower-supernode under a supervisor that restarts it (systemd
    # Restart=always): see docs/flower.md, "Recovery"
"""

_NODES_DEVICES = """## 3. SuperNode host i: copy certs/ca.crt, keys/node-<i> and its data file there
    flower-supernode --superlink SUPERLINK_HOST_OR_IP:8000 --root-certificates ca.crt \\
        --auth-supernode-private-key node-<i> \\
        --node-config "data-path='/data/dev-<i>.npz'"
"""

_NODES_SITES = """## 3. SuperNode host of each site: copy certs/ca.crt, keys/node-<i>, the site's file
    # the site's file stays on its host; device-id is the file's position in [data] paths,
    # and the run names a failed node by its site
{lines}"""

#: sites listed one by one in DEPLOY.md; the others follow the same pattern
_SITES_SHOWN = 20


def _site_nodes(devices: Mapping[int, Any]) -> str:
    """DEPLOY.md's step 3 for a site run: each site's SuperNode with its own file."""
    lines = [] if devices else [
        "    # site <name> (device <i>), its file <name>.csv",
        "    flower-supernode --superlink SUPERLINK_HOST_OR_IP:8000 --root-certificates ca.crt \\",
        "        --auth-supernode-private-key node-<i> \\",
        "        --node-config \"data-path='/data/<name>.csv' device-id=<i>\""]
    for z, path in sorted(devices.items())[:_SITES_SHOWN]:
        path = Path(path)
        lines += [f"    # site {path.stem!r} (device {z}), its file {path.name}",
                  "    flower-supernode --superlink SUPERLINK_HOST_OR_IP:8000 --root-certificates "
                  "ca.crt \\",
                  f"        --auth-supernode-private-key node-{z} \\",
                  f"        --node-config \"data-path='/data/{path.name}' device-id={z}\""]
    if len(devices) > _SITES_SHOWN:
        lines.append(f"    # ... and so on for the other {len(devices) - _SITES_SHOWN} sites "
                     "(`fedclust flower split CONFIG --out DATA` prints every node's "
                     "--node-config)")
    return _NODES_SITES.format(lines="\n".join(lines) + "\n")


_DEPLOY_INSECURE = """
## Local experiments without TLS (--insecure, chosen explicitly)
Anyone who reaches the SuperLink can then join, read the model and poison a
round; use only on one trusted machine:
    flower-superlink --insecure --disable-runtime-dependency-installation
    flower-supernode --insecure --superlink 127.0.0.1:8000 --node-config "data-path='...'"
    # connection: address = "127.0.0.1:8000", insecure = true
"""


def write_app(app_dir: str | Path, cfg: Mapping[str, Any], *, result_dir: str | Path | None = None,
              wheel: str | Path | bool | None = None, insecure: bool = False, **kw: Any) -> Path:
    """Write a Flower app for ``cfg`` to ``app_dir``; returns the pyproject path.

    ``wheel``: ``True`` builds a fedclust wheel into ``app_dir/wheels``
    (:func:`build_wheel`), a path copies that wheel there, ``None``/``False``
    writes none. ``insecure`` adds the no-TLS commands to ``DEPLOY.md``.
    """
    from . import __version__

    app_dir = Path(app_dir)
    result_dir = Path(result_dir) if result_dir is not None else app_dir / "result"
    rc = app_run_config(cfg, result_dir=result_dir, **kw)
    (app_dir / PACKAGE).mkdir(parents=True, exist_ok=True)
    (app_dir / PACKAGE / "__init__.py").write_text('"""fedclust Flower app."""\n')
    (app_dir / PACKAGE / "apps.py").write_text(
        _MODULE.format(version=__version__, result_root=str(result_dir.resolve())))
    title = str(cfg.get("title", "")).replace("\n", " ")
    params = {k[len("params."):]: v for k, v in rc.items() if k.startswith("params.")}
    top = {k: v for k, v in rc.items() if not k.startswith("params.")}
    lines = [
        "# Flower app generated by `fedclust flower app` — edit [tool.flwr.app.config] freely.",
        f"# Run: {title}" if title else "#",
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", 'name = "fedclust-app"', 'version = "1.0.0"',
        'description = "fedclust protocol on Flower"', 'license = "BSD-3-Clause"',
        f'dependencies = ["fedclust[flower]>={__version__}"]', "",
        "[tool.hatch.build.targets.wheel]", f'packages = ["{PACKAGE}"]', "",
        "[tool.flwr.app]", 'publisher = "fedclust"', "",
        "[tool.flwr.app.components]",
        f'serverapp = "{PACKAGE}.apps:server_app"', f'clientapp = "{PACKAGE}.apps:client_app"', "",
        "# The run. dropout/late simulate faults drawn from the seed (as `fedclust run`);",
        "# set them to 0 for a production run. round-timeout-s: a device that does not",
        "# answer in time is dropped and named in result.json.",
        "[tool.flwr.app.config]",
    ]
    lines += [f'{k} = {_toml_value(v)}' for k, v in top.items()]
    lines += ["", "# Protocol parameters (lists are JSON text)", "[tool.flwr.app.config.params]"]
    lines += [f'{k} = {_toml_value(v)}' for k, v in params.items()]
    path = app_dir / "pyproject.toml"
    path.write_text("\n".join(lines) + "\n")
    wheel_path: Path | None = None
    if wheel is True:
        wheel_path = build_wheel(app_dir / "wheels")
    elif wheel:
        src = Path(wheel)
        if not src.is_file() or not src.name.startswith("fedclust-") or src.suffix != ".whl":
            raise ValidationError(f"--wheel {src}: not a fedclust-*.whl file")
        (app_dir / "wheels").mkdir(exist_ok=True)
        wheel_path = Path(shutil.copy2(src, app_dir / "wheels" / src.name))
    nodes = _NODES_DEVICES
    if rc["algorithm"] == "site-preprocess":  # site files: each node holds its own, named
        try:
            sites = experiment_protocol(cfg)[1]
        except ValidationError:  # the files are not on this machine (--min-nodes given)
            sites = {}
        nodes = _site_nodes(sites)
    text = _DEPLOY.format(
        title=title or rc["algorithm"], n_nodes=rc["min-nodes"], app_dir=app_dir, nodes=nodes,
        wheel=wheel_path if wheel_path is not None else
        f"/path/to/fedclust-{__version__}-py3-none-any.whl",
        wheel_note="" if wheel_path is not None else
        "\n    # no wheel written (--no-wheel): build one with `pip wheel --no-deps "
        "FEDCLUST_CHECKOUT`,\n    # or run `fedclust flower app` without --no-wheel")
    (app_dir / "DEPLOY.md").write_text(text + (_DEPLOY_INSECURE if insecure else ""))
    return path
