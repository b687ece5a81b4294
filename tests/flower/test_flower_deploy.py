"""Multi-host deployment with TLS and SuperNode authentication (opt-in, a few minutes).

    make test-deploy            # or: pytest -m deploy tests/flower/test_flower_deploy.py

SuperLink, operator and SuperNodes in separate network namespaces (loopback where
namespaces cannot be made); see scripts/flower_deploy.sh for the checks.
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


@pytest.mark.deploy
def test_multi_host_deployment_with_tls_and_authentication():
    env = dict(os.environ, FEDCLUST_BIN=str(Path(sys.executable).parent))
    r = subprocess.run(["bash", str(ROOT / "scripts" / "flower_deploy.sh")], env=env,
                       capture_output=True, text=True, timeout=1800)
    print(r.stdout[-4000:], r.stderr[-4000:])
    assert r.returncode == 0
    out = r.stdout
    assert "centers IDENTICAL" in out
    assert "unregistered SuperNode refused" in out
    assert "rejected: device 1" in out
    assert "failed: device 2" in out
    assert out.rstrip().endswith("OK")
