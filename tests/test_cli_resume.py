"""``fedclust run --resume OUT``: a run killed mid-way continues after its last complete
round and writes the result the uninterrupted run writes; a private run's ε counts a
release the crash lost."""

import json

import numpy as np
import pytest

from fedclust.cli import main
from fedclust.core.checkpoint import CHECKPOINT_FILE, LEDGER_FILE
from fedclust.sim.transport import InProcessTransport

CONFIG = """
seed = 3
[data]
source = "gaussians"
n_features = 4
n_clusters = 3
n_local_clusters = 2
m0 = 3
separation = 30.0
n_per_component = 30

[algorithm]
name = "distributed-lloyd"
n_clusters = 3
max_rounds = 4
init = "candidates"
{extra}
"""
PRIVACY = """
[privacy]
epsilon = 2.0
delta = 1e-6
data_bound = 60.0
noise_seed = 5
"""


class Killed(RuntimeError):
    pass


def _crash_at(monkeypatch, at, after_step=False):
    """Kill the run at round ``at``: after its checkpoint, or after its server step."""
    if after_step:
        step = InProcessTransport._server_step
        seen = []

        def crash(self, protocol, state, request, replies):
            step(self, protocol, state, request, replies)
            seen.append(1)
            if len(seen) - 1 == at:
                raise Killed(f"killed in round {at}")

        monkeypatch.setattr(InProcessTransport, "_server_step", crash)
        return
    save = InProcessTransport._checkpoint

    def crash(self, ckpt, identity, state, log, meter, states, active):
        save(self, ckpt, identity, state, log, meter, states, active)
        if meter.rounds - 1 == at:
            raise Killed(f"killed after round {at}")

    monkeypatch.setattr(InProcessTransport, "_checkpoint", crash)


def _result(folder):
    return json.loads((folder / "result.json").read_text())


@pytest.mark.parametrize("private,after_step", [(False, False), (True, True)])
def test_resumed_cli_run_writes_the_uninterrupted_result(tmp_path, monkeypatch, capsys,
                                                          private, after_step):
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(CONFIG.format(extra=PRIVACY if private else ""))
    assert main(["run", str(cfg), "--out", str(tmp_path / "ref"), "--no-plot"]) == 0
    ref = _result(tmp_path / "ref")
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _crash_at(m, 3, after_step)
        assert main(["run", str(cfg), "--out", str(out), "--no-plot"]) == 3
    assert "Killed" in capsys.readouterr().err
    assert not (out / "result.json").exists()
    assert (out / "checkpoint" / "fit" / CHECKPOINT_FILE).exists()
    assert main(["run", "--resume", str(out)]) == 0
    got = _result(out)
    assert np.array_equal(np.asarray(got["cluster_centers"]), np.asarray(ref["cluster_centers"]))
    assert got["communication"] == ref["communication"]
    # the device state of the finished run is removed; its ledger stays
    assert not (out / "checkpoint" / "fit" / CHECKPOINT_FILE).exists()
    assert main(["run", "--resume", str(out)]) == 2
    assert "has finished" in capsys.readouterr().err
    if private:
        ledger = json.loads((out / "checkpoint" / "fit" / LEDGER_FILE).read_text())
        assert [e["round"] for e in ledger["lost"]] == [3]
        assert got["privacy"]["epsilon_spent"] > ref["privacy"]["epsilon_spent"]
        assert got["run_log"]["privacy_ledger"]["lost_releases"][0]["round"] == 3
    else:
        assert got["run_log"] == ref["run_log"]


def test_resume_needs_a_checkpointed_run(tmp_path, capsys):
    assert main(["run", "--resume", str(tmp_path)]) == 2
    assert "no run to resume there" in capsys.readouterr().err
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(CONFIG.format(extra=""))
    assert main(["run", str(cfg), "--resume", str(tmp_path)]) == 2
    assert "takes neither CONFIG nor --out" in capsys.readouterr().err
    assert main(["run", str(cfg)]) == 2
    assert "needs CONFIG and --out" in capsys.readouterr().err
