"""Figures: the 2-D view of D > 2 data is scikit-learn's PCA, axes are labelled, there is a
legend, points are coloured by cluster, and titles fit their figure."""

import numpy as np
import pytest

pytest.importorskip("matplotlib")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402

from fedclust.plotting import (clustering_figure, plane_view, plot_gaussian_clusters,  # noqa: E402
                               wrap_title)


def _blobs(d=6, k=3, n=60, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=10.0, size=(k, d))
    labels = np.repeat(np.arange(k), n)
    X = centers[labels] + rng.normal(size=(k * n, d)) * np.linspace(0.5, 3.0, d)
    return X, labels, centers


def test_plane_view_is_sklearns_pca_and_labels_the_variance_share():
    X, _, _ = _blobs()
    view = plane_view(X)
    pca = PCA(n_components=2).fit(X)
    np.testing.assert_allclose(view.points(X), pca.transform(X), atol=1e-10)
    # the labels carry the explained variance, checked against numpy's eigenvalues
    ev = np.linalg.eigvalsh(np.cov(X.T))[::-1]
    share = 100 * ev[:2] / ev.sum()
    assert view.labels == (f"PC1 ({share[0]:.1f} % var)", f"PC2 ({share[1]:.1f} % var)")


def test_projected_gaussian_covariance_matches_projected_samples():
    X, _, _ = _blobs(d=5)
    view = plane_view(X)
    rng = np.random.default_rng(1)
    A = rng.normal(size=(5, 5))
    S = A @ A.T
    samples = rng.multivariate_normal(np.zeros(5), S, size=200_000)
    got = view.covariances(S[None])[0]
    np.testing.assert_allclose(got, np.cov(view.points(samples).T), rtol=0.03, atol=0.03)


def test_two_features_are_drawn_as_they_are():
    X, _, _ = _blobs(d=2)
    view = plane_view(X)
    np.testing.assert_array_equal(view.points(X), X)
    assert view.labels == ("feature 1", "feature 2")


def test_clustering_figure_has_pca_axes_legend_and_cluster_colours():
    X, labels, centers = _blobs(d=7, k=4)
    devices, device_labels = [X[:120], X[120:]], [labels[:120], labels[120:]]
    result = {"algorithm": "kfed", "title": "a run", "metrics": {"kmeans_cost": 1.0},
              "communication": {"bytes_total": 10}, "baselines": {}}
    fig = clustering_figure(devices, device_labels, centers, result)
    try:
        ax = fig.axes[0]
        assert ax.get_xlabel().startswith("PC1 (") and ax.get_ylabel().startswith("PC2 (")
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["cluster 0", "cluster 1", "cluster 2", "cluster 3", "final centers"]
        dots = ax.collections[0]
        assert len(np.unique(dots.get_array())) == 4      # coloured by the 4 clusters
    finally:
        plt.close(fig)


def test_gaussian_clusters_in_13_dimensions_are_drawn_in_the_pca_view():
    X, labels, centers = _blobs(d=13, k=3)
    covs = np.stack([np.cov(X[labels == j].T) for j in range(3)])
    fig, ax = plt.subplots(figsize=(6, 5))
    try:
        plot_gaussian_clusters(ax, X, centers, covs, labels, title="13-D data")
        assert ax.get_xlabel().startswith("PC1 (") and ax.get_ylabel().startswith("PC2 (")
        assert len(ax.patches) == 3 and ax.get_legend() is not None
        # each ellipse sits on its cluster's projected mean
        view = plane_view(X)
        np.testing.assert_allclose([p.center for p in ax.patches], view.points(centers),
                                   atol=1e-9)
    finally:
        plt.close(fig)


def test_a_long_title_is_wrapped_to_fit_its_figure():
    title = ("Robust clustered regression: 4 linear regressions, 100 machines, 20% Byzantine "
             "devices sending arbitrary models")
    fig, ax = plt.subplots(figsize=(5.5, 4))
    try:
        text = ax.set_title(wrap_title(title, 5.0, 9), fontsize=9)
        fig.canvas.draw()
        box = text.get_window_extent()
        assert "\n" in text.get_text()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width
        assert text.get_text().replace("\n", " ") == title
    finally:
        plt.close(fig)


@pytest.mark.parametrize("baselines", [{}, {"distributed_lloyd": {"kmeans_cost": 930.0}},
                                       {"centralized": {"kmeans_cost": 800.0},
                                        "distributed_lloyd": {"kmeans_cost": 930.0}}])
def test_cost_bars_show_only_measured_values(baselines):
    X, labels, centers = _blobs(d=3, k=3)
    result = {"algorithm": "kfed", "metrics": {"kmeans_cost": 952.0},
              "communication": {"bytes_total": 10}, "baselines": baselines}
    fig = clustering_figure([X], [labels], centers, result)
    try:
        ax = fig.axes[1]
        heights = [bar.get_height() for bar in ax.containers[0]]
        costs = [952.0, *(b["kmeans_cost"] for b in baselines.values())]
        if "centralized" in baselines:  # a ratio only where the centralized cost was measured
            assert heights == pytest.approx([c / 800.0 for c in costs])
            assert ax.get_ylabel() == "k-means cost / centralized k-means"
        else:  # no ratio of 1.0 for a reference never run: the measured costs themselves
            assert heights == pytest.approx(costs)
            assert ax.get_ylabel() == "k-means cost"
    finally:
        plt.close(fig)
