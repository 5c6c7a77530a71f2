"""`asyncrl advise RUN_DIR`: read a run's metrics and config, recommend how to split devices between
rollout and trainer, and how to set `trigger_parameter_sync_step` and `staleness_threshold`.

The numbers: per training step, generation needs G device-seconds (the rollout's busy time x its devices)
and training T device-seconds (the trainer's busy time x its devices). With N devices, a pipeline is
balanced when rollout devices / N = G / (G + T) (both sides then take the same time per step). Idle
ratios say which side waits: a trainer idle while waiting for samples is starved by the rollout; a
rollout idle while waiting for the trainer (budget used up, queue full) is starved by the trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from asyncrl.telemetry.trackers import read_metrics


@dataclass
class Advice:
    mode: str
    total_devices: int             # what a separated split divides: sync's trainer devices, else both sides
    rollout_devices: int           # now (0 for colocated sync)
    recommended_rollout_devices: Optional[int]  # None when the devices cannot be split (fewer than 2)
    balanced_rollout_devices: float  # the unrounded balance point, G / (G + T) x total
    generation_device_s: float     # G per step
    training_device_s: float       # T per step
    trainer_idle_ratio: Optional[float]    # None in sync: its devices never wait, they generate in turn
    rollouter_idle_ratio: Optional[float]  # None in sync: there is no separate rollout
    recommendations: list[str] = field(default_factory=list)

    @property
    def move(self) -> str:
        """"to_trainer", "to_rollout" or "keep" (sync, an unsplittable run, or a balanced split)."""
        if self.mode == "sync" or self.recommended_rollout_devices in (None, self.rollout_devices):
            return "keep"
        return "to_trainer" if self.recommended_rollout_devices < self.rollout_devices else "to_rollout"

    @property
    def generation_share(self) -> float:
        return self.generation_device_s / max(self.generation_device_s + self.training_device_s, 1e-9)

    def text(self) -> str:
        def ratio(value: Optional[float]) -> str:
            return f"{value:.2f}" if value is not None else "n/a"
        lines = [f"mode {self.mode}, {self.total_devices} device{'' if self.total_devices == 1 else 's'} "
                 f"({self.rollout_devices} rollout)",
                 f"per step: generation {self.generation_device_s:.2f} device-s, training "
                 f"{self.training_device_s:.2f} device-s; trainer idle {ratio(self.trainer_idle_ratio)}, "
                 f"rollouter idle {ratio(self.rollouter_idle_ratio)}"]
        return "\n".join(lines + [f"- {line}" for line in self.recommendations])


def mean(rows: list[dict[str, Any]], key: str) -> float:
    values = [row[key] for row in rows if row.get(key) is not None]
    return sum(values) / len(values) if values else 0.0


TRAINING_STAGES = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")


def advise(run_dir: str | Path) -> Advice:
    run_dir = Path(run_dir)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = [row for row in read_metrics(run_dir / "metrics.jsonl") if "timing_s/step" in row]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl holds no training steps to advise on")
    mode = config["trainer"]["mode"]
    trainer_devices = config["trainer"]["n_gpus_per_node"] * config["trainer"]["nnodes"]
    rollout_devices = 0 if mode == "sync" else config["rollout"]["n_gpus_per_node"] * config["rollout"]["nnodes"]
    step_s = mean(rows, "timing_s/step")
    train_s = sum(mean(rows, f"timing_s/{stage}") for stage in TRAINING_STAGES)
    waited_s = mean(rows, "timing_s/gen")  # sync: generating; the separated modes: the trainer waiting for it
    if mode == "sync":
        generate_s, trainer_idle, rollouter_idle = waited_s, None, None
    elif mode == "one_step_off":
        generate_s = mean(rows, "timing_s/generate_async") or waited_s  # the generation's own time, overlapped
        trainer_idle = waited_s / step_s if step_s else 0.0
        rollouter_idle = max(0.0, 1 - generate_s / step_s) if step_s else 0.0
    else:
        rollouter_idle = mean(rows, "rollouter/idle_ratio")
        generate_s = step_s * (1 - rollouter_idle)
        trainer_idle = mean(rows, "trainer/idle_ratio") if any("trainer/idle_ratio" in row for row in rows) \
            else (waited_s / step_s if step_s else 0.0)
    # A separated split divides the devices this run used: sync's trainer devices, or both sides.
    total = trainer_devices + rollout_devices
    generation = generate_s * (rollout_devices or trainer_devices)
    training = train_s * trainer_devices
    balanced = generation / max(generation + training, 1e-9) * total
    recommended = min(total - 1, max(1, round(balanced))) if total >= 2 else None
    advice = Advice(mode, total, rollout_devices, recommended, balanced, generation, training, trainer_idle,
                    rollouter_idle)
    advice.recommendations = recommendations(advice, rows, config, step_s)
    return advice


def split_advice(advice: Advice) -> str:
    """What to do with the rollout:trainer split, or why it cannot be split."""
    share = advice.generation_share
    total, recommended = advice.total_devices, advice.recommended_rollout_devices
    if recommended is None:
        return (f"generation is {share:.0%} of the device time, but {total} device cannot be split: a separated "
                f"mode needs at least one rollout and one trainer device (with 2 devices: trainer.mode=fully_async "
                f"trainer.n_gpus_per_node=1 rollout.n_gpus_per_node=1); keep trainer.mode=sync here")
    split = f"{recommended} rollout : {total - recommended} trainer"
    if advice.mode == "sync":
        return (f"generation is {share:.0%} of the device time; a separated mode would balance at {split} devices "
                f"(trainer.mode=fully_async rollout.n_gpus_per_node={recommended} "
                f"trainer.n_gpus_per_node={total - recommended})")
    if advice.move == "to_trainer":
        return (f"the trainer is the bottleneck (rollouter idle {advice.rollouter_idle_ratio or 0:.2f}, trainer idle "
                f"{advice.trainer_idle_ratio or 0:.2f}): move devices to the trainer, {split} (generation is "
                f"{share:.0%} of the device time)")
    if advice.move == "to_rollout":
        return (f"the rollout is the bottleneck (trainer idle {advice.trainer_idle_ratio or 0:.2f}): move devices to "
                f"the rollout, {split} (generation is {share:.0%} of the device time)")
    if abs(advice.balanced_rollout_devices - recommended) >= 0.5:
        # The balance point lies beyond the last device either side can give up.
        side = "rollout" if advice.balanced_rollout_devices > recommended else "trainer"
        return (f"keep {split}: the {side} is the bottleneck (generation is {share:.0%} of the device time), but "
                f"with {total} devices neither side can give up another; add devices to the {side} to go faster")
    return f"the split is balanced for this workload (generation is {share:.0%} of the device time)"


def recommendations(advice: Advice, rows: list[dict[str, Any]], config: dict[str, Any], step_s: float) -> list[str]:
    lines = [split_advice(advice)]
    sync_s = mean(rows, "timing_s/sync_weights")
    asynchronous = config["async_training"]
    if advice.mode == "fully_async" and sync_s > 0.1 * step_s:
        steps = math.ceil(sync_s / (0.05 * step_s))
        lines.append(f"weight syncs take {sync_s:.2f} s per step ({sync_s / step_s:.0%}): raise "
                     f"async_training.trigger_parameter_sync_step to about {max(steps, asynchronous['trigger_parameter_sync_step'] + 1)}")
    if advice.mode == "fully_async" and (advice.trainer_idle_ratio or 0) > 0.2 and asynchronous["staleness_threshold"] < 1:
        lines.append(f"the trainer waits {advice.trainer_idle_ratio:.0%} of the time: raise "
                     f"async_training.staleness_threshold (now {asynchronous['staleness_threshold']}) towards 0.5-1 so the "
                     f"rollouter can run ahead, and turn on async_training.partial_rollout")
    return lines
