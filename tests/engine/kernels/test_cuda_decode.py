"""The CUDA C++ decode-attention kernel (`asyncrl.engine.kernels.cuda_decode`) against fp32 attention and against the
Triton kernel it stands in for (skipped without a GPU; the first test builds the kernel, a minute or two), and the
engine's choice of kernel ("auto" falls back to Triton where the CUDA kernel cannot be built).

    python -m pytest tests/engine/kernels/test_cuda_decode.py -q
"""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models.rope import apply_rotary

from ..helpers import prompt
from .test_cuda_engine import assert_within_bf16_noise, wide_folder  # noqa: F401 (a fixture)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def decode_case(context_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                seed: int):
    """bf16 caches of shuffled blocks with NaN in every slot past a context, the slot of each context's last
    position, and q / new k / new v as strided views of one projection output (as the engine passes them)."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    width = max(-(-length // block_size) for length in context_lens)
    num_blocks = len(context_lens) * width + 1
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    value_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    tables = torch.randperm(num_blocks - 1, device="cuda", generator=generator)
    tables = tables.view(len(context_lens), width).to(torch.int32)
    for row, length in enumerate(context_lens):
        for position in range(length, width * block_size):
            block = tables[row, position // block_size]
            key_cache[block, position % block_size] = float("nan")
            value_cache[block, position % block_size] = float("nan")
    lengths = torch.tensor(context_lens, device="cuda", dtype=torch.int32)
    positions = lengths.long() - 1
    slots = tables.long().gather(1, (positions // block_size)[:, None]).squeeze(1) * block_size + positions % block_size
    qkv = torch.randn((len(context_lens), (num_heads + 2 * num_kv_heads) * head_dim), device="cuda",
                      dtype=torch.bfloat16, generator=generator)
    query = qkv[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
    new_key = qkv[:, num_heads * head_dim: (num_heads + num_kv_heads) * head_dim].view(-1, num_kv_heads, head_dim)
    new_value = qkv[:, (num_heads + num_kv_heads) * head_dim:].view(-1, num_kv_heads, head_dim)
    return query, key_cache, value_cache, tables, lengths, slots, new_key, new_value


def fp32_reference(query, key_cache, value_cache, tables, lengths) -> torch.Tensor:
    """float32 attention of each sequence's query over its context alone, gathered through its block table
    (the torch path reads whole blocks, and 0 x the NaN past a context would be NaN)."""
    outputs = []
    block_size, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    for sequence, length in enumerate(lengths.tolist()):
        positions = torch.arange(length, device=query.device)
        blocks = tables[sequence, positions // block_size].long()
        keys = key_cache[blocks, positions % block_size].float().repeat_interleave(group, 1)  # (L, Hq, D)
        values = value_cache[blocks, positions % block_size].float().repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", query[sequence].float(), keys) * query.shape[-1] ** -0.5
        outputs.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), values))
    return torch.stack(outputs)


# Head shapes of Qwen2.5-0.5B (14 over 2, dim 64) and 1.5B (12 over 2, dim 128), and one query head per kv head.
@needs_cuda
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(14, 2, 64), (12, 2, 128), (4, 4, 64)])
@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("warps,stages", [(4, 2), (4, 3), (8, 3)])
def test_cuda_decode_stores_the_new_token_and_matches_fp32_attention(num_heads, num_kv_heads, head_dim, block_size,
                                                                      warps, stages):
    from asyncrl.engine.kernels import cuda_decode

    # 1: only the new token; 15-17, 31-33: tile edges; 2,047: many tiles per warp.
    context_lens = [1, 2, 15, 16, 17, 31, 32, 33, 100, 129, 1000, 2047]
    query, key_cache, value_cache, tables, lengths, slots, new_key, new_value = decode_case(
        context_lens, num_heads, num_kv_heads, head_dim, block_size, seed=block_size + warps)
    assert cuda_decode.covers(query, key_cache, 1)
    row_order = lengths.argsort(descending=True).to(torch.int32)
    output = cuda_decode.paged_decode_attention(query, key_cache, value_cache, tables, lengths, 1, new_key=new_key,
                                                new_value=new_value, write_slots=slots, row_order=row_order,
                                                num_warps=warps, num_stages=stages)
    flat = (-1, num_kv_heads, head_dim)
    assert torch.equal(key_cache.view(flat)[slots], new_key) and torch.equal(value_cache.view(flat)[slots], new_value)
    expected = fp32_reference(query, key_cache, value_cache, tables, lengths)
    assert torch.isfinite(output).all()
    # bf16 probabilities in the P V product and a bf16 output: ~3e-3 relative, far below a wrong row's ~1.
    relative = ((output.float() - expected).norm(dim=-1) / expected.norm(dim=-1)).max().item()
    assert relative < 1e-2, relative


def rotary_case(lengths: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 cos/sin (S, D) of each sequence's new position (its context's last), as the model's `embed` makes them."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, device="cuda").float() / head_dim))
    angles = (lengths.float() - 1)[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)


def rotate_once(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in fp32 of the bf16 inputs, rounded once: what the compiled rotary kernel computes."""
    return apply_rotary(x.float(), cos.float(), sin.float()).to(torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(14, 2, 64), (12, 2, 128)])
