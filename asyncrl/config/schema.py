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
from asyncrl.config.distillation_schema import DistillationConfig
from asyncrl.config.evaluation_schema import EvaluationConfig
from asyncrl.config.fields import option, section
from asyncrl.config.limits import MAX_SEED, MAX_WAIT_S
from asyncrl.config.reward_schema import RewardConfig
from asyncrl.config.rollout_schema import RolloutConfig

Mode = Literal["sync", "one_step_off", "fully_async"]

# What dynamic sampling compares within a group (verl's algorithm.filter_groups.metric): see FilterGroupsConfig.
FilterMetric = Literal["acc", "score", "seq_reward"]


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
    router_aux_loss_coef: Optional[float] = option(
        None, "mixture-of-experts models: weight of the load-balancing loss added to the policy loss (docs/moe.md); "
              "null = the model's config.json router_aux_loss_coef (transformers' default 0.001)", ge=0.0)
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
    routing_replay: bool = option(
        False, "mixture-of-experts models: the trainer's forward uses the experts the rollout engine chose for each "
               "token (router probabilities still the trainer's); the routing metrics are logged either way "
               "(docs/moe.md)")
    distillation: DistillationConfig = section(
        DistillationConfig, "on-policy distillation: a teacher's per-token log-probs as a dense advantage (every mode)")


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
    encoding: Literal["auto", "dense", "sparse"] = option(
        "dense", "what a sync to Ray replicas sends (docs/weight-sync.md): dense = every weight; sparse = per "
                 "tensor only the elements whose value in the engine's dtype changed since the last sync (indices "
                 "or a bitmask, dense where that is smaller), the engines end bitwise equal to a dense sync; auto "
                 "= sparse for bf16 engines, dense otherwise. Sparse trades a compare per element on trainer rank 0 "
                 "for bytes: for slow links (across nodes); not timed on GPU yet. Ray replicas only "
                 "(rollout.backend=ray_replicas): the others load whole tensors, and refuse sparse")


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
    evaluation: EvaluationConfig = section(
        EvaluationConfig, "evaluation as its own stage: a pinned policy version on actors of its own, while training "
                          "goes on")
    async_training: AsyncTrainingConfig = section(AsyncTrainingConfig, "fully-async staleness control")
    weight_sync: WeightSyncConfig = section(WeightSyncConfig, "trainer-to-rollout weight transfer")
    ray: RayConfig = section(RayConfig, "Ray cluster and remote-call limits")
