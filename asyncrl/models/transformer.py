"""The transformer shared by the trainer and the generation engine (Llama / Qwen2 / Qwen2.5 / Qwen3 dense,
Qwen3-MoE / Mixtral mixture of experts).

Parameter names equal HF state-dict names (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, ...),
so checkpoint I/O and weight sync are plain name matches.

    model = CausalLM(config)
    hidden = model(input_ids, positions)          # dense: input_ids, positions (B, T), right-padded rows
    logits = model.compute_logits(hidden)         # (B, T, V) fp32; callers may pass chunks of `hidden`
    hidden = model(input_ids, positions, attention=PackedCausalAttention(cu_seqlens))  # flattened: (N,)
    hidden = model(input_ids, positions, routing=Routing(replay_ids=recorded))  # MoE: replay, record routing

`forward` returns final-normed hidden states rather than logits so that log-probs can be computed in chunks
without materialising (B, T, V) at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from asyncrl.models.attention import AttentionBackend, SelfAttention
from asyncrl.models.layers import MLPGradients, RMSNorm, SwiGLU
from asyncrl.models.model_config import TransformerConfig
from asyncrl.models.moe import SparseMoE
from asyncrl.models.rope import RotaryEmbedding
from asyncrl.models.routing import Routing

# HF's name of a layer's sparse MLP where it is not `mlp`.
SPARSE_MLP_NAMES = {"mixtral": "block_sparse_moe"}


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); the MLP is a `SparseMoE` in MoE families."""

    def __init__(self, config: TransformerConfig, layer_index: int) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config, layer_index)
        self.is_moe = config.is_moe
        self.mlp_name = SPARSE_MLP_NAMES.get(config.model_type, "mlp")
        if config.is_moe:
            self.add_module(self.mlp_name, SparseMoE(config, layer_index))
        else:
            self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @property
    def sparse_mlp(self) -> SparseMoE:
        """The MoE block of an MoE layer (`mlp` or, in Mixtral, `block_sparse_moe`)."""
        return self.get_submodule(self.mlp_name)

    def forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, routing: Routing | None = None) -> Tensor:
        """The layer over a dense (B, T) batch; with an attention backend the model calls `paged_forward`."""
        return self.dense_forward(hidden, cos, sin, routing)

    def dense_forward(self, hidden: Tensor, cos: Tensor, sin: Tensor, routing: Routing | None = None) -> Tensor:
        """The whole layer over a dense (B, T) batch, causal SDPA included: one graph when compiled (the
        trainer's path), so a layer costs one compiled call forward and one backward. The class's own halves
        are called, not the instance's (possibly compiled) attributes: compiled here, they are traced inline. An
        MoE layer's dense forward stays eager (`compile_decoder_layers`) and calls its compiled attention half."""
        if self.is_moe:
            hidden, query, key, value = self.attention_inputs(hidden, None, cos, sin)
        else:
            hidden, query, key, value = DecoderLayer.attention_inputs(self, hidden, None, cos, sin)
        attended = self.self_attn.attend(query, key, value, None)
        return residual_add(*DecoderLayer.attention_outputs(self, hidden, attended, None, routing))

    def paged_forward(self, hidden: Tensor, update: Tensor | None, cos: Tensor, sin: Tensor,
                      attention: AttentionBackend, mlp_grads_into: MLPGradients | None = None,
                      routing: Routing | None = None) -> tuple[Tensor, Tensor]:
        """The layer with an attention backend, its residual adds deferred: takes the stream and the previous
        layer's pending MLP output (None: none), returns the stream and this layer's MLP output.
        `mlp_grads_into`: see `SwiGLU.forward`."""
        # A backend that rotates gets q and k before RoPE (the compiled half then has no rotary kernel) and cos/sin.
        rotates = attention.rotates
        hidden, query, key, value = self.attention_inputs(hidden, update, cos, sin, not rotates)
        attended = self.self_attn.attend(query, key, value, attention, (cos, sin) if rotates else None)
        return self.attention_outputs(hidden, attended, mlp_grads_into, routing)

    # With an attention backend the layer is split around the attention kernel, so that
    # `compile_decoder_layers` can compile the two halves (norms, projections, rotary, activation, residual
    # adds: most of a layer's small kernels) while the backend, which may read and write a paged KV cache,
    # stays eager. Each residual add is left to the next reader of the stream, where it fuses into the norm's
    # kernel: the MLP's add into the next layer's first half.
    def attention_inputs(self, hidden: Tensor, update: Tensor | None, cos: Tensor, sin: Tensor,
                         rotate: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """hidden (..., hidden) plus a pending update -> the stream, query (..., Hq, D), key and value (RoPE
        applied unless `rotate` is False)."""
        if update is not None:
            hidden = residual_add(hidden, update)
        return (hidden, *self.self_attn.project(self.input_layernorm(hidden), cos, sin, rotate))

    def attention_outputs(self, hidden: Tensor, attended: Tensor, mlp_grads_into: MLPGradients | None = None,
                          routing: Routing | None = None) -> tuple[Tensor, Tensor]:
        """The stream after attention (attended heads (..., Hq * D)) and the MLP's output, not yet added.
        `routing`: what an MoE layer replays and records (ignored by a dense one)."""
        hidden = residual_add(hidden, self.self_attn.o_proj(attended))
        if self.is_moe:
            return hidden, self.sparse_mlp(self.post_attention_layernorm(hidden), routing)
        return hidden, self.mlp(self.post_attention_layernorm(hidden), mlp_grads_into)


def residual_add(hidden: Tensor, update: Tensor) -> Tensor:
    """hidden + update rounded once to their dtype, exactly as a bf16 add rounds. Written as an fp32 add so
    Inductor cannot turn it into cuBLAS's beta = 1 add of the producing GEMM, which first copies the residual
    into the GEMM's output (two copies per layer of a decode step); as a plain add it fuses into the kernel
    of the norm that next reads the stream."""
    return (hidden.float() + update.float()).to(hidden.dtype)


class TransformerModel(nn.Module):
    """Embedding, decoder layers and the final norm (HF's `model.*`); returns final-normed hidden states."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        # Recompute each layer's activations in backward instead of storing them (trainer memory saver).
        self.gradient_checkpointing = False

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionBackend | None = None,
                inputs_embeds: Tensor | None = None,
                mlp_grads_into: Sequence[MLPGradients | None] | None = None,
                routing: Routing | None = None) -> Tensor:
        """input_ids/positions (B, T) with attention None, or (N,) with a backend -> hidden (..., hidden).
        `inputs_embeds` (..., hidden), as in HF: the token embeddings, looked up by the caller (the trainer's
        packed step, which adds the embedding's gradient into its fp32 master itself). `mlp_grads_into` (with
        a backend): per layer, where its MLP's backward adds the weights' gradients (`SwiGLU.forward`).
        `routing` (MoE): the experts to replay (ids aligned with input_ids) and where the layers record theirs."""
        if mlp_grads_into is not None and (attention is None or len(mlp_grads_into) != len(self.layers)):
            raise ValueError(f"mlp_grads_into needs an attention backend and one entry per layer "
                             f"({len(self.layers)}), got {len(mlp_grads_into)}")
        _check_layout(input_ids, positions, attention)
        if inputs_embeds is None:
            hidden, cos, sin = self.embed(input_ids, positions)
        else:
            hidden, (cos, sin) = inputs_embeds, self.rotary_emb(positions, inputs_embeds.dtype)
        if attention is not None:  # the engine's path: each layer's MLP add waits for the next layer's norm
            update = None
            for index, layer in enumerate(self.layers):
                hidden, update = layer.paged_forward(hidden, update, cos, sin, attention,
                                                     None if mlp_grads_into is None else mlp_grads_into[index],
                                                     routing)
            return self.final_norm(hidden, update)
        use_checkpoint = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            if use_checkpoint:
                hidden = checkpoint(layer, hidden, cos, sin, routing, use_reentrant=False)
            else:
                hidden = layer(hidden, cos, sin, routing)
        return self.norm(hidden)

    # The two ends of the engine's forward, outside the layers; `compile_decoder_layers` compiles them, so a
    # decode step's embedding, cos/sin and last norm are three kernels instead of ~20 eager ones.
    def embed(self, input_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Token embeddings (..., hidden) and the rotary cos/sin (..., D) of the positions (int32 or int64).

        Flattened (N,) ids on CUDA gather rows with `index_select`: the same values as `nn.Embedding`, whose
        eager backward de-duplicates the ids with a host synchronisation above 3,072 of them (pytorch#82886),
        and an accumulating index_put (plain indexing's backward) is not capturable either; index_select's
        backward is an index_add, so the trainer's packed step can be replayed from a CUDA graph. Elsewhere
        `nn.Embedding`, whose CPU backward is deterministic (bitwise-exact resumes rely on it)."""
        if input_ids.is_cuda and input_ids.dim() == 1:
            hidden = self.embed_tokens.weight.index_select(0, input_ids)
        else:
            hidden = self.embed_tokens(input_ids)
        return (hidden, *self.rotary_emb(positions, hidden.dtype))

    def final_norm(self, hidden: Tensor, update: Tensor) -> Tensor:
        """The last layer's pending MLP output added to the stream, then the final norm."""
        return self.norm(residual_add(hidden, update))


def _check_layout(input_ids: Tensor, positions: Tensor, attention: AttentionBackend | None) -> None:
    if positions.shape != input_ids.shape:
        raise ValueError(
            f"positions must have the shape of input_ids, got {tuple(positions.shape)} and {tuple(input_ids.shape)}")
    if attention is None and input_ids.dim() != 2:
        raise ValueError(
            f"dense layout (attention=None) needs input_ids (B, T), got {tuple(input_ids.shape)}; "
            "pass an AttentionBackend for flattened (N,) tokens")
    if attention is not None and input_ids.dim() != 1:
        raise ValueError(f"an AttentionBackend needs flattened input_ids (N,), got {tuple(input_ids.shape)}")


class CausalLM(nn.Module):
    """Backbone `.model` plus `.lm_head` (the same Parameter as the embedding when tied, as in HF)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.is_compiled = False  # set by `compile_decoder_layers`; the trainer's LM head follows it

    def tie_weights(self) -> None:
        """Makes lm_head share the embedding Parameter when configured (again after `to_empty`, which unties)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        self.model.gradient_checkpointing = enabled

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionBackend | None = None,
                inputs_embeds: Tensor | None = None,
                mlp_grads_into: Sequence[MLPGradients | None] | None = None,
                routing: Routing | None = None) -> Tensor:
        """Final-normed hidden states (B, T, hidden) or (N, hidden); see `compute_logits` and
        `TransformerModel.forward`."""
        return self.model(input_ids, positions, attention, inputs_embeds, mlp_grads_into, routing)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., hidden) -> logits (..., V) in fp32 (the matmul runs in the model dtype, like HF)."""
        return self.lm_head(hidden).float()


class ValueModel(nn.Module):
    """Backbone `.model` plus a `.score` head Linear(hidden, 1) named like HF's `*ForTokenClassification`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TransformerModel(config)
        self.score = nn.Linear(config.hidden_size, 1, bias=True)
        self.reset_score_head()
        self.is_compiled = False  # set by `compile_decoder_layers`

    def reset_score_head(self, seed: int = 0) -> None:
        """Deterministic small init: weight ~ N(0, 1 / (hidden + 1)^2) from `seed`, bias 0, so initial values
        are near 0 while gradients still reach the backbone from the first step."""
        generator = torch.Generator().manual_seed(seed)
        std = 1.0 / (self.config.hidden_size + 1)
        weight = torch.randn(tuple(self.score.weight.shape), generator=generator) * std
        with torch.no_grad():
            self.score.weight.copy_(weight)
            self.score.bias.zero_()

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        self.model.gradient_checkpointing = enabled

    def forward(self, input_ids: Tensor, positions: Tensor, attention: AttentionBackend | None = None) -> Tensor:
        """Values in fp32, shaped like input_ids: (B, T) dense or (N,) flattened."""
        hidden = self.model(input_ids, positions, attention)
        # A fresh tensor, not a view: FSDP hooks the output for backward and a view could lose the hook.
        return self.score(hidden).squeeze(-1).to(torch.float32, copy=True)
