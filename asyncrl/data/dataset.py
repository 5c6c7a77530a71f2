"""A tokenized prompt dataset with the overlong-prompt policy applied and its inputs checked.

    dataset = PromptDataset.from_files(cfg.data.train_files, tokenizer, cfg.data)
    dataset[i].prompt_ids, dataset[i].record.ground_truth

Prompts longer than `data.max_prompt_length` are dropped and counted (`num_dropped`), or truncated
(`num_truncated`), or rejected with an error naming the row, as `data.filter_overlong_prompts` /
`data.truncation` say; dropping and truncating are logged as one warning per dataset. Nothing is changed
silently: a tokenizer without a chat template, or special-token text inside a message, is an error unless the
user chose otherwise (`PromptEncoder`); a tokenizer that cannot represent more than
`data.max_unrepresentable_char_fraction` of the messages' characters is warned about, naming an example row.
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.config.schema import DataConfig
from asyncrl.data.chat_template import PromptEncoder
from asyncrl.data.coverage import Coverage, measure_coverage
from asyncrl.data.reader import DatasetError, read_prompt_files
from asyncrl.data.records import PromptRecord, TokenizedPrompt

logger = logging.getLogger(__name__)


class PromptDataset:
    def __init__(self, prompts: list[TokenizedPrompt], num_dropped: int = 0, num_truncated: int = 0,
                 coverage: Coverage | None = None):
        self.prompts = prompts
        self.num_dropped = num_dropped
        self.num_truncated = num_truncated
        self.coverage = coverage
        self.index_by_id = {prompt.record.prompt_id: index for index, prompt in enumerate(prompts)}

    @classmethod
    def from_files(cls, paths: list[str], tokenizer: Any, config: DataConfig) -> "PromptDataset":
        if not paths:
            raise DatasetError("no dataset files given (data.train_files / data.val_files is empty)")
        records = read_prompt_files(paths, config.prompt_key)
        return cls.from_records(records, tokenizer, config, ", ".join(paths))

    @classmethod
    def from_records(cls, records: list[PromptRecord], tokenizer: Any, config: DataConfig,
                     source: str = "records") -> "PromptDataset":
        if not records:
            raise DatasetError(f"{source}: no prompts")
        encoder = PromptEncoder(tokenizer, config.apply_chat_template, config.chat_template_fallback,
                                config.special_tokens_in_content)
        limit = config.max_prompt_length
        prompts, num_truncated, overlong_lengths = [], 0, []
        for record in records:
            prompt_ids = encoder.encode(record.messages, record.prompt_id)
            if len(prompt_ids) <= limit:
                prompts.append(TokenizedPrompt(record, prompt_ids))
            elif config.filter_overlong_prompts:
                overlong_lengths.append(len(prompt_ids))
            elif config.truncation == "left":
                prompts.append(TokenizedPrompt(record, prompt_ids[-limit:]))
                num_truncated += 1
            elif config.truncation == "right":
                prompts.append(TokenizedPrompt(record, prompt_ids[:limit]))
                num_truncated += 1
            else:
                raise DatasetError(
                    f"{record.prompt_id}: prompt has {len(prompt_ids)} tokens, more than data.max_prompt_length="
                    f"{limit} (set data.filter_overlong_prompts=true or data.truncation)")
        if not prompts:
            raise DatasetError(
                f"{source}: no prompt left after dropping {len(overlong_lengths)} prompts longer than "
                f"data.max_prompt_length={limit} tokens (chat template included): the shortest has "
                f"{min(overlong_lengths)} tokens, the longest {max(overlong_lengths)}; raise data.max_prompt_length")
        if overlong_lengths:
            logger.warning("dropped %d of %d prompts of %s longer than data.max_prompt_length=%d (the longest has %d "
                           "tokens)", len(overlong_lengths), len(records), source, limit, max(overlong_lengths))
        if num_truncated:
            logger.warning("truncated %d of %d prompts of %s to data.max_prompt_length=%d (data.truncation=%s)",
                           num_truncated, len(records), source, limit, config.truncation)
        coverage = measure_coverage(tokenizer, records)
        warn_about_coverage(coverage, tokenizer, source, config.max_unrepresentable_char_fraction)
        return cls(prompts, len(overlong_lengths), num_truncated, coverage)

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> TokenizedPrompt:
        return self.prompts[index]


def warn_about_coverage(coverage: Coverage, tokenizer: Any, source: str, max_fraction: float) -> None:
    """A warning above `max_fraction`; a lower, nonzero share is logged at info level, since a stray emoji in a
    large dataset should not alarm anyone."""
    if not coverage.num_lost_chars:
        return
    level = logging.WARNING if coverage.lost_fraction > max_fraction else logging.INFO
    logger.log(level, "%s: tokenizer %s cannot represent %.1f%% of the prompt characters (%d of %d, in %d of %d "
                      "prompts; they become its unknown token or vanish): e.g. %s. Use a tokenizer that covers the "
                      "data, or clean the data (warned above data.max_unrepresentable_char_fraction=%g)",
               source, tokenizer.name_or_path, 100 * coverage.lost_fraction, coverage.num_lost_chars,
               coverage.num_chars, coverage.num_prompts_affected, coverage.num_prompts, coverage.describe(),
               max_fraction)
