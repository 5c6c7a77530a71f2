"""The LM head's per-chunk softmax math on CUDA as two Triton kernels, one pass over the logits each.

    log_probs, entropy, lse = fused_chunk_statistics(logits, target_ids, temperature, with_entropy)
    grad_logits = fused_chunk_grad_logits_(logits, target_ids, lse, grad_log_probs, grad_entropy, entropy,
                                           temperature)   # written over `logits`, which it returns

The same math as `lm_head.chunk_statistics` / `chunk_grad_logits` (see the formulas in `lm_head.py`), for
(c, V) logits in bf16, fp16 or fp32, in float32 arithmetic. A chunk of a 152k vocabulary is ~270 MB of bf16
logits; torch.compile's kernels for it took several passes (and 4 ms per 883-token chunk in a replayed CUDA
graph, 60x the memory floor), these take one each:
- statistics: one program per row walks the vocabulary in blocks and keeps an online softmax (max, sum of
  exp(z - max), and for the entropy the sum of exp(z - max) (z - max)), with z = logits / T;
- gradient: one program per row reads each logit once and writes dL/dlogits in its place (the logits are not
  needed afterwards), from the forward's logsumexp.

`TRITON_CHUNK_KERNELS` is the pair as the chunked LM head takes it (`lm_head.FusedChunkKernels`). Imported only on
CUDA (CPU installs may lack triton); the kernels also run under Triton's interpreter (`TRITON_INTERPRET=1`,
`tests/train/fast/test_triton_lm_head.py`).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from asyncrl.train.lm_head import FusedChunkKernels

BLOCK = 4096      # vocabulary entries per loop step of one row
NUM_WARPS = 8
COMBINE_ROWS = 64  # rows per program of the segments' merge


@triton.jit
def _online_softmax(row_logits, first, last, inverse_temperature, BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    """Over columns [first, last) of one row, with z = logits / T: (max, sum of exp(z - max), and with the entropy
    sum of exp(z - max) (z - max) <= 0, else 0), walked in blocks."""
    running_max = tl.full((), float("-inf"), tl.float32)
    running_sum = tl.zeros((), tl.float32)
    running_moment = tl.zeros((), tl.float32)
    for start in range(first, last, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        inside = columns < last
        z = tl.load(row_logits + columns, mask=inside, other=0.0).to(tl.float32) * inverse_temperature
        new_max = tl.maximum(running_max, tl.max(tl.where(inside, z, float("-inf")), 0))
        shift = running_max - new_max  # <= 0; -inf on the first block, whose running sums are 0
        correction = tl.exp(shift)
        centred = z - new_max
        probs = tl.where(inside, tl.exp(centred), 0.0)
        if WITH_ENTROPY:
            # Re-centring the moment: sum e (z - m) = correction (moment + (m_old - m) sum_old).
            carried = tl.where(running_sum > 0.0, correction * (running_moment + shift * running_sum), 0.0)
            running_moment = carried + tl.sum(probs * tl.where(inside, centred, 0.0), 0)
        running_sum = running_sum * correction + tl.sum(probs, 0)
        running_max = new_max
    return running_max, running_sum, running_moment


@triton.jit
def _statistics_kernel(logits_ptr, targets_ptr, log_probs_ptr, entropy_ptr, lse_ptr, vocab_size, row_stride,
                       inverse_temperature, BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    row = tl.program_id(0)
    row_logits = logits_ptr + row.to(tl.int64) * row_stride
    running_max, running_sum, running_moment = _online_softmax(row_logits, 0, vocab_size, inverse_temperature,
                                                               BLOCK, WITH_ENTROPY)
    log_sum = tl.log(running_sum)
    lse = running_max + log_sum
    target_logit = tl.load(row_logits + tl.load(targets_ptr + row)).to(tl.float32) * inverse_temperature
    tl.store(log_probs_ptr + row, target_logit - lse)
    tl.store(lse_ptr + row, lse)
    if WITH_ENTROPY:
        # H = -sum p log p = log S - E_p[z - m]: two non-negative terms, no cancellation.
        tl.store(entropy_ptr + row, log_sum - running_moment / running_sum)


@triton.jit
def _segment_statistics_kernel(logits_ptr, partials_ptr, vocab_size, row_stride, segment_length, inverse_temperature,
                               BLOCK: tl.constexpr, SEGMENTS: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    """`_online_softmax` of one row's vocabulary segment, into partials (rows, 3, SEGMENTS)."""
    row, segment = tl.program_id(0), tl.program_id(1)
    row_logits = logits_ptr + row.to(tl.int64) * row_stride
    first = segment * segment_length
    running_max, running_sum, running_moment = _online_softmax(
        row_logits, first, tl.minimum(first + segment_length, vocab_size), inverse_temperature, BLOCK, WITH_ENTROPY)
    out = partials_ptr + row.to(tl.int64) * 3 * SEGMENTS + segment
    tl.store(out, running_max)
    tl.store(out + SEGMENTS, running_sum)
    tl.store(out + 2 * SEGMENTS, running_moment)


