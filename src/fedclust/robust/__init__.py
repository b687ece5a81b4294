"""Byzantine-robust clustering and robust clustered federated learning (Ghosh, Hong, Yin & Ramchandran)."""
