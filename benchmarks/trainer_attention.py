"""Attention kernels at the trainer's micro-batch shapes, forward and forward + backward, on one CUDA device.

    python benchmarks/trainer_attention.py            # 4,096 tokens as 4 rows of 1,024; 0.5B and 1.5B heads

Why. In the graphed 0.5B update at 4,096-token micro-batches (stop 25's profile) flash attention's forward and
backward took 40 of 254 GPU ms, at ~115 TFLOP/s: head dim 64 and 1,024-token rows are where FA2 is weakest on
Hopper. A graph replays whatever kernel it captured, so a backend with per-shape host setup (cuDNN builds a plan
per shape, which `avoid_per_shape_attention_plans` keeps out of eager paths) costs nothing per replay there.

Each variant computes the same causal attention within each row (GQA heads as the model has them) and is
checked against the flash varlen kernel the trainer runs today; the floor is the causal FLOPs (4 T^2 D / 2 per
head and row forward, 2.5x that backward) at the H200's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from asyncrl.bench.graph_timing import event_ms


PEAK_TFLOPS = 989.0


def flash_varlen(q, k, v, starts, max_length):
    out, *_ = torch.ops.aten._flash_attention_forward(q, k, v, starts, starts, max_length, max_length, 0.0, True,
                                                      False)
    return out


def cudnn_varlen(q, k, v, starts, max_length):
    out, *_ = torch.ops.aten._cudnn_attention_forward(q, k, v, None, starts, starts, max_length, max_length, True,
                                                      0.0, True, False)
    return out


def dense(backend):
    from torch.nn.attention import sdpa_kernel

    def attend(q, k, v, starts, max_length):
        rows = starts.numel() - 1
        shape = lambda x: x.view(rows, max_length, x.shape[1], x.shape[2]).transpose(1, 2)  # (B, H, T, D)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(shape(q), shape(k), shape(v), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape)
    return attend


def flex(num_tokens, row_length, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    row = torch.arange(num_tokens, device=device) // row_length

    def mask(b, h, q_index, kv_index):
        return (row[q_index] == row[kv_index]) & (q_index >= kv_index)
    block_mask = create_block_mask(mask, None, None, num_tokens, num_tokens, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)

    def attend(q, k, v, starts, max_length):
        shape = lambda x: x.transpose(0, 1)[None]  # (1, H, N, D)
        out = compiled(shape(q), shape(k), shape(v), block_mask=block_mask, enable_gqa=True)
        return out[0].transpose(0, 1)
    return attend


def measure(name, attend, q, k, v, starts, row_length, reference, flops_forward):
    def forward():
        return attend(q, k, v, starts, row_length)
    grad_out = torch.randn_like(q)

    def forward_backward():
        out = attend(q, k, v, starts, row_length)
        return torch.autograd.grad(out, (q, k, v), grad_out)
    try:
        out = forward()
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        ref_out = reference(q, k, v, starts, row_length)
        ref_grads = torch.autograd.grad(ref_out, (q, k, v), grad_out)
        error = max([(out - ref_out).abs().max().item()] + [(g - r).abs().max().item()
                                                             for g, r in zip(grads, ref_grads)])
        forward_ms = event_ms(forward)
        total_ms = event_ms(forward_backward)
    except Exception as failure:  # a backend that cannot run this shape: say why, go on with the others
        print(f"{name:28s} failed: {type(failure).__name__}: {str(failure)[:200]}")
        return None
    backward_ms = total_ms - forward_ms
    result = dict(name=name, forward_ms=forward_ms, backward_ms=backward_ms, max_abs_diff=error,
                  forward_tflops=flops_forward / forward_ms / 1e9,
                  backward_tflops=2.5 * flops_forward / backward_ms / 1e9)
    print(f"{name:28s} fwd {forward_ms:7.3f} ms ({result['forward_tflops']:5.0f} TFLOP/s)  "
          f"bwd {backward_ms:7.3f} ms ({result['backward_tflops']:5.0f} TFLOP/s)  max|diff| {error:.2e}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--row-length", type=int, default=1024)
    parser.add_argument("--output")
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = args.tokens // args.row_length
    starts = torch.arange(0, args.tokens + 1, args.row_length, dtype=torch.int32, device=device)
    results = []
    for model, query_heads, kv_heads, head_dim in (("0.5b", 14, 2, 64), ("1.5b", 12, 2, 128)):
        generator = torch.Generator(device).manual_seed(0)
        make = lambda heads: torch.randn(args.tokens, heads, head_dim, device=device, dtype=torch.bfloat16,
                                         generator=generator).requires_grad_()
        q, k, v = make(query_heads), make(kv_heads), make(kv_heads)
        flops = 4 * rows * query_heads * head_dim * args.row_length ** 2 / 2
        floor_ms = 3.5 * flops / PEAK_TFLOPS / 1e9
        print(f"{model}: {rows} rows x {args.row_length}, {query_heads}/{kv_heads} heads of {head_dim}; "
              f"forward + backward floor {floor_ms:.3f} ms at {PEAK_TFLOPS:.0f} TFLOP/s")
        from torch.nn.attention import SDPBackend
        variants = [("flash varlen (today)", flash_varlen), ("cudnn varlen", cudnn_varlen),
                    ("cudnn dense", dense(SDPBackend.CUDNN_ATTENTION)),
                    ("flash dense", dense(SDPBackend.FLASH_ATTENTION)),
                    ("flex (compiled)", flex(args.tokens, args.row_length, device))]
        for name, attend in variants:
            result = measure(name, attend, q, k, v, starts, args.row_length, flash_varlen, flops)
            if result is not None:
                results.append(dict(model=model, tokens=args.tokens, row_length=args.row_length,
                                    device=torch.cuda.get_device_name(), torch=torch.__version__, **result))
    if args.output:
        with open(args.output, "a") as out:
            for result in results:
                out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