@triton.jit
def _combine_statistics_kernel(logits_ptr, targets_ptr, partials_ptr, log_probs_ptr, entropy_ptr, lse_ptr, rows,
                               row_stride, inverse_temperature, ROWS: tl.constexpr, SEGMENTS: tl.constexpr,
                               WITH_ENTROPY: tl.constexpr):
    """Each row's segments merged: the same sums re-centred on the row's max, then as `_statistics_kernel`."""
    row_ids = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    valid = row_ids < rows
    base = partials_ptr + row_ids.to(tl.int64)[:, None] * 3 * SEGMENTS + tl.arange(0, SEGMENTS)[None, :]
    maxima = tl.load(base, mask=valid[:, None], other=0.0)                  # (ROWS, SEGMENTS)
    sums = tl.load(base + SEGMENTS, mask=valid[:, None], other=0.0)
    row_max = tl.max(maxima, 1)
    shift = maxima - row_max[:, None]                                       # <= 0; -inf for an empty segment
    weights = tl.where(sums > 0.0, tl.exp(shift), 0.0)
    total = tl.where(valid, tl.sum(sums * weights, 1), 1.0)  # rows past the end: a harmless 1
    log_sum = tl.log(total)
    lse = row_max + log_sum
    targets = tl.load(targets_ptr + row_ids, mask=valid, other=0)
    target_logit = tl.load(logits_ptr + row_ids.to(tl.int64) * row_stride + targets, mask=valid,
                           other=0.0).to(tl.float32) * inverse_temperature
    tl.store(log_probs_ptr + row_ids, target_logit - lse, mask=valid)
    tl.store(lse_ptr + row_ids, lse, mask=valid)
    if WITH_ENTROPY:
        moments = tl.load(base + 2 * SEGMENTS, mask=valid[:, None], other=0.0)
        moment = tl.sum(tl.where(sums > 0.0, weights * (moments + shift * sums), 0.0), 1)
        tl.store(entropy_ptr + row_ids, log_sum - moment / total, mask=valid)


