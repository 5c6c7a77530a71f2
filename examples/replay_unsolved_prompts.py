"""A curriculum that revisits the prompts the policy has not solved yet, written only from asyncrl's public stages:
a recipe to copy and adapt (no config key does this).

    python examples/replay_unsolved_prompts.py examples/grpo.yaml model.path=MODEL \
        data.train_files=[data/arith/train.parquet] data.val_files=[data/arith/val.parquet] --max-replays 2

Why. A prompt whose rollout.n responses all fail teaches nothing this step (a group estimator gives it no
advantage), but it may be within reach a few updates later. Dynamic sampling (`algorithm.filter_groups`) drops
such groups and moves on; this recipe keeps them and tries them again.

How. Each step trains data.train_batch_size prompts: first up to `--replay-share` of the batch from the replay
queue (oldest first), the rest fresh from the data cursor. After scoring, a prompt none of whose responses scored
above `--solved-above` goes (back) to the queue, unless it was already replayed `--max-replays` times. A replayed
prompt draws new random numbers (its requests are salted with the step), so it is a new attempt, not a repeat.
Metrics added per step: `replay/num_replayed`, `replay/num_unsolved`, `replay/num_solved_on_replay`,
`replay/queue_size`.

Simplified: the replay queue is not checkpointed (a resumed run starts with an empty one), and the step is the
sync recipe's otherwise, stage for stage.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from asyncrl.cli import USER_ERRORS, split_config_args
from asyncrl.config import AsyncRLConfig, ConfigError, load_config
from asyncrl.core import Runtime
from asyncrl.core.records import Sample
from asyncrl.data.records import TokenizedPrompt
from asyncrl.launch import build_runtime
from asyncrl.recipes.run_report import run_report
from asyncrl.recipes.training_loop import TrainingLoop


@dataclass(frozen=True)
class ReplaySettings:
    replay_share: float = 0.5     # at most this fraction of a batch comes from the replay queue
    max_replays: int = 2          # a prompt is tried at most 1 + max_replays times
    solved_above: float = 0.0     # a response solves its prompt when its score is above this

    def __post_init__(self):
        if not 0.0 <= self.replay_share <= 1.0:
            raise ValueError(f"replay_share must be within 0 .. 1, got {self.replay_share}")
        if self.max_replays < 0:
            raise ValueError(f"max_replays must be >= 0, got {self.max_replays}")


# ---- pure helpers ---------------------------------------------------------------------------------------
def unsolved_prompts(samples: Sequence[Sample], solved_above: float) -> list[str]:
    """Ids of the prompts none of whose responses scored above `solved_above`, in batch order."""
    best: dict[str, float] = {}
    for sample in samples:
        best[sample.prompt_id] = max(best.get(sample.prompt_id, float("-inf")), sample.score)
    return [prompt_id for prompt_id, score in best.items() if score <= solved_above]


def num_from_replay(batch_size: int, queue_size: int, replay_share: float) -> int:
    """How many of a batch's prompts come from the replay queue."""
    return min(queue_size, int(batch_size * replay_share))


# ---- the recipe ---------------------------------------------------------------------------------------
class ReplayRecipe:
    def __init__(self, runtime: Runtime, settings: ReplaySettings = ReplaySettings()):
        self.runtime = runtime
        self.core = runtime.core
        self.loop = TrainingLoop.create(runtime)
        self.settings = settings
        self.queue: deque[TokenizedPrompt] = deque()     # unsolved prompts, oldest first
        self.replays: dict[str, int] = {}                 # prompt id -> times replayed so far

    def step(self, step: int) -> tuple[dict[str, float], list[Sample]]:
        metrics: dict[str, float] = {}
        size = self.runtime.config.data.train_batch_size
        replayed = [self.queue.popleft() for _ in range(num_from_replay(size, len(self.queue),
                                                                          self.settings.replay_share))]
        fresh, salts = self.loop.next_prompts(size - len(replayed)) if size > len(replayed) else ([], [])
        prompts = replayed + fresh
        salts = [f"replay{step}"] * len(replayed) + salts   # a replay draws new numbers
        samples = self.core.generate(prompts, salts, metrics)
        samples = self.core.compute_reward(samples, metrics)
        self.core.train(samples, step, metrics)
        self.core.sync_weights(metrics)
        self.requeue(prompts, samples, {prompt.record.prompt_id for prompt in replayed}, metrics)
        return metrics, samples

    def requeue(self, prompts: list[TokenizedPrompt], samples: list[Sample], replayed_ids: set[str],
                metrics: dict[str, float]) -> None:
        unsolved = set(unsolved_prompts(samples, self.settings.solved_above))
        by_id = {prompt.record.prompt_id: prompt for prompt in prompts}
        for prompt_id in by_id:
            if prompt_id in unsolved and self.replays.get(prompt_id, 0) < self.settings.max_replays:
                self.replays[prompt_id] = self.replays.get(prompt_id, 0) + 1
                self.queue.append(by_id[prompt_id])
        metrics.update({"replay/num_replayed": float(len(replayed_ids)),
                        "replay/num_unsolved": float(len(unsolved)),
                        "replay/num_solved_on_replay": float(len(replayed_ids - unsolved)),
                        "replay/queue_size": float(len(self.queue))})

    def begin(self) -> None:
        pass

    def has_next(self) -> bool:
        return not self.loop.is_done

    def maybe_checkpoint(self) -> None:
        self.loop.maybe_save()   # the replay queue is not saved: a resumed run starts with an empty one

    def finish_training(self) -> None:
        pass

    def save_final_checkpoint(self) -> None:
        self.loop.save()

    def fit(self) -> dict[str, Any]:
        return self.loop.run(self)


def train_with_replay(config: AsyncRLConfig, settings: ReplaySettings = ReplaySettings()) -> dict[str, Any]:
    """Build the runtime, run the recipe, clean up (as `asyncrl.launch.train` does for built-in modes)."""
    if config.trainer.mode != "sync":
        raise ConfigError(f"the replay recipe runs its stages synchronously and needs trainer.mode=sync, got "
                          f"trainer.mode={config.trainer.mode}")
    runtime = build_runtime(config)
    try:
        return ReplayRecipe(runtime, settings).fit()
    finally:
        runtime.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GRPO-family training that revisits unsolved prompts")
    parser.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value]")
    parser.add_argument("--replay-share", type=float, default=0.5, help="fraction of a batch from the replay queue")
    parser.add_argument("--max-replays", type=int, default=2, help="times an unsolved prompt is tried again")
    parser.add_argument("--solved-above", type=float, default=0.0, help="a score above this solves a prompt")
    options = parser.parse_intermixed_args(argv)
    path, overrides = split_config_args(options.args)
    try:
        settings = ReplaySettings(options.replay_share, options.max_replays, options.solved_above)
        summary = train_with_replay(load_config(path, overrides), settings)
    except (ValueError, *USER_ERRORS) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(run_report(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
