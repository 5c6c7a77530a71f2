"""`asyncrl demo`: the main job on the embedded default, end to end on a laptop CPU.

    asyncrl demo                                   # 2-digit sums, sync mode
    asyncrl demo --task longtail --mode fully_async  # long-tailed response lengths: the async modes' workload
    asyncrl demo --setup-only                      # only the data and the warm-started model, for your own job

1. writes the task (2-digit addition) as parquet in verl's schema, with warm-start answers from a "sloppy
   teacher" that often repeats the last digit (the reward checks the exact sum);
2. builds a tiny character-level Qwen2-style model;
3. warm-starts it with SFT on the teacher's answers: it learns to add, and the stutter;
4. trains it with GRPO through Ray actors in `--mode`, with the demo task's settings for that mode;
5. prints validation accuracy before and after, and where the outputs are.

Steps 1-3 (the setup) are cached under `<out>/setup/<task>/`, keyed by their settings (`setup.json`): a
later demo of the same task, in any mode, starts at step 4. `--rebuild-setup` makes them again.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from asyncrl.config import load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.launch.modes import train
from asyncrl.models import build_tiny_model
from asyncrl.train.sft import SFTSettings, run_sft

logger = logging.getLogger(__name__)

DEFAULT_MODE = "sync"
DEFAULT_TASK = "arithmetic"
SETUP_FILE_NAME = "setup.json"  # written last: its presence means the setup is complete
# 2-digit sums taught by a teacher that stutters on 60% of its answers ("122" -> "1222"): the warm start
# can add but has picked up the habit, which exact-match RL removes (see asyncrl/data/tasks/arithmetic.py).
TASK_KNOBS = {"min_digits": "2", "max_digits": "2", "operators": "+", "sloppy_teacher": "0.6"}
MODEL_SHAPE = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, max_position_embeddings=64)
# The tools demo's calculator (docs/agents.md): a multi-turn trajectory is call, result, answer (~130 tokens).
TOOLS_CONFIG = Path(str(resources.files("asyncrl") / "configs" / "tools_calculator.yaml"))
# 4-digit operands: every digit a call copies sits at one distance from its place in the question, a single
# relative offset for the attention of a 2-layer model to learn.
# The teacher skips the tool on half the problems and mistypes a call on a tenth; what limits the warm start is
# copying the tool's 7-8 digit result into the answer, which exact-match RL rewards.
TOOLS_KNOBS = {"min_digits": "4", "max_digits": "4", "skip_tool": "0.5", "typo": "0.1"}
# GRPO over the ~60 model tokens of a trajectory, 8 samples of 16 prompts a step and two updates: lr 2e-4 breaks
# the warm start within a few steps (its sampled score falls to ~0), and at temperature 0.5 too few sampled
# 8-digit copies are right to learn from (docs/agents.md, Status).
TOOLS_OVERRIDES = ("rollout.multi_turn.enable=true", f"rollout.multi_turn.tool_config_path={TOOLS_CONFIG}",
                   "rollout.multi_turn.max_assistant_turns=2", "data.max_prompt_length=16",
                   "data.max_response_length=136", "data.train_batch_size=16", "rollout.n=8",
                   "actor.ppo_mini_batch_size=8", "actor.optim.lr=1e-4", "rollout.temperature=0.2",
                   "trainer.total_steps=20", "trainer.test_freq=10", "data.val_batch_size=128")


@dataclass(frozen=True)
class DemoTask:
    """One demo: the task and its knobs, the setup's sizes, and the RL run's overrides of `demo.yaml`
    (for every mode, then per mode)."""

    summary: str
    task: str
    knobs: dict[str, str]
    overrides: tuple[str, ...] = ()
    mode_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    train_size: int = 4000
    val_size: int = 200
    sft_epochs: float = 12.0
    model_shape: dict[str, int] = field(default_factory=lambda: dict(MODEL_SHAPE))
    # A demo task whose warm-started model this one's SFT continues from ("": a new tiny model), so a variant
    # of a task pays only for what it adds.
    warm_start_from: str = ""

    def run_overrides(self, mode: str) -> tuple[str, ...]:
        return self.overrides + (self.mode_overrides[mode] if mode in self.mode_overrides else ())

    def setup_settings(self, seed: int) -> dict[str, Any]:
        """What the cached setup depends on; a different value rebuilds it."""
        settings = {"task": self.task, "knobs": self.knobs, "train_size": self.train_size, "val_size": self.val_size,
                    "sft": asdict(SFTSettings(epochs=self.sft_epochs, seed=seed)), "model_shape": self.model_shape,
                    "seed": seed}
        if self.warm_start_from:
            settings["warm_start_from"] = {"demo": self.warm_start_from,
                                           **DEMO_TASKS[self.warm_start_from].setup_settings(seed)}
        return settings


DEMO_TASKS: dict[str, DemoTask] = {
    "tools": DemoTask(
        summary="4-digit products the model hands to a calculator tool (multi-turn: call, result, answer); the "
                "teacher skipped the tool or mistyped an operand, RL raises the score and the rate of correct calls",
        task="tool_arithmetic", knobs=TOOLS_KNOBS, train_size=4096, val_size=128, sft_epochs=6.0,
        model_shape={**MODEL_SHAPE, "max_position_embeddings": 192}, overrides=TOOLS_OVERRIDES,
        mode_overrides={"fully_async": ("async_training.require_batches=2", "async_training.staleness_threshold=0.5",
                                        "async_training.partial_rollout=true")}),
    "arithmetic": DemoTask(
        summary="2-digit sums; responses of 3-5 tokens, so every mode waits about as long for a batch",
        task="arithmetic", knobs=TASK_KNOBS),
    "longtail": DemoTask(
        summary="the same sums, each answer followed by a long-tailed run of '.' (median 8 tokens, up to 48): "
                "a synchronous batch waits for its longest response, the asynchronous modes do not",
        task="arithmetic", knobs={**TASK_KNOBS, "tail_median": "8", "tail_cap": "48"},
        warm_start_from="arithmetic", sft_epochs=2.0,
        # 60 steps of 32 prompts in every mode (fully_async: R = 16 x 2), enough to compare time and accuracy.
        overrides=("data.max_response_length=56", "data.max_prompt_length=8", "trainer.total_steps=60",
                   "trainer.test_freq=20"),
        mode_overrides={"fully_async": ("async_training.require_batches=2", "async_training.staleness_threshold=0.5",
                                        "async_training.partial_rollout=true")}),
}


@dataclass(frozen=True)
class DemoSetup:
    """The demo's inputs on disk: the task's parquet files and the warm-started HF folder."""

    folder: Path
    train_file: Path
    val_file: Path
    model: Path


def demo_config_path() -> Path:
    return Path(str(resources.files("asyncrl") / "configs" / "demo.yaml"))


def demo_task(name: str) -> DemoTask:
    if name not in DEMO_TASKS:
        raise ValueError(f"unknown demo task {name!r}; demo tasks: {', '.join(DEMO_TASKS)}")
    return DEMO_TASKS[name]


def prepare_setup(output_dir: str | Path, task_name: str = DEFAULT_TASK, seed: int = 0,
                  rebuild: bool = False) -> DemoSetup:
    """Steps 1-3 under `output_dir/setup/<task>/`, reused when its `setup.json` holds the same settings."""
    demo = demo_task(task_name)
    folder = Path(output_dir) / "setup" / task_name
    setup = DemoSetup(folder, folder / "data" / "train.parquet", folder / "data" / "val.parquet", folder / "model")
    settings = demo.setup_settings(seed)
    record = folder / SETUP_FILE_NAME
    if not rebuild and record.is_file() and json.loads(record.read_text()) == settings:
        print(f"[demo] 1-3/4 reusing the data and warm-started model in {folder} (--rebuild-setup makes them again)",
              flush=True)
        return setup
    shutil.rmtree(folder, ignore_errors=True)
    print(f"[demo] 1/4 writing the {task_name} task to {folder / 'data'}", flush=True)
    write_task(make_task(demo.task, demo.knobs), folder / "data", demo.train_size, demo.val_size, seed)
    if demo.warm_start_from:
        print(f"[demo] 2/4 starting from the {demo.warm_start_from} demo's warm-started model", flush=True)
        initial = prepare_setup(output_dir, demo.warm_start_from, seed).model
    else:
        print("[demo] 2/4 building a tiny model", flush=True)
        initial = build_tiny_model(folder / "initial_model", family="qwen2", seed=seed, **demo.model_shape)
    print(f"[demo] 3/4 SFT warm start ({demo.sft_epochs} epochs)", flush=True)
    run_sft(initial, [str(setup.train_file)], setup.model, SFTSettings(epochs=demo.sft_epochs, seed=seed))
    if not demo.warm_start_from:
        shutil.rmtree(initial)
    record.write_text(json.dumps(settings, indent=1) + "\n")
    return setup


def run_demo(output_dir: str | Path, mode: str = DEFAULT_MODE, overrides: list[str] | None = None,
             task_name: str = DEFAULT_TASK, seed: int = 0, rebuild_setup: bool = False) -> dict[str, Any]:
    """The whole demo; the run goes to `output_dir/<task>-<mode>/` (a demo always starts it fresh)."""
    started = time.monotonic()
    demo = demo_task(task_name)
    setup = prepare_setup(output_dir, task_name, seed, rebuild_setup)
    run_dir = Path(output_dir) / f"{task_name}-{mode}"
    print(f"[demo] 4/4 GRPO in trainer.mode={mode} on {task_name}: {demo.summary}", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    config = load_config(demo_config_path(), [
        f"model.path={setup.model}", f"data.train_files=[{setup.train_file}]", f"data.val_files=[{setup.val_file}]",
        f"trainer.output_dir={run_dir}", f"trainer.mode={mode}", *demo.run_overrides(mode),
        *(overrides or [])])
    summary = train(config)
    if "stopped_by" in summary:  # a signal ended it early: there is no final validation to report
        print(f"\n[demo] stopped by {summary['stopped_by']} after {summary['steps']} steps; outputs: "
              f"{summary['output_dir']}")
        return summary
    before = summary["initial_validation"].get("val/score/mean", float("nan"))
    after = summary["final_validation"].get("val/score/mean", float("nan"))
    print(f"\n[demo] validation accuracy: {before:.1%} after SFT -> {after:.1%} after GRPO "
          f"({summary['wall_time_s']:.0f}s of RL, {time.monotonic() - started:.0f}s in all)")
    print(f"[demo] outputs: {summary['output_dir']} (metrics.jsonl, summary.json, timeline.json, plots/, policy/)")
    return summary
