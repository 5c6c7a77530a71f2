"""Prompt datasets in verl's schema, chat templates, a resumable sampler and built-in tasks."""

from asyncrl.data.reader import DatasetError, read_prompt_file, read_prompt_files
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.data.sampler import PromptSampler

__all__ = ["DatasetError", "PromptRecord", "PromptSampler", "TokenizedPrompt", "read_prompt_file",
           "read_prompt_files"]
