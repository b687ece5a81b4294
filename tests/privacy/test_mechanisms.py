"""The mechanisms' building blocks: clipping at the bound, and Gaussian noise that is
centred, independent per entry, present at every std > 0 and keyed per stream."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.privacy import (clip_contribution, clip_points, gaussian, noise_rng,
                              symmetric_gaussian)


def test_one_row_over_the_bound_is_clipped_and_counted():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [30.0, 40.0]])
    Xc, n = clip_points(X, 5.0)
    assert n == 1
    np.testing.assert_array_equal(Xc[:2], X[:2])          # on or inside: untouched
    np.testing.assert_allclose(Xc[2], [3.0, 4.0])
    Xc, n = clip_points(X[:2], 5.0)
    assert n == 0 and np.array_equal(Xc, X[:2])


def test_a_contribution_on_the_bound_is_not_clipped():
    (a, b), clipped = clip_contribution([np.array([3.0]), np.array([2.0])], [1.0, 2.0], 5.0)
    assert not clipped
    np.testing.assert_array_equal(a, [3.0])
    (a, b), clipped = clip_contribution([np.array([3.0]), np.array([2.0])], [1.0, 2.0], 2.5)
    assert clipped
    np.testing.assert_allclose([a[0], 2.0 * b[0]], [1.5, 2.0])


@pytest.mark.parametrize("std", [0.5, 1.0, 3.0])
def test_gaussian_noise_is_centred_independent_and_of_the_given_std(std):
    x = np.zeros((400, 50))
    y = gaussian(x, std, noise_rng(7))
    assert y.shape == x.shape
    assert abs(y.mean()) < 4 * std / np.sqrt(y.size)
    assert y.std() == pytest.approx(std, rel=0.02)
    # entries are independent: the 50 columns are uncorrelated
    C = np.corrcoef(y.T)
    assert np.abs(C[np.triu_indices(50, 1)]).max() < 0.25
    assert np.array_equal(gaussian(x, 0.0, noise_rng(7)), x)


@pytest.mark.parametrize("std", [0.5, 1.0])
def test_symmetric_noise_is_centred_independent_on_the_upper_triangle(std):
    d = 6
    draws = np.stack([symmetric_gaussian(np.eye(d), std, noise_rng(s)) for s in range(600)])
    E = draws - np.eye(d)
    np.testing.assert_array_equal(E, np.swapaxes(E, 1, 2))
    iu = np.triu_indices(d)
    U = E[:, iu[0], iu[1]]
    assert np.abs(U.mean(axis=0)).max() < 5 * std / np.sqrt(600)
    assert U.std(axis=0) == pytest.approx(np.full(U.shape[1], std), rel=0.12)
    C = np.corrcoef(U.T)
    assert np.abs(C[np.triu_indices(U.shape[1], 1)]).max() < 0.2


def test_noise_streams_differ_by_key_and_repeat_by_seed():
    a = noise_rng(3, 0, 1).normal(size=5)
    assert np.array_equal(a, noise_rng(3, 0, 1).normal(size=5))
    assert not np.array_equal(a, noise_rng(3, 1, 1).normal(size=5))
    assert not np.array_equal(a, noise_rng(3, 0, 2).normal(size=5))
    assert not np.array_equal(a, noise_rng(4, 0, 1).normal(size=5))
    assert not np.array_equal(noise_rng(None).normal(size=5), noise_rng(None).normal(size=5))
