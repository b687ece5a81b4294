"""Tests of fedclust.metrics against hand-computed values, brute force and scikit-learn."""

from itertools import permutations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from fedclust import ValidationError
from fedclust.metrics import (adjusted_rand, clustering_report, cost_ratio, kmeans_cost,
                              match_labels, matched_accuracy, misclustering_rate,
                              normalized_mutual_info, partition_cost)


def _brute_accuracy(y_true, y_pred):
    """Max over all injective maps cluster -> class (padded with 'no class')."""
    classes = list(np.unique(y_true))
    clusters = list(np.unique(y_pred))
    slots = classes + [None] * len(clusters)
    best = 0
    for perm in permutations(slots, len(clusters)):
        m = dict(zip(clusters, perm))
        best = max(best, sum(m[p] == t for t, p in zip(y_true, y_pred)))
    return best / len(y_true)


# ------------------------------------------------------------------ costs

def test_kmeans_cost_hand_computed():
    X = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0], [10.0, 2.0]])
    C = np.array([[0.0, 0.0], [10.0, 1.0]])
    # distances^2: 0, 1, 1, 1
    assert kmeans_cost(X, C) == pytest.approx(3.0)
    assert kmeans_cost(X, C, sample_weight=[1, 2, 3, 4]) == pytest.approx(0 + 2 + 3 + 4)


def test_kmeans_cost_unit_weights_and_repeats():
    rng = np.random.default_rng(0)
    X, C = rng.normal(size=(50, 3)), rng.normal(size=(4, 3))
    assert kmeans_cost(X, C, np.ones(50)) == pytest.approx(kmeans_cost(X, C))
    # weight 2 on a point == that point repeated
    w = np.ones(50)
    w[7] = 2
    assert kmeans_cost(X, C, w) == pytest.approx(kmeans_cost(np.vstack([X, X[7:8]]), C))


def test_partition_cost_matches_direct_computation():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(40, 5)) + 1e3  # far from origin: needs the direct formula
    labels = rng.choice(["a", "b", "c"], size=40)
    expected = sum(((X[labels == c] - X[labels == c].mean(0)) ** 2).sum()
                   for c in np.unique(labels))
    assert partition_cost(X, labels) == pytest.approx(expected, rel=1e-10)
    assert partition_cost(X, np.zeros(40, int)) == pytest.approx(((X - X.mean(0)) ** 2).sum())


def test_cost_ratio():
    X = np.array([[0.0], [2.0]])
    assert cost_ratio(X, [[0.0]], [[1.0]]) == pytest.approx(4.0 / 2.0)
    assert cost_ratio(X, [[0.0], [2.0]], [[0.0], [2.0]]) == 1.0
    assert cost_ratio(X, [[1.0]], [[0.0], [2.0]]) == float("inf")


# --------------------------------------------------------- label metrics

def test_matched_accuracy_hand_case():
    y_true = [0, 0, 0, 1, 1, 2]
    y_pred = [5, 5, 7, 7, 7, 9]
    assert matched_accuracy(y_true, y_pred) == pytest.approx(5 / 6)
    assert misclustering_rate(y_true, y_pred) == pytest.approx(1 / 6)
    assert match_labels(y_true, y_pred) == {5: 0, 7: 1, 9: 2}


@pytest.mark.parametrize("k_true,k_pred", [(3, 3), (2, 4), (4, 2), (1, 3)])
def test_matched_accuracy_equals_brute_force(k_true, k_pred):
    rng = np.random.default_rng(k_true * 10 + k_pred)
    for _ in range(5):
        y_true = rng.integers(0, k_true, size=25)
        y_pred = rng.integers(0, k_pred, size=25)
        assert matched_accuracy(y_true, y_pred) == pytest.approx(_brute_accuracy(y_true, y_pred))


