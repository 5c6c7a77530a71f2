"""Run a training job from a validated config: build the runtime, run the mode's recipe, clean up.

    summary = train(load_config("run.yaml", ["trainer.mode=sync"]))
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.config import AsyncRLConfig
from asyncrl.launch.cpu_threads import cpu_policy
from asyncrl.launch.runtime import ModeActors, build_runtime
from asyncrl.recipes.errors import RunAlreadyFinished
from asyncrl.recipes.fully_async import FullyAsyncRecipe
from asyncrl.recipes.one_step_off import OneStepOffRecipe
from asyncrl.recipes.sync import SyncRecipe

RECIPES = {"sync": SyncRecipe, "one_step_off": OneStepOffRecipe, "fully_async": FullyAsyncRecipe}
# Started with the runtime, not after it; the fully-async rollouter owns the rollout backend.
MODE_ACTORS = {"fully_async": ModeActors(FullyAsyncRecipe.launch_actors, FullyAsyncRecipe.host_rollout)}

logger = logging.getLogger(__name__)


def train(config: AsyncRLConfig) -> dict[str, Any]:
    """The run's summary. Run again on a finished run's trainer.output_dir (trainer.resume=auto), nothing starts:
    a warning says how to train again, and the finished run's summary comes back with "already_finished"."""
    if config.trainer.mode not in RECIPES:
        raise NotImplementedError(f"trainer.mode={config.trainer.mode} is not available yet; available: "
                                  f"{sorted(RECIPES)}")
    with cpu_policy():
        try:
            runtime = build_runtime(config, MODE_ACTORS.get(config.trainer.mode))
        except RunAlreadyFinished as finished:
            logger.warning("%s", finished)
            return {**finished.summary, "already_finished": True}
        try:
            return RECIPES[config.trainer.mode](runtime).fit()
        finally:
            runtime.close()
