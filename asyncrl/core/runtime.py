"""What the composition root (`asyncrl.launch.build_runtime`) built for one run, handed to a recipe.

    runtime = build_runtime(config)
    ... a recipe uses runtime.core, runtime.train_data, runtime.val_data ...
    runtime.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

import ray

from asyncrl.config import AsyncRLConfig
from asyncrl.core.evaluation import EvaluationStage
from asyncrl.core.stages import PPOCore
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.data.dataset import PromptDataset
from asyncrl.rewards import Scorer
from asyncrl.rollout import RolloutBackend
from asyncrl.telemetry import Timeline, Tracker

class Resources(Protocol):
    """The devices the composition root reserved for the run (`asyncrl.launch.resource_pool.Pools`)."""

    def placement(self) -> dict[str, dict[str, str]]:
        """Where each worker runs: {"trainer/rank0": {"node_id": ..., "node_ip": ...}, ...}."""
        ...

    def release(self) -> None:
        ...


class StopRequest(Protocol):
    """While entered, whether the run was asked to stop after the current step (`asyncrl.launch.StopSignals`
    turns SIGTERM and SIGINT into such a request)."""
    requested: bool
    signal_name: str

    def __enter__(self) -> "StopRequest":
        ...

    def __exit__(self, *exc_info: Any) -> None:
        ...


@dataclass
class Runtime:
    config: AsyncRLConfig
    output_dir: Path
    tokenizer: Any
    train_data: PromptDataset
    val_data: Optional[PromptDataset]
    reward: Scorer
    resources: Resources
    trainers: TrainerGroup
    rollout: RolloutBackend
    core: PPOCore
    tracker: Tracker
    timeline: Timeline
    stop: StopRequest               # the training loop enters it around its steps
    mode_actors: dict[str, Any]     # the mode's own actors (fully async: the rollouter, which owns the rollout)
    actors: list[Any]               # every actor the run started (trainer ranks, replicas, mode actors)
    resume_from: Optional[Path] = None  # the checkpoint to resume from, checked against the config before Ray
    evaluation: Optional[EvaluationStage] = None   # evaluation.enable: the evaluation stage and its actors

    def close(self) -> None:
        """Saves the timeline, stops the scoring processes, the rollout and every actor, frees the devices."""
        self.tracker.close()
        self.timeline.save(self.output_dir / "timeline.json")
        self.reward.close()
        try:
            self.rollout.close()
        finally:
            for actor in self.actors:
                ray.kill(actor)
            self.resources.release()
