"""The demo's tasks: a built-in task with its knobs, the warm start's sizes, and the RL run's overrides of
`demo.yaml` (for every mode, then per mode). Plain data, so that `asyncrl demo --help` lists them without
loading the composition root; `asyncrl.launch.demo` makes the setup and runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

DEFAULT_MODE = "sync"
DEFAULT_TASK = "arithmetic"
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
# GRPO over the ~60 model tokens of a trajectory, 8 samples of 16 prompts a step and two updates. Its learning is
# noisy: what 20 steps at lr 1e-4 reached depended on the sampling seeds (25.8% -> 25.8% to 39.1%), so the demo
# takes 40 steps at lr 5e-5, which gained 10-13 points of validation in every mode and every seed tried. lr 2e-4
# breaks the warm start within a few steps, and at temperature 0.5 too few sampled 8-digit copies are right to
# learn from (docs/agents.md, Status).
TOOLS_OVERRIDES = ("rollout.multi_turn.enable=true", f"rollout.multi_turn.tool_config_path={TOOLS_CONFIG}",
                   "rollout.multi_turn.max_assistant_turns=2", "data.max_prompt_length=16",
                   "data.max_response_length=136", "data.train_batch_size=16", "rollout.n=8",
                   "actor.ppo_mini_batch_size=8", "actor.optim.lr=5e-5", "rollout.temperature=0.2",
                   "trainer.total_steps=40", "trainer.test_freq=20", "data.val_batch_size=128")


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


DEMO_TASKS: dict[str, DemoTask] = {
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
    "tools": DemoTask(
        summary="4-digit products the model hands to a calculator tool (multi-turn: call, result, answer); the "
                "teacher skipped the tool or mistyped an operand, RL raises the score and the rate of correct calls",
        task="tool_arithmetic", knobs=TOOLS_KNOBS, train_size=4096, val_size=128, sft_epochs=6.0,
        model_shape={**MODEL_SHAPE, "max_position_embeddings": 192}, overrides=TOOLS_OVERRIDES,
        mode_overrides={"fully_async": ("async_training.require_batches=2", "async_training.staleness_threshold=0.5",
                                        "async_training.partial_rollout=true")}),
}


def demo_task(name: str) -> DemoTask:
    if name not in DEMO_TASKS:
        raise ValueError(f"unknown demo task {name!r}; demo tasks: {', '.join(DEMO_TASKS)}")
    return DEMO_TASKS[name]
