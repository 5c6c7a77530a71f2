"""The forward of a packed micro-batch (`packed_batch.py`), the graphed update's: log-probs and entropies from
static shapes only, with weight gradients added straight into fp32 tensors where the caller asks.

    log_probs, entropy = packed_response_log_probs(model, packed, temperature,
                                                   GradientTargets.of(model, weights.gradient_of))   # (rows, R)

It computes what `forward.response_log_probs` computes for the same rows; see `forward.py` for the positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from asyncrl.models import CausalLM, FixedCapacityPackedAttention
from asyncrl.models.layers import MLPGradients
from asyncrl.train.fast.embedding_lookup import embedding_rows
from asyncrl.train.fast.packed_batch import PackedMicroBatch, scatter_to_grid
from asyncrl.train.lm_head import FusedChunkKernels, token_log_probs_and_entropy


@dataclass(frozen=True)
class GradientTargets:
    """Float32 tensors that a packed step's backward adds weight gradients into, instead of returning them to
    autograd (`actor.cuda_graphs`: the fp32 masters' `.grad`, so no bf16 gradient is written, read back and
    accumulated); None: returned as usual. A tied LM head and embedding share one tensor."""
    lm_head: Optional[Tensor] = None
    embedding: Optional[Tensor] = None
    mlp: Optional[list[Optional[MLPGradients]]] = None  # per layer: gate, up and down projections

    @classmethod
    def of(cls, model: CausalLM, gradient_of: Callable[[Tensor], Optional[Tensor]]) -> GradientTargets:
        """The targets of every weight that has one: `gradient_of(weight)` (None: this weight has none)."""
        def mlp_targets(mlp) -> Optional[MLPGradients]:
            targets = [gradient_of(linear.weight) for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
            return None if any(target is None for target in targets) else MLPGradients(*targets)
        return cls(lm_head=gradient_of(model.lm_head.weight), embedding=gradient_of(model.model.embed_tokens.weight),
                   mlp=[mlp_targets(layer.mlp) for layer in model.model.layers])


def packed_response_log_probs(model: CausalLM, packed: PackedMicroBatch, temperature: float,
                              targets: GradientTargets = GradientTargets(),
                              fused_kernels: Optional[FusedChunkKernels] = None) -> tuple[Tensor, Tensor]:
    """log-probs and entropies (rows, R) of a fixed-capacity packed micro-batch (`packed_batch.py`), 0 where no
    token trains: the values `response_log_probs` gives for the same rows, from static shapes only. `targets`:
    where backward adds weight gradients in fp32 instead of returning them (`token_log_probs_and_entropy`,
    `embedding_rows`, `SwiGLU.forward`); `fused_kernels`: the LM head's chunk math (None: torch's)."""
    attention = FixedCapacityPackedAttention(packed.starts, packed.positions, max_length=packed.num_tokens)
    embeddings = None if targets.embedding is None else embedding_rows(
        model.model.embed_tokens.weight, packed.input_ids, targets.embedding)  # (N, H)
    hidden = model(packed.input_ids, packed.positions, attention=attention, inputs_embeds=embeddings,
                   mlp_grads_into=targets.mlp)  # (N, H)
    token_log_probs, token_entropy = token_log_probs_and_entropy(
        hidden.index_select(0, packed.predictor_index), model.lm_head.weight, packed.target_ids, temperature,
        with_entropy=True, fused_kernels=fused_kernels, weight_grad_into=targets.lm_head)  # (M,) each
    return scatter_to_grid(token_log_probs, packed), scatter_to_grid(token_entropy, packed)
