"""Client maths: pure functions over one device's own arrays."""

from .spectral_kmeans import LocalKMeansResult, local_kmeans

__all__ = ["LocalKMeansResult", "local_kmeans"]
