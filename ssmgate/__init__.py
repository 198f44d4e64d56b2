"""ssmgate: gating and oscillatory dynamics in state-space models, in JAX."""

__version__ = "0.1.0"
