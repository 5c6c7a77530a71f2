"""One AdamW step over a 0.5B model's parameters on one CUDA device: torch's fused AdamW against `FlatAdamW`.

    python benchmarks/adamw_step.py [--model qwen2.5-0.5b] [--output results.jsonl]

Why. In the graphed 0.5B update torch's fused AdamW took 4.6 ms (25 multi-tensor launches over 290 tensors,
~3.0 TB/s) of ~0.25 s. `FlatAdamW` runs one Triton kernel over flat buffers. The floor: 28 bytes per parameter
(read the master, gradient and both moments, write the master and both moments) at the H200's ~4.8 TB/s.

Both optimizers step the same parameters from the same gradients, with the trainer's flags (a clip divisor and a
skip flag on the device); the script checks that the two agree after the timed steps, then times each with
CUDA events over 20 steps.
"""

from __future__ import annotations

import argparse
import json

import torch

from asyncrl.bench.graph_timing import event_ms
from asyncrl.bench.trainer import qwen2_config
from asyncrl.config.schema import OptimConfig
from asyncrl.models import CausalLM
from asyncrl.train.compute_weights import ComputeWeights
from asyncrl.train.flat_adamw import FlatAdamW

HBM_BYTES_PER_S = 4.8e12


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    config = OptimConfig(lr=1e-6, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01)
    with torch.device("cuda"):
        flat_model, torch_model = CausalLM(qwen2_config(args.model)), CausalLM(qwen2_config(args.model))
    torch_model.load_state_dict(flat_model.state_dict())
    weights = ComputeWeights(flat_model, torch.bfloat16)
    flat = FlatAdamW(weights, config)
    fused = torch.optim.AdamW(torch_model.parameters(), lr=config.lr, betas=tuple(config.betas), eps=config.eps,
                              weight_decay=config.weight_decay, fused=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    for master, parameter in zip(weights.trainable_masters, torch_model.parameters()):
        master.grad.copy_(torch.randn(master.shape, generator=generator, device="cuda"))
        parameter.grad = master.grad.clone()
    found_inf, grad_scale = torch.zeros((), device="cuda"), torch.full((), 1.25, device="cuda")

    for optimizer in (fused, flat):  # the flags `NonFiniteGuard` sets for a step, read by both
        optimizer.found_inf, optimizer.grad_scale = found_inf, grad_scale

    numel = sum(master.numel() for master in weights.trainable_masters)
    results = {"model": args.model, "parameters": numel,
               "floor_ms": 28 * numel / HBM_BYTES_PER_S * 1e3,
               "torch_fused_ms": event_ms(fused.step),
               "flat_triton_ms": event_ms(flat.step)}
    results["max_abs_diff"] = max((master - parameter).abs().max().item()
                                  for master, parameter in zip(flat_model.parameters(), torch_model.parameters()))
    print(json.dumps(results))
    if args.output:
        with open(args.output, "a") as out:
            out.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
