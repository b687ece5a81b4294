"""Tests of the simulated-device partitioners."""

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.sim.partition import (apply_partition, dirichlet_partition, iid_partition,
                                    partition, power_law_partition, structured_partition)


def _assert_exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert all(len(p) >= 1 for p in parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


def _labels(n_classes=10, per_class=30, seed=0):
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(n_classes), per_class))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_iid_partition():
    parts = iid_partition(103, 10, random_state=0)
    _assert_exact_cover(parts, 103)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert _same(parts, iid_partition(103, 10, random_state=0))
    assert not _same(parts, iid_partition(103, 10, random_state=1))
    assert len(iid_partition(5, 5, random_state=0)) == 5


def test_structured_partition_with_m0():
    y = _labels(10, 30)
    parts = structured_partition(y, n_local_clusters=3, m0=4, random_state=0)
    assert len(parts) == 4 * 4  # ceil(10/3)=4 groups
    _assert_exact_cover(parts, len(y))
    for g in range(4):
        group = parts[4 * g:4 * g + 4]
        labs = [set(y[p]) for p in group]
        # every device of a group holds the same <= k' labels, all of them
        assert all(len(s) <= 3 for s in labs)
        assert all(s == labs[0] for s in labs)
        sizes = [len(p) for p in group]
        assert max(sizes) - min(sizes) <= 1
    # groups are disjoint in labels
    group_labels = [set(y[parts[4 * g]]) for g in range(4)]
    assert sorted(len(s) for s in group_labels) == [1, 3, 3, 3]
    assert len(set().union(*group_labels)) == 10


def test_structured_partition_with_n_devices():
    y = _labels(6, 20, seed=1)  # k'=2 -> 3 groups of 40 points
    parts = structured_partition(y, n_local_clusters=2, n_devices=7, random_state=0)
    assert len(parts) == 7
    _assert_exact_cover(parts, len(y))
    assert all(len(set(y[p])) <= 2 for p in parts)
    # 7 devices over 3 groups: 3,2,2 devices
    per_group = {}
    for p in parts:
        per_group.setdefault(frozenset(y[p]), 0)
        per_group[frozenset(y[p])] += 1
    assert sorted(per_group.values()) == [2, 2, 3]
    # extra devices go to the biggest group
    y2 = np.concatenate([np.zeros(100, int), np.ones(10, int), np.full(10, 2)])
    for seed in range(3):
        parts2 = structured_partition(y2, n_local_clusters=1, n_devices=4, random_state=seed)
        assert sorted(len(p) for p in parts2) == [10, 10, 50, 50]
        assert sum(set(y2[p]) == {0} for p in parts2) == 2


def test_structured_partition_reproducible_and_arbitrary_labels():
    y = np.array(list("aabbccddee" * 4))
    a = structured_partition(y, 2, m0=2, random_state=5)
    assert _same(a, structured_partition(y, 2, m0=2, random_state=5))
    assert not _same(a, structured_partition(y, 2, m0=2, random_state=6))
    _assert_exact_cover(a, len(y))
    assert all(len(set(y[p])) <= 2 for p in a)


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_partition(alpha):
    y = _labels(5, 40)
    parts = dirichlet_partition(y, 8, alpha, random_state=0, min_size=2)
    assert len(parts) == 8
    _assert_exact_cover(parts, len(y))
    assert min(len(p) for p in parts) >= 2
    assert _same(parts, dirichlet_partition(y, 8, alpha, random_state=0, min_size=2))


def test_dirichlet_alpha_controls_skew():
    y = _labels(10, 100)

    def mean_classes(alpha):
        parts = dirichlet_partition(y, 20, alpha, random_state=0)
        return np.mean([len(np.unique(y[p])) for p in parts])

    assert mean_classes(0.05) < 4 < 9 < mean_classes(100.0)


def test_dirichlet_gives_up_with_clear_error():
    y = _labels(2, 10)
    with pytest.raises(ValidationError,
                       match=r"after max_tries=3 draws with alpha=0.01.*min_size=5"):
        dirichlet_partition(y, 4, 0.01, random_state=0, min_size=5, max_tries=3)


def test_power_law_partition():
    parts = power_law_partition(1000, 30, exponent=1.0, min_size=3, random_state=0)
    _assert_exact_cover(parts, 1000)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 3
    assert sizes.max() > 3 * np.median(sizes)  # heavy tail
    assert _same(parts, power_law_partition(1000, 30, exponent=1.0, min_size=3, random_state=0))
    assert not _same(parts, power_law_partition(1000, 30, exponent=1.0, min_size=3,
                                                random_state=1))
    exact = power_law_partition(10, 5, min_size=2, random_state=0)
    assert [len(p) for p in exact] == [2] * 5


def test_power_law_sizes_follow_weights():
    # with rest large, size_z - min_size ~ rest * w_z / sum w: the largest device's
    # share of a 1e5-point split should equal the largest Pareto weight's share
    n, m, a = 100_000, 50, 1.5
    parts = power_law_partition(n, m, exponent=a, random_state=3)
    w = np.random.default_rng(3).pareto(a, size=m) + 1.0
    sizes = np.array([len(p) for p in parts])
    assert np.abs(sizes - (n - m) * w / w.sum() - 1).max() <= 1.0


