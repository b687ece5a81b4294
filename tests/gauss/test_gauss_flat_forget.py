"""The default (flat) server's forget over many owners equals a retrain bit for bit,
for device and row forgets interleaved: the step run again over the kept clusters,
with the greedy merge reading its next pair from kept row minima."""

import numpy as np
import pytest

from fedclust import FedGaussClustering


def _owners(rng, n_owners, d=6, k=5, k_local=2):
    """Every owner holds ``k_local`` of ``k`` unit-variance Gaussians (the benchmark's
    federation, scaled down), 40 to 90 rows each."""
    means = rng.normal(scale=5.0, size=(k, d))
    out = []
    for _ in range(n_owners):
        own = rng.choice(k, size=k_local, replace=False)
        m = int(rng.integers(40, 90))
        out.append(means[own[rng.integers(k_local, size=m)]] + rng.normal(size=(m, d)))
    return out


@pytest.mark.parametrize("trial", range(2))
def test_flat_forget_sequences_over_many_owners_equal_a_retrain(trial):
    rng = np.random.default_rng(70 + trial)
    n = 24
    ids = [int(z) for z in rng.choice(10_000, size=n, replace=False)]
    data = dict(zip(ids, _owners(rng, n)))
    model = FedGaussClustering(random_state=trial).fit(list(data.values()), device_ids=ids)
    received = sum(len(c) for c in model._unlearning_.result.local_counts.values())
    assert received > 4 * model.means_.shape[0]   # many greedy merges per step
    for step in range(4):
        alive = [z for z in ids if z in data]
        z = int(rng.choice(alive))
        if step % 2 == 0:
            model.forget(devices=[z], relabel=False)
            del data[z]
        else:
            rows = rng.choice(len(data[z]), size=5, replace=False)
            model.forget(rows={z: rows}, relabel=False)
            data[z] = np.delete(data[z], rows, axis=0)
        assert model.forget_log_[-1].path == "replay"
        kept = [z for z in ids if z in data]
        fresh = FedGaussClustering(random_state=trial).fit([data[z] for z in kept],
                                                           device_ids=kept)
        for name in ("means_", "covariances_", "counts_"):
            np.testing.assert_array_equal(getattr(model, name), getattr(fresh, name),
                                          err_msg=f"step {step}: {name}")
        assert model._unlearning_.store.digest() == fresh._unlearning_.store.digest()
