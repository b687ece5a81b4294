"""Shared plumbing for the benchmark scripts: flags, tables, JSON, plots, timers.

Every benchmark is one script (``python benchmarks/<name>.py [--quick]``) that
prints a table with the paper's figure beside ours and writes
``<out>/<name>.json`` (plus ``<name>.png`` when matplotlib is installed).

Common flags
------------
--quick            reduced sizes (seconds; what CI and the smoke test run)
--out DIR          where JSON/PNG go (default ``benchmarks/results``)
--data-dir DIR     real data (default ``$FEDCLUST_DATA``, else the ``data`` folder
                   beside the repository)
--seed N           root seed (run r uses ``seed + r``)
--blas-threads N   cap BLAS threads for the whole run (threadpoolctl); default:
                   leave the BLAS library alone (what a user gets)
--no-plot          skip the figure
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results"


def default_data_dir() -> Path:
    env = os.environ.get("FEDCLUST_DATA", "").strip()
    return Path(env).expanduser() if env else (REPO.parent / "shared" / "data")


def make_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true",
                   help="reduced sizes for CI / smoke tests (seconds, not minutes)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT,
                   help=f"output folder for JSON/PNG (default {DEFAULT_OUT.relative_to(REPO)})")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="real-data folder (default $FEDCLUST_DATA, else the data folder beside "
                        "the repository)")
    p.add_argument("--seed", type=int, default=0, help="root seed (run r uses seed + r)")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="cap BLAS threads for the whole run (default: leave as is)")
    p.add_argument("--no-plot", action="store_true", help="do not draw the figure")
    return p


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.data_dir is None:
        args.data_dir = default_data_dir()
    args.out = Path(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def mnist_path(data_dir: Path) -> Path | None:
    """The MNIST file under ``data_dir`` (``mnist_70k.npz`` or ``mnist/mnist_70k.npz``), or None."""
    for cand in (Path(data_dir) / "mnist_70k.npz", Path(data_dir) / "mnist" / "mnist_70k.npz"):
        if cand.is_file():
            return cand
    return None


def mnist_or_digits(args: argparse.Namespace) -> tuple[str, str]:
    """``(dataset, note)``: MNIST when asked for and present; in ``--quick`` mode fall back to
    scikit-learn's digits with a printed note; a full run without MNIST is an error."""
    if args.dataset != "mnist" or mnist_path(args.data_dir) is not None:
        return args.dataset, ""
    if not args.quick:
        raise SystemExit(f"MNIST not found under {args.data_dir} (set --data-dir or "
                         "FEDCLUST_DATA, or use --dataset digits)")
    note = f"MNIST not found under {args.data_dir}; using scikit-learn digits"
    print("note:", note, flush=True)
    return "digits", note


def blas_limit(args: argparse.Namespace):
    """Context manager applying ``--blas-threads`` (no-op when not given)."""
    if getattr(args, "blas_threads", None) is None:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=int(args.blas_threads), user_api="blas")


# ------------------------------------------------------------------ machine

def machine_info() -> dict[str, Any]:
    import scipy
    import sklearn

    try:
        import fedclust
        fc_version = getattr(fedclust, "__version__", "?")
    except Exception:  # pragma: no cover
        fc_version = "?"
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "sklearn": sklearn.__version__,
        "fedclust": fc_version,
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                           "MKL_NUM_THREADS") if k in os.environ},
    }
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = [
            {"api": t.get("internal_api"), "threads": t.get("num_threads"),
             "version": t.get("version"), "lib": Path(t.get("filepath", "")).name}
            for t in threadpool_info()]
    except Exception:  # pragma: no cover
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


# ------------------------------------------------------------------ output

def fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None
                ) -> str:
    """Print (and return) a plain-text table; cells are formatted with :func:`fmt`."""
    rows = [[c if isinstance(c, str) else fmt(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        obj = float(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    return obj


def write_json(args: argparse.Namespace, name: str, payload: dict[str, Any]) -> Path:
    doc = {
        "benchmark": name,
        "quick": bool(args.quick),
        "seed": args.seed,
        "blas_threads": args.blas_threads,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        **payload,
    }
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def save_plot(args: argparse.Namespace, name: str, draw: Callable[[Any], None]) -> Path | None:
    """``draw(plt)`` makes the figure; saved as ``<out>/<name>.png``. Skipped with a
    printed note when matplotlib is missing or ``--no-plot`` is given."""
    if args.no_plot:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; skipping the plot "
              "(pip install 'fedclust[plot]')", flush=True)
        return None
    path = args.out / f"{name}.png"
    draw(plt)
    plt.tight_layout()
    plt.savefig(path, dpi=120)
    plt.close("all")
    print(f"wrote {path}", flush=True)
    return path


# ------------------------------------------------------------------ measuring

@contextmanager
def grouped_error_bars(ax: Any, rows: Sequence[dict[str, Any]], methods: Sequence[str],
                       labels: Sequence[str], *, ncol: int = 3, capsize: float = 2.0,
                       ylabel: str = "max_j |w_j - w*_j|") -> None:
    """One group of bars per row, one bar per method: ``row[method]["error_mean"]`` with
    ``error_std`` as the error bar (the robust-regression benchmarks' figure)."""
    width = 0.8 / len(methods)
    x = np.arange(len(rows))
    for i, m in enumerate(methods):
        ax.bar(x + i * width, [r[m]["error_mean"] for r in rows], width,
               yerr=[r[m]["error_std"] for r in rows], label=m, capsize=capsize)
    ax.set_xticks(x + 0.4 - width / 2)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7 if ncol < 3 else 6, ncol=ncol)


def timer(store: dict[str, float], key: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        store[key] = time.perf_counter() - t0


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std())


def rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_rss_mb()


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (ru_maxrss)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0 ``clear_refs`` 5). Returns success."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def vm_hwm_mb() -> float | None:
    """Peak RSS since the last :func:`reset_peak_rss` (``VmHWM``), in MiB."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None
