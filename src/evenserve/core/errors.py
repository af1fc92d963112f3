"""Errors that carry a message fit to show a person (no traceback needed)."""


class EvenserveError(Exception):
    """Base of the errors evenserve raises on purpose."""


class ConfigError(EvenserveError):
    """A config, scenario or profile file is invalid; the message names the field."""


class ProfileError(ConfigError):
    """A latency/memory profile is missing or malformed."""
