"""The trainer's one switch between its readable paths and the speed paths of this folder.

    update = fast_update(model, config.actor, param_dtype, device)   # None: the readable update (FSDP)
    kernels = lm_head_kernels(model, hidden.device)                  # None: the LM head's torch math

- `actor.cuda_graphs` (one trainer rank, checked with the config): `GraphedUpdate` runs every update micro-batch
  as a packed step replayed from CUDA graphs (eagerly without a GPU) on fixed-address copies of the policy's
  weights, with AdamW as one kernel over flat buffers. The worker then leaves the policy unsharded: FSDP would
  gather its copies into new memory every step.
- a compiled model on CUDA (`model.compile`): the chunked LM head's softmax math as two Triton kernels
  (`triton_lm_head.py`), in the trainer's forward and in the graphed update's.

Triton is imported only once a Triton path is chosen: CPU installs may lack it.
"""

from __future__ import annotations

from typing import Optional

import torch

from asyncrl.config.schema import ActorConfig
from asyncrl.models import CausalLM
from asyncrl.train.fast.graphed_update import GraphedUpdate
from asyncrl.train.lm_head import FusedChunkKernels


def fast_update(model: CausalLM, actor: ActorConfig, param_dtype: Optional[torch.dtype],
                device: torch.device) -> Optional[GraphedUpdate]:
    """The graphed update of the (unsharded) policy `model` where `actor.cuda_graphs` asks for it, else None."""
    if not actor.cuda_graphs:
        return None
    if model.config.is_moe:
        # Expert dispatch has data-dependent shapes (tokens per expert), which a captured graph cannot replay.
        raise ValueError(f"actor.cuda_graphs=true does not support mixture-of-experts models ({model.config.model_type}"
                         f"); set actor.cuda_graphs=false (docs/moe.md)")
    return GraphedUpdate(model, param_dtype, actor.optim, device, lm_head_kernels(model, device))


def lm_head_kernels(model: CausalLM, device: torch.device) -> Optional[FusedChunkKernels]:
    """The chunked LM head's softmax math for `model`'s hidden states on `device`: Triton's kernels for a compiled
    model on CUDA (the GPU fast path comes with the compiled layers), else None (torch's)."""
    if not (model.is_compiled and device.type == "cuda"):
        return None
    return triton_lm_head_kernels()


def triton_lm_head_kernels() -> FusedChunkKernels:
    # Imported here, not at the top: triton ships with CUDA installs only.
    from asyncrl.train.fast.triton_lm_head import TRITON_CHUNK_KERNELS
    return TRITON_CHUNK_KERNELS
