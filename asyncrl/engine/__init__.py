"""The generation engine: paged KV cache, continuous batching, batch-independent sampling with log-probs,
abort / pause / resume, in-place weight updates; on GPU, CUDA graphs and CUDA / Triton kernels (`kernels/`, chosen
once by `kernels/selection.py`).

    from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
    engine = LLMEngine(model_folder, EngineConfig(device="cpu"))
    results = engine.generate([GenerationRequest("0", prompt_ids, SamplingParams(max_new_tokens=32, seed=1))])

`AsyncEngine` wraps an `LLMEngine` for asyncio callers (Ray actors).
"""

from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.engine.config import EngineConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.engine.request import FINISH_REASONS, GenerationRequest, GenerationResult, SamplingParams
from asyncrl.engine.sequence import derive_seed

__all__ = [
    "AsyncEngine",
    "EngineConfig",
    "FINISH_REASONS",
    "GenerationRequest",
    "GenerationResult",
    "LLMEngine",
    "SamplingParams",
    "derive_seed",
]
