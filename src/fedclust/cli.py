"""``fedclust`` command line.

    fedclust demo [NAME] [--out DIR]                embedded run of a family (default k-FED)
    fedclust run CONFIG.toml --out DIR [--transport inprocess|flower] [--progress]
    fedclust predict MODEL.npz SITE_FILE [--out LABELS.csv]   apply a saved model, no refit
    fedclust flower app DIR --config CONFIG.toml    write a deployable Flower app
    fedclust flower split CONFIG.toml --out DIR     one data file per SuperNode
    fedclust flower result DIR [--compare result.json]
    fedclust flower run APP [SUPERLINK]              flwr run; exit 1 unless the run completed
    fedclust flower certs DIR --host NAME_OR_IP ...  CA + SuperLink TLS certificate
    fedclust flower keys DIR --nodes N              SuperNode authentication key pairs
    fedclust flower secagg-key DIR --device-id Z    this node's secure-aggregation identity
    fedclust flower secagg-directory OUT PUB...     the identity directory from public halves

Errors are one line on stderr and exit status 2 (a failed Flower run: 1; an
unexpected internal error: 3); no traceback (set ``FEDCLUST_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import __version__
from .config import describe_config
from .core.atomic import write_json_atomic, write_text_atomic
from .core.exceptions import FedClustError
from .core.registry import DEMO_DESCRIPTIONS, DEMOS

__all__ = ["main"]


def _demo_list() -> str:
    """``demo --help``'s list of the registered demos, one line each."""
    width = max((len(n) for n in DEMOS), default=0)
    lines = []
    for name in DEMOS:
        text = DEMO_DESCRIPTIONS.get(name, "") or "-"
        lines += textwrap.wrap(text, 88, initial_indent=f"  {name.ljust(width)}  ",
                               subsequent_indent=" " * (width + 4))
    return "demos:\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``fedclust`` argument parser (also renders the documentation's CLI reference)."""
    p = argparse.ArgumentParser(prog="fedclust", description="Federated clustering experiments.")
    p.add_argument("--version", action="version", version=f"fedclust {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a family's embedded example (seconds)",
                          description="Run a small embedded example of a family; writes\n"
                          "result.json and result.png into --out.",
                          epilog=_demo_list(), formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("name", nargs="?", default=None, metavar="NAME",
                      help=f"which demo (default: {next(iter(DEMOS), '-')}; listed below)")
    demo.add_argument("--out", default="fedclust-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    run = sub.add_parser("run", help="run a configured experiment",
                         description="Run the experiment a TOML configuration describes; "
                         "writes\nresult.json (and result.png) into --out.",
                         epilog=describe_config() + "\n\nexamples/ has a commented "
                         "configuration per family.",
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", nargs="?", default=None,
                     help="TOML configuration (tables below; see examples/)")
    run.add_argument("--out", default=None, help="output folder for result.json (and the "
                     "run's checkpoint/, written after every round)")
    run.add_argument("--resume", metavar="OUT", default=None,
                     help="continue the interrupted run in OUT after its last complete round "
                     "(same configuration, seed and transport; no CONFIG)")
    run.add_argument("--no-checkpoint", action="store_true",
                     help="write no checkpoint/ (a crash then loses the run)")
    run.add_argument("--transport", choices=("inprocess", "flower"), default="inprocess",
                     help="in-process simulator (default) or Flower's simulation engine")
    run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    run.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    run.add_argument("--progress", action="store_true",
                     help="progress bars over rounds and devices (as [simulation] progress = true)")
    pred = sub.add_parser("predict", help="apply a saved model.npz to a site file (no refit)")
    pred.add_argument("model", help="model.npz written by `fedclust run`")
    pred.add_argument("data", help="site file (.csv, .tsv, .parquet, .npz) with the training columns")
    pred.add_argument("--out", default=None,
                      help="CSV to write (row, id columns, cluster or prediction); default stdout")
    fgt = sub.add_parser("forget", help="forget a training site of a saved model.npz (exact)",
                         description="Drop a site's kept summaries and recompute the model from "
                         "the others' (the site\nneed not be online); the result equals a run "
                         "without the site's data\nwith the same seed and the other sites' device "
                         "ids (docs/unlearning.md).")
    fgt.add_argument("model", help="model.npz written by `fedclust run`")
    fgt.add_argument("--site", required=True, action="append",
                     help="name of the site to forget (repeat for several)")
    fgt.add_argument("--out", default=None, help="model file to write (default: in place)")
    _add_flower_parser(sub)
    return p


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n}"


