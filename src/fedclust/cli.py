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
from .cli_flower import add_flower_parser, flower_command

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
    add_flower_parser(sub)
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
            return flower_command(args)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
