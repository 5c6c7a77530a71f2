"""The training loop every recipe shares, and what it keeps: the data cursor, the step counter,
checkpoint/resume, validation cadence, and the run's end (final validation, policy export, summary, plots).

A recipe supplies only its step (and, if it keeps work in flight, when it has a next step and which data
cursor a checkpoint must record); `TrainingLoop.run(recipe)` is the one loop every recipe uses.

    loop = TrainingLoop.create(runtime)
    prompts, salts = loop.next_prompts()       # inside a recipe's step
    summary = loop.run(recipe)                  # the recipe's `fit`
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from asyncrl.algos import ADVANTAGE_ESTIMATORS
from asyncrl.config import AsyncRLConfig, prompts_per_step, step_meaning
from asyncrl.core.checkpoint import CheckpointManager
from asyncrl.core.runtime import Runtime
from asyncrl.data.records import TokenizedPrompt
from asyncrl.data.sampler import PromptSampler
from asyncrl.recipes.errors import IncompatibleCheckpointError
from asyncrl.telemetry import Progress, plot_run

logger = logging.getLogger(__name__)

# Keys whose change makes a checkpoint's state meaningless (model, data order, batch layout, sharding).
RESUME_CRITICAL_KEYS = (
    "model.path", "data.train_files", "data.train_batch_size", "data.shuffle", "data.seed", "rollout.n",
    "actor.ppo_mini_batch_size", "trainer.mode", "trainer.n_gpus_per_node", "trainer.nnodes", "trainer.seed",
    "critic.enable", "algorithm.adv_estimator", "async_training.require_batches",
    "async_training.trigger_parameter_sync_step",
)


def total_training_steps(config: AsyncRLConfig, num_prompts: int) -> int:
    """Steps of the whole run, known before any worker is built (the LR schedule is sized from it). Every
    mode draws its batches from one stream of prompts that crosses epoch boundaries without a gap, so the
    run takes ceil(prompts over all epochs / prompts per step) steps, and only the last one may be short."""
    steps = math.ceil(num_prompts * config.trainer.total_epochs / prompts_per_step(config))
    return min(steps, config.trainer.total_steps) if config.trainer.total_steps > 0 else steps


def critic_in_use(tree: dict[str, Any]) -> Optional[bool]:
    """What critic.enable means in a config written as a dict: the loader now fills it from the estimator's
    metadata, but a checkpoint written before that holds null, which meant the same decision. None when that
    estimator is not registered in this process (then algorithm.adv_estimator differs too, and says so)."""
    enable = tree["critic"]["enable"]
    if enable is not None:
        return enable
    estimator = tree["algorithm"]["adv_estimator"]
    return ADVANTAGE_ESTIMATORS.spec(estimator).needs_critic if estimator in ADVANTAGE_ESTIMATORS else None


# Keys compared by their meaning rather than by the value written.
RESOLVED_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {"critic.enable": critic_in_use}


def check_compatible(saved: dict[str, Any], current: dict[str, Any], folder: Path) -> None:
    def lookup(tree: dict[str, Any], dotted: str) -> Any:
        if dotted in RESOLVED_KEYS:
            return RESOLVED_KEYS[dotted](tree)
        for part in dotted.split("."):
            tree = tree[part]
        return tree
    differences = [f"{key}: {lookup(saved, key)!r} in the checkpoint, {lookup(current, key)!r} now"
                   for key in RESUME_CRITICAL_KEYS if lookup(saved, key) != lookup(current, key)]
    if differences:
        raise IncompatibleCheckpointError(
            f"cannot resume from {folder}: the config differs in " + "; ".join(differences) +
            ". Use the original values, another trainer.output_dir, or trainer.resume=disable.")


def find_resume_checkpoint(config: AsyncRLConfig, output_dir: Path) -> Optional[Path]:
    """The checkpoint a run resumes from: none with trainer.resume=disable (or auto without an intact one), the
    newest intact one under trainer.output_dir with auto (each is verified, so look once), else the folder
    trainer.resume names."""
    setting = config.trainer.resume
    if setting == "disable":
        return None
    if setting == "auto":
        return CheckpointManager(output_dir / "checkpoints", config.trainer.max_checkpoints).find_resumable()
    # A named checkpoint is verified as `auto` verifies each, but refused rather than skipped: the user chose it.
    problem = CheckpointManager.check(Path(setting))
    if problem is not None:
        raise IncompatibleCheckpointError(f"cannot resume from {setting} (trainer.resume): {problem}. Name another "
                                          f"checkpoint, trainer.resume=auto for the newest intact one, or "
                                          f"trainer.resume=disable.")
    return Path(setting)


class StepRecipe(Protocol):
    def begin(self) -> None:
        """Called once after resume and the first validation (start work that runs ahead of training)."""

    def has_next(self) -> bool:
        """Whether another training step follows."""

    def step(self, step: int) -> tuple[dict[str, float], list[Any]]:
        """Run training step `step`; its metrics and the samples it trained on."""

    def maybe_checkpoint(self) -> None:
        """Checkpoint if the cadence says so (after every step)."""

    def finish_training(self) -> None:
        """After the last step, before the final validation (e.g. push the last weights)."""

    def save_final_checkpoint(self) -> None:
        """The checkpoint at the end of the run."""


@dataclass
class TrainingLoop:
    runtime: Runtime
    sampler: PromptSampler
    total_steps: int
    checkpoints: CheckpointManager
    step: int = 0                               # last finished training step
    num_samples: int = 0
    num_tokens: int = 0
    started_s: float = field(default_factory=time.monotonic)
    last_validation: dict[str, float] = field(default_factory=dict)
    resumed_from: Optional[Path] = None         # the checkpoint this run resumed from
    resumed_counts: tuple[int, int, int] = (0, 0, 0)  # (step, samples, tokens) that checkpoint had reached

    @classmethod
    def create(cls, runtime: Runtime) -> "TrainingLoop":
        config = runtime.config
        sampler = PromptSampler(len(runtime.train_data), config.data.shuffle, config.data.seed,
                                config.trainer.total_epochs)
        return cls(runtime, sampler, total_training_steps(config, len(runtime.train_data)),
                   CheckpointManager(runtime.output_dir / "checkpoints", config.trainer.max_checkpoints))

    @property
    def is_done(self) -> bool:
        return self.step >= self.total_steps or self.sampler.is_exhausted

    def next_prompts(self, size: Optional[int] = None) -> tuple[list[TokenizedPrompt], list[str]]:
        """The next `size` prompts (default data.train_batch_size; fewer only at the end of the data) and
        their seed salts ("epoch<e>": a prompt draws the same numbers in an epoch whatever the mode)."""
        prompts, salts = [], []
        for _ in range(size or self.runtime.config.data.train_batch_size):
            index = self.sampler.next_index()
            if index is None:
                break
            prompts.append(self.runtime.train_data[index])
            salts.append(f"epoch{self.sampler.epoch}")
        return prompts, salts

    # ---- the loop -------------------------------------------------------------------------------------
    def run(self, recipe: StepRecipe) -> dict[str, Any]:
        """Resume, validate, train step by step (logging, validating and saving on cadence), finish.
        SIGTERM or SIGINT ends the run after the current step with a checkpoint (a second SIGINT quits)."""
        self.resume()
        core = self.runtime.core
        initial: dict[str, float] = {}
        if self.runtime.config.trainer.val_before_train and self.step == 0:
            self.validate(initial)
            core.log(initial, 0)
        recipe.begin()
        self.evaluate(initial)   # evaluation.enable: version 0's evaluation runs during the first steps
        logger.info("%d steps; %s", self.total_steps, step_meaning(self.runtime.config))
        progress = Progress(self.total_steps, initial_step=self.step)
        # The end of the run is inside too: a signal while it validates, saves and plots lets it finish (the
        # checkpoint is being written anyway), rather than cutting it off with a traceback.
        with self.runtime.stop as stop:
            started = time.monotonic()  # a step's time includes waiting for its data (has_next)
            while not stop.requested and recipe.has_next():
                metrics, samples = recipe.step(self.step + 1)
                self.step += 1
                num_tokens = sum(sample.result.prompt_ids.size + sample.num_response_tokens for sample in samples)
                self.record_step(metrics, len(samples), num_tokens, time.monotonic() - started)
                self.dump_rollouts(samples, core.decode)
                self.maybe_validate(metrics)
                self.evaluate(metrics)
                core.log(metrics, self.step)
                progress.update(self.step, metrics)
                recipe.maybe_checkpoint()
                started = time.monotonic()
            progress.close()
            recipe.finish_training()
            if stop.requested:
                return self.stop_early(recipe, stop.signal_name)
            return self.finish(initial, recipe.save_final_checkpoint)

    def stop_early(self, recipe: StepRecipe, signal_name: str) -> dict[str, Any]:
        recipe.save_final_checkpoint()
        self.runtime.tracker.close()
        logger.warning("stopped by %s after step %d; checkpoint saved under %s; run again (trainer.resume=auto) "
                       "to continue", signal_name, self.step, self.checkpoints.root)
        return {**self.summary({}, {}), "stopped_by": signal_name}

    def summary(self, initial_validation: dict[str, float], final_validation: dict[str, float]) -> dict[str, Any]:
        """What this run did: `steps`, `samples`, `tokens` and `wall_time_s` count only this run (a resumed run's
        earlier segments are in `resumed_from_step`); `last_step` is the step the run reached."""
        runtime = self.runtime
        resumed_step, resumed_samples, resumed_tokens = self.resumed_counts
        return {"steps": self.step - resumed_step, "last_step": self.step, "resumed_from_step": resumed_step,
                "resumed_from": str(self.resumed_from or ""), "samples": self.num_samples - resumed_samples,
                "tokens": self.num_tokens - resumed_tokens, "wall_time_s": time.monotonic() - self.started_s,
                "param_version": runtime.core.version, "initial_validation": initial_validation,
                "final_validation": final_validation, "output_dir": str(runtime.output_dir),
                "mode": runtime.config.trainer.mode, "placement": runtime.resources.placement()}

    # ---- checkpoints ----------------------------------------------------------------------------------
    def driver_state(self, extra: Optional[dict[str, Any]] = None,
                     sampler_state: Optional[dict[str, int]] = None) -> dict[str, Any]:
        """`sampler_state` overrides the live cursor (a recipe with prompts in flight saves the cursor
        from before them, so they are regenerated on resume)."""
        return {"step": self.step, "sampler": sampler_state or self.sampler.state_dict(),
                "core": self.runtime.core.state_dict(), "num_samples": self.num_samples,
                "num_tokens": self.num_tokens, "recipe": extra or {},
                "config": dataclasses.asdict(self.runtime.config)}

    def save(self, extra: Optional[dict[str, Any]] = None, sampler_state: Optional[dict[str, int]] = None,
             artifacts: Optional[dict[str, bytes]] = None) -> Path:
        return self.checkpoints.save(self.step, self.driver_state(extra, sampler_state),
                                     self.runtime.trainers.save_checkpoint, artifacts)

    def maybe_save(self, extra: Optional[dict[str, Any]] = None,
                   sampler_state: Optional[dict[str, int]] = None) -> None:
        frequency = self.runtime.config.trainer.save_freq
        if frequency > 0 and self.step % frequency == 0:
            self.save(extra, sampler_state)

    def resume(self) -> dict[str, Any]:
        """Restore the checkpoint the composition root found and checked against the config before anything
        started (`Runtime.resume_from`); the recipe's extra state."""
        folder = self.runtime.resume_from
        if folder is None:
            return {}
        state = CheckpointManager.read_driver_state(folder)
        self.resumed_from = folder
        self.step, self.num_samples, self.num_tokens = state["step"], state["num_samples"], state["num_tokens"]
        self.resumed_counts = (self.step, self.num_samples, self.num_tokens)
        self.sampler.load_state_dict(state["sampler"])
        self.runtime.core.load_state_dict(state["core"], str(folder / "trainer"))
        logger.info("resumed from %s at step %d", folder, self.step)
        return state["recipe"]

    # ---- validation and the end of the run ------------------------------------------------------------
    def validate(self, metrics: dict[str, float]) -> None:
        if self.runtime.val_data is None:
            return
        self.runtime.core.validate(self.runtime.val_data, metrics)
        self.last_validation = {key: value for key, value in metrics.items() if key.startswith("val/")}

    def maybe_validate(self, metrics: dict[str, float]) -> None:
        frequency = self.runtime.config.trainer.test_freq
        if frequency > 0 and self.step % frequency == 0 and not self.is_done:
            self.validate(metrics)

    def evaluate(self, metrics: dict[str, float]) -> None:
        """The evaluation stage after a step: log what came back (a row each, under the version it measured), and
        dispatch the trainer's weights when their version is due."""
        evaluation = self.runtime.evaluation
        if evaluation is None:
            return
        for row in evaluation.poll(self.step):
            self.runtime.core.log(row, self.step)
        evaluation.maybe_start(self.runtime.core.weights_version, self.step, metrics)

    def record_step(self, metrics: dict[str, float], num_samples: int, num_tokens: int, step_seconds: float) -> None:
        self.num_samples += num_samples
        self.num_tokens += num_tokens
        metrics["timing_s/step"] = step_seconds
        metrics["perf/time_per_step"] = step_seconds
        metrics["perf/throughput"] = num_tokens / max(step_seconds, 1e-9)
        metrics["perf/samples_per_s"] = num_samples / max(step_seconds, 1e-9)
        metrics["training/epoch"] = float(self.sampler.epoch)

    def finish(self, initial_validation: dict[str, float], save_checkpoint: Callable[[], Any]) -> dict[str, Any]:
        """Final validation, checkpoint, policy export, summary.json and plots."""
        runtime = self.runtime
        metrics: dict[str, float] = {}
        self.validate(metrics)
        if metrics:
            runtime.core.log(metrics, self.step)
        save_checkpoint()
        runtime.trainers.export_policy(str(runtime.output_dir / "policy"))
        summary = self.summary(initial_validation, self.last_validation)
        if runtime.evaluation is not None:
            for row in runtime.evaluation.finish(runtime.core.weights_version, self.step):
                runtime.core.log(row, self.step)
            summary["evaluation"] = runtime.evaluation.summary()
        (runtime.output_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
        runtime.tracker.close()
        plot_run(runtime.output_dir)
        return summary

    def dump_rollouts(self, samples: list, decode) -> None:
        """rollouts/step_N.jsonl: prompt, response, score and versions of every sample (trainer.dump_rollouts);
        a multi-turn sample adds its per-token versions and loss mask (1 model, 0 tool), which show a sync that
        fell inside a trajectory."""
        if not self.runtime.config.trainer.dump_rollouts:
            return
        folder = self.runtime.output_dir / "rollouts"
        folder.mkdir(exist_ok=True)
        with open(folder / f"step_{self.step}.jsonl", "w") as handle:
            for sample in samples:
                record = {
                    "prompt_id": sample.prompt_id, "sample_index": sample.sample_index,
                    "prompt": self.runtime.tokenizer.decode(sample.result.prompt_ids.tolist()),
                    "response": decode(sample), "score": sample.score, "finish_reason": sample.result.finish_reason,
                    "num_tokens": sample.num_response_tokens,
                    "versions": sorted(set(sample.result.response_versions.tolist()))}
                if sample.trajectory is not None:
                    record["token_versions"] = sample.result.response_versions.tolist()
                    record["loss_mask"] = sample.loss_mask.tolist()
                    record["response_ids"] = sample.result.response_ids.tolist()   # what trained, token-exact
                handle.write(json.dumps(record) + "\n")
