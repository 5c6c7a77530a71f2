"""The Triton kernels against the torch paths, on a GPU or on the CPU under Triton's interpreter, which
`tests/conftest.py` turns on where no GPU is present:

    python -m pytest tests/engine/kernels/test_triton_kernels.py -q
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from asyncrl.engine.attention import AttentionMetadata, torch_paged_attention
from asyncrl.engine.kernels.selection import KernelChoice
from asyncrl.engine.sampler import sample_reference

from ..helpers import mixed_sampling_rows, tied_greedy_rows

IS_CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (IS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                reason="runs Triton kernels on a GPU or under TRITON_INTERPRET=1")
DEVICE = "cuda" if IS_CUDA else "cpu"
# The engine-level tests below run the kernels on the CPU engine's tensors: interpreter only.
interpreter_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                      reason="runs Triton on CPU tensors (TRITON_INTERPRET=1)")


def paged_case(context_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
               dtype: torch.dtype):
    """Random caches with shuffled block tables: each sequence's blocks are scattered across the cache."""
    generator = torch.Generator().manual_seed(0)
    num_blocks = sum(-(-length // block_size) for length in context_lens) + 3
    shape = (num_blocks + 1, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=generator).to(DEVICE, dtype)
    value_cache = torch.randn(shape, generator=generator).to(DEVICE, dtype)
    permutation = torch.randperm(num_blocks, generator=generator).tolist()
    width = max(-(-length // block_size) for length in context_lens)
    tables = torch.full((len(context_lens), width), num_blocks, dtype=torch.int32)
    for row, length in enumerate(context_lens):
        count = -(-length // block_size)
        tables[row, :count] = torch.tensor(permutation[:count], dtype=torch.int32)
        permutation = permutation[count:]
    query = torch.randn((len(context_lens), num_heads, head_dim), generator=generator).to(DEVICE, dtype)
    return query, key_cache, value_cache, tables.to(DEVICE), torch.tensor(context_lens, dtype=torch.int32).to(DEVICE)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(4, 2, 16), (14, 2, 64), (6, 6, 48)])
# Blocks of 4 are gathered position by position (tiles of 16 span four blocks); blocks of 16 and 32 hold whole
# tiles, read with one block id each (32: two tiles per block, the second starting mid-block).
@pytest.mark.parametrize("block_size", [4, 16, 32])
def test_paged_decode_matches_torch_paged_attention(num_splits, num_heads, num_kv_heads, head_dim, block_size):
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention

    dtype = torch.bfloat16 if IS_CUDA else torch.float32
    context_lens = [1, 5, 16, 17, 70]
    query, key_cache, value_cache, tables, lengths = paged_case(context_lens, num_heads, num_kv_heads, head_dim,
                                                                block_size, dtype)
    metadata = AttentionMetadata(
        write_slots=torch.zeros(0, dtype=torch.int64), write_rows=None, block_tables=tables, context_lens=lengths,
        query_lens=torch.ones(len(context_lens), dtype=torch.int64, device=DEVICE),
        query_token_indices=torch.arange(len(context_lens), device=DEVICE), max_query_len=1,
        max_context_len=max(context_lens), is_decode=True)
    expected = torch_paged_attention(query.float(), key_cache.float(), value_cache.float(), metadata)
    output = paged_decode_attention(query, key_cache, value_cache, tables, lengths, num_splits=num_splits, tile=16)
    tolerance = 3e-2 if dtype == torch.bfloat16 else 1e-5
    assert output.dtype == dtype and output.shape == query.shape
    assert (output.float() - expected).abs().max().item() <= tolerance


@pytest.mark.parametrize("block_size", [4, 32])
def test_paged_decode_ignores_nan_left_in_unattended_slots(block_size):
    """Slots past a context (a block's unused tail, written long ago by a sequence whose numbers blew up) may
    hold NaN: whole-block tiles read them, and the output must still equal the clean cache's."""
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention

    dtype = torch.bfloat16 if IS_CUDA else torch.float32
    context_lens = [1, 5, 16, 17, 70]
    query, key_cache, value_cache, tables, lengths = paged_case(context_lens, 14, 2, 64, block_size, dtype)
    expected = paged_decode_attention(query, key_cache, value_cache, tables, lengths, tile=16)
    for row, length in enumerate(context_lens):
        for position in range(length, tables.shape[1] * block_size):
            block = tables[row, position // block_size]
            key_cache[block, position % block_size] = float("nan")
            value_cache[block, position % block_size] = float("nan")
    output = paged_decode_attention(query, key_cache, value_cache, tables, lengths, tile=16)
    assert torch.equal(output, expected)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size", [4, 32])
def test_paged_decode_that_stores_the_new_token_equals_a_cache_write_then_attention(num_splits, block_size):
    """The engine's decode launch: the kernel writes each sequence's new key/value at its slot (the last
    position of its context) and attends to it from registers; values arrive as a strided view (a split of
    the fused q/k/v output). Caches and outputs equal a separate write followed by the plain kernel. With
    blocks of 32 the last tile read from the cache holds the slot being written: its stale value is masked."""
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention

    dtype = torch.bfloat16 if IS_CUDA else torch.float32
    num_heads, num_kv_heads, head_dim = 14, 2, 64
    context_lens = [1, 5, 16, 17, 70]  # 1: only the new token (CUDA-graph padding rows look like this)
    query, key_cache, value_cache, tables, lengths = paged_case(context_lens, num_heads, num_kv_heads, head_dim,
                                                                block_size, dtype)
    positions = lengths.long() - 1
    slots = tables.long().gather(1, (positions // block_size)[:, None]).squeeze(1) * block_size + positions % block_size
    generator = torch.Generator().manual_seed(1)
    fused_kv = torch.randn((len(context_lens), 3, num_kv_heads, head_dim), generator=generator).to(DEVICE, dtype)
    new_key, new_value = fused_kv[:, 0], fused_kv[:, 2]  # non-contiguous rows, like q/k/v split views
    written_keys, written_values = key_cache.clone(), value_cache.clone()
    written_keys.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, new_key)
    written_values.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, new_value)
    expected = paged_decode_attention(query, written_keys, written_values, tables, lengths, num_splits=num_splits,
                                      tile=16)
    output = paged_decode_attention(query, key_cache, value_cache, tables, lengths, num_splits=num_splits, tile=16,
                                    new_key=new_key, new_value=new_value, write_slots=slots)
    assert torch.equal(key_cache, written_keys) and torch.equal(value_cache, written_values)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert (output.float() - expected.float()).abs().max().item() <= tolerance


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode_row_order_changes_only_which_programs_start_first(num_splits):
    """Launching the sequences longest context first (as the engine does) gives every sequence exactly the
    output, and the cache writes, of the unordered launch."""
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention

    dtype = torch.bfloat16 if IS_CUDA else torch.float32
    context_lens = [5, 70, 1, 17, 16]
    query, key_cache, value_cache, tables, lengths = paged_case(context_lens, 14, 2, 64, 4, dtype)
    positions = lengths.long() - 1
    slots = tables.long().gather(1, (positions // 4)[:, None]).squeeze(1) * 4 + positions % 4
    new_key, new_value = torch.randn((2, len(context_lens), 2, 64), generator=torch.Generator().manual_seed(2)).to(
        DEVICE, dtype)
    row_order = torch.tensor([1, 3, 4, 0, 2], dtype=torch.int32, device=DEVICE)  # by descending length
    caches = [(key_cache.clone(), value_cache.clone()) for _ in range(2)]
    outputs = [paged_decode_attention(query, keys, values, tables, lengths, num_splits=num_splits, tile=16,
                                      new_key=new_key, new_value=new_value, write_slots=slots, row_order=order)
               for (keys, values), order in zip(caches, [None, row_order])]
    assert torch.equal(outputs[0], outputs[1])
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])


@pytest.mark.parametrize("num_splits, dtype", [(1, torch.float32), (3, torch.float32), (8, torch.bfloat16)])
def test_fused_sample_matches_the_torch_sampler(num_splits, dtype):
    """Any vocabulary split gives the torch sampler's tokens; bf16 logits sample as their fp32 widening."""
    from asyncrl.engine.kernels.triton_sampler import fused_sample

    logits, temperatures, thresholds, keys = mixed_sampling_rows(DEVICE, dtype)
    expected_ids, expected_log_probs = sample_reference(logits, temperatures, thresholds, keys)
    token_ids, log_probs = fused_sample(logits.to(dtype), temperatures, thresholds, keys, block_vocab=512,
                                        num_splits=num_splits)
    assert token_ids.tolist() == expected_ids.tolist()
    assert (log_probs - expected_log_probs).abs().max().item() <= 1e-4
    assert logits[3, token_ids[3]] >= thresholds[3]


def test_fused_sample_picks_the_reference_token_on_many_rows():
    """The kernel's ratio form of the Gumbel race (one logarithm per logit) selects the reference's token on
    every one of 200 rows with mixed temperatures, including greedy rows whose best logit is tied."""
    from asyncrl.engine.kernels.triton_sampler import fused_sample

    logits, temperatures, thresholds, keys = tied_greedy_rows(DEVICE)
    expected_ids, expected_log_probs = sample_reference(logits, temperatures, thresholds, keys)
    token_ids, log_probs = fused_sample(logits, temperatures, thresholds, keys, block_vocab=128, num_splits=4)
    assert token_ids.tolist() == expected_ids.tolist()
    assert token_ids[::5].eq(17).all()
    assert (log_probs - expected_log_probs).abs().max().item() <= 1e-4


@pytest.mark.skipif(IS_CUDA, reason="the CPU engine's choice of kernels")
def test_a_cpu_engine_picks_the_torch_paths_with_triton_importable(tiny_folder):
    """Triton imports in the CPU test install and its interpreter is on, yet a CPU engine takes no kernel: the
    device alone decides."""
    import triton  # noqa: F401 (the premise: present)

    from ..helpers import make_engine

    runner = make_engine(tiny_folder).runner
    assert runner.kernels == KernelChoice.torch_paths() and runner.sampler.fused_kernel is None


@interpreter_only
def test_engine_with_the_cuda_kernels_matches_the_torch_path(tiny_folder):
    """The CUDA dispatch (dense prefill, Triton decode, fused sampler) run on this device, against the torch
    path of the same engine configuration."""
    from asyncrl.engine.sampler import Sampler
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention
    from asyncrl.engine.kernels.triton_sampler import fused_sample

    from ..helpers import make_engine, request

    requests = [request(f"k{index}", 3 + 5 * index, offset=index, temperature=[1.0, 0.0, 0.8][index],
                        max_new_tokens=12, ignore_eos=True, seed=index) for index in range(3)]
    expected = make_engine(tiny_folder).generate(requests)
    engine = make_engine(tiny_folder)
    engine.runner.kernels = dataclasses.replace(engine.runner.kernels, decode_kernel=paged_decode_attention)
    engine.runner.sampler = Sampler(fused_sample)
    results = engine.generate(requests)
    for result, reference in zip(results, expected):
        assert result.response_ids.tolist() == reference.response_ids.tolist()
        assert abs(result.response_log_probs - reference.response_log_probs).max() <= 1e-4


@interpreter_only
def test_decode_graph_buffers_padding_and_buckets_with_eager_replay(tiny_folder):
    """`DecodeGraphs` with each CUDA graph replaced by an eager rerun of its static forward: checks the
    static buffers, the sink-block padding, bucket choice and per-bucket context splits on this device."""
    from asyncrl.engine.sampler import Sampler
    from asyncrl.engine.kernels.triton_decode import paged_decode_attention
    from asyncrl.engine.kernels.triton_sampler import fused_sample

    from ..helpers import EagerDecodeGraphs, make_engine, request

    requests = [request(f"b{index}", 3 + 4 * index, offset=index, temperature=1.0, max_new_tokens=6 + 5 * index,
                        ignore_eos=True, seed=index) for index in range(5)]
    expected = make_engine(tiny_folder).generate(requests)
    engine = make_engine(tiny_folder, max_num_seqs=8)
    runner = engine.runner
    runner.kernels = dataclasses.replace(runner.kernels, decode_kernel=paged_decode_attention)
    runner.sampler = Sampler(fused_sample)
    runner.graphs = EagerDecodeGraphs(runner.model, runner.kv_cache, paged_decode_attention, runner.sampler, 8,
                                      -(-engine.max_model_len // 4), num_processors=8)
    assert runner.graphs.buckets == [1, 2, 4, 8] and runner.graphs.num_splits_for(1) == 8
    results = engine.generate(requests)
    assert sorted(runner.graphs.graphs) == [1, 2, 4, 8]  # 5 running sequences shrink to 1
    for result, reference in zip(results, expected):
        assert result.response_ids.tolist() == reference.response_ids.tolist()
        assert abs(result.response_log_probs - reference.response_log_probs).max() <= 1e-4
    sink = runner.kv_cache.sink_block
    # Padding rows wrote into the sink block (and, as the equal results show, nowhere else).
    assert runner.kv_cache.tensor[:, :, sink].abs().sum() > 0
