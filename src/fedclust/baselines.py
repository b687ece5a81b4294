"""Baselines the families are measured against (they live in :mod:`fedclust.lloyd`)."""

from .lloyd.estimator import DistributedLloyd, centralized_kmeans

__all__ = ["centralized_kmeans", "DistributedLloyd"]
