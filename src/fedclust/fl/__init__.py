"""Clustered federated learning: FedAvg, IFCA, k-FED + FedAvg, cluster-aware client selection."""
