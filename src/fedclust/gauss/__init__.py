"""Federated self-evolving Gaussian clustering and classification (Ožbot & Škrjanc; eGAUSS+)."""
