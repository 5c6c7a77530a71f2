"""Is our CUDA Gumbel sampler faster than the Triton one, and does it pick the same tokens?

    python benchmarks/cuda_sampler_timing.py

Both run the same race (`asyncrl/engine/sampler.py`): a hash and a logarithm per logit, bound by instructions, not
by reading the logits. From their SASS for sm_90: Triton's loop spends ~58 instructions per logit, ours ~31, so
the prediction is ~45 us against ~83 us for 256 x 151,936 bf16 logits (reading them takes ~18 us). Timed in CUDA
graphs (`graph_replay_ms`), sampled rows at T = 1 and at T = 0.7 under a top-k threshold, and greedy rows; then the
tokens of both kernels compared on those logits.

Answer (one H200, 2026-12-04, docs/benchmarks.md, eighteenth round): see `cuda_sampler_timing_round18.txt`.
"""

from __future__ import annotations

import torch

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.engine import cuda_sampler, triton_sampler
from asyncrl.engine.sampler import row_keys

ROWS, VOCAB = 256, 151_936


def cases(logits: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Temperatures and thresholds per case: (ROWS,) each."""
    minus_inf = torch.full((ROWS,), float("-inf"), device="cuda")
    top_50 = logits.float().topk(50, dim=-1).values[:, -1]
    return {"T = 1": (torch.ones(ROWS, device="cuda"), minus_inf),
            "T = 0.7, top-50": (torch.full((ROWS,), 0.7, device="cuda"), top_50),
            "greedy": (torch.zeros(ROWS, device="cuda"), minus_inf)}


def main() -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(ROWS, VOCAB, device="cuda", generator=generator) * 3).to(torch.bfloat16)
    keys = row_keys(torch.arange(ROWS, device="cuda"), torch.full((ROWS,), 7, device="cuda"))
    read_us = ROWS * VOCAB * 2 / 4.3e12 * 1e6
    print(f"{ROWS} x {VOCAB} bf16 logits; reading them once at 4.3 TB/s: {read_us:.1f} us")
    for name, (temperatures, thresholds) in cases(logits).items():
        triton_us = graph_replay_ms(lambda: triton_sampler.fused_sample(logits, temperatures, thresholds, keys),
                                    replays=50) * 1e3
        line = f"{name:16s} Triton {triton_us:6.1f} us; CUDA"
        for splits in (4, 8, 16):
            cuda_us = graph_replay_ms(lambda: cuda_sampler.fused_sample(logits, temperatures, thresholds, keys,
                                                                        splits), replays=50) * 1e3
            line += f" {splits} splits {cuda_us:6.1f} us,"
        theirs = triton_sampler.fused_sample(logits, temperatures, thresholds, keys)
        ours = cuda_sampler.fused_sample(logits, temperatures, thresholds, keys)
        same = int((theirs[0] == ours[0]).sum())
        line += f" same tokens {same}/{ROWS}, log-probs within {(theirs[1] - ours[1]).abs().max().item():.1e}"
        print(line)


if __name__ == "__main__":
    main()
