"""The fused Gumbel-max sampler of the CUDA path as our own CUDA kernel (`csrc/gumbel_sample.cu`): the race of
`triton_sampler.fused_sample` and of the torch reference (`sampler.sample_reference`), in about half the
instructions per logit. The sampler is bound by instructions, not by reading the logits, so that is its time: on
an H200, 256 x 151,936 bf16 logits take ~59 us against the Triton kernel's ~83 us. Logits it does not cover (a
vocabulary or row stride that is not a multiple of 8) go to the Triton kernel."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from asyncrl.engine.kernels import triton_sampler
from asyncrl.engine.kernels.cuda_build import SOURCES, build_extension
from asyncrl.engine.sampler import FusedSampleKernel

ENTRY = SOURCES / "gumbel_sample.cu"
_DECLARATION = ("std::tuple<torch::Tensor, torch::Tensor> gumbel_sample(torch::Tensor logits, "
                "torch::Tensor temperatures, torch::Tensor thresholds, torch::Tensor keys, int64_t num_splits);")
NUM_SPLITS = 8  # per row: 8 were faster than 16 or 32 at 256 rows on an H200 (fewer, longer programs)


@functools.cache
def _extension():
    return build_extension("asyncrl_gumbel_sample", ENTRY, _DECLARATION, ["gumbel_sample"])


def covers(logits: Tensor) -> bool:
    """Whether the CUDA kernel takes these logits (else the Triton kernel does): 16-byte loads of whole rows."""
    return (logits.is_cuda and logits.dtype in (torch.bfloat16, torch.float32) and logits.dim() == 2
            and logits.stride(1) == 1 and logits.shape[1] % 8 == 0 and logits.stride(0) % 8 == 0
            and logits.data_ptr() % 16 == 0)


def fused_sample(logits: Tensor, temperatures: Tensor, thresholds: Tensor, keys: Tensor,
                 num_splits: int = NUM_SPLITS) -> tuple[Tensor, Tensor]:
    """`FusedSampleKernel`: logits (S, V) bf16 or fp32, temperatures (S,) (0 = greedy), thresholds (S,) raw
    logits (-inf: none), keys (S,) row keys -> token ids (S,) int64, log-probs (S,) fp32."""
    if not covers(logits):
        return triton_sampler.fused_sample(logits, temperatures, thresholds, keys)
    num_splits = max(1, min(num_splits, logits.shape[1] // 8))
    return _extension().gumbel_sample(logits, temperatures.to(torch.float32).contiguous(),
                                      thresholds.to(torch.float32).contiguous(), keys.to(torch.int64).contiguous(),
                                      num_splits)


def load_sample_kernel() -> FusedSampleKernel:
    """The CUDA sampler, built now (a minute the first time on a machine)."""
    try:
        _extension()
    except Exception as error:  # no CUDA toolkit, a compiler error: say which; the Triton sampler does without it
        raise RuntimeError(f"the CUDA sampler could not be built "
                           f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from error
    return fused_sample
