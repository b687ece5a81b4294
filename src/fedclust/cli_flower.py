"""``fedclust flower ...``: the deployment subcommands of the command line (write an app,
split a config's devices into node files, run it, read its result, make certificates and
keys). flwr is not needed to write an app; the subcommands that run one import it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_flower_parser", "flower_command"]


def add_flower_parser(sub: Any) -> None:
    """The ``fedclust flower`` subcommands, added to the main parser's subparsers."""
    fl = sub.add_parser("flower", help="deploy on Flower: write an app, split data, read results")
    fsub = fl.add_subparsers(dest="flower_command", required=True)
    app = fsub.add_parser("app", help="write a Flower app (pyproject.toml + module) for a config")
    app.add_argument("dir", help="folder of the app (created)")
    app.add_argument("--config", required=True, help="TOML configuration (see examples/)")
    app.add_argument("--result-dir", default=None,
                     help="where the ServerApp writes result.json (default: DIR/result)")
    app.add_argument("--min-nodes", type=int, default=None,
                     help="SuperNodes to wait for (default: the number of devices)")
    app.add_argument("--round-timeout", type=float, default=600.0,
                     help="seconds a round waits for replies (default: %(default)s)")
    app.add_argument("--collect-outputs", action="store_true",
                     help="send each device's point labels to the server")
    app.add_argument("--no-faults", action="store_true",
                     help="ignore [simulation] dropout/late (a production run)")
    app.add_argument("--seed", type=int, default=None, help="override the config's seed")
    app.add_argument("--wheel", default=None, metavar="PATH",
                     help="copy this fedclust wheel into DIR/wheels (default: build one with "
                          "`pip wheel --no-deps` from the source checkout)")
    app.add_argument("--no-wheel", action="store_true",
                     help="write no wheel (every node already has fedclust installed)")
    app.add_argument("--insecure", action="store_true",
                     help="also list no-TLS commands in DEPLOY.md (local experiments only)")
    split = fsub.add_parser("split", help="write the config's devices as DIR/dev-<id>.npz")
    split.add_argument("config", help="TOML configuration")
    split.add_argument("--out", required=True, help="output folder")
    split.add_argument("--seed", type=int, default=None, help="override the config's seed")
    res = fsub.add_parser("result", help="summarise a Flower run's result folder")
    res.add_argument("dir", help="the app's result folder (holds result.npz)")
    res.add_argument("--compare", default=None, metavar="RESULT_JSON",
                     help="exit 1 unless the centers equal those of this `fedclust run` result")
    run = fsub.add_parser("run", help="`flwr run APP SUPERLINK --stream`, exit 1 with the reason "
                          "unless the run finished as completed")
    run.add_argument("app", help="the app folder (written by `fedclust flower app`)")
    run.add_argument("superlink", nargs="?", default=None,
                     help="SuperLink connection name of the Flower configuration")
    run.add_argument("--run-config", default=None, metavar="'KEY=VALUE ...'",
                     help="override the app's run config for this run, e.g. "
                     "\"round-timeout-s=60 min-nodes=3\" (Flower's own --run-config)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run checkpointed in the app's result folder after its "
                     "last complete round")
    certs = fsub.add_parser("certs", help="a CA and a SuperLink TLS certificate for given hosts")
    certs.add_argument("dir", help="output folder (ca.crt, ca.key, server.pem, server.key)")
    certs.add_argument("--host", action="append", required=True, metavar="NAME_OR_IP",
                       help="a DNS name or IP address SuperNodes and `flwr` use to reach the "
                            "SuperLink (repeat for several)")
    certs.add_argument("--days", type=int, default=365, help="validity (default: %(default)s)")
    certs.add_argument("--force", action="store_true", help="overwrite existing files")
    certs.add_argument("--loopback", action="store_true",
                       help="also name 127.0.0.1, ::1 and localhost (a SuperExec that dials "
                            "its SuperLink over loopback)")
    keys = fsub.add_parser("keys", help="SuperNode authentication key pairs (OpenSSH ECDSA)")
    keys.add_argument("dir", help="output folder (node-<i>, node-<i>.pub, public-keys.csv)")
    keys.add_argument("--nodes", type=int, required=True, help="how many SuperNodes")
    keys.add_argument("--force", action="store_true", help="overwrite existing files")
    keys.add_argument("--secagg-identities", action="store_true",
                      help="also make every node's secure-aggregation identity here (a test "
                           "federation; in a deployment each node runs `secagg-key`)")
    skey = fsub.add_parser("secagg-key", help="this node's own secure-aggregation identity key "
                           "(run it on the node; send out only the .pub.json)")
    skey.add_argument("dir", help="output folder (secagg-<id>.pem, secagg-<id>.pub.json)")
    skey.add_argument("--device-id", type=int, required=True, help="the device this node holds")
    skey.add_argument("--force", action="store_true", help="overwrite existing files")
    sdir = fsub.add_parser("secagg-directory", help="the secure-aggregation directory from the "
                           "nodes' public key files")
    sdir.add_argument("out", help="output file (secagg-identities.json)")
    sdir.add_argument("public", nargs="+", help="the nodes' secagg-<id>.pub.json files")
    sdir.add_argument("--force", action="store_true", help="overwrite an existing file")


