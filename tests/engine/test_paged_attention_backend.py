"""`PagedAttention` hands RoPE to its decode kernel only on decode steps of a kernel that rotates, and says so
(`rotates`); cos/sin go with, and only with, such a backend. The kernel here is a fake that records its call."""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.attention import AttentionMetadata, PagedAttention
from asyncrl.engine.kv_cache import KVCache
from asyncrl.models import tiny_config
from asyncrl.models.rope import apply_rotary


def metadata(is_decode: bool) -> AttentionMetadata:
    rows = 2
    return AttentionMetadata(
        write_slots=torch.tensor([3, 17]), write_rows=None, block_tables=torch.tensor([[0], [1]], dtype=torch.int32),
        context_lens=torch.tensor([4, 2], dtype=torch.int32), query_lens=torch.ones(rows, dtype=torch.int64),
        query_token_indices=torch.arange(rows), max_query_len=1, max_context_len=4, is_decode=is_decode)


class RecordingKernel:
    """A `DecodeKernel` that rotates as the CUDA kernel would and returns the rotated query."""

    def __init__(self) -> None:
        self.rotary: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self.programmatic: list[bool] = []

    def __call__(self, query, key_cache, value_cache, block_tables, context_lens, num_splits, *, new_key, new_value,
                 write_slots, row_order, rotary, programmatic):
        self.rotary.append(rotary)
        self.programmatic.append(programmatic)
        return query if rotary is None else apply_rotary(query, *rotary)


def test_only_a_decode_step_of_a_rotating_kernel_rotates_and_cos_sin_go_with_it():
    config = tiny_config("qwen2")
    cache = KVCache(config, 3, 16, torch.float32, torch.device("cpu"))
    kernel = RecordingKernel()
    assert PagedAttention(cache, metadata(True), kernel, rotary_in_decode_kernel=True).rotates
    assert not PagedAttention(cache, metadata(True), kernel).rotates  # the Triton kernel: the model rotates
    assert not PagedAttention(cache, metadata(False), kernel, rotary_in_decode_kernel=True).rotates  # a prefill
    assert not PagedAttention(cache, metadata(True), None, rotary_in_decode_kernel=True).rotates  # the torch path

    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    query, key, value = torch.randn(2, heads, dim), torch.randn(2, kv_heads, dim), torch.randn(2, kv_heads, dim)
    cos, sin = torch.randn(2, dim), torch.randn(2, dim)
    rotating = PagedAttention(cache, metadata(True), kernel, rotary_in_decode_kernel=True)
    output = rotating.attend(0, query, key, value, (cos, sin))
    assert kernel.rotary[-1] is not None and torch.equal(output, apply_rotary(query, cos, sin))
    # Plain launches unless the engine asks for programmatic ones (where the fused decode layers run).
    assert kernel.programmatic == [False]
    with pytest.raises(ValueError, match=r"rotates=True\) was given rotary=False"):
        rotating.attend(0, query, key, value)
    with pytest.raises(ValueError, match=r"rotates=False\) was given rotary=True"):
        PagedAttention(cache, metadata(True), kernel).attend(0, query, key, value, (cos, sin))
    assert len(kernel.rotary) == 1  # the refused calls never reached the kernel
    PagedAttention(cache, metadata(True), kernel, rotary_in_decode_kernel=True, programmatic_decode=True).attend(
        0, query, key, value, (cos, sin))
    assert kernel.programmatic == [False, True]
