"""Cross-field rules of a config, checked once at start (before any Ray worker exists).

Each rule raises `ConfigError` naming the keys involved and their values. What an algorithm needs (a critic,
groups of responses, a replayable loss) is read from its registry entry's metadata in `asyncrl.algos`, so a
newly registered estimator or loss is checked like a built-in one.

The batch rules hold in every mode, over the prompts one training step trains (`prompts_per_step`):
`data.train_batch_size` in sync and one_step_off, R = actor.ppo_mini_batch_size x
async_training.require_batches in fully_async, where a step takes whole mini-batches from the queue. So in
fully_async an actor mini-batch is never larger than a step (R is a whole number of them) and
`data.train_batch_size` sizes nothing; the critic's mini-batch must divide R as it divides the batch elsewhere.
The rules that differ by mode are the fully_async keys themselves (`check_async`).
"""

from __future__ import annotations

from asyncrl.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, REJECTION_LEVELS
from asyncrl.config.agent_path import check_agent
from asyncrl.config.errors import ConfigError
from asyncrl.config.schema import LORA_PROJECTIONS, AsyncRLConfig

LOGGERS = frozenset({"console", "jsonl", "tensorboard", "wandb", "mlflow"})


def cuda_decode_takes_block_size(block_size: int) -> bool:
    """Whether the CUDA decode-attention kernel reads KV blocks of `block_size` positions: a power of two from
    16 (it walks tiles of 16 positions and finds their blocks by shifts). Other sizes decode with Triton."""
    return block_size >= 16 and block_size & (block_size - 1) == 0


def check_invariants(config: AsyncRLConfig) -> None:
    check_batch_sizes(config)
    check_optimizers(config)
    check_policy_loss(config)
    check_algorithm(config)
    check_rejection(config)
    check_reward_shaping(config)
    check_async(config)
    check_cuda_graphs(config)
    check_lora(config)
    check_decode_attention(config)
    check_length_distribution(config.rollout.length_distribution)
    check_multi_turn(config)
    check_agent(config)
    check_evaluation(config)
    unknown_loggers = sorted(set(config.trainer.logger) - LOGGERS)
    if unknown_loggers:
        raise ConfigError(f"trainer.logger: unknown tracker(s) {unknown_loggers}; valid: {sorted(LOGGERS)}")
    if not config.trainer.resume:
        raise ConfigError("trainer.resume: '' is empty; give auto, disable, or a checkpoint folder")


def check_evaluation(config: AsyncRLConfig) -> None:
    evaluation = config.evaluation
    if not evaluation.enable:
        return
    if not evaluation.data_files and not config.data.val_files:
        raise ConfigError("evaluation.enable needs prompts: set evaluation.data_files, or data.val_files")
    if config.rollout.multi_turn.enable or config.rollout.agent.path:
        raise ConfigError("evaluation.enable generates single responses and cannot run an agent "
                          "(rollout.multi_turn.enable, rollout.agent.path) yet: validate agents with trainer.test_freq")
    too_large = [k for k in evaluation.pass_k if k > evaluation.n]
    if too_large:
        raise ConfigError(f"evaluation.pass_k: {too_large} exceed evaluation.n ({evaluation.n}): pass@k is estimated "
                          f"from the n samples of a prompt, so raise evaluation.n to at least {max(too_large)}")


def prompts_per_step(config: AsyncRLConfig) -> int:
    """Prompts one training step trains: R = actor.ppo_mini_batch_size x async_training.require_batches in
    fully_async, data.train_batch_size in the other modes. What counts a run's steps (the learning-rate
    schedule's length) divides the prompts by this."""
    if config.trainer.mode == "fully_async":
        return config.actor.ppo_mini_batch_size * config.async_training.require_batches
    return config.data.train_batch_size


def step_batch_text(config: AsyncRLConfig) -> str:
    """The key (or product of keys) that sets `prompts_per_step` in this mode, for messages."""
    if config.trainer.mode == "fully_async":
        return ("the prompts of a fully_async step, actor.ppo_mini_batch_size x async_training.require_batches "
                f"= {prompts_per_step(config)}")
    return f"data.train_batch_size ({config.data.train_batch_size})"


