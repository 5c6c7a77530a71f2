"""Whether an engine's KV cache holds the sequences a step sends it, said once at start.

A cache too small for a step's sequences does not fail: the engine admits what fits and the rest wait, or
running sequences are preempted and recomputed, and generation slows down with nothing said. Each engine
says at start how many sequences of the run's longest length (prompt + response budget) its cache holds at
once, and warns, with the key and the value that would hold them, when a step sends it more. In a run,
`rollout/preempted_fraction` (samples preempted at least once) shows the same.
"""

from __future__ import annotations

import logging

from asyncrl.config import AsyncRLConfig
from asyncrl.engine import LLMEngine
from asyncrl.engine.block_manager import num_blocks_for
from asyncrl.engine.kv_cache import MIB, bytes_per_block

logger = logging.getLogger(__name__)


def kv_budget_report(engine: LLMEngine, config: AsyncRLConfig, num_engines: int, name: str) -> tuple[int, str]:
    """(logging level, line) for `engine`, one of `num_engines` sharing a step's sequences."""
    length = min(config.data.max_prompt_length + config.data.max_response_length, engine.max_model_len)
    blocks_per_sequence = num_blocks_for(length, engine.config.block_size)
    fits = engine.num_kv_blocks // blocks_per_sequence
    per_step = -(-config.data.train_batch_size * config.rollout.n // max(num_engines, 1))
    wanted = min(engine.config.max_num_seqs, per_step)
    line = (f"{name}: KV cache of {engine.kv_capacity_tokens} tokens holds {fits} sequences of {length} tokens "
            f"(data.max_prompt_length + data.max_response_length) at once; a step sends it up to {per_step}")
    if fits >= wanted:
        return logging.INFO, line
    if engine.config.is_cuda:
        hint = "raise rollout.gpu_memory_utilization or lower rollout.max_num_seqs"
    else:
        block_bytes = bytes_per_block(engine.model_config, engine.config.block_size, engine.config.model_dtype)
        hint = f"rollout.cpu_kv_cache_mb={-(-wanted * blocks_per_sequence * block_bytes // MIB)} holds them"
    return logging.WARNING, f"{line}: the rest wait or are preempted and recomputed; {hint}"


def log_kv_budget(engine: LLMEngine, config: AsyncRLConfig, num_engines: int, name: str) -> None:
    level, line = kv_budget_report(engine, config, num_engines, name)
    logger.log(level, line)
