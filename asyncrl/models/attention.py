"""Self-attention with a pluggable attention kernel.

Two layouts reach `SelfAttention.forward`:
- dense batch: hidden (B, T, hidden), every row one sequence from position 0, right-padded; attention is
  causal SDPA (`is_causal=True`, so CUDA picks flash attention in bf16). Valid tokens never see the right
  padding under a causal mask, so no padding mask is needed.
- flattened tokens: hidden (N, hidden) of many sequences, and an `AttentionBackend` that knows which token
  belongs to which sequence (packed varlen rows for training, paged KV cache for the generation engine).
  The backend receives q/k/v after q/k norm and RoPE and owns any KV-cache reads and writes.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.models.layers import RMSNorm
from asyncrl.models.lora import add_fused_adapters
from asyncrl.models.model_config import TransformerConfig
from asyncrl.models.rope import apply_rotary


class AttentionBackend(Protocol):
    """Attention over flattened tokens, called once per decoder layer in layer order."""

    # Whether the backend applies RoPE itself (the engine's CUDA decode kernel rotates the query and the new key
    # as it loads them, which saves a rotary kernel per layer). Then `attend` gets them before RoPE, with the
    # tokens' (cos, sin) as `rotary`; a backend that does not rotate never gets `rotary`.
    rotates: bool

    def attend(self, layer_index: int, query: Tensor, key: Tensor, value: Tensor,
               rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """query (N, Hq, D), key and value (N, Hkv, D) for the N tokens of this forward, after q/k norm and
        RoPE (before RoPE with `rotary`: cos and sin (N, D)); returns (N, Hq, D). Softmax scale is
        head_dim ** -0.5; Hq is a multiple of Hkv (GQA: query head h reads kv head h // (Hq // Hkv))."""
        ...


def causal_attention(query: Tensor, key: Tensor, value: Tensor, grouped: bool) -> Tensor:
    """Dense causal attention: query (B, T, Hq, D), key/value (B, T, Hkv, D) -> (B, T, Hq, D); `grouped`
    says Hq > Hkv (a plain bool fixed at construction: under torch.compile's dynamic shapes a comparison of
    head counts is symbolic, which SDPA does not accept)."""
    output = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal=True, enable_gqa=grouped,
    )  # (B, Hq, T, D)
    return output.transpose(1, 2)


def varlen_causal_attention(query: Tensor, key: Tensor, value: Tensor, starts: Tensor, max_length: int) -> Tensor:
    """Causal attention within each of R sequences packed back to back, on CUDA in bf16/fp16: query (N, Hq, D),
    key/value (N, Hkv, D) with Hq a multiple of Hkv, starts (R + 1,) int32 cumulative lengths, max_length the
    longest -> (N, Hq, D).

    Flash attention's variable-length kernel: no padded (R, T_max) copies, and no work on padding. The engine
    bench's 20 prefill steps (152k prompt tokens in rows of 128-1,024, 0.5B on an H200) took 0.77 s padded and
    0.46 s packed."""
    output, *_ = torch.ops.aten._flash_attention_forward(query, key, value, starts, starts, max_length, max_length,
                                                         0.0, True, False)
    return output


def avoid_per_shape_attention_plans() -> None:
    """Keeps CUDA's SDPA off the cuDNN backend, for the whole process. cuDNN builds an execution plan for
    every new (batch, length) shape, ~2 ms of host time per call: an H200 prefill step of 8k tokens spent
    44 of its 60 ms there (24 layers), and a trainer's micro-batches change shape just as often. Flash
    attention (also GQA-capable) has no per-shape setup."""
    torch.backends.cuda.enable_cudnn_sdp(False)


