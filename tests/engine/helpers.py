"""Helpers for the engine tests: engines on a tiny folder, requests, and a dense reference forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine, SamplingParams
from asyncrl.engine.cuda_graph import DecodeGraphs
from asyncrl.models import CausalLM

EOS_ID = 1  # the character tokenizer's <|endoftext|>


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