def step_meaning(config: AsyncRLConfig) -> str:
    """What one training step is in this mode, for the console and the docs: the same data makes twice as many
    fully_async steps as sync steps when R is half of data.train_batch_size."""
    actor, prompts = config.actor, prompts_per_step(config)
    num_updates = prompts // actor.ppo_mini_batch_size * actor.ppo_epochs
    if config.trainer.mode == "fully_async":
        source = (f"R = actor.ppo_mini_batch_size x async_training.require_batches = {actor.ppo_mini_batch_size} x "
                  f"{config.async_training.require_batches} = {prompts} prompts from the rollouter's queue")
        push = (f"the weights are pushed every async_training.trigger_parameter_sync_step = "
                f"{config.async_training.trigger_parameter_sync_step} steps")
    else:
        source = f"data.train_batch_size = {prompts} prompts"
        push = "the weights are pushed after every step"
    return (f"a {config.trainer.mode} step trains {source} x rollout.n = {config.rollout.n} responses, in "
            f"{num_updates} optimizer update{'' if num_updates == 1 else 's'} (mini-batches of "
            f"actor.ppo_mini_batch_size = {actor.ppo_mini_batch_size} prompts, actor.ppo_epochs = "
            f"{actor.ppo_epochs}); {push}")


def check_batch_sizes(config: AsyncRLConfig) -> None:
    actor, critic = config.actor, config.critic
    prompts = prompts_per_step(config)
    # Never true in fully_async, where R is a whole number of actor mini-batches by its definition.
    if prompts % actor.ppo_mini_batch_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size must divide data.train_batch_size, got "
            f"{actor.ppo_mini_batch_size} and {prompts}: each step's prompts split into whole mini-batches, one "
            f"optimizer step each")
    if needs_critic(config) and prompts % critic.ppo_mini_batch_size:
        raise ConfigError(
            f"critic.ppo_mini_batch_size ({critic.ppo_mini_batch_size}) must divide {step_batch_text(config)}: "
            f"each step's prompts split into whole critic mini-batches")
    world_size = config.trainer.n_gpus_per_node * config.trainer.nnodes
    rows = actor.ppo_mini_batch_size * config.rollout.n
    if rows % world_size:
        raise ConfigError(
            f"actor.ppo_mini_batch_size x rollout.n ({rows} rows) must be divisible by the trainer world size "
            f"trainer.n_gpus_per_node x trainer.nnodes = {world_size}")


def check_optimizers(config: AsyncRLConfig) -> None:
    for key, optim in (("actor.optim", config.actor.optim), ("critic.optim", config.critic.optim)):
        if len(optim.betas) != 2:
            raise ConfigError(f"{key}.betas must hold two numbers (beta1, beta2), got {optim.betas}")


def check_policy_loss(config: AsyncRLConfig) -> None:
    policy_loss = config.actor.policy_loss
    if policy_loss.clip_cov_lb >= policy_loss.clip_cov_ub:
        # clip_cov picks tokens whose covariance lies between the two: an empty range would pick none, silently.
        raise ConfigError(f"actor.policy_loss.clip_cov_lb ({policy_loss.clip_cov_lb}) must be below "
                          f"actor.policy_loss.clip_cov_ub ({policy_loss.clip_cov_ub})")


def check_algorithm(config: AsyncRLConfig) -> None:
    algorithm = config.algorithm
    name = algorithm.adv_estimator
    estimator = ADVANTAGE_ESTIMATORS.spec(name)
    if estimator.needs_groups and config.rollout.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={name} compares responses within a group and needs rollout.n >= 2, got "
            f"rollout.n={config.rollout.n}")
    if estimator.needs_critic and config.critic.enable is False:
        raise ConfigError(f"algorithm.adv_estimator={name} needs a critic, but critic.enable=false")
    if algorithm.filter_groups.enable and not estimator.needs_groups:
        # Dynamic sampling keeps groups whose rewards vary: only a group estimator gives the others no advantage.
        grouped = [spec.name for spec in ADVANTAGE_ESTIMATORS.specs() if spec.needs_groups]
        raise ConfigError(f"algorithm.filter_groups.enable drops the groups whose rewards do not vary, which only a "
                          f"group estimator ignores; algorithm.adv_estimator={name} is none: use one of "
                          f"{', '.join(grouped)}, or filter_groups.enable=false")


