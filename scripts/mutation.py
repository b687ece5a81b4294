"""Mutation testing of the privacy, secure-aggregation and k-means core (``make mutation``).

mutmut makes small plausible bugs (an operator, a constant, a comparison) one
at a time in one module and runs the tests of that module's area against each;
a mutant that no test notices *survives*. Each module runs on its own, in a
scratch copy under ``.mutation/<module>/`` (the work tree is never changed),
with only its own tests, at low CPU priority.

Usage::

    python scripts/mutation.py                    # every module below
    python scripts/mutation.py core/kmeans.py     # one module
    python scripts/mutation.py --list             # the modules and their tests
    python scripts/mutation.py lloyd/protocol.py --only '*_lloyd_step*'   # some functions

Prints a table (killed, survived, timeouts, score, minutes) and writes
``.mutation/summary.json``; ``mutmut results`` / ``mutmut show NAME`` inside a
module's scratch folder list and show its survivors. Surviving mutants are
reviewed in ``docs/developer.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".mutation"

# the accountant's own tests: each private fit calibrates, so whole files would run
# dozens of fits per mutant for no stronger check
ACCOUNTANT_TESTS: list[str] = [
    "tests/privacy/test_spec.py",
    "tests/privacy/test_composition.py",
    "tests/privacy/test_privacy.py::test_single_release_matches_analytic_gaussian",
    "tests/privacy/test_privacy.py::test_composed_epsilon_never_exceeds_request",
    "tests/privacy/test_privacy.py::test_noise_variance_matches_calibration",
    "tests/privacy/test_privacy.py::test_private_protocols_rebuild_from_their_config",
    "tests/privacy/test_privacy_fl.py::test_noise_scale_and_budget",
    "tests/privacy/test_privacy_fl.py::test_subsampled_rounds_are_amplified_as_dp_"
    "accounting_computes",
    "tests/privacy/test_privacy_preprocess.py::test_budget_is_shared_with_the_algorithm_"
    "and_composed_by_the_accountant",
    "tests/privacy/test_privacy_preprocess.py::test_prior_travels_in_the_protocol_config",
    "tests/privacy/test_privacy_preprocess.py::test_a_noiseless_prior_cannot_enter_a_finite_"
    "budget",
    "tests/privacy/test_private_release.py::test_secure_sampled_dp_fedavg_asks_every_device_"
    "and_accounts_a_number"]

#: distributed Lloyd's rounds (lloyd/protocol.py) and device steps (lloyd/device.py)
LLOYD_TESTS = ["tests/lloyd", "tests/privacy/test_privacy.py", "tests/privacy/test_sensitivity.py",
               "tests/privacy/test_lloyd_kfed_init.py", "tests/privacy/test_secure_dp.py"]

#: module (under src/fedclust) -> the test files that guard it
MODULES: dict[str, list[str]] = {
    "core/kmeans.py": ["tests/core/test_kmeans_kernels.py", "tests/core/test_kmeans_relocation.py",
                       "tests/lloyd",
                       "tests/kfed/test_local_kmeans.py", "tests/kfed/test_server_kfed.py"],
    "lloyd/protocol.py": LLOYD_TESTS,
    "lloyd/device.py": LLOYD_TESTS,
    "kfed/server.py": ["tests/kfed/test_server_kfed.py", "tests/kfed/test_kfed_server_kmeanspp.py",
                       "tests/kfed/test_kfed.py", "tests/kfed/test_kfed_trim.py",
                       "tests/kfed/test_kfed_explanation.py"],
    "core/secure_sum.py": ["tests/core/test_secure_sum.py", "tests/core/test_secagg_malicious.py",
                           "tests/core/test_secure_sum_server_checks.py",
                           "tests/security/test_secagg_attacks.py", "tests/security/harness.py",
                           "tests/sim/test_secure_transport.py"],
    "core/secure_sum_device.py": ["tests/core/test_secure_sum.py",
                                  "tests/core/test_secure_sum_server_checks.py",
                                  "tests/core/test_secure_sum_device_checks.py",
                                  "tests/core/test_secagg_malicious.py",
                                  "tests/security/test_secagg_attacks.py",
                                  "tests/security/harness.py",
                                  "tests/sim/test_secure_transport.py"],
    "core/secagg.py": ["tests/core/test_secure_sum.py", "tests/core/test_secagg_malicious.py",
                       "tests/core/test_secure_sum_server_checks.py",
                       "tests/security/test_secagg_attacks.py", "tests/security/harness.py"],
    "privacy/mechanisms.py": ["tests/privacy/test_mechanisms.py", "tests/privacy/test_privacy.py",
                              "tests/privacy/test_sensitivity.py"],
    "privacy/kmeans.py": ["tests/privacy/test_mechanisms.py", "tests/privacy/test_privacy.py",
                          "tests/privacy/test_sensitivity.py",
                          "tests/lloyd"],
    "privacy/accounting.py": ACCOUNTANT_TESTS,
    "core/composition.py": ACCOUNTANT_TESTS,
    "privacy/spec.py": ["tests/privacy/test_spec.py", "tests/privacy/test_privacy.py"],
    "privacy/distributed.py": ["tests/privacy/test_secure_dp.py"],
    "privacy/columns.py": ["tests/privacy/test_mechanisms.py",
                           "tests/privacy/test_privacy_preprocess.py",
                           "tests/privacy/test_sensitivity.py"],
}


#: modules whose results a memoised function keeps between the tests
CACHED_MODULES = frozenset({"core/composition.py"})

FRESH_CACHES = """

