"""Small shared helpers for the core tests (numpy only, no fedclust code)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment


def make_structured_federation(*, k=16, k_local=4, m0=5, d=50, n_per=20, sep=10.0,
                               seed=0):
    """k-FED's structured Gaussian federation (ALGORITHMS.md §1.4).

    The k components are split into k/k_local groups of ``k_local``; every group's
    data is spread over ``m0`` devices, each of which sees ``n_per`` points of every
    component of its group. Means are ``sep * N(0, I_d)``, noise is N(0, I_d).

    Returns ``(devices, labels, means)``: lists of (n_z, d) arrays and (n_z,) true
    component ids, and the (k, d) means.
    """
    rng = np.random.default_rng(seed)
    means = sep * rng.standard_normal((k, d))
    devices, labels = [], []
    for g in range(k // k_local):
        comps = np.arange(g * k_local, (g + 1) * k_local)
        for _ in range(m0):
            y = np.repeat(comps, n_per)
            X = means[y] + rng.standard_normal((len(y), d))
            p = rng.permutation(len(y))
            devices.append(X[p])
            labels.append(y[p])
    return devices, labels, means


def blobs(n_per, means, rng, scale=1.0):
    """Points around ``means`` (k, d): ``n_per`` each, shuffled. Returns (X, y)."""
    k, d = means.shape
    y = np.repeat(np.arange(k), n_per)
    X = means[y] + scale * rng.standard_normal((len(y), d))
    p = rng.permutation(len(y))
    return X[p], y[p]


def matched_accuracy(y_true, y_pred):
    """Hungarian-matched accuracy, written here with scipy only."""
    y_true = np.asarray(y_true)
    y_pred = np.asarray(y_pred)
    t = np.unique(y_true, return_inverse=True)[1]
    p = np.unique(y_pred, return_inverse=True)[1]
    M = np.zeros((p.max() + 1, t.max() + 1))
    np.add.at(M, (p, t), 1)
    r, c = linear_sum_assignment(-M)
    return M[r, c].sum() / len(y_true)


def sorted_rows(A):
    """Rows of A in lexicographic order (compare center sets up to row order)."""
    A = np.asarray(A)
    return A[np.lexsort(A.T[::-1])]


@pytest.fixture
def federation():
    return make_structured_federation


@pytest.fixture
def acc():
    return matched_accuracy


class KeepOutput:
    """A transport that keeps the last run's output (the devices' own outputs included)."""

    def __init__(self, inner=None):
        from fedclust.sim.transport import InProcessTransport

        self.inner = inner or InProcessTransport()
        self.out = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, *args, **kwargs):
        self.out = self.inner.run(*args, **kwargs)
        return self.out

    def clipped(self, ids):
        """What every device counted as clipped (kept on the device, never released)."""
        return [int(self.out.device_outputs[z]["n_clipped"]) for z in ids]
