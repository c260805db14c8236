"""Federated recommendation algorithms, one module per method."""