class PackedCausalAttention:
    """Reference `AttentionBackend` for packed varlen rows: sequences concatenated into one row of N tokens,
    positions restarting at 0 per sequence, block-diagonal causal attention.

    It uses SDPA with a boolean (N, N) mask, which is exact but O(N^2) memory: a reference for tests and
    CPU runs, not a fast kernel. `cu_seqlens` (S + 1,) holds cumulative lengths [0, len_0, len_0 + len_1, ...].
    """

    rotates = False

    def __init__(self, cu_seqlens: Tensor) -> None:
        cu_seqlens = torch.as_tensor(cu_seqlens, dtype=torch.int64)
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or int(cu_seqlens[0]) != 0:
            raise ValueError(f"cu_seqlens must be 1-D, start at 0 and hold S + 1 >= 2 entries, got {cu_seqlens.tolist()}")
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # (S,)
        if bool((lengths <= 0).any()):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {cu_seqlens.tolist()}")
        self.cu_seqlens = cu_seqlens
        self.num_tokens = int(cu_seqlens[-1])
        self._mask: Tensor | None = None  # (N, N), built on first use and shared by all layers

    @classmethod
    def from_lengths(cls, lengths: list[int]) -> PackedCausalAttention:
        cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        cu_seqlens[1:] = torch.cumsum(torch.as_tensor(lengths, dtype=torch.int64), dim=0)
        return cls(cu_seqlens)

    def positions(self, device: torch.device | str | None = None) -> Tensor:
        """(N,) positions restarting at 0 for every packed sequence."""
        lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
        starts = torch.repeat_interleave(self.cu_seqlens[:-1], lengths)  # (N,)
        return (torch.arange(self.num_tokens) - starts).to(device)

    def _block_causal_mask(self, device: torch.device) -> Tensor:
        if self._mask is None or self._mask.device != device:
            lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
            sequence_ids = torch.repeat_interleave(torch.arange(lengths.numel()), lengths).to(device)  # (N,)
            same_sequence = sequence_ids[:, None] == sequence_ids[None, :]  # (N, N)
            causal = torch.ones(self.num_tokens, self.num_tokens, dtype=torch.bool, device=device).tril()
            self._mask = same_sequence & causal
        return self._mask

    def attend(self, layer_index: int, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        if query.shape[0] != self.num_tokens:
            raise ValueError(f"PackedCausalAttention expects {self.num_tokens} tokens, got query {tuple(query.shape)}")
        return masked_packed_attention(query, key, value, self._block_causal_mask(query.device))


class FixedCapacityPackedAttention:
    """`AttentionBackend` for a trainer micro-batch packed into a fixed number of tokens (the static shapes a
    CUDA-graph step needs): sequences back to back, each from position 0, the unused tail one more sequence
    of its own. `starts` (S + 1,) int32 holds the cumulative lengths on the tokens' device and may repeat a
    value (empty sequences pad it to a fixed count); `max_length` bounds the longest sequence (the capacity).
    Neither is read on the host, so the step never waits for the device.

    CUDA in bf16/fp16: flash attention's variable-length kernel (differentiable). Otherwise SDPA with a
    block-diagonal causal mask built from the positions (a token at position 0 starts a sequence): O(N^2)
    memory, for CPU runs and tests."""

    rotates = False

    def __init__(self, starts: Tensor, positions: Tensor, max_length: int) -> None:
        self.starts = starts
        self.positions = positions
        self.max_length = max_length
        self._mask: Tensor | None = None  # (N, N), built on first use and shared by all layers

    def attend(self, layer_index: int, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
            return varlen_causal_attention(query, key, value, self.starts, self.max_length)
        if self._mask is None:
            sequence_ids = torch.cumsum(self.positions == 0, dim=0)  # (N,)
            self._mask = (sequence_ids[:, None] == sequence_ids[None, :]).tril()
        return masked_packed_attention(query, key, value, self._mask)


def masked_packed_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """SDPA over packed tokens with a boolean (N, N) mask: query (N, Hq, D), key/value (N, Hkv, D) -> (N, Hq, D)."""
    output = F.scaled_dot_product_attention(
        query.transpose(0, 1).unsqueeze(0), key.transpose(0, 1).unsqueeze(0), value.transpose(0, 1).unsqueeze(0),
        attn_mask=mask, enable_gqa=query.shape[1] != key.shape[1],
    )  # (1, Hq, N, D)
    return output.squeeze(0).transpose(0, 1)


class SelfAttention(nn.Module):
    """q/k/v projections, optional per-head q/k RMSNorm (Qwen3), RoPE, attention kernel, o_proj.

    Parameter names mirror HF: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `q_norm`, `k_norm`.
    """

    def __init__(self, config: TransformerConfig, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.use_qk_norm = config.use_qk_norm
        # A bool attribute stays a constant under torch.compile (dynamic=True turns int attributes symbolic).
        self.grouped = config.num_attention_heads != config.num_key_value_heads
        hidden, head_dim = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * head_dim, hidden, bias=config.output_bias)
        if self.use_qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
        self.projection_sizes = [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * head_dim]
        # Set by `fuse_projections` (inference only): one (q + 2 kv, hidden) matrix whose row blocks ARE the
        # q/k/v weights (their Parameters are views into it), so in-place weight updates reach both.
        self.qkv_weight: Tensor | None = None
        self.qkv_bias: Tensor | None = None

    def project(self, hidden: Tensor, cos: Tensor, sin: Tensor, rotate: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """hidden (..., hidden) -> query (..., Hq, D), key and value (..., Hkv, D), after q/k norm and RoPE
        (`rotate` False: before RoPE, for a backend that `rotates`)."""
        leading = hidden.shape[:-1]
        # One matrix product instead of three, as the engine computes it (so both round alike). The engine stacks
        # the weights once (`fuse_projections`); a trainer stacks them per call, a copy of (q + 2 kv) x hidden,
        # and autograd splits the gradient back. That copy is cheap next to the narrow k/v products it replaces
        # (N = 128 for Qwen2.5-0.5B), which run far below the GEMM peak, forward and backward.
        weight, bias = self.qkv_weight, self.qkv_bias
        if weight is None:
            projections = (self.q_proj, self.k_proj, self.v_proj)
            weight = torch.cat([projection.weight for projection in projections])
            bias = None if self.q_proj.bias is None else torch.cat([projection.bias for projection in projections])
        fused = add_fused_adapters(F.linear(hidden, weight, bias), hidden, (self.q_proj, self.k_proj, self.v_proj))
        if not self.use_qk_norm and rotate:
            return self._rotate_query_and_key_together(fused, cos, sin)
        query, key, value = fused.split(self.projection_sizes, dim=-1)
        query = query.view(*leading, self.num_heads, self.head_dim)  # (..., Hq, D)
        key = key.view(*leading, self.num_kv_heads, self.head_dim)  # (..., Hkv, D)
        value = value.view(*leading, self.num_kv_heads, self.head_dim)  # (..., Hkv, D)
        if self.use_qk_norm:
            query = self.q_norm(query)
            key = self.k_norm(key)
        if not rotate:
            return query, key, value
        return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin), value

    def _rotate_query_and_key_together(self, fused: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q and k are adjacent columns of the fused product: one rotary pass over all their heads (compiled,
        one kernel per layer instead of two); the query is a view into its output."""
        leading, num_heads = fused.shape[:-1], self.num_heads + self.num_kv_heads
        query_and_key = fused[..., :num_heads * self.head_dim].view(*leading, num_heads, self.head_dim)
        rotated = apply_rotary(query_and_key, cos, sin)
        value = fused[..., num_heads * self.head_dim:].view(*leading, self.num_kv_heads, self.head_dim)
        key = rotated[..., self.num_heads:, :]
        if torch.is_grad_enabled():
            # With autograd the key is copied out of `rotated` (2 of 16 heads for Qwen2.5-0.5B). Two outputs of a
            # compiled function that view one intermediate are re-created as eager views after the call, and
            # their backward is then eager too: zeros, a copy into a slice and an add for each, five kernels per
            # layer and micro-batch, ~5 ms of a 0.25 s 0.5B update on an H200. Without autograd (the engine, log-
            # prob passes) the view is free, where the copy was a kernel of its own in every decode layer (1.1 us
            # on an H200); every attention path takes strided heads, as it does for the value.
            key = key.contiguous()
        return rotated[..., :self.num_heads, :], key, value

    def attend(self, query: Tensor, key: Tensor, value: Tensor, attention: AttentionBackend | None,
               rotary: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Dense causal SDPA over (B, T, H, D) with attention None, else the backend over (N, H, D) (`rotary`:
        the cos/sin of a backend that `rotates`); returns the heads concatenated, (..., Hq * D)."""
        if attention is None:
            output = causal_attention(query, key, value, grouped=self.grouped)
        elif rotary is not None:
            output = attention.attend(self.layer_index, query, key, value, rotary)
        else:
            output = attention.attend(self.layer_index, query, key, value)
        return output.reshape(*query.shape[:-2], self.num_heads * self.head_dim)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, attention: AttentionBackend | None) -> Tensor:
        """hidden (B, T, hidden) with attention None, or (N, hidden) with a backend; cos/sin (..., D)."""
        return self.o_proj(self.attend(*self.project(hidden, cos, sin), attention))
