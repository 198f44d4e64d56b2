"""ssmgate: gating and oscillatory dynamics in state-space models, in JAX."""

from ssmgate import malloc_env as _malloc_env, platform_env as _platform_env, xla_env as _xla_env

_malloc_env.reexec_if_needed()  # first: `python -m ssmgate.main` etc. restart with malloc tuning
_xla_env.apply_defaults()  # before a JAX backend starts: see ssmgate/xla_env.py
_platform_env.apply_default()  # CPU unless chosen or an accelerator is attached: ssmgate/platform_env.py

__version__ = "0.1.0"
