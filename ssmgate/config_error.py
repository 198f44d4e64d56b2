"""The one error type of bad program configuration (main turns it into a usage error)."""


class ConfigError(ValueError):
    """A flag value out of range; the message names the flag and the allowed range."""