def format_table(result: dict[str, Any]) -> str:
    """A readable summary table of one result dict (columns from the algorithm's registration)."""
    from .core.registry import get_algorithm

    columns = get_algorithm(result["algorithm"]).columns
    c = result["communication"]

    def cell(entry: dict[str, Any], key: str) -> str:
        v = entry.get(key)
        if v is None:
            return "-"
        if "accuracy" in key:
            return f"{100 * v:.2f}%"
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    head = ("method", *(title for _, title in columns), "rounds", "bytes up", "bytes down", "time")
    rows = [head]
    rows.append((result["algorithm"], *(cell(result["metrics"], k) for k, _ in columns),
                 str(c["rounds"]), _fmt_bytes(c["bytes_up"]), _fmt_bytes(c["bytes_down"]),
                 f"{result['time_s']['fit']:.2f}s"))
    for name, b in result["baselines"].items():
        rows.append((name, *(cell(b, k) for k, _ in columns), str(b.get("rounds", "-")),
                     _fmt_bytes(b["bytes_up"]) if "bytes_up" in b else "all data",
                     _fmt_bytes(b["bytes_down"]) if "bytes_down" in b else "-",
                     f"{b['time_s']:.2f}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _execute(cfg: dict[str, Any], out: Path, transport: str, plot: bool,
             source: str = "config", checkpoint: bool = False,
             resume: bool = False) -> dict[str, Any]:
    from .experiment import run_experiment

    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / CHECKPOINT_DIR if checkpoint else None
    if ckpt is not None and not resume:
        ckpt.mkdir(exist_ok=True)
        write_json_atomic(ckpt / RUN_FILE, {"config": cfg, "source": source,
                                            "transport": transport, "plot": plot,
                                            "finished": False}, indent=1,
                          default=_json_default)
    exp = run_experiment(cfg, transport=transport, source=source, checkpoint_dir=ckpt,
                         resume=resume)
    result = exp.result
    path = out / "result.json"
    write_text_atomic(path, json.dumps(result, indent=1, default=_json_default))
    print(result.get("title") or result["federation"])
    print(f"federation: {result['federation']}")
    print(format_table(result))
    if result.get("rounds_note"):
        print(f"rounds: {result['rounds_note']}")
    for warning in result.get("run_log", {}).get("warnings", []):
        print(f"warning: {warning}")
    print(f"wrote {path}")
    _write_model_outputs(exp, out)
    if plot:
        from .core.registry import get_algorithm

        draw = get_algorithm(result["algorithm"]).plot
        png = None if draw is None else draw(exp.model, exp.federation, result, out / "result.png")
        if png is not None:
            print(f"wrote {png}")
        elif draw is not None:
            print("(matplotlib not installed: no figure; pip install 'fedclust[plot]')")
    if ckpt is not None:
        _finish_checkpoint(ckpt)
    return result


CHECKPOINT_DIR = "checkpoint"
RUN_FILE = "run.json"


def _finish_checkpoint(ckpt: Path) -> None:
    """A finished run keeps its ledger and run.json (marked finished); the checkpoints,
    which hold the simulated devices' own state, are removed."""
    from .core.checkpoint import CHECKPOINT_FILE

    run = json.loads((ckpt / RUN_FILE).read_text())
    write_json_atomic(ckpt / RUN_FILE, {**run, "finished": True}, indent=1)
    for part in ("preprocess", "fit"):
        (ckpt / part / CHECKPOINT_FILE).unlink(missing_ok=True)


def _resume(args) -> None:
    """``fedclust run --resume OUT``: the run written in OUT/checkpoint/run.json, resumed."""
    from .config import check_config

    if args.config is not None or args.out is not None:
        raise FedClustError("--resume OUT takes neither CONFIG nor --out (the run's "
                            f"configuration is in OUT/{CHECKPOINT_DIR}/{RUN_FILE})")
    out = Path(args.resume)
    path = out / CHECKPOINT_DIR / RUN_FILE
    if not path.is_file():
        raise FedClustError(f"--resume {out}: no run to resume there ({path} does not exist; "
                            "runs started with --no-checkpoint cannot be resumed)")
    run = json.loads(path.read_text())
    if run.get("finished"):
        raise FedClustError(f"--resume {out}: that run has finished (its result.json is "
                            "complete); start a new run in another folder")
    cfg = check_config(run["config"], source=run["source"])
    if args.progress:
        cfg.setdefault("simulation", {})["progress"] = True
    _execute(cfg, out, run["transport"], run["plot"] and not args.no_plot, source=run["source"],
             checkpoint=True, resume=True)


def format_sites(result: dict[str, Any]) -> str:
    """Per-site sizes and scores of a site-data run (and the pooled figure)."""
    sites = result.get("sites") or []
    keys = [k for k in ("test_accuracy", "train_accuracy", "test_mse", "ari")
            if any(k in e for e in sites)]
    head = ("site", "rows", "train", "test", *(k.replace("_", " ") for k in keys))

    def fmt(k, v):
        if v is None:
            return "-"
        return f"{100 * v:.2f}%" if k.endswith("accuracy") else f"{v:.4f}"

    rows = [head] + [(e["site"], str(e["n_rows"]), str(e["n_train"]), str(e["n_test"]),
                      *(fmt(k, e.get(k)) for k in keys)) for e in sites]
    m = result["metrics"]
    pooled = {"test_accuracy": m.get("test_accuracy_pooled"), "test_mse": m.get("test_mse_pooled"),
              "train_accuracy": m.get("train_accuracy_pooled"), "ari": m.get("ari_pooled")}
    rows.append(("pooled", str(sum(e["n_rows"] for e in sites)),
                 str(sum(e["n_train"] for e in sites)), str(sum(e["n_test"] for e in sites)),
                 *(fmt(k, pooled.get(k)) for k in keys)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _write_model_outputs(exp: Any, out: Path) -> None:
    """``model.npz`` (the exported model + preprocessing) and, for site data, ``labels/``."""
    from .sites.files_out import save_model, write_site_labels

    sites = exp.federation.extra.get("sites")
    if exp.exported is None:
        if sites is not None:
            print(f"({exp.result['algorithm']} registers no model export: no labels/ or "
                  "model.npz)")
        return
    if sites is not None:
        print(format_sites(exp.result))
        for p in write_site_labels(out, exp)[:1]:
            print(f"wrote {p.parent}/<site>.csv ({len(sites.names)} files)")
    from .unlearning.saved import saved_section

    names = [] if sites is None else sites.names
    path = save_model(out / "model.npz", exp.exported, algorithm=exp.result["algorithm"],
                      preprocessor=exp.preprocessor,
                      schema=None if sites is None else sites.schema,
                      columns=None if sites is not None or exp.preprocessor is not None else
                      [f"x{j}" for j in range(exp.result["n_features"])],
                      sites=names, unlearning=saved_section(exp.model, names))
    print(f"wrote {path}  (fedclust predict {path} NEW_FILE)")


def _predict(args) -> int:
    from .sites.files_out import load_model, write_labels_csv

    model = load_model(args.model)
    values, table = model.predict_file(args.data)
    column = "cluster" if model.task == "clustering" else "prediction"
    ids = {}
    if model.schema is not None:
        ids = {c: table.columns[c] for c in model.schema.id_columns if c in table.columns}
    if args.out:
        path = write_labels_csv(args.out, values, column, ids=ids)
        print(f"wrote {path} ({len(values)} rows)")
    else:
        import csv

        w = csv.writer(sys.stdout)
        w.writerow(["row", *ids, column])
        for i, v in enumerate(np.asarray(values).tolist()):
            w.writerow([i, *(ids[c][i] for c in ids), v])
    return 0


def _forget(args) -> int:
    from .unlearning.saved import forget_saved_model

    path, record = forget_saved_model(args.model, args.site, args.out)
    asked = sorted({z for _, z in record.recomputed})
    print(f"forgot site(s) {', '.join(args.site)}: "
          + ("no device computed again" if not asked else f"devices {asked} computed again")
          + f"; remaining summaries digest {record.summaries_digest[:16]}")
    print(f"wrote {path}")
    return 0


def _json_default(obj):
    import numpy as np

    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (0 done, 1 a failed Flower run or a closed
    output pipe, 2 an error, 3 an internal error, 130 interrupted)."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return status
    except BrokenPipeError:
        # the reader went away (`fedclust run ... | head`): stop quietly, as Python's
        # documentation of SIGPIPE advises; stdout goes to devnull so that the flush
        # at exit does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from .config import check_config, load_config
        from .core.registry import DEMOS

        if args.command == "flower":
            return _flower(args)
        if args.command == "predict":
            return _predict(args)
        if args.command == "forget":
            return _forget(args)
        if args.command == "demo":
            name = args.name or next(iter(DEMOS))
            if name not in DEMOS:
                raise FedClustError(f"no demo named {name!r}; available: {sorted(DEMOS)}")
            cfg = check_config(DEMOS[name], source=f"demo {name}")
            _execute(cfg, Path(args.out), "inprocess", not args.no_plot, source=f"demo {name}")
        elif args.resume is not None:
            _resume(args)
        else:
            if args.config is None or args.out is None:
                raise FedClustError("fedclust run needs CONFIG and --out OUT (or --resume OUT)")
            cfg = load_config(args.config)
            if args.seed is not None:
                cfg["seed"] = args.seed
            if args.progress:
                cfg.setdefault("simulation", {})["progress"] = True
            _execute(cfg, Path(args.out), args.transport, not args.no_plot, source=args.config,
                     checkpoint=args.transport == "inprocess" and not args.no_checkpoint)
    except BrokenPipeError:
        raise
    except (FedClustError, OSError, ImportError) as exc:
        if os.environ.get("FEDCLUST_DEBUG"):
            raise
        print(f"fedclust: error: {_one_line(exc)}", file=sys.stderr)
        return 1 if type(exc).__name__ == "DeploymentError" else 2
    except KeyboardInterrupt:
        print("fedclust: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line first, the traceback on request
        if os.environ.get("FEDCLUST_DEBUG"):
            raise
        print(f"fedclust: internal error: {type(exc).__name__}: {_one_line(exc)} "
              "(set FEDCLUST_DEBUG=1 for the traceback)", file=sys.stderr)
        return 3
    return 0


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- fedclust flower ... (deployment helpers; flwr is not needed to write an app) --------
def _add_flower_parser(sub) -> None:
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


def _flower(args) -> int:
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
    import numpy as np

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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