def check_rejection(config: AsyncRLConfig) -> None:
    """A ratio level keeps a band [lower, upper] (one bound may be implied); a KL level (k2 / k3) bounds an estimate
    that is never negative, from above only."""
    correction = config.algorithm.rollout_correction
    level, lower, upper = correction.rollout_rs, correction.rollout_rs_threshold_lower, correction.rollout_rs_threshold
    if level is None:
        return
    if REJECTION_LEVELS.spec(level).is_divergence:
        if upper is None or lower is not None:
            raise ConfigError(f"algorithm.rollout_correction.rollout_rs={level} bounds a KL estimate from above only: "
                              f"set rollout_rs_threshold and leave rollout_rs_threshold_lower null, got "
                              f"rollout_rs_threshold={upper}, rollout_rs_threshold_lower={lower}")
        return
    if lower is None and upper is None:
        raise ConfigError(f"algorithm.rollout_correction.rollout_rs={level} is set but neither rollout_rs_threshold "
                          f"nor rollout_rs_threshold_lower is; set one of them")
    if lower is not None and upper is not None and lower >= upper:
        raise ConfigError(f"algorithm.rollout_correction.rollout_rs_threshold_lower ({lower}) must be below "
                          f"rollout_rs_threshold ({upper})")


def check_reward_shaping(config: AsyncRLConfig) -> None:
    overlong, budget = config.reward.overlong_buffer, config.data.max_response_length
    if overlong.enable and not 0 < overlong.len <= budget:
        raise ConfigError(f"reward.overlong_buffer.len must be within 1 .. data.max_response_length ({budget}) when "
                          f"reward.overlong_buffer.enable=true, got {overlong.len}: the penalty rises over the last "
                          f"len tokens of the budget")


def check_async(config: AsyncRLConfig) -> None:
    """The two keys that ask for stale or resumed samples are refused outside fully_async: a sync or one_step_off
    run would silently deliver neither. The keys that only shape the fully_async queue (K, require_batches,
    max_concurrent_samples) are accepted and unused elsewhere, so that one config runs in every mode (`asyncrl
    bench modes` sets require_batches for all of them)."""
    asynchronous = config.async_training
    if config.trainer.mode != "fully_async" and (asynchronous.partial_rollout or asynchronous.staleness_threshold):
        raise ConfigError(
            f"async_training.partial_rollout / staleness_threshold only apply to trainer.mode=fully_async, "
            f"got trainer.mode={config.trainer.mode} with partial_rollout={asynchronous.partial_rollout}, "
            f"staleness_threshold={asynchronous.staleness_threshold}")


def check_cuda_graphs(config: AsyncRLConfig) -> None:
    """actor.cuda_graphs replays a fixed, capturable step on one rank: what it cannot replay fails here."""
    if not config.actor.cuda_graphs:
        return
    world_size = config.trainer.n_gpus_per_node * config.trainer.nnodes
    if world_size > 1:
        raise ConfigError(f"actor.cuda_graphs needs one trainer rank (it replaces FSDP with fixed-address weight "
                          f"copies), got trainer.n_gpus_per_node x trainer.nnodes = {world_size}")
    loss_mode = config.actor.policy_loss.loss_mode
    host_read = POLICY_LOSSES.spec(loss_mode).host_read
    if host_read is not None:
        capturable = [spec.name for spec in POLICY_LOSSES.specs() if spec.capturable]
        raise ConfigError(f"actor.cuda_graphs: actor.policy_loss.loss_mode={loss_mode} reads the host ({host_read}), "
                          f"which a CUDA graph cannot replay; use one of {', '.join(capturable)}")
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode and (correction.rollout_is is not None or correction.rollout_rs is not None):
        raise ConfigError("actor.cuda_graphs: the bypass-mode correction of algorithm.rollout_correction "
                          "(rollout_is / rollout_rs) runs per micro-batch with host-side checks a CUDA graph cannot "
                          "replay; turn one of them off")
    if config.model.gradient_checkpointing:
        raise ConfigError("actor.cuda_graphs does not recompute activations: set model.gradient_checkpointing=false")