def flower_command(args: argparse.Namespace) -> int:
    """Run one ``fedclust flower`` subcommand; its exit status."""
    from .config import load_config

    if args.flower_command in ("app", "split"):
        cfg = load_config(args.config)
        if args.seed is not None:
            cfg["seed"] = args.seed
    if args.flower_command == "app":
        from .flower_app import write_app

        path = write_app(args.dir, cfg, result_dir=args.result_dir, min_nodes=args.min_nodes,
                         round_timeout_s=args.round_timeout, collect_outputs=args.collect_outputs,
                         faults=not args.no_faults,
                         wheel=False if args.no_wheel else (args.wheel or True),
                         insecure=args.insecure)
        print(f"wrote {path}, {Path(args.dir) / 'fedclust_app'}/ and "
              f"{Path(args.dir) / 'DEPLOY.md'}")
        for whl in sorted((Path(args.dir) / "wheels").glob("fedclust-*.whl")):
            print(f"install on every node: pip install \"{whl}[flower]\"")
        print("start a SuperLink (TLS, --enable-supernode-auth) and one SuperNode per device, "
              f"then: fedclust flower run {args.dir} <connection>  (see DEPLOY.md)")
        return 0
    if args.flower_command == "run":
        from .flower.runner import flwr_run

        run_id = flwr_run(args.app, args.superlink, run_config=args.run_config,
                          resume=args.resume)
        print(f"fedclust: run {run_id} finished:completed")
        return 0
    if args.flower_command == "certs":
        from .flower.pki import write_certificates

        paths = write_certificates(args.dir, args.host, days=args.days, overwrite=args.force,
                                   loopback=args.loopback)
        for what, path in paths.items():
            print(f"{what}: {path}")
        return 0
    if args.flower_command == "keys":
        from .flower.pki import write_node_keys, write_secagg_identities

        paths = write_node_keys(args.dir, args.nodes, overwrite=args.force)
        print(f"{args.nodes} SuperNode key pairs in {args.dir}; public keys listed in "
              f"{paths['csv']}")
        if args.secagg_identities:
            ident = write_secagg_identities(args.dir, range(args.nodes), overwrite=args.force)
            print(f"secure-aggregation identities secagg-<i>.pem, directory "
                  f"{ident['directory']}")
        return 0
    if args.flower_command == "secagg-key":
        from .flower.pki import write_secagg_key

        p = write_secagg_key(args.dir, args.device_id, overwrite=args.force)
        print(f"private key {p['private']} (keep it on this node); send {p['public']}")
        return 0
    if args.flower_command == "secagg-directory":
        from .flower.pki import write_secagg_directory

        print(f"wrote {write_secagg_directory(args.out, args.public, overwrite=args.force)}")
        return 0
    if args.flower_command == "split":
        from .flower_app import split_devices

        for z, path in split_devices(cfg, args.out):
            print(f"device {z}: {path}  (--node-config \"data-path='{path.resolve()}' "
                  f"device-id={z}\")")
        return 0
    from .flower.results import load_run_output

    out, extra = load_run_output(args.dir)
    centers = getattr(out.result, "centers", None)
    log = out.log
    shape = "no centers" if centers is None else (
        f"centers: {centers.shape[0]} x {centers.shape[1]} ({centers.dtype})")
    print(f"{shape}; participants {len(log.participants)}, dropped {log.dropped}, "
          f"late {log.late}, failed {sorted(log.failed)}, rejected {sorted(log.rejected)}")
    for z, why in sorted({**log.failed, **log.rejected}.items()):
        print(f"  {why}" if f"device {z}" in why else f"  device {z}: {why}")
    for warning in log.warnings:
        print(f"warning: {warning}")
    model = Path(args.dir) / "model.npz"
    if model.is_file():
        print(f"model: {model}  (fedclust predict {model} NEW_FILE)")
    if args.compare:
        ref = np.asarray(json.loads(Path(args.compare).read_text())["cluster_centers"])
        same = centers is not None and ref.shape == centers.shape and np.array_equal(ref, centers)
        print(f"centers {'IDENTICAL to' if same else 'DIFFER from'} {args.compare}")
        return 0 if same else 1
    return 0
