"""The error every config check raises, in a module of its own so that the loader and the cross-field rules
both import it without importing each other."""


class ConfigError(ValueError):
    """A bad config: the message names the key, the value and what was expected."""
