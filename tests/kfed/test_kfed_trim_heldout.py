"""KFed(trim=α) on federations unlike the ones its grouping was built on: moderate separation
(neighbouring clusters within a few honest spreads), poisoned data around far points, tight
colluding groups with data of their own, other d, k, k', seeds and scales."""

import numpy as np
import pytest

from fedclust import KFed
from fedclust.datasets import make_federated_gaussians
from fedclust.kfed.robust_server import distrusted_centers
from fedclust.metrics import matched_accuracy
from fedclust.sim.byzantine import poison_devices


def _honest_accuracy(model, fd, bad):
    honest = [z for z in range(len(fd.devices)) if z not in set(bad)]
    return matched_accuracy(np.concatenate([fd.labels[z] for z in honest]),
                            np.concatenate([model.device_labels_[z] for z in honest]))


@pytest.mark.parametrize("d, k, kp, m0, c, alpha, seed", [
    (30, 9, 3, 8, 12.0, 0.2, 5),      # neighbouring clusters chain under a global radius
    (40, 16, 4, 10, 14.0, 0.1, 7),    # the shape, another seed
    (12, 8, 2, 6, 25.0, 0.2, 11),     # low dimension
])
def test_scattered_far_poisoning_at_moderate_separation(d, k, kp, m0, c, alpha, seed):
    fd = make_federated_gaussians(n_features=d, n_clusters=k, n_local_clusters=kp, m0=m0,
                                  separation=c, random_state=seed)
    far = 30.0 * np.linalg.norm(fd.means, axis=1).max()
    devices, bad = poison_devices(fd.devices, alpha, seed, attack="shift", scale=far)
    honest_only = KFed(k, kp, random_state=seed).fit(
        [X for z, X in enumerate(fd.devices) if z not in set(bad)])
    assert matched_accuracy(np.concatenate([fd.labels[z] for z in range(len(fd.devices))
                                            if z not in set(bad)]),
                            np.concatenate(honest_only.device_labels_)) == 1.0
    plain = KFed(k, kp, random_state=seed).fit(devices)
    robust = KFed(k, kp, trim=alpha, random_state=seed).fit(devices)
    assert _honest_accuracy(plain, fd, bad) < 0.9          # the lies take global centers
    assert _honest_accuracy(robust, fd, bad) >= 0.98
    assert set(robust.run_log_.distrusted) == set(bad)


def test_coordinated_colluders_with_their_own_data_lose_to_larger_true_clusters():
    # every poisoned device holds data around one shared far point (honest-looking spread)
    fd = make_federated_gaussians(n_features=25, n_clusters=8, n_local_clusters=2, m0=12,
                                  separation=16.0, random_state=21)
    target = 50.0 * np.linalg.norm(fd.means, axis=1).max() * np.ones(25) / 5.0
    devices, bad = poison_devices(fd.devices, 0.15, 21, attack="coordinated", target=target)
    robust = KFed(8, 2, trim=0.15, random_state=21).fit(devices)
    assert _honest_accuracy(robust, fd, bad) >= 0.98
    d = np.sqrt(((robust.cluster_centers_[:, None] - fd.means[None]) ** 2).sum(-1))
    assert d.min(axis=0).max() < 2.0      # every true mean has a final center next to it


def test_no_chaining_between_close_true_clusters():
    # ten true clusters on a line, neighbours 5 honest spreads apart: a linkage at any global
    # radius that joins one cluster's estimates chains several clusters; balls do not
    rng = np.random.default_rng(3)
    true = np.c_[np.arange(10) * 5.0, np.zeros((10, 4))]
    honest = [true + rng.normal(scale=0.6, size=true.shape) for _ in range(9)]
    liars = [rng.normal(size=(10, 5)) * 1e4 for _ in range(2)]
    dist = distrusted_centers(honest + liars, trim=0.2, n_clusters=10)
    assert dist.keep[:90].all() and not dist.keep[90:].any()
    groups = dist.group[:90].reshape(9, 10)
    # the centers of one true cluster share a group, and no group holds two true clusters
    assert (groups == groups[0]).all() and len(set(groups[0])) == 10


def test_lone_centers_are_never_trusted_even_when_fewer_than_k_groups_qualify():
    rng = np.random.default_rng(4)
    true = np.array([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    honest = [true[:2] + rng.normal(scale=0.5, size=(2, 2)) for _ in range(6)]
    liar = [np.array([[900.0, 900.0], [-900.0, 400.0]])]
    dist = distrusted_centers(honest + liar, trim=0.2, n_clusters=3)
    assert not dist.keep[-2:].any() and dist.keep[:-2].all()