def test_apply_partition():
    X = np.arange(12.0).reshape(6, 2)
    y = np.array([0, 1, 2, 3, 4, 5])
    devs, labs = apply_partition(X, y, [np.array([4, 0]), np.array([1, 2, 3, 5])])
    assert np.array_equal(devs[0], X[[4, 0]]) and list(labs[0]) == [4, 0]
    assert np.array_equal(devs[1], X[[1, 2, 3, 5]])
    devs, labs = apply_partition(X, None, iid_partition(6, 2, random_state=0))
    assert labs is None and sum(len(d) for d in devs) == 6


def test_apply_partition_refuses_bad_parts():
    X, y = np.zeros((4, 1)), np.zeros(4)
    with pytest.raises(ValidationError, match="1 index\\(es\\) repeated, 2 missing"):
        apply_partition(X, y, [np.array([0, 1]), np.array([1])])
    with pytest.raises(ValidationError, match="0 index\\(es\\) repeated, 1 missing"):
        apply_partition(X, y, [np.array([0, 1, 2])])
    with pytest.raises(ValidationError, match="parts\\[1\\] holds index 4 outside 0..3"):
        apply_partition(X, y, [np.array([0, 1, 2]), np.array([4])])
    with pytest.raises(ValidationError, match="parts\\[0\\] is empty"):
        apply_partition(X, y, [np.array([], dtype=int), np.arange(4)])
    with pytest.raises(ValidationError, match="integer index array"):
        apply_partition(X, y, [np.arange(4.0)])
    with pytest.raises(ValidationError, match="y has 3 labels but X has 4 rows"):
        apply_partition(X, y[:3], [np.arange(4)])


def test_partition_dispatcher():
    y = _labels(4, 10)
    X = np.zeros((len(y), 2))
    assert _same(partition("iid", X, y, 5, random_state=0), iid_partition(40, 5, random_state=0))
    assert _same(partition("structured", X, y, 4, n_local_clusters=2, random_state=0),
                 structured_partition(y, 2, n_devices=4, random_state=0))
    assert _same(partition("dirichlet", X, y, 3, alpha=0.5, random_state=0),
                 dirichlet_partition(y, 3, 0.5, random_state=0))
    assert _same(partition("power-law", X, None, 3, exponent=2.0, random_state=0),
                 power_law_partition(40, 3, exponent=2.0, random_state=0))
    with pytest.raises(ValidationError, match="kind='random' is not supported"):
        partition("random", X, y, 3)
    with pytest.raises(ValidationError, match="kind='iid' does not take \\['alpha'\\]"):
        partition("iid", X, y, 3, alpha=1.0)
    with pytest.raises(ValidationError, match="needs labels y"):
        partition("dirichlet", X, None, 3, alpha=1.0)
    with pytest.raises(ValidationError, match="needs n_local_clusters"):
        partition("structured", X, y, 3)
    with pytest.raises(ValidationError, match="needs alpha"):
        partition("dirichlet", X, y, 3)
    with pytest.raises(ValidationError, match="y has shape \\(3,\\) but X has 40 rows"):
        partition("structured", X, y[:3], 3, n_local_clusters=1)


def test_partitioner_bad_parameters():
    y = _labels(4, 5)
    with pytest.raises(ValidationError, match="n_devices=11 devices .* only n_samples=10"):
        iid_partition(10, 11)
    with pytest.raises(ValidationError, match="n_devices=0 must be >= 1"):
        iid_partition(10, 0)
    with pytest.raises(ValidationError, match="exactly one of m0"):
        structured_partition(y, 2)
    with pytest.raises(ValidationError, match="exactly one of m0"):
        structured_partition(y, 2, m0=2, n_devices=4)
    with pytest.raises(ValidationError, match="n_devices=1 is fewer than the 2 groups"):
        structured_partition(y, 2, n_devices=1)
    with pytest.raises(ValidationError, match="has 10 points for 11 devices"):
        structured_partition(y, 2, m0=11, random_state=0)
    with pytest.raises(ValidationError, match="n_local_clusters=0 must be >= 1"):
        structured_partition(y, 0, m0=1)
    with pytest.raises(ValidationError, match="y must be 1-D"):
        structured_partition(y.reshape(4, 5), 1, m0=1)
    with pytest.raises(ValidationError, match="alpha=0.0 must be > 0"):
        dirichlet_partition(y, 2, 0.0)
    with pytest.raises(ValidationError, match="need 30 points, but there are only n_samples=20"):
        dirichlet_partition(y, 3, 1.0, min_size=10)
    with pytest.raises(ValidationError, match="exponent=-1.0 must be > 0"):
        power_law_partition(10, 2, exponent=-1.0)
    with pytest.raises(ValidationError, match="random_state=-3 must be >= 0"):
        iid_partition(10, 2, random_state=-3)
