"""flwr is an optional extra: the core imports and runs without it (no flwr needed here)."""

from __future__ import annotations

import subprocess
import sys

BLOCK = "import sys; sys.modules['flwr'] = None; sys.modules['ray'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                          timeout=120)


def test_core_and_flower_package_import_without_flwr():
    r = _run("import fedclust, fedclust.cli, fedclust.experiment, fedclust.flower\n"
             "import fedclust.flower_app, fedclust.flower.results, fedclust.flower.transport\n"
             "assert 'flwr' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
             "print('ok')")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_flower_transport_without_flwr_is_a_one_line_error():
    r = _run("import numpy as np\nfrom fedclust import KFed\n"
             "rng = np.random.default_rng(0)\n"
             "KFed(2, 2, random_state=0).fit([rng.standard_normal((20, 3)) for _ in range(3)])\n")
    assert r.returncode == 0, r.stderr  # the in-process path needs no flwr
    r = _run("from fedclust.flower.transport import FlowerSimulationTransport\n"
             "import numpy as np\n"
             "from fedclust.kfed.protocol import KFedProtocol\n"
             "try:\n"
             "    FlowerSimulationTransport().run(KFedProtocol(1, 1), {0: np.ones((3, 2))}, 0)\n"
             "except ImportError as exc:\n"
             "    print(exc)\n")
    assert r.returncode == 0, r.stderr
    assert "pip install 'fedclust[flower]'" in r.stdout
