"""Run every benchmark with the same flags, one after another.

    python benchmarks/run_all.py --quick            # all of them, seconds each
    python benchmarks/run_all.py --out results/     # paper sizes (tens of minutes)

Flags are passed through unchanged (``--quick``, ``--out``, ``--data-dir``,
``--seed``, ``--blas-threads``, ``--no-plot``); ``--dataset`` goes to the two
real-data benchmarks (Fig. 2, Fig. 3; default ``mnist``, falling back to
scikit-learn's bundled ``digits`` with a note when MNIST is not found).
Each benchmark runs in its own process (``sys.executable``) so a failure in
one does not stop the others; the exit status is non-zero if any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as C  # noqa: E402

_NOT_BENCHMARKS = {"run_all", "authors_kfed"}
#: every script in benchmarks/ (families add theirs by adding a file)
BENCHMARKS = sorted(p.stem for p in HERE.glob("[a-z]*.py") if p.stem not in _NOT_BENCHMARKS)
REAL_DATA = {"fig2_heterogeneity", "fig3_rounds"}


def main(argv=None) -> int:
    p = C.make_parser(__doc__.split("\n")[0])
    p.add_argument("--dataset", choices=["mnist", "digits"], default="mnist")
    p.add_argument("--only", default=None, help="comma-separated subset of " + ",".join(BENCHMARKS))
    args = C.finish_args(p.parse_args(argv))
    common = ["--out", str(args.out), "--data-dir", str(args.data_dir), "--seed", str(args.seed)]
    if args.quick:
        common.append("--quick")
    if args.blas_threads is not None:
        common += ["--blas-threads", str(args.blas_threads)]
    if args.no_plot:
        common.append("--no-plot")
    dataset = args.dataset
    if dataset == "mnist":
        if C.mnist_path(args.data_dir) is None:
            print(f"note: no MNIST under {args.data_dir}; Fig. 2 and Fig. 3 use --dataset digits", flush=True)
            dataset = "digits"
    names = args.only.split(",") if args.only else BENCHMARKS
    failed, summary = [], []
    for name in names:
        cmd = [sys.executable, str(HERE / f"{name}.py"), *common]
        if name in REAL_DATA:
            cmd += ["--dataset", dataset]
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        dt = time.perf_counter() - t0
        summary.append([name, "ok" if rc == 0 else f"FAILED ({rc})", f"{dt:.1f}"])
        if rc != 0:
            failed.append(name)
    print()
    C.print_table(["benchmark", "status", "seconds"], summary, title="run_all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
