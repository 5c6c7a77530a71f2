"""Errors of a run that the CLI reports as one line (kept light: the CLI imports this module early)."""

from __future__ import annotations

from typing import Any


class IncompatibleCheckpointError(ValueError):
    """A checkpoint written by a run whose config differs in keys a resume cannot bridge."""


class RunAlreadyFinished(Exception):
    """trainer.output_dir holds a run that finished: nothing was started. Not a failure: the command reached
    the state it asks for (as verl's and Hugging Face's trainers do when resumed at their last step), so the CLI
    prints the message as a warning and exits 0."""

    def __init__(self, message: str, summary: dict[str, Any]):
        super().__init__(message)
        self.summary = summary   # the finished run's summary.json
