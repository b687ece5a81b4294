"""A forget after a resumed run sees every round's kept summaries, not only those after the
resume: the server's summaries are part of the checkpoint (Flower ServerApp on an in-memory
grid, and the in-process transport)."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import FedGaussClassifier
from fedclust.core.random import root_seed
from fedclust.sim import InProcessTransport

pytest.importorskip("flwr")

from fedclust.core.policy import DevicePolicy  # noqa: E402
from fedclust.flower.apps import ServerAppFailed, ServerSpec, make_client_app  # noqa: E402
from fedclust.flower.apps import make_server_app  # noqa: E402
from fedclust.flower.grid import LocalGrid, run_server_app  # noqa: E402


class _LinkLost(RuntimeError):
    pass


class _CrashingGrid(LocalGrid):
    """Loses the connection on its ``at``-th exchange (0: the hello; -1: never)."""

    def __init__(self, *args, at: int, **kw):
        super().__init__(*args, **kw)
        self.at, self.n = at, 0

    def send_and_receive(self, messages, *, timeout=None):
        n, self.n = self.n, self.n + 1
        if n == self.at:
            raise _LinkLost(f"connection lost in exchange {n}")
        return super().send_and_receive(messages, timeout=timeout)


class _CheckpointedGridTransport:
    """The Flower ServerApp and ClientApp on an in-memory grid, checkpointing into
    ``result_dir``; the connection is lost at exchange ``crash_at``."""

    def __init__(self, result_dir, *, resume=False, crash_at=-1):
        self.result_dir, self.resume, self.crash_at = str(result_dir), resume, crash_at
        self.exchanges = 0

    def run(self, protocol, devices, random_state=None):
        ids = sorted(int(z) for z in devices)
        data = {i: (z, devices[z]) for i, z in enumerate(ids)}
        spec = ServerSpec.for_protocol(protocol, root_seed(random_state), min_nodes=len(ids),
                                       node_wait_s=0.0, round_timeout_s=None,
                                       result_dir=self.result_dir, resume=self.resume)
        box = {}
        app = make_server_app(spec, on_result=lambda out, extra: box.update(out=out))
        client = make_client_app(lambda ctx: data[int(ctx.node_config["partition-id"])],
                                 policy=lambda ctx: DevicePolicy(allow_collect=True,
                                                                 allow_noise_seed=True))
        # each node keeps its state on its own disk, so the resumed run finds it
        nodes = [{"partition-id": i, "state-dir": f"{self.result_dir}-node-{i}"}
                 for i in range(len(ids))]
        grid = _CrashingGrid(client, nodes, at=self.crash_at)
        try:
            run_server_app(app, grid)
        finally:
            self.exchanges = grid.n
        return box["out"]


def _federation(seed, n_devices=6, d=3, k=3):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, d)) * 6
    Xs, ys = [], []
    for _ in range(n_devices):
        n = int(rng.integers(30, 60))
        y = rng.integers(k, size=n)
        Xs.append(means[y] + rng.normal(size=(n, d)))
        ys.append(y)
    return Xs, ys


ATTRS = ("means_", "covariances_", "counts_", "fisher_scores_")


def _same(a, b):
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ATTRS)


def test_forget_after_a_resumed_flower_run_equals_the_uninterrupted_runs_forget(tmp_path):
    Xs, ys = _federation(4)
    ids = [31, 5, 17, 8, 22, 40]
    make = lambda: FedGaussClassifier(random_state=3)   # noqa: E731  selection + learning
    # exchange 0 is the hello, 1 the selection round: lost in exchange 2 (the learning round)
    crashing = _CheckpointedGridTransport(tmp_path / "run", crash_at=2)
    with pytest.raises(ServerAppFailed, match="connection lost"):
        make().fit(Xs, ys, device_ids=ids, transport=crashing)
    assert (tmp_path / "run" / "checkpoint" / "checkpoint.npz").exists()
    resumed_transport = _CheckpointedGridTransport(tmp_path / "run", resume=True)
    resumed = make().fit(Xs, ys, device_ids=ids, transport=resumed_transport)
    whole = make().fit(Xs, ys, device_ids=ids,
                       transport=_CheckpointedGridTransport(tmp_path / "whole"))
    assert resumed_transport.exchanges < whole_exchanges(tmp_path)   # the selection not redone
    assert _same(resumed, whole)
    kept = resumed._unlearning_.store
    assert [r.action for r in kept.rounds] == [r.action for r in whole._unlearning_.store.rounds]
    assert len(kept.rounds) == 2 and kept.digest() == whole._unlearning_.store.digest()
    # the sites are offline: the forget works from the kept summaries alone
    resumed.forget(devices=[17])
    whole.forget(devices=[17])
    assert resumed.forget_log_[-1].retrained is False
    assert _same(resumed, whole)
    keep = [i for i, z in enumerate(ids) if z != 17]
    fresh = make().fit([Xs[i] for i in keep], [ys[i] for i in keep],
                       device_ids=[ids[i] for i in keep])
    assert _same(resumed, fresh)
    assert resumed.verify().summaries


def whole_exchanges(tmp_path) -> int:
    """Exchanges of an uninterrupted run (hello, every round, the final message)."""
    Xs, ys = _federation(4)
    t = _CheckpointedGridTransport(tmp_path / "count")
    FedGaussClassifier(random_state=3).fit(Xs, ys, device_ids=[31, 5, 17, 8, 22, 40],
                                           transport=t)
    return t.exchanges


class _CrashAfterCheckpoint(InProcessTransport):
    """Stops right after the checkpoint of round ``at`` (0-based)."""

    def __init__(self, at, **kw):
        super().__init__(**kw)
        self.at = at

    def _checkpoint(self, ckpt, identity, state, log, meter, states, active):
        super()._checkpoint(ckpt, identity, state, log, meter, states, active)
        if meter.rounds - 1 == self.at:
            raise _LinkLost(f"stopped after round {self.at}")


def test_forget_after_a_resumed_in_process_run_is_exact(tmp_path):
    Xs, ys = _federation(7)
    ids = [3, 9, 1, 12, 6, 20]
    make = lambda: FedGaussClassifier(random_state=5)   # noqa: E731
    with pytest.raises(_LinkLost):
        make().fit(Xs, ys, device_ids=ids, transport=_CrashAfterCheckpoint(
            0, checkpoint_dir=tmp_path))
    resumed = make().fit(Xs, ys, device_ids=ids,
                         transport=InProcessTransport(checkpoint_dir=tmp_path, resume=True))
    whole = make().fit(Xs, ys, device_ids=ids)
    assert resumed._unlearning_.store.digest() == whole._unlearning_.store.digest()
    resumed.forget(devices=[12])
    keep = [i for i, z in enumerate(ids) if z != 12]
    fresh = make().fit([Xs[i] for i in keep], [ys[i] for i in keep],
                       device_ids=[ids[i] for i in keep])
    assert _same(resumed, fresh)
