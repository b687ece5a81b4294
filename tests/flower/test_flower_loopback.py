"""Loopback deployment: a real SuperLink (TLS, SuperNode authentication) and 3 SuperNodes
on 127.0.0.1 (opt-in, ≈40 s on an idle machine).

    make test-loopback            # or: pytest -m loopback
Deselected by default (pyproject addopts ``-m "not loopback and not deploy"``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.loopback
def test_loopback_deployment_matches_inprocess():
    env = dict(os.environ, FEDCLUST_BIN=str(Path(sys.executable).parent))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "flower_loopback.sh")], env=env,
                       capture_output=True, text=True, timeout=600)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0
    assert "centers IDENTICAL" in r.stdout and r.stdout.rstrip().endswith("OK")
