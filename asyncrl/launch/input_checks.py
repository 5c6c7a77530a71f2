"""Checks of what a run reads and writes that the config alone cannot decide, run before Ray by `load_inputs`:
each failure names the key, the file or the row, instead of surfacing after the workers started (or never).

    check_run_folders(config)                  # trainer.output_dir not a file; data.train_files not empty
    check_datasets(config, train, val)         # a step's worth of prompts; answers the built-in scorer can match
    warn_about_sampling(config)                # a temperature so low that the policy gradient vanishes
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from asyncrl.config import AsyncRLConfig, ConfigError
from asyncrl.config.invariants import prompts_per_step, step_batch_text
from asyncrl.data import DatasetError
from asyncrl.data.dataset import PromptDataset
from asyncrl.rewards.builtin import ground_truth_problem

logger = logging.getLogger(__name__)

# Below it, log pi(a) of a sampled token is ~0 for all but near-ties of the logits, and so is its gradient.
MIN_USEFUL_TEMPERATURE = 0.1


def check_run_folders(config: AsyncRLConfig) -> None:
    output_dir = Path(config.trainer.output_dir)
    for folder in (output_dir, *output_dir.parents):
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"trainer.output_dir={config.trainer.output_dir}: {folder} is a file, not a folder; "
                              f"give a folder the run may create and write into")
    if not config.data.train_files:
        raise ConfigError("data.train_files is empty: give the training prompt files, e.g. "
                          "data.train_files=[train.parquet] (.parquet, .jsonl or .json in verl's schema; "
                          "`asyncrl data make` writes a synthetic task)")


def check_datasets(config: AsyncRLConfig, train: PromptDataset, val: Optional[PromptDataset]) -> None:
    needed = prompts_per_step(config)
    if len(train) < needed:
        dropped = f" ({train.num_dropped} overlong ones dropped)" if train.num_dropped else ""
        raise DatasetError(f"data.train_files hold {len(train)} prompt(s){dropped}, fewer than one step trains, "
                           f"{step_batch_text(config)}: add prompts or lower the batch size")
    if config.reward.custom_function or config.rollout.agent.path:
        return   # the user's function (or agent) reads the answers as it likes
    for key, dataset in (("data.train_files", train), ("data.val_files", val)):
        for prompt in dataset.prompts if dataset is not None else []:
            record = prompt.record
            problem = ground_truth_problem(record.data_source, record.ground_truth)
            if problem is not None:
                raise DatasetError(f"{key}: {record.prompt_id}: reward_model.ground_truth: {problem}")


def warn_about_sampling(config: AsyncRLConfig) -> None:
    temperature = config.rollout.temperature
    if temperature < MIN_USEFUL_TEMPERATURE:
        logger.warning("rollout.temperature=%g is below %g: the sampled tokens' log-probs are ~0 and so is the "
                       "policy gradient (a run that trains nothing and reports success); sample at 0.6-1.0",
                       temperature, MIN_USEFUL_TEMPERATURE)
