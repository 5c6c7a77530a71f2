"""The actors of a run that sit outside its resource pools, each a fraction of a CPU or the GPU share it asks for:
reward models and judges (`reward.model`), the distillation teacher (`algorithm.distillation`) and the evaluators
(`evaluation`). Started together right after the pools, without waiting; joined once the trainers are up.

    side = SideActors.launch(config)        # they load while the replicas and trainers start
    pids = side.wait_ready(timeout_s)       # name -> process id, or the error names the actor that failed
    side.actors                             # every handle, for the composition root to kill on failure or close
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from asyncrl.config import AsyncRLConfig
from asyncrl.core.evaluation import EvaluationStage
from asyncrl.remote import wait_for_all, worker_name
from asyncrl.rewards import RewardModelPool
from asyncrl.teacher import TeacherPool


@dataclass
class SideActors:
    reward_models: Optional[RewardModelPool] = None
    teacher: Optional[TeacherPool] = None
    evaluators: list[Any] = field(default_factory=list)

    @classmethod
    def launch(cls, config: AsyncRLConfig) -> "SideActors":
        return cls(RewardModelPool.launch(config.reward.model) if config.reward.model.enable else None,
                   TeacherPool.launch(config) if config.algorithm.distillation.enable else None,
                   EvaluationStage.launch_actors(config) if config.evaluation.enable else [])

    @property
    def actors(self) -> list[Any]:
        return [*(self.reward_models.actors if self.reward_models is not None else []),
                *(self.teacher.actors if self.teacher is not None else []), *self.evaluators]

    def wait_ready(self, timeout_s: float) -> dict[str, int]:
        """Each actor's process id once it has loaded its model; a load failure raises RemoteCallError naming it."""
        pids: dict[str, int] = {}
        if self.reward_models is not None:
            pids.update(zip(self.reward_models.names, self.reward_models.wait_ready(timeout_s)))
        if self.teacher is not None:
            pids.update(zip(self.teacher.names, self.teacher.wait_ready(timeout_s)))
        names = [worker_name(EvaluationStage.POOL_NAME, index) for index in range(len(self.evaluators))]
        pids.update(zip(names, wait_for_all([actor.ping.remote() for actor in self.evaluators], names, "startup",
                                            timeout_s)))
        return pids
