"""Experiment programs run by `python -m ssmgate.main --flagfile=...` (one module per experiment)."""
