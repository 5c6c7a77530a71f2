"""Colocated synchronous PPO / GRPO: generate, score, train, sync, on the same devices, one step at a time.

    asyncrl train config.yaml trainer.mode=sync

The rollout engines live inside the trainer ranks (they sleep while training on GPU), and weights move
in process after each update, so every token is sampled by the current policy (staleness 0). The step
is only stage calls; the stages live in `asyncrl.core`.
"""

from __future__ import annotations

import time
from typing import Any

from asyncrl.core.records import Sample
from asyncrl.data.records import TokenizedPrompt
from asyncrl.recipes.run_state import RunState
from asyncrl.recipes.runtime import Runtime
from asyncrl.telemetry import Progress


class SyncRecipe:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self.core = runtime.core
        self.state = RunState.create(runtime)

    def step(self, prompts: list[TokenizedPrompt], step: int) -> tuple[dict[str, float], list[Sample]]:
        metrics: dict[str, float] = {}
        samples = self.core.generate(prompts, metrics, salt=f"step{step}")
        samples = self.core.compute_reward(samples, metrics)
        batch = self.core.build_batch(samples, metrics)
        batch = self.core.compute_old_log_prob(batch, metrics)
        batch = self.core.compute_ref_log_prob(batch, metrics)
        batch = self.core.compute_values(batch, metrics)
        batch = self.core.compute_advantage(batch, metrics)
        self.core.update_critic(batch, step, metrics)
        self.core.update_actor(batch, step, metrics)
        self.core.sync_weights(metrics)
        return metrics, samples

    def fit(self) -> dict[str, Any]:
        state = self.state
        state.resume()
        initial: dict[str, float] = {}
        if self.runtime.config.trainer.val_before_train and state.step == 0:
            state.validate(initial)
            self.core.log(initial, 0)
        progress = Progress(state.total_steps, initial_step=state.step)
        while not state.is_done:
            started = time.monotonic()
            prompts = state.next_prompts()
            metrics, samples = self.step(prompts, state.step + 1)
            state.step += 1
            num_tokens = sum(sample.result.prompt_ids.size + sample.num_response_tokens for sample in samples)
            state.record_step(metrics, len(samples), num_tokens, time.monotonic() - started)
            state.dump_rollouts(samples, self.core.decode)
            state.maybe_validate(metrics)
            self.core.log(metrics, state.step)
            progress.update(state.step, metrics)
            state.maybe_save()
        progress.close()
        return state.finish(initial)