def check_lora(config: AsyncRLConfig) -> None:
    """model.lora_rank > 0: the target names, and the fast paths that run the base weights without adapters."""
    model = config.model
    if model.lora_rank == 0:
        return
    targets = model.target_modules
    unknown = [name for name in targets if name not in LORA_PROJECTIONS]
    if not targets or (targets != ["all-linear"] and unknown):
        raise ConfigError(f"model.target_modules: {targets} names no projection LoRA can adapt ({unknown}); give "
                          f"all-linear or a list of {', '.join(LORA_PROJECTIONS)}")
    if config.actor.cuda_graphs:
        raise ConfigError("model.lora_rank > 0 with actor.cuda_graphs=true: the graphed update trains fixed-address "
                          "copies of every weight and has no adapter path; set actor.cuda_graphs=false")
    if config.rollout.decode_products == "fused":
        raise ConfigError("model.lora_rank > 0 with rollout.decode_products=fused: the fused decode layers multiply "
                          "the stacked base weights and would skip the adapters; use auto or torch (the model's "
                          "layers, adapters included)")


def check_decode_attention(config: AsyncRLConfig) -> None:
    """rollout.decode_attention=cuda asks for the CUDA kernel: a block size it cannot read fails here rather than
    decoding with Triton unannounced ("auto" does that). The fused decode products need that kernel."""
    rollout = config.rollout
    if rollout.decode_attention == "cuda" and not cuda_decode_takes_block_size(rollout.block_size):
        raise ConfigError(f"rollout.decode_attention=cuda reads KV blocks whose size is a power of two from 16, got "
                          f"rollout.block_size={rollout.block_size}; use decode_attention=auto or triton for it")
    if rollout.decode_products == "fused" and rollout.decode_attention == "triton":
        raise ConfigError("rollout.decode_products=fused hands RoPE to the CUDA decode-attention kernel, so it needs "
                          "rollout.decode_attention=cuda or auto, got triton")


def check_length_distribution(text: str) -> None:
    parts = text.split(":") if text else []
    is_number = lambda part: part.isdigit() and int(part) > 0  # noqa: E731
    valid = (not parts or (len(parts) == 1 and is_number(parts[0]))
             or (len(parts) == 2 and all(map(is_number, parts)))
             or (parts[0] == "lognormal" and len(parts) in (3, 4) and is_number(parts[1]) and is_number(parts[2])))
    if not valid:
        raise ConfigError(f"rollout.length_distribution: {text!r} is not 'N', 'LOW:HIGH' or "
                          f"'lognormal:MEDIAN:CAP[:SIGMA]'")


def needs_critic(config: AsyncRLConfig) -> bool:
    """critic.enable when set, else whether the advantage estimator needs critic values (its metadata)."""
    if config.critic.enable is not None:
        return config.critic.enable
    return ADVANTAGE_ESTIMATORS.spec(config.algorithm.adv_estimator).needs_critic


def resolve_critic(config: AsyncRLConfig) -> None:
    """Sets an unset critic.enable from the estimator's metadata. The trainer workers read the config in their
    own processes, where an estimator the user registered in the driver does not exist: the decision travels
    in the config instead of being looked up there."""
    config.critic.enable = needs_critic(config)


def needs_greedy_baseline(config: AsyncRLConfig) -> bool:
    """Whether generation adds one greedy response per prompt (remax's baseline), from the estimator's metadata.
    A process where the estimator is not registered (a user's estimator registered in the driver only, read by
    the fully-async rollouter) generates none; such an estimator that needs one then fails on its missing
    reward_baselines, by name."""
    name = config.algorithm.adv_estimator
    return name in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS.spec(name).needs_greedy_baseline


def needs_reference(config: AsyncRLConfig) -> bool:
    return config.algorithm.use_kl_in_reward or config.actor.use_kl_loss


def check_multi_turn(config: AsyncRLConfig) -> None:
    """Multi-turn rollouts render tool results through the chat template and need a tool file."""
    multi_turn = config.rollout.multi_turn
    if not multi_turn.enable:
        return
    if not multi_turn.tool_config_path:
        raise ConfigError("rollout.multi_turn.enable=true needs rollout.multi_turn.tool_config_path, the YAML file "
                          "of the tools the model may call (docs/agents.md)")
    if not config.data.apply_chat_template:
        raise ConfigError("rollout.multi_turn.enable=true renders tool results through the chat template's tool "
                          "role; data.apply_chat_template=false has none (set it true, with "
                          "data.chat_template_fallback=plain for a tokenizer without a template)")
