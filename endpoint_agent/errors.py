"""The agent's configuration error, in a module of its own so that every part can raise it
without importing the config model (config.py re-exports it: `endpoint_agent.config.ConfigError`
is this class)."""


class ConfigError(Exception):
    """A configuration file that cannot be used; the message says what to change."""
