"""A prompt as read from a dataset row, in verl's schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptRecord:
    """One dataset row.

    `prompt_id` is stable across runs ("<file name>:<row>"), so checkpoints can record which prompts were
    consumed; `messages` are chat messages `[{"role": ..., "content": ...}]`.
    """
    prompt_id: str
    messages: list[dict[str, str]]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenizedPrompt:
    """A prompt after the chat template: the token ids the engine is given."""
    record: PromptRecord
    prompt_ids: list[int]