def test_match_labels_achieves_matched_accuracy():
    rng = np.random.default_rng(3)
    y_true = rng.integers(0, 4, size=60)
    y_pred = rng.integers(0, 5, size=60)
    m = match_labels(y_true, y_pred)
    assert len(m) == 4 and len(set(m.values())) == 4  # one-to-one
    hits = sum(m.get(p) == t for t, p in zip(y_true, y_pred))
    assert hits / 60 == pytest.approx(matched_accuracy(y_true, y_pred))


def test_matched_accuracy_permutation_invariance():
    rng = np.random.default_rng(4)
    y_true = rng.integers(0, 5, size=100)
    y_pred = np.where(rng.random(100) < 0.7, y_true, rng.integers(0, 5, size=100))
    base = matched_accuracy(y_true, y_pred)
    relabel = rng.permutation(5)
    assert matched_accuracy(y_true, relabel[y_pred]) == pytest.approx(base)
    assert matched_accuracy(relabel[y_true] + 100, y_pred) == pytest.approx(base)
    assert matched_accuracy(y_true, y_true) == 1.0
    assert matched_accuracy(y_true, relabel[y_true]) == 1.0


def test_ari_nmi_match_sklearn():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 4, 80), rng.integers(0, 3, 80)
    assert adjusted_rand(a, b) == pytest.approx(adjusted_rand_score(a, b))
    assert normalized_mutual_info(a, b) == pytest.approx(normalized_mutual_info_score(a, b))


def test_clustering_report():
    X = np.array([[0.0, 0.0], [0.0, 1.0], [5.0, 0.0], [5.0, 1.0]])
    y = [0, 0, 1, 1]
    lab = [1, 1, 0, 0]
    C = np.array([[5.0, 0.5], [0.0, 0.5]])
    r = clustering_report(X, y, lab, C)
    assert set(r) == {"accuracy", "ari", "nmi", "misclustering_rate", "kmeans_cost"}
    assert r["accuracy"] == 1.0 and r["misclustering_rate"] == 0.0
    assert r["ari"] == pytest.approx(1.0) and r["nmi"] == pytest.approx(1.0)
    assert r["kmeans_cost"] == pytest.approx(4 * 0.25)
    r2 = clustering_report(X, y, lab, C, reference_centers=[[2.5, 0.5]])
    assert r2["cost_ratio"] == pytest.approx(1.0 / (4 * 6.5))


# ------------------------------------------------------------- bad input

def test_bad_inputs():
    X = np.zeros((3, 2))
    with pytest.raises(ValidationError, match="y_true has 3 labels but y_pred has 2"):
        matched_accuracy([0, 1, 2], [0, 1])
    with pytest.raises(ValidationError, match="y_pred must be 1-D"):
        matched_accuracy([0, 1], [[0], [1]])
    with pytest.raises(ValidationError, match="y_true is empty"):
        adjusted_rand([], [])
    with pytest.raises(ValidationError, match="centers has 3 features but X has 2"):
        kmeans_cost(X, np.zeros((1, 3)))
    with pytest.raises(ValidationError, match="X has 0 rows"):
        kmeans_cost(np.zeros((0, 2)), np.zeros((1, 2)))
    with pytest.raises(ValidationError, match="sample_weight has 2 entries but X has 3"):
        kmeans_cost(X, np.zeros((1, 2)), sample_weight=[1, 1])
    with pytest.raises(ValidationError, match="negative"):
        kmeans_cost(X, np.zeros((1, 2)), sample_weight=[1, -1, 1])
    with pytest.raises(ValidationError, match="non-finite"):
        kmeans_cost([[np.nan, 0.0]], np.zeros((1, 2)))
    with pytest.raises(ValidationError, match="labels has 2 entries but X has 3"):
        partition_cost(X, [0, 1])
    with pytest.raises(ValidationError, match="reference_centers has 1 features"):
        cost_ratio(X, np.zeros((1, 2)), np.zeros((1, 1)))
    with pytest.raises(ValidationError, match="y_true has 2 labels but X has 3"):
        clustering_report(X, [0, 1], [0, 1], np.zeros((1, 2)))
