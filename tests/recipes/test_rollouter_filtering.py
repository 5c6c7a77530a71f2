"""The fully-async rollouter under dynamic sampling, with no trainer taking: a real `Rollouter` (its scoring
processes, staleness budget and queue) over a real engine. Every group scores 0 for every response, so dynamic
sampling filters each one; each filtered prompt must leave the staleness budget, or admission stops for good
after M = int(R (1 + s) K) prompts (no sync is coming to reset the budget), as it would in a run whose
trainer waits for groups that the rollouter can no longer admit."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.data.dataset import PromptDataset
from asyncrl.engine import EngineConfig, GenerationRequest, GenerationResult, LLMEngine
from asyncrl.engine.async_engine import AsyncEngine
from asyncrl.models import load_tokenizer
from asyncrl.recipes.fully_async.rollouter import Rollouter
from asyncrl.rollout import RolloutHealth
from asyncrl.rollout.gate import BusyClock
from tests.e2e.tiny_runs import tiny_config_factory

NUM_PROMPTS = 16
ZERO_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
POLL_S = 0.1
STALL_POLLS = 10   # this many polls in a row with nothing outstanding and admission closed: stalled for good


class EngineRollout:
    """The rollout as the rollouter uses it between syncs (generate, health, activity), over one real engine."""

    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.clock = BusyClock()

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return list(await asyncio.gather(*(self.engine.generate(request) for request in requests)))

    def health(self) -> RolloutHealth:
        return RolloutHealth(num_workers=1)

    def activity(self) -> BusyClock:
        return self.clock


def is_stalled(rollouter: Rollouter) -> bool:
    """Admission is closed while nothing the budget counts is outstanding: only a release could reopen it."""
    return (not rollouter.budget.can_admit() and not rollouter.in_flight and not rollouter.unqueued
            and not rollouter.queue.items)


async def run_or_name_the_stall(rollouter: Rollouter, state: dict) -> dict[str, float]:
    """`rollouter.run` to the end of the data, or a failure naming the budget as soon as admission stalls."""
    run = asyncio.create_task(rollouter.run(0, state, []))
    stalled_polls = 0
    while not run.done():
        await asyncio.sleep(POLL_S)
        stalled_polls = stalled_polls + 1 if is_stalled(rollouter) else 0
        if stalled_polls >= STALL_POLLS:
            run.cancel()
            budget = rollouter.budget
            pytest.fail(f"fully_async admission stalled: the staleness budget holds {budget.charged} of "
                        f"{budget.max_per_version} prompts with nothing outstanding after "
                        f"{rollouter.counters['filtered_groups']} filtered groups (a filtered group was not "
                        f"released)")
    return run.result()


def test_filtered_groups_leave_the_budget_so_admission_runs_through_the_data(tmp_path):
    (tmp_path / "zero.py").write_text(ZERO_REWARD)
    config = tiny_config_factory(tmp_path, NUM_PROMPTS, 4)(
        "trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "actor.ppo_mini_batch_size=4",
        "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=0",
        f"reward.custom_function={tmp_path / 'zero.py'}:compute_score", "reward.num_workers=1")
    tokenizer = load_tokenizer(config.model.path)
    dataset = PromptDataset.from_files(config.data.train_files, tokenizer, config.data)
    rollouter = Rollouter(config, tokenizer, dataset)
    assert rollouter.budget.max_per_version == 4    # R = 4, K = 1, s = 0: a quarter of the data

    async def scenario() -> dict[str, float]:
        engine = AsyncEngine(LLMEngine(config.model.path, EngineConfig(device="cpu", cpu_kv_cache_mb=8)))
        rollouter.rollout = EngineRollout(engine)
        state = {"sampler": rollouter.sampler.state_dict(), "parked": [], "next_serial": 0}
        try:
            return await asyncio.wait_for(run_or_name_the_stall(rollouter, state), timeout=300)
        finally:
            await engine.close()

    try:
        counters = asyncio.run(scenario())
    finally:
        rollouter.reward.close()
    # Every prompt was admitted, generated and filtered; nothing was queued, and nothing holds the budget.
    assert counters["generated_groups"] == counters["filtered_groups"] == NUM_PROMPTS
    assert counters["queued_groups"] == 0 and not rollouter.queue.items
    assert rollouter.admitted_in_version == NUM_PROMPTS > rollouter.budget.max_per_version
    assert rollouter.budget.charged == 0
