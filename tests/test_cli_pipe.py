"""``fedclust ... | head``: a reader that goes away ends the command quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fedclust


def _run_into_closed_pipe(args, tmp_path):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line: every write fails
    env = dict(os.environ, PYTHONPATH=str(Path(fedclust.__file__).parents[1]))
    try:
        return subprocess.run([sys.executable, "-m", "fedclust.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, env=env, cwd=tmp_path, timeout=120)
    finally:
        os.close(write)


SMALL = """
[data]
source = "gaussians"
n_features = 3
n_clusters = 2
n_local_clusters = 2
m0 = 2
n_per_component = 20
[algorithm]
name = "kfed"
n_clusters = 2
n_local_clusters = 2
"""


def test_closed_output_pipe_exits_quietly(tmp_path):
    (tmp_path / "small.toml").write_text(SMALL)
    done = _run_into_closed_pipe(["run", "small.toml", "--out", "o", "--no-plot"], tmp_path)
    # Python's documented handling of SIGPIPE: no message, exit status 1
    assert done.stderr.decode() == "" and done.returncode == 1
    # the run itself finished: its files are written before the output is flushed
    assert (tmp_path / "o" / "result.json").is_file()

