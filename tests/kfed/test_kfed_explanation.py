"""The k-FED warning about local clusters their final center explains poorly, on hand
cases: ‖c_j − μ‖² against 4 S_j / n_j, twice the RMS radius (a one-point cluster: the
median over the others)."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.kfed.server import explanation_warning, poorly_explained

# local clusters (device, mean, n, scatter S):
#   A dev 0 (0, 0)   n 4  S 8   4S/n 8     final 0 at (0, 0): ‖·‖² 0     explained
#   B dev 0 (10, 0)  n 1  S 0   4 median 4 final 1 at (10, y): ‖·‖² y²   see below
#   C dev 1 (0, 2)   n 3  S 3   4S/n 4     final 0: ‖·‖² 4, equal        explained
#   D dev 1 (1.2, 0) n 2  S 0.5 4S/n 1     final 0: ‖·‖² 1.44            outside
CENTERS = [np.array([[0.0, 0.0], [10.0, 0.0]]), np.array([[0.0, 2.0], [1.2, 0.0]])]
COUNTS = [np.array([4, 1]), np.array([3, 2])]
SCATTER = [np.array([8.0, 0.0]), np.array([3.0, 0.5])]
LABELS = [np.array([0, 1]), np.array([0, 0])]


def _final(y):
    return np.array([[0.0, 0.0], [10.0, y]])


@pytest.mark.parametrize("y,b_bad", [(1.9, False),    # 3.61 <= 4 median(2, 1, 0.25) = 4
                                     (2.1, True)])    # 4.41 > 4
def test_poorly_explained_by_hand(y, b_bad):
    bad = poorly_explained(CENTERS, COUNTS, SCATTER, _final(y), LABELS)
    assert [b.tolist() for b in bad] == [[False, b_bad], [False, True]]


def test_the_warning_counts_points_and_fires_above_the_share():
    args = (CENTERS, COUNTS, SCATTER, _final(1.9), LABELS, [7, 9])
    # D's 2 of the 10 points: 20 %
    assert explanation_warning(*args) is None                 # default 25 %
    assert explanation_warning(*args, share=0.2) is None      # not above it
    assert explanation_warning(*args, share=0.19) == (
        "k-FED: 20% of the points are in local clusters whose final center lies outside "
        "them (farther than twice their RMS radius; devices 9): the 2 final centers explain "
        "these devices poorly. Try more clusters, n_local_clusters='auto', or refine with "
        "DistributedLloyd(init='kfed')")
    # B and D: 3 of 10 points on both devices
    got = explanation_warning(CENTERS, COUNTS, SCATTER, _final(2.1), LABELS, [7, 9])
    assert got.startswith("k-FED: 30% of the points are in local clusters whose final center "
                          "lies outside them (farther than twice their RMS radius; devices 7, "
                          "9): ")


def test_a_lone_point_far_from_its_center_is_warned_about():
    got = explanation_warning([np.array([[1.0, 0.0]])], [np.array([1])], [np.array([0.0])],
                              np.array([[0.0, 0.0]]), [np.array([0])], [3])
    assert got is not None and got.startswith("k-FED: 100% of the points") and "devices 3)" in got


@pytest.mark.parametrize("n_bad,listed", [(10, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10"),
                                          (11, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ...")])
def test_the_warning_lists_at_most_ten_devices(n_bad, listed):
    # device 0 sits on its final center, devices 1.. lie 1 away with no spread
    n = n_bad + 1
    centers = [np.array([[float(z > 0), 0.0]]) for z in range(n)]
    counts = [np.array([5]) for _ in range(n)]
    scatter = [np.array([0.5]) for _ in range(n)]
    got = explanation_warning(centers, counts, scatter, np.array([[0.0, 0.0]]),
                              [np.array([0])] * n, list(range(n)))
    assert f"(farther than twice their RMS radius; devices {listed}): the 1 final centers" \
        in got