def test_cuda_decode_rotates_the_query_and_new_key_itself(num_heads, num_kv_heads, head_dim):
    from asyncrl.engine.kernels import cuda_decode

    context_lens = [1, 2, 17, 100, 1000, 2047]
    query, key_cache, value_cache, tables, lengths, slots, new_key, new_value = decode_case(
        context_lens, num_heads, num_kv_heads, head_dim, 16, seed=head_dim)
    cos, sin = rotary_case(lengths, head_dim)
    rotated_query, rotated_key = rotate_once(query, cos, sin), rotate_once(new_key, cos, sin)
    output = cuda_decode.paged_decode_attention(query, key_cache, value_cache, tables, lengths, 1, new_key=new_key,
                                                new_value=new_value, write_slots=slots, rotary=(cos, sin))
    flat = (-1, num_kv_heads, head_dim)
    stored = key_cache.view(flat)[slots].float()
    # The kernel's fp32 arithmetic may contract into FMAs: within one bf16 rounding of the reference.
    assert ((stored - rotated_key.float()).abs() <= rotated_key.float().abs() * 2**-8 + 1e-6).all()
    assert not torch.allclose(stored[1:], new_key[1:].float())  # sequence 0 sits at position 0: no rotation
    assert torch.equal(value_cache.view(flat)[slots], new_value)
    expected = fp32_reference(rotated_query, key_cache, value_cache, tables, lengths)
    relative = ((output.float() - expected).norm(dim=-1) / expected.norm(dim=-1)).max().item()
    assert relative < 1e-2, relative
    # A call it does not cover (split contexts) is rotated by torch and run by the Triton kernel, to the same result.
    caches = (key_cache.clone(), value_cache.clone())
    split = cuda_decode.paged_decode_attention(query, *caches, tables, lengths, 2, new_key=new_key, new_value=new_value,
                                               write_slots=slots, rotary=(cos, sin))
    assert (split.float() - output.float()).abs().max().item() < 2e-2


