"""Helpers for the engine tests: engines on a tiny folder, requests, and a dense reference forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine, SamplingParams
from asyncrl.engine.kernels.cuda_graph import DecodeGraphs
from asyncrl.engine.sampler import row_keys
from asyncrl.models import CausalLM

EOS_ID = 1  # the character tokenizer's <|endoftext|>


def mixed_sampling_rows(device: str, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """6 rows x 3,000 logits (as `dtype` would round them, held in fp32): sampled at several temperatures, greedy
    (row 2, under a top-5 threshold), under a top-20 threshold (row 3), one seed past 2**62. -> logits, temperatures,
    thresholds (raw logits, -inf: none), row keys."""
    generator = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn((6, 3000), generator=generator)).to(dtype).float().to(device)
    temperatures = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5], device=device)
    thresholds = torch.full((6,), float("-inf"), device=device)
    thresholds[3] = logits[3].topk(20).values[-1]
    thresholds[2] = logits[2].topk(5).values[-1]  # greedy under a threshold: still the argmax
    keys = row_keys(torch.tensor([1, 2, 3, 4, 2**62 + 5, 6], device=device),
                    torch.tensor([0, 5, 7, 9, 100, 3], device=device))
    return logits, temperatures, thresholds, keys


def tied_greedy_rows(device: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """200 rows x 1,000 logits at temperatures in [0.1, 1.6); every fifth row greedy, its best logit tied at ids 17
    and 600 (the lower id must win). -> logits, temperatures, thresholds (none), row keys."""
    generator = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn((200, 1000), generator=generator)
    logits[::5, 17] = logits[::5, 600] = logits[::5].max(dim=1).values + 1.0
    temperatures = torch.rand(200, generator=generator) * 1.5 + 0.1
    temperatures[::5] = 0.0
    thresholds = torch.full((200,), float("-inf"), device=device)
    keys = row_keys(torch.arange(200, device=device), torch.full((200,), 11, device=device))
    return logits.to(device), temperatures.to(device), thresholds, keys


def make_engine(folder: Path, **config) -> LLMEngine:
    """A CPU fp32 engine with small blocks (4 tokens), so short prompts span several blocks."""
    return LLMEngine(folder, EngineConfig(**{"block_size": 4, "num_kv_blocks": 256, **config}))


def prompt(length: int, offset: int = 0) -> list[int]:
    """Deterministic ids in [6, 103): no special tokens."""
    return [6 + (7 * index + 3 * offset) % 97 for index in range(length)]


def request(request_id: str, length: int, offset: int = 0, **params) -> GenerationRequest:
    return GenerationRequest(request_id, prompt(length, offset), SamplingParams(**params))


def dense_log_probs(model: CausalLM, result: GenerationResult, temperature: float) -> np.ndarray:
    """log_softmax(logits / T) of each response token from one dense forward over prompt + response (R,)."""
    token_ids = torch.as_tensor(np.concatenate([result.prompt_ids, result.response_ids]), dtype=torch.int64)
    positions = torch.arange(token_ids.numel())
    with torch.no_grad():
        logits = model.compute_logits(model(token_ids[None], positions[None]))[0]  # (T, V)
    num_prompt = result.prompt_ids.size
    scaled = logits[num_prompt - 1:-1] / (temperature if temperature > 0 else 1.0)  # (R, V)
    log_probs = torch.log_softmax(scaled, dim=-1)
    return log_probs.gather(1, token_ids[num_prompt:, None]).squeeze(1).numpy()


class EagerReplay:
    """A stand-in CUDA graph: replay reruns the captured callable (which writes into static buffers)."""

    def __init__(self, run):
        self.run = run

    def replay(self):
        self.run()


class EagerDecodeGraphs(DecodeGraphs):
    """`DecodeGraphs` with each graph replaced by an eager rerun: its staging, static buffers, padding and
    buckets run on any device."""

    def _capture(self, run):
        run()  # the warm-up run a real capture does
        return EagerReplay(run)
