"""DAPO-style dynamic sampling, written only from asyncrl's public stages: a recipe to copy and adapt.

    python examples/dapo_dynamic_sampling.py examples/grpo.yaml model.path=MODEL \
        data.train_files=[data/arith/train.parquet] data.val_files=[data/arith/val.parquet] --max-gen-rounds 8

Why. Under GRPO-family estimators a group whose `rollout.n` responses all get the same reward (all right
or all wrong) has zero advantage: it costs a forward and backward pass, teaches nothing, and dilutes
token-mean losses. DAPO (Yu et al., 2025) drops such groups and keeps sampling until the batch is full of
groups with signal.

How. Each step generates `data.train_batch_size` prompts, scores them, keeps the groups whose rewards
differ, and repeats with the next prompts until `data.train_batch_size` groups with signal are kept or
`--max-gen-rounds` rounds ran (verl's `algorithm.filter_groups.max_num_gen_batches`). Surplus groups of the
last round are discarded; when the cap is reached first, the batch is topped up with groups without signal
(zero advantage, so they only dilute that one step) and the step says so in `dapo/num_filler_groups`.
Every prompt drawn counts as consumed, so checkpoints and resume stay exact. The rest of the step is the
sync recipe's, stage for stage.

What it reuses: the runtime (`build_runtime`), `TrainingLoop` (data cursor, validation cadence, checkpoints,
end of run) and the `PPOCore` stages; what it adds is the generation loop `collect_groups_with_signal`
and four small pure functions. Metrics added per step: `dapo/num_gen_rounds`, `dapo/num_generated_groups`,
`dapo/num_groups_with_signal`, `dapo/kept_group_fraction` (groups with signal / groups generated),
`dapo/num_filler_groups`, `dapo/num_generated_samples`, `dapo/generated_score/mean`. `critic/score/mean`
is the score of the trained batch, so it sits above the generated mean whenever groups were dropped.

Simplified: only dynamic sampling is here. DAPO's clip-higher is `actor.clip_ratio_high=0.28`, its
token-level loss is `actor.loss_agg_mode=token-mean` (the default); overlong reward shaping is not included.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Sequence

from asyncrl.cli import USER_ERRORS, split_config_args
from asyncrl.config import AsyncRLConfig, ConfigError, load_config
from asyncrl.core import Runtime
from asyncrl.core.records import Sample
from asyncrl.launch import build_runtime
from asyncrl.recipes.training_loop import TrainingLoop

DEFAULT_MAX_GEN_ROUNDS = 8


# ---- pure helpers: groups and the batch they make -------------------------------------------------------
def split_into_groups(samples: Sequence[Sample]) -> list[list[Sample]]:
    """The samples of one `generate` call as groups (one per prompt), in prompt order."""
    groups: dict[int, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_index, []).append(sample)
    return [groups[index] for index in sorted(groups)]


def has_signal(group: Sequence[Sample]) -> bool:
    """True when the group's rewards are not all equal (a group estimator gives it non-zero advantages)."""
    return len({sample.score for sample in group}) > 1


def assemble_batch(with_signal: Sequence[list[Sample]], without_signal: Sequence[list[Sample]],
                   num_groups: int) -> tuple[list[list[Sample]], int]:
    """The first `num_groups` groups with signal, topped up with groups without signal when there are too
    few (the generation cap was reached); returns (groups, number of filler groups)."""
    groups = list(with_signal[:num_groups])
    fillers = list(without_signal[:num_groups - len(groups)])
    return groups + fillers, len(fillers)


def renumber_groups(groups: Sequence[list[Sample]]) -> list[Sample]:
    """Flatten groups drawn from several `generate` calls, giving group i the group index i.

    A sample's `group_index` is its prompt's position within its own `generate` call, and it becomes the
    batch's `group_ids`; groups of different rounds would otherwise share ids and be normalised together.
    """
    return [dataclasses.replace(sample, group_index=index) for index, group in enumerate(groups) for sample in group]


