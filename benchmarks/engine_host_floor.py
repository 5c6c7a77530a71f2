"""Is the engine's decode step bound by the host or by the GPU? Wall time per decode step of a 0.5B-shaped
engine at a given depth and vocabulary: with one layer and a small vocabulary the GPU's share is ~0.3 ms, so
what is left is the host's floor (scheduling, inputs, launches, postprocessing) at that batch.

    python benchmarks/engine_host_floor.py 24,151936 1,4096      # layers,vocab per case
    py-spy record --nonblocking --rate 500 --format raw -o steps.txt -- python benchmarks/engine_host_floor.py
    python benchmarks/pyspy_summary.py steps.txt timed_decode_loop

Prompts are uniform in 640-1536 tokens (the bench's context mix); every request decodes with `ignore_eos`.
"""

import argparse
import dataclasses
import time

import torch

from asyncrl.bench.models import qwen2_config, random_model
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams


def timed_decode_loop(engine: LLMEngine, steps: int) -> float:
    """Milliseconds per `engine.step()` over `steps` decode steps (the name marks them in py-spy's stacks)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps * 1e3


def step_ms(layers: int, vocab: int, batch: int, steps: int) -> float:
    config = dataclasses.replace(qwen2_config("qwen2.5-0.5b"), num_hidden_layers=layers, vocab_size=vocab)
    engine = LLMEngine(random_model(config, torch.bfloat16, "cuda"),
                       EngineConfig(device="cuda", max_num_seqs=batch, gpu_memory_utilization=0.5,
                                    max_num_batched_tokens=16384))
    generator = torch.Generator().manual_seed(0)
    for index in range(batch):
        length = int(torch.randint(640, 1537, (), generator=generator))
        prompt = torch.randint(0, vocab - 10, (length,), generator=generator).tolist()
        engine.add_request(GenerationRequest(str(index), prompt, SamplingParams(
            max_new_tokens=steps + 20, ignore_eos=True, seed=index)))
    while engine.scheduler.waiting:  # prefill everything
        engine.step()
    for _ in range(10):  # decode warm-up: graph capture
        engine.step()
    return timed_decode_loop(engine, steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="*", default=["24,151936", "1,4096"], help="layers,vocab")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=900)
    options = parser.parse_args()
    for case in options.cases:
        layers, vocab = map(int, case.split(","))
        milliseconds = step_ms(layers, vocab, options.batch, options.steps)
        print(f"layers {layers:2d} vocab {vocab:6d} batch {options.batch}: {milliseconds:.3f} ms per decode step",
              flush=True)


if __name__ == "__main__":
    main()
