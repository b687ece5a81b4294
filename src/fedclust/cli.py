"""``fedclust`` command line.

    fedclust demo [--out DIR]                       embedded k-FED run, table + result.json
    fedclust run CONFIG.toml --out DIR [--transport inprocess|flower]

Errors are one line on stderr and exit status 2; no traceback (set
``FEDCLUST_DEBUG=1`` to see one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .exceptions import FedClustError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedclust", description="Federated clustering experiments.")
    p.add_argument("--version", action="version", version=f"fedclust {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the embedded k-FED example (seconds)")
    demo.add_argument("--out", default="fedclust-demo", help="output folder (default: %(default)s)")
    demo.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    run = sub.add_parser("run", help="run a configured experiment")
    run.add_argument("config", help="TOML configuration (see examples/)")
    run.add_argument("--out", required=True, help="output folder for result.json")
    run.add_argument("--transport", choices=("inprocess", "flower"), default="inprocess")
    run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    run.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    return p


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n}"


def format_table(result: dict[str, Any]) -> str:
    """A readable summary table of one result dict."""
    m = result["metrics"]
    c = result["communication"]
    rows = [("method", "accuracy", "ARI", "cost / centralized", "rounds", "bytes up", "bytes down",
             "time")]
    ref = result["baselines"].get("centralized", {}).get("kmeans_cost")

    def ratio(cost):
        return f"{cost / ref:.4f}" if ref else "-"

    def acc(v):
        return "-" if v is None else f"{100 * v:.2f}%"

    rows.append((result["algorithm"], acc(m.get("accuracy")), f"{m['ari']:.4f}" if "ari" in m else "-",
                 ratio(m["kmeans_cost"]), str(c["rounds"]), _fmt_bytes(c["bytes_up"]),
                 _fmt_bytes(c["bytes_down"]), f"{result['time_s']['fit']:.2f}s"))
    for name, b in result["baselines"].items():
        rows.append((name, acc(b.get("accuracy")), "-", ratio(b["kmeans_cost"]),
                     str(b.get("rounds", "-")),
                     _fmt_bytes(b["bytes_up"]) if "bytes_up" in b else "all data",
                     _fmt_bytes(b["bytes_down"]) if "bytes_down" in b else "-",
                     f"{b['time_s']:.2f}s"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _execute(cfg: dict[str, Any], out: Path, transport: str, plot: bool) -> dict[str, Any]:
    from .experiment import run_experiment

    out.mkdir(parents=True, exist_ok=True)
    exp = run_experiment(cfg, transport=transport)
    result = exp.result
    path = out / "result.json"
    path.write_text(json.dumps(result, indent=1, default=_json_default))
    print(result.get("title") or result["federation"])
    print(f"federation: {result['federation']}")
    print(format_table(result))
    print(f"wrote {path}")
    if plot:
        from .plotting import have_matplotlib, plot_federated_clustering

        if have_matplotlib():
            png = plot_federated_clustering(exp.federation.devices, exp.model.device_labels_,
                                            exp.model.cluster_centers_, result,
                                            out / "result.png")
            print(f"wrote {png}")
        else:
            print("(matplotlib not installed: no figure; pip install 'fedclust[plot]')")
    return result


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
    args = _parser().parse_args(argv)
    try:
        from .config import DEMO_CONFIG, check_config, load_config

        if args.command == "demo":
            cfg = check_config(DEMO_CONFIG, source="demo")
            _execute(cfg, Path(args.out), "inprocess", not args.no_plot)
        else:
            cfg = load_config(args.config)
            if args.seed is not None:
                cfg["seed"] = args.seed
            _execute(cfg, Path(args.out), args.transport, not args.no_plot)
    except (FedClustError, OSError, ImportError) as exc:
        if os.environ.get("FEDCLUST_DEBUG"):
            raise
        print(f"fedclust: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedclust: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