# ---- the recipe ---------------------------------------------------------------------------------------
class DynamicSamplingRecipe:
    def __init__(self, runtime: Runtime, max_gen_rounds: int = DEFAULT_MAX_GEN_ROUNDS):
        if max_gen_rounds < 1:
            raise ValueError(f"max_gen_rounds must be at least 1, got {max_gen_rounds}")
        self.runtime = runtime
        self.core = runtime.core
        self.loop = TrainingLoop.create(runtime)
        self.max_gen_rounds = max_gen_rounds

    def step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        """One training step on a batch of groups with signal; returns its metrics and the trained samples."""
        metrics: dict[str, float] = {}
        samples = self.collect_groups_with_signal(step, metrics)
        self.core.train(samples, step, metrics)
        self.core.sync_weights(metrics)
        return metrics, samples

    def collect_groups_with_signal(self, step: int, metrics: dict[str, float]) -> list[Sample]:
        """Generate and score rounds of `data.train_batch_size` prompts until that many groups have signal."""
        num_groups = self.runtime.config.data.train_batch_size
        with_signal: list[list[Sample]] = []
        without_signal: list[list[Sample]] = []
        scores: list[float] = []
        num_rounds = 0
        while len(with_signal) < num_groups and num_rounds < self.max_gen_rounds:
            prompts, salts = self.loop.next_prompts()
            if not prompts:  # the last epoch ran out mid-step: train on what there is
                break
            num_rounds += 1
            # Stage metrics of every round land in one dict: timings add up, reward counters are the latest.
            samples = self.core.generate(prompts, salts, metrics)
            samples = self.core.compute_reward(samples, metrics)
            scores += [sample.score for sample in samples]
            for group in split_into_groups(samples):
                (with_signal if has_signal(group) else without_signal).append(group)
        groups, num_fillers = assemble_batch(with_signal, without_signal, num_groups)
        num_generated_groups = len(with_signal) + len(without_signal)
        metrics.update({
            "dapo/num_gen_rounds": float(num_rounds),
            "dapo/num_generated_groups": float(num_generated_groups),
            "dapo/num_groups_with_signal": float(len(with_signal)),
            "dapo/kept_group_fraction": len(with_signal) / max(num_generated_groups, 1),
            "dapo/num_filler_groups": float(num_fillers),
            "dapo/num_generated_samples": float(len(scores)),
            "dapo/generated_score/mean": sum(scores) / max(len(scores), 1),
        })
        return renumber_groups(groups)

    def begin(self) -> None:
        pass

    def has_next(self) -> bool:
        return not self.loop.is_done

    def maybe_checkpoint(self) -> None:
        self.loop.maybe_save()  # every prompt drawn was trained or dropped within its step

    def finish_training(self) -> None:
        pass

    def save_final_checkpoint(self) -> None:
        self.loop.save()

    def fit(self) -> dict[str, Any]:
        """The shared loop (`TrainingLoop.run`); only the step differs from the sync recipe."""
        return self.loop.run(self)


def train_with_dynamic_sampling(config: AsyncRLConfig, max_gen_rounds: int = DEFAULT_MAX_GEN_ROUNDS) -> dict[str, Any]:
    """Build the runtime, run the recipe, clean up (as `asyncrl.launch.train` does for built-in modes)."""
    if config.trainer.mode != "sync":
        raise ConfigError(f"the dynamic-sampling recipe runs its stages synchronously and needs trainer.mode=sync, "
                          f"got trainer.mode={config.trainer.mode}")
    runtime = build_runtime(config)
    try:
        return DynamicSamplingRecipe(runtime, max_gen_rounds).fit()
    finally:
        runtime.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GRPO-family training with DAPO-style dynamic sampling")
    parser.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value]")
    parser.add_argument("--max-gen-rounds", type=int, default=DEFAULT_MAX_GEN_ROUNDS,
                        help=f"generation rounds per step at most (default {DEFAULT_MAX_GEN_ROUNDS})")
    options = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(options.args)
    try:
        summary = train_with_dynamic_sampling(load_config(path, overrides), options.max_gen_rounds)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"finished {summary['steps']} steps in {summary['wall_time_s']:.0f}s; outputs in {summary['output_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