@triton.jit
def _grad_logits_kernel(logits_ptr, targets_ptr, lse_ptr, grad_log_probs_ptr, grad_entropy_ptr, entropy_ptr,
                        vocab_size, row_stride, inverse_temperature, BLOCK: tl.constexpr,
                        WITH_ENTROPY: tl.constexpr):
    row = tl.program_id(0)
    row_logits = logits_ptr + row.to(tl.int64) * row_stride
    lse = tl.load(lse_ptr + row)
    grad_log_prob = tl.load(grad_log_probs_ptr + row)
    target = tl.load(targets_ptr + row)
    if WITH_ENTROPY:
        grad_entropy = tl.load(grad_entropy_ptr + row)
        entropy = tl.load(entropy_ptr + row)
    for start in range(0, vocab_size, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        inside = columns < vocab_size
        raw = tl.load(row_logits + columns, mask=inside, other=0.0)
        log_probs = raw.to(tl.float32) * inverse_temperature - lse
        probs = tl.exp(log_probs)
        # dL/dz = g_lp onehot(y) - p (g_lp + g_H (log p + H)); dL/dlogits = dL/dz / T.
        if WITH_ENTROPY:
            grad = -probs * (grad_log_prob + grad_entropy * (log_probs + entropy))
        else:
            grad = -probs * grad_log_prob
        grad = tl.where(columns == target, grad + grad_log_prob, grad) * inverse_temperature
        tl.store(row_logits + columns, grad.to(raw.dtype), mask=inside)


def fused_chunk_statistics(logits: Tensor, target_ids: Tensor, temperature: float, with_entropy: bool,
                           segments: int = 4) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """logits (c, V) of W h -> log softmax(logits / T)[y], the entropy if asked, and logsumexp(logits / T),
    each (c,) float32.

    `segments` > 1 (a power of two) splits each row's vocabulary among that many programs, whose partial sums a
    second kernel merges: more reads in flight than one program per row keeps (its loop waits on each block's
    reductions before it loads the next; the trainer's 3,584-row chunks read at ~2.4 TB/s on an H200), for one
    more launch. At 3,584 x 151,936 on an H200 one program takes 437.7 us, 2 / 4 / 8 / 16 segments
    420.2 / 413.1 / 416.4 / 426.6 us, hence the default of 4."""
    rows, vocab_size = logits.shape
    _check(logits, target_ids)
    if segments < 1 or segments & (segments - 1):
        raise ValueError(f"segments must be a power of two, got {segments}")
    log_probs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(log_probs)
    entropy = torch.empty_like(log_probs) if with_entropy else None
    if not rows:
        return log_probs, entropy, lse
    if segments == 1:
        _statistics_kernel[(rows,)](logits, target_ids, log_probs, log_probs if entropy is None else entropy, lse,
                                    vocab_size, logits.stride(0), 1.0 / temperature, BLOCK=BLOCK,
                                    WITH_ENTROPY=with_entropy, num_warps=NUM_WARPS)
        return log_probs, entropy, lse
    segment_length = triton.cdiv(triton.cdiv(vocab_size, segments), BLOCK) * BLOCK
    partials = torch.empty(rows, 3, segments, dtype=torch.float32, device=logits.device)
    _segment_statistics_kernel[(rows, segments)](logits, partials, vocab_size, logits.stride(0), segment_length,
                                                 1.0 / temperature, BLOCK=BLOCK, SEGMENTS=segments,
                                                 WITH_ENTROPY=with_entropy, num_warps=NUM_WARPS)
    _combine_statistics_kernel[(triton.cdiv(rows, COMBINE_ROWS),)](
        logits, target_ids, partials, log_probs, log_probs if entropy is None else entropy, lse, rows,
        logits.stride(0), 1.0 / temperature, ROWS=COMBINE_ROWS, SEGMENTS=segments, WITH_ENTROPY=with_entropy)
    return log_probs, entropy, lse


def fused_chunk_grad_logits_(logits: Tensor, target_ids: Tensor, lse: Tensor, grad_log_probs: Tensor,
                             grad_entropy: Optional[Tensor], entropy: Optional[Tensor],
                             temperature: float) -> Tensor:
    """dL/dlogits (c, V) written over `logits` (returned), from the forward's `lse` and `entropy` and the
    incoming float32 gradients (c,); `grad_entropy` None when only the log-probs reach the loss."""
    rows, vocab_size = logits.shape
    _check(logits, target_ids)
    with_entropy = grad_entropy is not None
    if with_entropy and entropy is None:
        raise ValueError("fused_chunk_grad_logits_ needs the forward's entropy with an entropy gradient")
    if rows:
        _grad_logits_kernel[(rows,)](logits, target_ids, lse, grad_log_probs.float().contiguous(),
                                     grad_entropy.float().contiguous() if with_entropy else lse,
                                     entropy if with_entropy else lse, vocab_size, logits.stride(0),
                                     1.0 / temperature, BLOCK=BLOCK, WITH_ENTROPY=with_entropy,
                                     num_warps=NUM_WARPS)
    return logits


def _check(logits: Tensor, target_ids: Tensor) -> None:
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"fused LM-head kernels need (c, V) logits with contiguous rows, got shape "
                         f"{tuple(logits.shape)} and strides {logits.stride()}")
    if logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"fused LM-head kernels take bf16, fp16 or fp32 logits, got {logits.dtype}")
    if target_ids.shape != logits.shape[:1] or not target_ids.is_contiguous():
        raise ValueError(f"target_ids must be contiguous of shape ({logits.shape[0]},), got "
                         f"{tuple(target_ids.shape)}")


TRITON_CHUNK_KERNELS = FusedChunkKernels(fused_chunk_statistics, fused_chunk_grad_logits_)
