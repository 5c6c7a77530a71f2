"""The typed config tree of asyncrl: every key, its default and its meaning, in one place.

Leaf names follow verl where verl has one (`rollout.n`, `actor.ppo_mini_batch_size`,
`algorithm.adv_estimator`, `async_training.staleness_threshold`, ...), without verl's
`actor_rollout_ref.` prefix. Counts of prompts and counts of responses are kept apart in the help texts:
`data.train_batch_size` and `actor.ppo_mini_batch_size` count prompts, micro-batch sizes count rows
(responses). Build a config with `asyncrl.config.load_config`; cross-field rules live in `invariants.py`.
A key that names an algorithm (estimator, loss, KL estimator, aggregation, correction level) takes its valid
names from that family's registry in `asyncrl.algos` (`choices=`), never from a list here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from asyncrl.algos import (ADVANTAGE_ESTIMATORS, CORRECTION_LEVELS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES,
                           REJECTION_LEVELS, ROLLOUT_CORRECTION_PRESETS)
from asyncrl.config.fields import option, section

Mode = Literal["sync", "one_step_off", "fully_async"]

# The longest wait any timeout may ask for. The operating system's poll, which the reward processes are waited
# on with, takes at most 2**31 - 1 milliseconds (24.8 days); a round bound below it, for every timeout alike.
MAX_WAIT_S = 1e6
# The largest KV-cache block. Larger blocks decode no faster (the Triton kernel's largest tile is 512
# positions, at head dimension 16; the CUDA kernel's is 16) and waste KV memory, since every sequence holds
# whole blocks: a huge one leaves no block at all within the cache budget, which an engine finds only once
# it starts.
MAX_BLOCK_SIZE = 512
# Seeds: numpy takes non-negative ones only; the trainer derives per-step seeds as seed x 100019 + step,
# which stays within torch's 64 bits below this bound.
MAX_SEED = 2**32 - 1
# Memory limits become bytes for setrlimit, a signed 64-bit number; 2**30 MiB (1 PiB) is far below it.
MAX_MEMORY_MB = 2**30
DecodeAttention = Literal["auto", "triton", "cuda"]
# What dynamic sampling compares within a group (verl's algorithm.filter_groups.metric): see FilterGroupsConfig.
FilterMetric = Literal["acc", "score", "seq_reward"]
DecodeProducts = Literal["auto", "fused", "torch"]


# The projections LoRA can adapt (model.target_modules), in layer order; "all-linear" means all of them.
LORA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelConfig:
    path: str = option("", "HF-format model folder (config.json, safetensors, tokenizer files) of the policy")
    tokenizer_path: str = option("", "tokenizer folder; empty means model.path")
    dtype: Literal["auto", "float32", "bfloat16"] = option(
        "auto", "parameter dtype of the engine and of mixed precision: auto = bfloat16 on GPU, float32 on CPU")
    gradient_checkpointing: bool = option(False, "recompute each decoder layer's activations in backward")
    compile: bool = option(True, "torch.compile each decoder layer around its attention kernel on CUDA, in the "
                                 "trainer and the engine (fused norms, rotary, activation); ignored on CPU")
    lora_rank: int = option(0, "rank of the LoRA adapters trained on the policy's projections (docs/lora.md); 0 "
                               "trains every weight", ge=0)
    lora_alpha: float = option(16.0, "LoRA scale numerator: an adapter's output is multiplied by "
                                     "lora_alpha / lora_rank", gt=0.0)
    target_modules: list[str] = option(["all-linear"], "projections that get adapters: all-linear (q/k/v/o and "
                                                       "gate/up/down) or a list of q_proj, k_proj, v_proj, o_proj, "
                                                       "gate_proj, up_proj, down_proj")
    lora_dropout: float = option(0.0, "dropout on an adapter's input in training (as PEFT's lora_dropout)",
                                 ge=0.0, lt=1.0)
    lora_init: Literal["gaussian", "kaiming"] = option(
        "gaussian", "initial A of each adapter: gaussian = N(0, 1/r), kaiming = kaiming-uniform (PEFT's default); "
                    "B starts at zero, so the first policy is the base model")


@dataclass
class DataConfig:
    train_files: list[str] = option([], "training prompt files (.parquet or .jsonl, verl schema)")
    val_files: list[str] = option([], "validation prompt files (.parquet or .jsonl, verl schema)")
    prompt_key: str = option("prompt", "column holding the chat messages of a prompt")
    max_prompt_length: int = option(128, "maximum prompt length in tokens, chat template included", gt=0)
    max_response_length: int = option(64, "maximum number of generated tokens per response", gt=0)
    train_batch_size: int = option(
        16, "prompts per training step in sync and one_step_off (each generates rollout.n responses); fully_async "
            "steps train actor.ppo_mini_batch_size x async_training.require_batches prompts instead", gt=0)
    val_batch_size: int = option(256, "prompts per validation generation call", gt=0)
    filter_overlong_prompts: bool = option(
        True, "drop prompts longer than max_prompt_length (counted and logged); false applies data.truncation")
    truncation: Literal["error", "left", "right"] = option(
        "error", "what to do with an overlong prompt when filtering is off: fail, or keep its left/right part")
    shuffle: bool = option(True, "shuffle the training prompts every epoch")
    seed: int = option(1, "seed of the training-prompt order", ge=0, le=MAX_SEED)
    apply_chat_template: bool = option(True, "format prompts with the tokenizer's chat template")
    chat_template_fallback: Literal["error", "plain"] = option(
        "error", "when the tokenizer has no chat template: error = fail naming the tokenizer folder, plain = "
                 "format prompts as 'role: content' lines ending in 'assistant: '")
    special_tokens_in_content: Literal["error", "escape", "allow"] = option(
        "error", "the text of a tokenizer special token (e.g. '<|im_end|>', the EOS text) inside a prompt message: "
                 "error = refuse the row, escape = encode it as plain text, allow = keep it a control token")
    max_unrepresentable_char_fraction: float = option(
        0.01, "warn when more than this fraction of the prompt characters cannot be represented by the tokenizer "
              "(they become its unknown token or vanish in an encode/decode round trip)", ge=0.0, le=1.0)


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
    format: str = option("hermes", "tool-call format the model writes, a name registered in "
                                   "asyncrl.rollout.agent.TOOL_CALL_PARSERS: hermes = <tool_call>{\"name\": ..., "
                                   "\"arguments\": {...}}</tool_call> (Qwen2.5)")
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
    reload_endpoint: str = option("/update_weights_from_disk", "POST route that reloads weights from an HF folder, "
                                  "body {model_path, weight_version} (asyncrl serve and SGLang's name)")
    weights_dir: str = option("", "folder the policy is written to for the servers to reload (they must read it: "
                                  "same machine or a shared file system); empty = <trainer.output_dir>/"
                                  "external_weights")
    verify_weights: bool = option(False, "after every reload compare each server's GET /weights_checksum (asyncrl "
                                         "serve) with the written folder's, and fail on a difference")


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
    cpu_kv_cache_mb: int = option(256, "KV-cache byte budget of the engine on CPU, in MiB", gt=0)
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
    backend: str = option(
        "auto", "rollout backend, a name registered in asyncrl.rollout.ROLLOUT_BACKENDS (verl: rollout.name): "
                "colocated = an engine inside each trainer rank, ray_replicas = Ray replica actors on devices of "
                "their own, external = OpenAI-compatible HTTP servers (rollout.external); auto = colocated in "
                "trainer.mode=sync, ray_replicas otherwise")
    n_gpus_per_node: int = option(1, "rollout devices per node in separated modes (CPU slots on CPU)", gt=0)
    max_replica_restarts: int = option(3, "times Ray restarts a rollout replica that died (fully_async then "
                                          "re-syncs its weights and re-queues its requests)", ge=0)
    nnodes: int = option(1, "rollout nodes in separated modes", gt=0)
    val_kwargs: ValSamplingConfig = section(ValSamplingConfig, "sampling used for validation")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "multi-turn agentic rollouts with tools")
    agent: AgentConfig = section(AgentConfig, "bring your own agent: an openai-client agent trained through a "
                                                   "recording endpoint")
    external: ExternalRolloutConfig = section(ExternalRolloutConfig, "OpenAI-compatible servers as rollout workers "
                                                                     "(rollout.backend=external)")


@dataclass
class OptimConfig:
    lr: float = option(1e-6, "peak learning rate; 0 computes gradients and metrics without moving the weights",
                       ge=0.0)
    betas: list[float] = option([0.9, 0.999], "AdamW betas (beta1, beta2): decay rates of the gradient's moving "
                                              "averages", ge=0.0, lt=1.0)
    eps: float = option(1e-8, "AdamW epsilon", gt=0.0)
    weight_decay: float = option(0.01, "AdamW weight decay", ge=0.0)
    lr_warmup_steps: int = option(-1, "linear warmup steps; -1 uses lr_warmup_steps_ratio", ge=-1)
    lr_warmup_steps_ratio: float = option(0.0, "warmup as a fraction of the total steps", ge=0.0, le=1.0)
    lr_scheduler_type: Literal["constant", "cosine"] = option("constant", "schedule after warmup")
    min_lr_ratio: float = option(0.0, "cosine floor as a fraction of lr", ge=0.0, le=1.0)
    total_training_steps: int = option(
        -1, "updates the LR schedule spans; -1 = the run's own length (its training steps: one update each)", ge=1,
        also_allowed=(-1,))


@dataclass
class PolicyLossConfig:
    loss_mode: str = option("vanilla", "policy loss", choices=POLICY_LOSSES)
    clip_cov_ratio: float = option(2e-4, "clip_cov: fraction of tokens detached", ge=0.0, le=1.0)
    clip_cov_lb: float = option(1.0, "clip_cov: lower covariance bound (below clip_cov_ub)")
    clip_cov_ub: float = option(5.0, "clip_cov: upper covariance bound")
    kl_cov_ratio: float = option(2e-4, "kl_cov: fraction of tokens penalised", ge=0.0, le=1.0)
    ppo_kl_coef: float = option(0.1, "kl_cov: coefficient of the |log-ratio| penalty", ge=0.0)
    tau_pos: float = option(1.0, "sapo: temperature of the soft gate on tokens with a positive advantage", gt=0.0)
    tau_neg: float = option(1.05, "sapo: temperature of the soft gate on tokens with a zero or negative advantage "
                                  "(above tau_pos: damped sooner)", gt=0.0)


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = option(16, "prompts per optimizer step (x rollout.n rows)", gt=0)
    ppo_micro_batch_size_per_gpu: int = option(16, "rows per forward/backward on one rank", gt=0)
    use_dynamic_bsz: bool = option(False, "pack micro-batches by a token budget instead of a row count")
    ppo_max_token_len_per_gpu: int = option(16384, "token budget of one dynamic micro-batch", gt=0)
    log_prob_micro_batch_size_per_gpu: int = option(32, "rows per forward when computing log-probs", gt=0)
    ppo_epochs: int = option(1, "passes over each training batch", gt=0)
    shuffle: bool = option(True, "shuffle rows into mini-batches every epoch")
    clip_ratio_low: float = option(0.2, "PPO lower clip epsilon", ge=0.0)
    clip_ratio_high: float = option(0.2, "PPO upper clip epsilon", ge=0.0)
    clip_ratio_c: float = option(3.0, "dual-clip bound for negative advantages", gt=1.0)
    loss_agg_mode: str = option("token-mean", "how per-token losses reduce to a scalar", choices=LOSS_AGG_MODES)
    policy_loss: PolicyLossConfig = section(PolicyLossConfig, "policy loss choice and its knobs")
    entropy_coeff: float = option(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = option(False, "add a KL(actor || ref) term to the loss")
    kl_loss_coef: float = option(0.001, "coefficient of the KL loss", ge=0.0)
    kl_loss_type: str = option("low_var_kl", "KL estimator of the loss", choices=KL_ESTIMATORS)
    grad_clip: float = option(1.0, "global gradient-norm clip; <= 0 disables")
    cuda_graphs: bool = option(
        False, "one trainer rank: each update micro-batch packed at a fixed capacity and replayed from a CUDA "
               "graph (no FSDP; bf16 copies of the fp32 masters; AdamW as one Triton kernel over flat buffers, "
               "torch's AdamW state format); on CPU the same packed step, run eagerly, and torch's AdamW")
    optim: OptimConfig = section(OptimConfig, "actor optimizer")


@dataclass
class CriticOptimDefaults(OptimConfig):
    lr: float = option(1e-5, "peak learning rate; 0 computes gradients and metrics without moving the weights",
                       ge=0.0)


@dataclass
class CriticConfig:
    enable: Optional[bool] = option(
        None, "train a value model; null = set when the config loads: true when the advantage estimator needs a "
              "critic")
    model_path: str = option("", "folder to initialise the critic from; empty means model.path")
    ppo_mini_batch_size: int = option(16, "prompts per critic optimizer step", gt=0)
    ppo_micro_batch_size_per_gpu: int = option(16, "rows per critic forward/backward on one rank", gt=0)
    ppo_epochs: int = option(1, "critic passes over each training batch", gt=0)
    cliprange_value: float = option(0.5, "value clipping range around the old values", ge=0.0)
    loss_agg_mode: str = option("token-mean", "how per-token value losses reduce to a scalar",
                                choices=LOSS_AGG_MODES)
    grad_clip: float = option(1.0, "global gradient-norm clip; <= 0 disables")
    optim: CriticOptimDefaults = section(CriticOptimDefaults, "critic optimizer")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = option(32, "rows per forward of the reference policy", gt=0)


@dataclass
class KLControlConfig:
    type: Literal["fixed", "adaptive"] = option("fixed", "KL-in-reward coefficient controller")
    kl_coef: float = option(0.001, "initial (or fixed) KL coefficient", ge=0.0)
    target_kl: float = option(0.1, "adaptive controller: target KL", gt=0.0)
    horizon: int = option(10000, "adaptive controller: horizon in samples", gt=0)


@dataclass
class RolloutCorrectionConfig:
    preset: Optional[str] = option(
        None, "a named setting of every other key of this section (the reference system's presets); the loader "
              "applies it first, and keys set explicitly win; null = none", choices=ROLLOUT_CORRECTION_PRESETS)
    bypass_mode: bool = option(
        True, "true: old log-probs = rollout log-probs (two policies); false: decoupled, the trainer "
              "recomputes the proximal policy's log-probs (three policies)")
    loss_type: Literal["ppo_clip", "reinforce"] = option(
        "ppo_clip", "bypass mode only: PPO clip against the rollout policy, or importance-weighted REINFORCE")
    rollout_is: Optional[str] = option(None, "importance-weight level; null = none", choices=CORRECTION_LEVELS)
    rollout_is_threshold: float = option(2.0, "upper truncation of the importance weights", gt=0.0)
    rollout_is_batch_normalize: bool = option(False, "divide the truncated weights by their batch mean")
    rollout_rs: Optional[str] = option(
        None, "rejection level: a ratio level (token, sequence, geometric) kept within [rs_threshold_lower, "
              "rs_threshold], or a KL estimate (k2 / k3, per token or per sequence) kept up to rs_threshold; "
              "null = none", choices=REJECTION_LEVELS)
    rollout_rs_threshold: Optional[float] = option(
        None, "reject when the ratio, or the KL estimate of a k2 / k3 level, exceeds this", gt=0.0)
    rollout_rs_threshold_lower: Optional[float] = option(
        None, "ratio levels: reject when the ratio is below this (null = 1 / rollout_rs_threshold); k2 / k3 levels "
              "take none", gt=0.0)


@dataclass
class FilterGroupsConfig:
    enable: bool = option(
        False, "dynamic sampling (DAPO): drop the groups whose rollout.n responses all got the same `metric` (a "
               "group estimator gives them no advantage) and keep generating until a step has its groups: "
               "data.train_batch_size in sync and one_step_off, R = actor.ppo_mini_batch_size x "
               "async_training.require_batches in fully_async")
    metric: FilterMetric = option(
        "acc", "what must vary within a group: acc = the `acc` value of a reward function's dict result, else its "
               "score; score = the reward function's score; seq_reward = the trained reward (score plus the "
               "overlong penalty)")
    max_num_gen_batches: int = option(
        0, "generation batches one step may use before the run stops with an error (the data is too easy or too "
           "hard): batches of data.train_batch_size prompts in sync and one_step_off, of R prompts in fully_async; "
           "0 = no limit", ge=0)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = option("grpo", "advantage estimator", choices=ADVANTAGE_ESTIMATORS)
    gamma: float = option(1.0, "discount factor", ge=0.0, le=1.0)
    lam: float = option(1.0, "GAE lambda", ge=0.0, le=1.0)
    norm_adv_by_std_in_grpo: bool = option(True, "GRPO: divide by the group std (false = Dr.GRPO)")
    use_kl_in_reward: bool = option(False, "subtract a KL(old || ref) penalty from the token rewards")
    kl_penalty: str = option("kl", "KL estimator of the reward penalty", choices=KL_ESTIMATORS)
    kl_ctrl: KLControlConfig = section(KLControlConfig, "KL-in-reward coefficient")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "off-policy correction between the rollout and the old/proximal policy")
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, "dynamic sampling: train only groups whose rewards vary (every mode)")


@dataclass
class OverlongBufferConfig:
    enable: bool = option(
        False, "DAPO's soft overlong punishment: a training response longer than data.max_response_length - len "
               "tokens gets (length - (data.max_response_length - len)) / len x penalty_factor subtracted from its "
               "reward, penalty_factor at the full budget (every mode; validation scores are not shaped)")
    len: int = option(0, "the buffer: how many of the last tokens of data.max_response_length are penalised, "
                         "linearly (0 < len <= data.max_response_length when enabled)", ge=0)
    penalty_factor: float = option(1.0, "the penalty of a response that uses the whole token budget", ge=0.0)


# The judge's user message when reward.model.prompt_template is not set.
DEFAULT_JUDGE_TEMPLATE = ("Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
                          "Is the response correct? Answer 1 for yes, 0 for no.")


@dataclass
class RewardModelConfig:
    enable: bool = option(
        False, "score every response with a reward model too (Ray actors, in every mode), combined with the rule "
               "score as reward.model.combine says; verl's reward_model.enable")
    kind: Literal["discriminative", "generative"] = option(
        "discriminative", "discriminative = an HF *ForSequenceClassification folder with one label (what "
                          "AutoModelForSequenceClassification.save_pretrained writes), scored at the last token of "
                          "the prompt and response in its tokenizer's chat template; generative = a causal LM judge "
                          "that answers reward.model.prompt_template greedily on our engine, its answer read by "
                          "reward.model.answer_parser")
    path: str = option("", "HF folder of the reward model or judge, with its own tokenizer files (required when "
                           "enabled); verl's reward_model.model.path")
    weight: float = option(1.0, "factor on the model's score before it is combined with the rule score")
    combine: Literal["sum", "model_only", "rule_if_model_failed"] = option(
        "sum", "sum = rule score + weight x model score; model_only = weight x model score (the rule score is "
               "still computed and logged as reward/rule/mean); rule_if_model_failed = weight x model score, or "
               "the rule score where the model's call failed. A failed call's model score is 0 either way")
    num_workers: int = option(1, "reward-model actors; each scoring call's batch is split among them", gt=0)
    num_cpus_per_worker: float = option(0.1, "CPUs Ray reserves for each actor (a fraction on CPU)", gt=0.0)
    num_gpus_per_worker: float = option(
        0.0, "GPU share of each actor: 1 = a device of its own, a fraction to share one the trainer and rollout "
             "pools do not hold; 0 runs the model on CPU", ge=0.0, le=1.0)
    micro_batch_size_per_gpu: int = option(
        16, "samples per forward pass of a discriminative model (a judge generates its whole share at once)", gt=0)
    max_length: Optional[int] = option(
        None, "tokens of a discriminative model's input (a longer one keeps its last tokens, where the score is "
              "read) and of a judge's prompt (a longer one scores 0 as an error); null = the model's "
              "max_position_embeddings", gt=1)
    timeout_s: float = option(
        60.0, "limit on one scoring call to the actors; the samples of an actor past it score 0 as timeouts "
              "(reward/model_timeouts) and the actor is restarted", gt=0.0, le=MAX_WAIT_S)
    prompt_template: str = option(
        DEFAULT_JUDGE_TEMPLATE, "generative: the judge's user message; {prompt} (the prompt's user text), "
                                "{response} and {ground_truth} are filled in (write {{ and }} for braces)")
    answer_parser: str = option(
        "number", "generative: how the judge's answer becomes a score: number (the first number in it), yes_no "
                  "(yes -> 1, no -> 0), or 'path/to/file.py:function' taking the answer text and returning a "
                  "number (None: unparsable). An unparsable answer scores 0 and counts in reward/model_errors")
    max_new_tokens: int = option(16, "generative: token budget of the judge's greedy answer", gt=0)


@dataclass
class RewardConfig:
    custom_function: str = option(
        "", "user scorer 'path/to/file.py:function' or 'package.module:function'; empty = built-in "
            "scorer chosen by each row's data_source")
    timeout_s: float = option(10.0, "per-sample time limit; a scorer past it scores 0 and is counted", gt=0.0,
                              le=MAX_WAIT_S)
    num_workers: int = option(1, "scoring processes (capped at 4 per CPU, with a warning)", gt=0)
    import_timeout_s: float = option(
        120.0, "time a scoring process may take to import the reward function; a file that hangs, exits or "
               "raises at import fails the run before Ray starts, naming the file", gt=0.0, le=MAX_WAIT_S)
    max_batch_s: Optional[float] = option(
        None, "cap on one scoring call over a batch; samples left at the cap score 0 as timeouts; null = none",
        gt=0.0, le=MAX_WAIT_S)
    max_memory_mb: Optional[int] = option(
        None, "memory limit of each scoring process (Linux); a scorer past it scores 0 and is counted; "
              "null = none", gt=0, le=MAX_MEMORY_MB)
    max_cpu_s: Optional[int] = option(
        None, "CPU seconds a scoring process may spend on one sample (Linux); past it the process is "
              "replaced and the sample scores 0; null = none", gt=0, le=int(MAX_WAIT_S))
    overlong_buffer: OverlongBufferConfig = section(
        OverlongBufferConfig, "reward shaping of responses that approach the token budget (DAPO)")
    model: RewardModelConfig = section(
        RewardModelConfig, "a discriminative reward model or a generative judge, combined with the rule score")


@dataclass
class TrainerConfig:
    mode: Mode = option("sync", "sync (colocated), one_step_off, or fully_async")
    project_name: str = option("asyncrl", "tracker project name")
    experiment_name: str = option("run", "tracker run name")
    output_dir: str = option("outputs/run", "run folder: config.yaml, metrics.jsonl, checkpoints, plots, ...")
    total_epochs: int = option(1, "passes over the training prompts", gt=0)
    total_steps: int = option(-1, "stop after this many training steps; -1 = run all epochs", ge=1,
                              also_allowed=(-1,))
    test_freq: int = option(-1, "validate every N steps; <= 0 validates only before and after training")
    val_before_train: bool = option(True, "validate before the first step")
    save_freq: int = option(-1, "checkpoint every N steps; <= 0 saves only at the end")
    max_checkpoints: int = option(3, "checkpoints kept; older ones are deleted", gt=0)
    resume: str = option("auto", "auto (latest checkpoint under output_dir, if any), disable, or a checkpoint "
                                 "folder (output_dir/checkpoints/step_N), which must exist")
    seed: int = option(1, "seed of model init, dropout-free training order and sampling", ge=0, le=MAX_SEED)
    device: Literal["auto", "cpu", "cuda"] = option(
        "auto", "auto = cuda when available; cuda fails before Ray starts when the driver sees no CUDA device and "
                "ray.address is empty (a cluster joined through ray.address may have GPUs the driver lacks: its "
                "workers check their own)")
    n_gpus_per_node: int = option(1, "trainer devices per node (CPU slots on CPU)", gt=0)
    nnodes: int = option(1, "trainer nodes", gt=0)
    critic_warmup: int = option(0, "steps that train only the critic", ge=0)
    logger: list[str] = option(["console", "jsonl"], "trackers: console, jsonl, tensorboard, wandb, mlflow")
    dump_rollouts: bool = option(False, "write every step's generations to rollouts/step_N.jsonl")
    log_val_generations: int = option(0, "validation generations printed per validation", ge=0)
    max_consecutive_nonfinite: int = option(
        3, "optimizer steps in a row with a non-finite gradient before the run stops (each is skipped and "
           "counted in actor/num_skipped_steps)", gt=0)


@dataclass
class AsyncTrainingConfig:
    staleness_threshold: float = option(
        0.0, "fully_async freshness budget s: at most (1+s)*K*R prompts per parameter version", ge=0.0)
    trigger_parameter_sync_step: int = option(1, "fully_async: local trainer steps K between weight syncs", gt=0)
    require_batches: int = option(1, "fully_async: mini-batches per local step (R = mini-batch x this)", gt=0)
    partial_rollout: bool = option(False, "fully_async: abort in-flight requests at a sync and resume them after")
    max_concurrent_samples: int = option(0, "fully_async: prompts in flight at once; 0 = derived", ge=0)


@dataclass
class WeightSyncConfig:
    bucket_mb: int = option(256, "bucket size of the bucketed broadcast, MiB", gt=0)
    timeout_s: float = option(120.0, "limit on each step of a weight sync", gt=0.0, le=MAX_WAIT_S)


@dataclass
class RayConfig:
    address: str = option("", "existing Ray cluster to join; empty starts a local one")
    num_cpus: Optional[int] = option(None, "CPUs of the local cluster, a whole number; null = all cores", gt=0)
    rpc_timeout_s: float = option(600.0, "limit on any remote call's result", gt=0.0, le=MAX_WAIT_S)
    trainer_node_resource: str = option(
        "", "custom Ray resource that places the trainer ranks (start their nodes with `ray start --resources "
            "'{\"NAME\": 1}'`); empty = any node")
    rollout_node_resource: str = option(
        "", "custom Ray resource that places the rollout replicas; empty = any node")
    watchdog_s: float = option(
        600.0, "fully_async: no sample reaching the trainer for this long stops the run with every "
               "component's state", gt=0.0, le=MAX_WAIT_S)


@dataclass
class AsyncRLConfig:
    """The whole config tree."""
    model: ModelConfig = section(ModelConfig, "the policy model")
    data: DataConfig = section(DataConfig, "prompt datasets")
    rollout: RolloutConfig = section(RolloutConfig, "generation engine and sampling")
    actor: ActorConfig = section(ActorConfig, "policy training")
    critic: CriticConfig = section(CriticConfig, "value model training")
    ref: RefConfig = section(RefConfig, "reference policy (used when a KL term is on)")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantages, KL and off-policy correction")
    reward: RewardConfig = section(RewardConfig, "reward functions")
    trainer: TrainerConfig = section(TrainerConfig, "the run: mode, length, outputs, devices")
    async_training: AsyncTrainingConfig = section(AsyncTrainingConfig, "fully-async staleness control")
    weight_sync: WeightSyncConfig = section(WeightSyncConfig, "trainer-to-rollout weight transfer")
    ray: RayConfig = section(RayConfig, "Ray cluster and remote-call limits")