@needs_cuda
@pytest.mark.parametrize("writer", ["copy", "fused q/k/v product"])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(14, 2, 64), (12, 2, 128)])
def test_a_programmatic_launch_reads_what_the_kernel_before_it_wrote(writer, num_heads, num_kv_heads, head_dim):
    """Launched programmatically, the kernel requests its first tiles of the cache before the kernel before it has
    finished, and reads the query, the new key/value and cos/sin only after it. Here that kernel writes them into a
    buffer zeroed first, in a CUDA graph as the engine replays it: a copy (which lets the next kernel launch only as
    it ends), or the engine's fused q/k/v product, which lets it launch once past its own wait, so a read before the
    wait would see zeros. The output and the stored key/value equal a plain launch's, bit for bit. Contexts up to
    192 positions put the new one among a warp's first tiles (its store then precedes their requests); longer ones
    put it later."""
    from asyncrl.engine.kernels import cuda_decode, fused_decode

    if writer != "copy" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the fused products need a Hopper GPU (sm_90)")
    context_lens = [1, 2, 17, 100, 191, 193, 700, 2047] * 4
    query, key_cache, value_cache, tables, lengths, slots, new_key, new_value = decode_case(
        context_lens, num_heads, num_kv_heads, head_dim, 16, seed=head_dim + 1)
    cos, sin = rotary_case(lengths, head_dim)
    source = torch.cat([query.flatten(1), new_key.flatten(1), new_value.flatten(1)], dim=1)
    buffer = torch.zeros_like(source)
    sizes = (num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)
    views = [part.view(len(context_lens), -1, head_dim) for part in buffer.split(sizes, dim=1)]
    row_order = lengths.argsort(descending=True).to(torch.int32)
    if writer == "copy":
        def write() -> None:
            buffer.copy_(source)
    else:
        generator = torch.Generator(device="cuda").manual_seed(head_dim)
        x = torch.randn((len(context_lens), 896), device="cuda", generator=generator).to(torch.bfloat16)
        weight = (0.05 * torch.randn((source.shape[1], 896), device="cuda", generator=generator)).to(torch.bfloat16)
        squares = x.float().square().sum(-1)

        def write() -> None:
            fused_decode._extension().fused_product(fused_decode.QKV, x, weight, buffer, None, None, squares, None,
                                                    None, 1e-6, True)

    def replayed(programmatic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values = key_cache.clone(), value_cache.clone()

        def step() -> torch.Tensor:
            write()  # the kernel before: writes the query and the new key/value
            return cuda_decode.paged_decode_attention(views[0], keys, values, tables, lengths, 1, new_key=views[1],
                                                      new_value=views[2], write_slots=slots, row_order=row_order,
                                                      rotary=(cos, sin), programmatic=programmatic)

        step()  # outside the graph first: the attributes are set, the extensions loaded
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = step()
        buffer.zero_()
        graph.replay()
        torch.cuda.synchronize()
        flat = (-1, num_kv_heads, head_dim)
        return output.clone(), torch.stack([keys.view(flat)[slots], values.view(flat)[slots]]), views[2].clone()

    plain_output, plain_stored, written_values = replayed(False)
    early_output, early_stored, _ = replayed(True)
    assert torch.isfinite(plain_output).all() and plain_output.abs().max().item() > 0
    assert torch.equal(early_output, plain_output) and torch.equal(early_stored, plain_stored)
    # What the kernel before wrote, not the zeros before it.
    assert written_values.abs().max().item() > 0 and torch.equal(plain_stored[1], written_values)


@needs_cuda
def test_cuda_decode_equals_the_triton_kernel_up_to_rounding_and_defers_what_it_does_not_cover():
    from asyncrl.engine.kernels import cuda_decode, triton_decode

    context_lens = [3, 64, 700, 1536]
    case = decode_case(context_lens, 14, 2, 64, 16, seed=7)
    query, key_cache, value_cache, tables, lengths, slots, new_key, new_value = case
    caches = [(key_cache.clone(), value_cache.clone()) for _ in range(2)]
    outputs = [kernel(query, keys, values, tables, lengths, 1, new_key=new_key, new_value=new_value, write_slots=slots,
                      row_order=None)
               for kernel, (keys, values) in zip((cuda_decode.paged_decode_attention,
                                                  triton_decode.paged_decode_attention), caches)]
    # NaN past every context: equal_nan, or no two caches would ever compare equal.
    assert all(torch.allclose(ours, theirs, rtol=0, atol=0, equal_nan=True) for ours, theirs in zip(*caches))
    assert (outputs[0].float() - outputs[1].float()).abs().max().item() < 2e-2
    # Split contexts (small batches), fp32 and blocks whose size is not a power of two (the kernel maps positions to
    # blocks by shifts) go to the Triton kernel, so the engine never sees the difference.
    assert not cuda_decode.covers(query, key_cache, 2)
    assert not cuda_decode.covers(query.float(), key_cache.float(), 1)
    assert not cuda_decode.covers(query, key_cache.new_empty((4, 48, *key_cache.shape[2:])), 1)
    odd = decode_case(context_lens, 14, 2, 64, 48, seed=8)
    odd_output = cuda_decode.paged_decode_attention(*odd[:5], 1, new_key=odd[6], new_value=odd[7], write_slots=odd[5])
    assert (odd_output.float() - fp32_reference(*odd[:5])).abs().max().item() < 2e-2


@needs_cuda
def test_engine_with_the_cuda_kernel_matches_a_dense_forward(wide_folder):  # noqa: F811
    """An engine whose decode batches are large enough for one context split (every decode graph bucket from
    136 sequences up takes the CUDA kernel): its bf16 log-probs against a teacher-forced dense forward."""
    engine = LLMEngine(wide_folder, EngineConfig(device="cuda", dtype=torch.bfloat16, max_num_seqs=288,
                                                  max_num_batched_tokens=4096, gpu_memory_utilization=0.2,
                                                  decode_attention="cuda"))
    from asyncrl.engine.kernels import cuda_decode
    assert engine.runner.kernels.decode_kernel is cuda_decode.paged_decode_attention
    requests = [GenerationRequest(f"r{index}", prompt(3 + 7 * (index % 9), offset=index % 5),
                                  SamplingParams(temperature=1.0, max_new_tokens=30, ignore_eos=True, seed=index))
                for index in range(280)]
    assert_within_bf16_noise(wide_folder, engine.generate(requests)[::35])


def test_engine_config_rejects_an_unknown_decode_kernel():
    with pytest.raises(ValueError, match="engine.decode_attention"):
        EngineConfig(device="cuda", decode_attention="flash")


@pytest.mark.parametrize("block_size", [8, 48, 96])
def test_asking_for_the_cuda_kernel_with_a_block_size_it_cannot_read_fails_at_config_time(block_size):
    with pytest.raises(ValueError, match=f"power of two from 16, got engine.block_size={block_size}"):
        EngineConfig(device="cuda", decode_attention="cuda", block_size=block_size)
    # "auto" and "triton" decode those blocks with the Triton kernel; powers of two from 16 suit "cuda".
    assert EngineConfig(device="cuda", decode_attention="auto", block_size=block_size).block_size == block_size
    assert EngineConfig(device="cuda", decode_attention="cuda", block_size=2 * 16).block_size == 32


@pytest.mark.parametrize("builds", [True, False])
def test_auto_takes_the_cuda_kernel_where_it_builds_and_falls_back_to_triton_with_a_warning(monkeypatch, caplog,
                                                                                            builds):
    from asyncrl.engine.kernels import cuda_decode, cuda_sampler, selection, triton_decode

    def load():
        if not builds:
            raise RuntimeError("the CUDA decode-attention kernel could not be built (no nvcc)")
        return cuda_decode.paged_decode_attention

    monkeypatch.setattr(cuda_decode, "load_decode_kernel", load)
    # The sampler is chosen in the same call and warns where it cannot be built: here it builds, so every
    # record is the decode-attention choice's own.
    monkeypatch.setattr(cuda_sampler, "load_sample_kernel", lambda: cuda_sampler.fused_sample)
    name, kernel, sample_kernel = selection.load_cuda_kernels("auto")
    assert sample_kernel is cuda_sampler.fused_sample
    if builds:
        assert (name, kernel) == ("cuda", cuda_decode.paged_decode_attention) and not caplog.records
    else:
        assert (name, kernel) == ("triton", triton_decode.paged_decode_attention)
        assert "uses the Triton kernel" in caplog.text and "no nvcc" in caplog.text
        with pytest.raises(RuntimeError, match="no nvcc"):  # asked for by name, a failed build is an error
            selection.load_cuda_kernels("cuda")
    assert selection.load_cuda_kernels("triton")[:2] == ("triton", triton_decode.paged_decode_attention)


def test_the_sampler_falls_back_to_triton_with_a_warning_where_the_cuda_one_does_not_build(monkeypatch, caplog):
    from asyncrl.engine.kernels import cuda_sampler, selection, triton_decode, triton_sampler

    def load():
        raise RuntimeError("the CUDA sampler could not be built (no nvcc)")

    monkeypatch.setattr(cuda_sampler, "load_sample_kernel", load)
    name, kernel, sample_kernel = selection.load_cuda_kernels("triton")
    assert (name, kernel, sample_kernel) == ("triton", triton_decode.paged_decode_attention,
                                             triton_sampler.fused_sample)
    assert [record.getMessage() for record in caplog.records] == [
        "the engine samples with the Triton kernel: the CUDA sampler could not be built (no nvcc)"]
