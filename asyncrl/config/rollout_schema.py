"""The `rollout` section of the config tree (the engine, sampling, multi-turn agents, a bring-your-own agent and
external servers); `schema.py` assembles the tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.config.fields import option, section
from asyncrl.config.limits import MAX_BLOCK_SIZE, MAX_SEED, MAX_WAIT_S

DecodeAttention = Literal["auto", "triton", "cuda"]
DecodeProducts = Literal["auto", "fused", "torch"]


@dataclass
class ValSamplingConfig:
    n: int = option(1, "responses per validation prompt; > 1 reports pass@n", gt=0)
    temperature: float = option(0.0, "validation temperature; 0 is greedy", ge=0.0)
    top_p: float = option(1.0, "validation nucleus threshold", gt=0.0, le=1.0)
    top_k: int = option(-1, "validation top-k; -1 disables", ge=1, also_allowed=(-1,))


ToolResponseTruncateSide = Literal["left", "right", "middle"]


@dataclass
class MultiTurnConfig:
    enable: bool = option(False, "multi-turn agentic rollouts: the model may call tools (docs/agents.md); a sample "
                                 "is the prompt, the model's turns and the tool results, which do not train")
    max_assistant_turns: int = option(5, "model turns per trajectory; a trajectory still calling tools after the "
                                         "last one ends there", gt=0)
    max_parallel_calls: int = option(1, "tool calls of one turn run at once; further calls of the turn get an "
                                        "error message instead of running", gt=0)
    max_tool_response_length: int = option(256, "tokens a tool result may take in the trajectory; longer ones are "
                                                "cut on tool_response_truncate_side", gt=0)
    tool_response_truncate_side: ToolResponseTruncateSide = option(
        "middle", "which part of a long tool result is cut: left keeps its end, right its start, middle both ends")
    tool_config_path: str = option("", "YAML file of the tools: each tool's class_name (a built-in name, "
                                       "'file.py:function' or 'package.module:Class'), its config and its OpenAI "
                                       "function schema (tool_schema)")
    format: str = option("hermes", "tool-call format the model writes (asyncrl.rollout.agent.TOOL_CALL_PARSERS)",
                         choices="tool-call format")
    tool_timeout_s: float = option(30.0, "wall-time limit of one tool call unless its config sets timeout_s; past "
                                         "it the model reads a timeout error", gt=0.0, le=MAX_WAIT_S)


@dataclass
class AgentConfig:
    path: str = option("", "your own agent (docs/byo-agent.md): 'file.py:function' or 'package.module:function', an "
                           "`async def rollout(client, sample)` written with the openai package (pip install "
                           "'asyncrl[agents]'); each of its completions is recorded token-exact and trained with the "
                           "reward it returns; empty = no agent")
    timeout_s: float = option(300.0, "wall-time limit of one agent run; past it the run scores 0 (its recorded "
                                     "turns still train) and counts in agent/timeouts", gt=0.0, le=MAX_WAIT_S)
    max_concurrent: int = option(0, "agent runs at once in the process that generates (the driver in sync and "
                                    "one_step_off, the rollouter in fully_async); 0 = every run of a batch at once",
                                 ge=0)


@dataclass
class ExternalRolloutConfig:
    urls: list[str] = option([], "base URLs of the OpenAI-compatible servers rollout.backend=external generates on, "
                                 "e.g. [http://127.0.0.1:8001, http://127.0.0.1:8002] (asyncrl serve; "
                                 "docs/external-servers.md maps vLLM and SGLang)")
    api_key_env: str = option("ASYNCRL_API_KEY", "environment variable holding the servers' API key (sent as a "
                                                 "Bearer token; unset or empty = none), so the key never lands in "
                                                 "the run's config.yaml")
    timeout_s: float = option(300.0, "limit on one HTTP call to a server (a completion, a health probe); past it "
                                     "the server leaves the rotation and its requests go to another",
                              gt=0.0, le=MAX_WAIT_S)
    max_retries: int = option(2, "times one request is sent again, to another server, after its server failed "
                                 "(connection lost, timeout, 5xx); past them the step fails naming the servers",
                              ge=0)
    health_interval_s: float = option(10.0, "a server not heard from for this long is probed (GET /health) before "
                                            "it gets requests; one that does not answer leaves the rotation until "
                                            "a weight sync reloads it", gt=0.0, le=MAX_WAIT_S)
    api: Literal["asyncrl", "vllm"] = option("asyncrl", "the servers' routes for reload, checksum and abort: asyncrl "
                                                     "(asyncrl serve; SGLang's names) or vllm (vllm serve in its dev "
                                                     "mode with asyncrl's worker extension: docs/external-servers.md)")
    reload_endpoint: str = option("/update_weights_from_disk", "POST route that reloads weights from an HF folder, "
                                  "body {model_path, weight_version} (asyncrl serve and SGLang's name; api=asyncrl)")
    weights_dir: str = option("", "folder the policy is written to for the servers to reload (they must read it: "
                                  "same machine or a shared file system); empty = <trainer.output_dir>/"
                                  "external_weights")
    verify_weights: bool = option(False, "after every reload compare each server's weights checksum (asyncrl serve's "
                                         "GET /weights_checksum; vLLM's worker extension) with the written folder's, "
                                         "and fail on a difference")


@dataclass
class VllmConfig:
    tensor_parallel_size: int = option(1, "GPUs one vLLM engine spreads a model over (its tensor_parallel_size)",
                                       gt=0)
    max_model_len: int = option(0, "context length of the engine; 0 = data.max_prompt_length + "
                                   "data.max_response_length", ge=0)
    enable_prefix_caching: bool = option(True, "vLLM's prefix cache: a group's samples and an agent's turns reuse "
                                               "the KV of their shared prefix")
    quantization: str = option("", "vLLM's quantization method for rollout (e.g. fp8); empty = the model's dtype. "
                                   "Log-probs then differ from the trainer's by more than rounding")
    kv_cache_dtype: str = option("auto", "vLLM's KV-cache dtype (auto = the model's; fp8 on GPUs that have it)")
    engine_args: list[str] = option([], "any other argument of vLLM's AsyncEngineArgs as 'name=value' (the value "
                                        "read as YAML), e.g. [block_size=32, max_num_batched_tokens=4096]; an "
                                        "unknown name fails before Ray with the closest valid one")
    verify_weights: bool = option(False, "after every weight sync compare a checksum of every tensor each replica "
                                         "loaded with the trainer's (gathers the whole policy on the driver: small "
                                         "models and debugging)")


@dataclass
class RolloutConfig:
    n: int = option(4, "responses sampled per prompt (the group size of GRPO-family estimators)", gt=0)
    temperature: float = option(1.0, "sampling temperature; the trainer's log-probs use the same", gt=0.0)
    top_p: float = option(1.0, "nucleus sampling threshold", gt=0.0, le=1.0)
    top_k: int = option(-1, "top-k sampling; -1 disables", ge=1, also_allowed=(-1,))
    ignore_eos: bool = option(False, "keep generating after EOS up to the token budget (benchmarks)")
    length_distribution: str = option(
        "", "benchmark workloads: per-request token budgets, 'N', 'LOW:HIGH' or 'lognormal:MEDIAN:CAP[:SIGMA]' "
            "(capped at data.max_response_length; with ignore_eos every request generates its budget); "
            "empty = every request may use data.max_response_length")
    seed: int = option(0, "base seed of per-request sampling seeds", ge=0, le=MAX_SEED)
    max_num_seqs: int = option(256, "maximum sequences decoded together by one engine", gt=0)
    max_num_batched_tokens: int = option(8192, "maximum tokens in one engine forward (prefill chunk)", gt=0)
    block_size: int = option(16, "tokens per KV-cache block. The CUDA decode kernel takes powers of two from 16; "
                                 "other sizes decode with the Triton kernel (a multiple of its tile, 128 positions "
                                 "at head dimension 64, makes it read each tile from one block); larger blocks only "
                                 "waste KV memory, every sequence holding whole blocks", gt=0, le=MAX_BLOCK_SIZE)
    gpu_memory_utilization: float = option(
        0.5, "fraction of device memory the engine may take on GPU, weights included", gt=0.0, le=1.0)
    cpu_kv_cache_mb: int = option(
        0, "KV-cache byte budget of the engine on CPU, in MiB; 0 sizes it for rollout.max_num_seqs sequences of the "
           "model's context within an eighth of the memory available at start (16 MiB to 4 GiB)", ge=0)
    enable_prefix_caching: bool = option(
        True, "asyncrl's engine reuses the KV of prompt prefixes computed before by the same weights (a group's "
              "samples, an agent's turns, resumed requests); outputs are the same with it off")
    enforce_eager: bool = option(False, "disable CUDA graphs and torch.compile in the engine (eager decode steps)")
    decode_attention: DecodeAttention = option(
        "auto", "decode-attention kernel on GPU: cuda = the CUDA C++ kernel (built on first use with the CUDA "
                "toolkit, nvcc and ninja; an error where it cannot be), triton = the Triton kernel, auto = cuda "
                "where it builds, else triton with a warning")
    decode_products: DecodeProducts = option(
        "auto", "decode layers on GPU: fused = four fused CUDA products per layer around attention (norms, bias, "
                "SiLU x up and residual adds folded in; Hopper, bf16 and decode_attention=cuda only, built on first "
                "use; an error where they cannot run), torch = the model's layers (compiled), auto = fused where "
                "they run, else torch with a warning")
    backend: str = option("auto", "rollout backend (asyncrl.rollout.ROLLOUT_BACKENDS; verl: rollout.name); auto = "
                                  "colocated in trainer.mode=sync, ray_replicas otherwise",
                          choices="rollout backend", also_allowed=("auto",))
    n_gpus_per_node: int = option(1, "rollout devices per node in separated modes (CPU slots on CPU)", gt=0)
    max_replica_restarts: int = option(3, "times Ray restarts a rollout replica that died (fully_async then "
                                          "re-syncs its weights and re-queues its requests)", ge=0)
    max_replica_failures: int = option(3, "a rollout replica that fails this many times in a row (dies mid-request "
                                          "or is found restarted at a weight sync) is retired at the next sync, "
                                          "naming it, and the run goes on with the others", gt=0)
    nnodes: int = option(1, "rollout nodes in separated modes", gt=0)
    val_kwargs: ValSamplingConfig = section(ValSamplingConfig, "sampling used for validation")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "multi-turn agentic rollouts with tools")
    agent: AgentConfig = section(AgentConfig, "bring your own agent: an openai-client agent trained through a "
                                                   "recording endpoint")
    external: ExternalRolloutConfig = section(ExternalRolloutConfig, "OpenAI-compatible servers as rollout workers "
                                                                     "(rollout.backend=external)")
    vllm: VllmConfig = section(VllmConfig, "vLLM engines as rollout replicas (rollout.backend=vllm, docs/vllm.md)")
