"""The LM head's per-chunk softmax math on one GPU: the fused Triton kernels against the torch path, per chunk.

    python benchmarks/lm_head_kernels.py [--tokens 3584] [--vocab 151936]

(3,584 tokens: the graphed 0.5B update's one chunk per 4,096-token micro-batch, 7/8 of them responses.)
The statistics also run split over 2-16 vocabulary segments per row (`fused_chunk_statistics(segments=...)`).

Floors: the statistics read the (c, V) bf16 logits once; the gradient reads and writes them once. Times are
per replay of a CUDA graph of each call (`graph_replay_ms`, as the benchmarks under `benchmarks/` time kernels),
so launch overhead stays out; GB/s counts those floor bytes.
"""

import argparse

import torch

from asyncrl.bench.graph_timing import graph_replay_ms
from asyncrl.train.lm_head import chunk_grad_logits, chunk_statistics
from asyncrl.train.triton_lm_head import fused_chunk_grad_logits_, fused_chunk_statistics


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=3584)
    parser.add_argument("--vocab", type=int, default=151936)
    options = parser.parse_args()
    logits = (torch.randn(options.tokens, options.vocab, device="cuda") * 3).bfloat16()
    targets = torch.randint(0, options.vocab, (options.tokens,), device="cuda")
    grads = torch.randn(2, options.tokens, device="cuda")
    nbytes = logits.numel() * logits.element_size()
    _, entropy, lse = fused_chunk_statistics(logits, targets, 0.9, True)
    scratch = logits.clone()
    cases = {
        **{f"statistics, fused, {segments} segments": (
            lambda segments=segments: fused_chunk_statistics(logits, targets, 0.9, True, segments=segments), nbytes)
           for segments in (1, 2, 4, 8, 16)},
        "statistics, torch": (lambda: chunk_statistics(logits, targets, 0.9, True), nbytes),
        "gradient, fused (in place)": (lambda: fused_chunk_grad_logits_(scratch, targets, lse, grads[0], grads[1],
                                                                        entropy, 0.9), 2 * nbytes),
        "gradient, torch": (lambda: chunk_grad_logits(logits, targets, lse, grads[0], grads[1], entropy, 0.9),
                            2 * nbytes),
    }
    print(f"{options.tokens} x {options.vocab} bf16 logits ({nbytes / 1e6:.0f} MB)")
    for name, (function, floor_bytes) in cases.items():
        seconds = graph_replay_ms(function, replays=20) / 1e3
        print(f"{name:28s} {seconds * 1e6:9.1f} us  {floor_bytes / seconds / 1e9:7.0f} GB/s of the floor's bytes")


if __name__ == "__main__":
    main()
