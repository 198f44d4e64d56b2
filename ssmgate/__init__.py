"""ssmgate: gating and oscillatory dynamics in state-space models, in JAX."""

from ssmgate import xla_env as _xla_env

_xla_env.apply_defaults()  # before a JAX backend starts: see ssmgate/xla_env.py

__version__ = "0.1.0"
