"""Errors of a run that the CLI reports as one line (kept light: the CLI imports this module early)."""


class IncompatibleCheckpointError(ValueError):
    """A checkpoint written by a run whose config differs in keys a resume cannot bridge."""
