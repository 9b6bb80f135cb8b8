"""errors.py - ConfigError, the trainer's one exception for "this setting
cannot work". Its own module, at the bottom of hpcdl.train, so that config,
data, shards, build and checkpoint all raise it without importing each other.
"""


class ConfigError(ValueError):
    """A setting that cannot work; the message says what to change."""
