"""``fedclust flower run``: ``flwr run`` with an exit status that tells whether the run worked.

Flower 1.42's ``flwr run APP SUPERLINK --stream`` exits 0 once the run has been
submitted and its log streamed, whether the ServerApp completed or raised.
The run's fate is recorded by the SuperLink: ``flwr ls --run-id N SUPERLINK
--format json`` reports ``status`` ``finished:completed`` / ``finished:failed``
/ ``finished:stopped`` and ``status-details`` (for a failed ServerApp,
``ServerApp failed with exception: <text>``). This module runs ``flwr run``,
streams its output through, reads that status and raises
:class:`DeploymentError` with one line naming the cause unless the run
completed. It drives Flower's own command-line tools and does not import flwr.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from ..core.exceptions import FedClustError

__all__ = ["DeploymentError", "flwr_run", "run_status"]

_STARTED = re.compile(r"Successfully started run (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class DeploymentError(FedClustError):
    """A Flower deployment step failed; the text is the one-line cause."""


def _flwr(binary: str | None) -> str:
    path = binary or shutil.which("flwr")
    if not path:
        raise DeploymentError("`flwr` is not on PATH: install fedclust's wheel with the "
                              "'flower' extra (see docs/flower.md)")
    return path


def run_status(run_id: int, superlink: str | None = None, *, flwr: str | None = None,
               wait_s: float = 60.0) -> tuple[str, str]:
    """``(status, details)`` of ``run_id`` from ``flwr ls``, waiting until it is finished."""
    cmd = [_flwr(flwr), "ls", "--run-id", str(int(run_id)), "--format", "json"]
    if superlink:
        cmd.insert(2, superlink)
    end = time.monotonic() + wait_s
    while True:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        text = _ANSI.sub("", r.stdout)
        try:
            runs = json.loads(text[text.index("{"):])["runs"]
            status = str(runs[0]["status"])
            details = str(runs[0].get("status-details", ""))
        except (ValueError, KeyError, IndexError) as exc:
            last = (_ANSI.sub("", r.stderr).strip().splitlines() or ["no output"])[-1]
            raise DeploymentError(f"cannot read the status of run {run_id} with "
                                  f"`{' '.join(cmd)}`: {last}") from exc
        if status.startswith("finished") or time.monotonic() >= end:
            return status, details
        time.sleep(1.0)


def flwr_run(app: str | Path, superlink: str | None = None, *, flwr: str | None = None,
             stream: bool = True, out: TextIO | None = None, run_config: str | None = None,
             resume: bool = False) -> int:
    """Run ``flwr run APP [SUPERLINK] --stream``; return the run id if it completed.

    ``run_config``: ``"key=value ..."`` overrides of the app's
    ``[tool.flwr.app.config]`` (e.g. ``"round-timeout-s=60"``), passed to
    Flower's own ``--run-config``. ``resume``: adds ``resume=true``, so the
    ServerApp continues the run checkpointed in its result folder
    (:mod:`fedclust.flower.recovery`).

    Raises
    ------
    DeploymentError
        ``flwr run`` did not start a run, or the run did not finish as
        ``finished:completed``; the message is one line with Flower's reason.
    """
    out = out or sys.stdout
    cmd = [_flwr(flwr), "run", str(app)] + ([superlink] if superlink else [])
    overrides = " ".join(t for t in ((run_config or "").strip(),
                                     "resume=true" if resume else "") if t)
    cmd += ["--run-config", overrides] if overrides else []
    cmd += ["--stream"] if stream else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    run_id = None
    tail: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            out.write(line)
            plain = _ANSI.sub("", line).strip()
            if plain:
                tail = (tail + [plain])[-5:]
            if run_id is None and (m := _STARTED.search(plain)):
                run_id = int(m.group(1))
    finally:
        rc = proc.wait()
    if run_id is None:
        why = next((t for t in reversed(tail) if "rror" in t), tail[-1] if tail else "no output")
        raise DeploymentError(f"`flwr run` started no run (exit status {rc}): {why}")
    status, details = run_status(run_id, superlink, flwr=flwr)
    if status != "finished:completed":
        details = " ".join(details.split()) or "no details from the SuperLink"
        raise DeploymentError(f"run {run_id} {status}: {details}")
    return run_id