@pytest.fixture(autouse=True)
def _fresh_accountant_cache():
    from fedclust.core import composition

    composition._epsilon.cache_clear()
    yield
"""


def mutmut_section(module: str, tests: list[str]) -> str:
    lines = ["", "[tool.mutmut]",
             'source_paths = ["src"]',
             f'only_mutate = ["src/fedclust/{module}"]',
             "pytest_add_cli_args_test_selection = [" + ", ".join(f'"{t}"' for t in tests) + "]",
             # the mutation venv has no Flower: its transport tests are left to make test;
             # the slow end-to-end checks are too, to keep a run within minutes
             'pytest_add_cli_args = ["-p", "no:cacheprovider", "-x", "-q", "-m", "not slow", '
             '"-k", "not flower and not Flower"]']
    return "\n".join(lines) + "\n"


def scratch(module: str, tests: list[str]) -> Path:
    """A fresh copy of src/, the module's tests and pyproject.toml with its mutmut section."""
    where = WORK / module.replace("/", "__")
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", where / "src", ignore=ignore)
    (where / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", where / "tests" / "conftest.py")
    for t in {t.split("::")[0] for t in tests}:   # a test file, folder or one test's node id
        src = ROOT / t
        dst = where / t
        if not src.exists():
            raise SystemExit(f"{module}: test path {t} does not exist")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy(src, dst)
    # each mutant runs in a process forked after the tests were collected and run once:
    # the accountant's memoised compositions would answer without running the mutated
    # composition (a cache keyed by its inputs is right for mutants of any other module,
    # and keeping it warm saves recomputing the privacy-loss distributions per mutant)
    if module in CACHED_MODULES:
        with open(where / "tests" / "conftest.py", "a") as f:
            f.write(FRESH_CACHES)
    text = (ROOT / "pyproject.toml").read_text()
    (where / "pyproject.toml").write_text(text + mutmut_section(module, tests))
    return where


def results(where: Path, mutmut: list[str]) -> dict[str, list[str]]:
    out = subprocess.run(mutmut + ["results", "--all", "true"], cwd=where, capture_output=True,
                         text=True).stdout
    by_status: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if m:
            by_status.setdefault(m.group(2).strip(), []).append(m.group(1))
    return by_status


def run_module(module: str, mutmut: list[str], children: int, only: list[str]) -> dict:
    tests = MODULES[module]
    where = scratch(module, tests)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    t0 = time.perf_counter()
    proc = subprocess.run(["nice", "-n", "15", *mutmut, "run", "--max-children", str(children),
                           *only], cwd=where, env=env, capture_output=True, text=True)
    minutes = (time.perf_counter() - t0) / 60.0
    (where / "mutmut-run.log").write_text(proc.stdout + proc.stderr)
    by_status = results(where, mutmut)
    by_status.pop("not checked", None)   # outside --only
    killed = len(by_status.get("killed", []))
    survived = by_status.get("survived", [])
    timeouts = len(by_status.get("timeout", []))
    total = sum(len(v) for v in by_status.values())
    return {"module": module, "only": only, "tests": tests, "total": total, "killed": killed,
            "survived": survived, "timeout": timeouts, "other": {
                k: len(v) for k, v in by_status.items()
                if k not in ("killed", "survived", "timeout")},
            "score": (killed + timeouts) / max(total, 1), "minutes": round(minutes, 1),
            "exit_code": proc.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help="modules under src/fedclust (default: all)")
    ap.add_argument("--list", action="store_true", help="print the modules and their tests")
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutant workers")
    ap.add_argument("--only", nargs="+", default=[], metavar="GLOB",
                    help="only the mutants whose names match (e.g. '*_lloyd_step*'); "
                         "one module at a time")
    args = ap.parse_args(argv)
    if args.list:
        for m, t in MODULES.items():
            print(f"{m:24s} {' '.join(t)}")
        return 0
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; choose from {sorted(MODULES)}")
    if args.only and len(args.modules) != 1:
        ap.error("--only needs exactly one module")
    mutmut = [sys.executable, "-m", "mutmut"]
    if subprocess.run(mutmut + ["--version"], capture_output=True).returncode != 0:
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    rows = []
    summary_path = WORK / "summary.json"
    done = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    for module in args.modules or list(MODULES):
        row = run_module(module, mutmut, args.max_children, args.only)
        rows.append(row)
        done[module + "".join(f" {g}" for g in args.only)] = row
        summary_path.write_text(json.dumps(done, indent=1))
        print(f"{module:24s} mutants {row['total']:4d}  killed {row['killed']:4d}  "
              f"survived {len(row['survived']):3d}  timeout {row['timeout']:2d}  "
              f"score {row['score']:.1%}  {row['minutes']:.1f} min", flush=True)
        for name in row["survived"]:
            print(f"    survived: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
