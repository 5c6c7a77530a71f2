"""A tokenized prompt dataset with the overlong-prompt policy applied.

    dataset = PromptDataset.from_files(cfg.data.train_files, tokenizer, cfg.data)
    dataset[i].prompt_ids, dataset[i].record.ground_truth

Prompts longer than `data.max_prompt_length` are dropped and counted (`num_dropped`), or truncated
(`num_truncated`), or rejected with an error naming the row, as `data.filter_overlong_prompts` /
`data.truncation` say; dropping and truncating are logged as one warning per dataset.
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.config.schema import DataConfig
from asyncrl.data.chat_template import encode_prompt
from asyncrl.data.reader import DatasetError, read_prompt_files
from asyncrl.data.records import PromptRecord, TokenizedPrompt

logger = logging.getLogger(__name__)


class PromptDataset:
    def __init__(self, prompts: list[TokenizedPrompt], num_dropped: int = 0, num_truncated: int = 0):
        self.prompts = prompts
        self.num_dropped = num_dropped
        self.num_truncated = num_truncated
        self.index_by_id = {prompt.record.prompt_id: index for index, prompt in enumerate(prompts)}

    @classmethod
    def from_files(cls, paths: list[str], tokenizer: Any, config: DataConfig) -> "PromptDataset":
        if not paths:
            raise DatasetError("no dataset files given (data.train_files / data.val_files is empty)")
        records = read_prompt_files(paths, config.prompt_key)
        return cls.from_records(records, tokenizer, config, source=", ".join(paths))

    @classmethod
    def from_records(cls, records: list[PromptRecord], tokenizer: Any, config: DataConfig,
                     source: str = "records") -> "PromptDataset":
        prompts, num_dropped, num_truncated = [], 0, 0
        for record in records:
            prompt_ids = encode_prompt(tokenizer, record.messages, config.apply_chat_template)
            if len(prompt_ids) <= config.max_prompt_length:
                prompts.append(TokenizedPrompt(record, prompt_ids))
            elif config.filter_overlong_prompts:
                num_dropped += 1
            elif config.truncation == "left":
                prompts.append(TokenizedPrompt(record, prompt_ids[-config.max_prompt_length:]))
                num_truncated += 1
            elif config.truncation == "right":
                prompts.append(TokenizedPrompt(record, prompt_ids[:config.max_prompt_length]))
                num_truncated += 1
            else:
                raise DatasetError(
                    f"{record.prompt_id}: prompt has {len(prompt_ids)} tokens, more than data.max_prompt_length="
                    f"{config.max_prompt_length} (set data.filter_overlong_prompts=true or data.truncation)")
        if num_dropped:
            logger.warning("dropped %d of %d prompts of %s longer than data.max_prompt_length=%d",
                           num_dropped, len(records), source, config.max_prompt_length)
        if num_truncated:
            logger.warning("truncated %d of %d prompts of %s to data.max_prompt_length=%d (data.truncation=%s)",
                           num_truncated, len(records), source, config.max_prompt_length, config.truncation)
        if not prompts:
            raise DatasetError(f"{source}: no prompt left after dropping {num_dropped} overlong prompts "
                               f"(data.max_prompt_length={config.max_prompt_length})")
        return cls(prompts, num_dropped, num_truncated)

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> TokenizedPrompt:
        return self.prompts[index]
