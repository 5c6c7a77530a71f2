"""The fully-async staleness budget against hand-computed numbers: M = int(R (1 + s) K) prompts per version,
outstanding work charged at a sync, and the staleness bound ceil(s) it gives a FIFO trainer."""

from __future__ import annotations

from collections import deque

import pytest

from asyncrl.config import load_config
from asyncrl.recipes.fully_async.budget import StalenessBudget

# (R, K, s, M = int(R (1 + s) K), ceil(s)), worked out by hand.
BUDGETS = [
    (8, 1, 0.0, 8, 0),      # the on-policy pipeline
    (8, 2, 0.5, 24, 1),     # 8 x 1.5 x 2
    (4, 3, 1.0, 24, 1),     # 4 x 2 x 3
    (3, 2, 0.3, 7, 1),      # 3 x 1.3 x 2 = 7.8, rounded down
    (5, 1, 2.5, 17, 3),     # 5 x 3.5 = 17.5, rounded down
]
BUDGET_IDS = [f"R{r}-K{k}-s{s}" for r, k, s, _, _ in BUDGETS]


def admit_all(budget: StalenessBudget) -> int:
    """Admit while the budget allows; how many were admitted."""
    admitted = 0
    while budget.can_admit():
        budget.admit()
        admitted += 1
    return admitted


@pytest.mark.parametrize(("prompts_per_step", "steps_per_sync", "threshold", "expected_max", "expected_staleness"),
                         BUDGETS, ids=BUDGET_IDS)
def test_a_fresh_version_admits_exactly_m_prompts(prompts_per_step, steps_per_sync, threshold, expected_max,
                                                  expected_staleness):
    budget = StalenessBudget(prompts_per_step, steps_per_sync, threshold)
    assert budget.max_per_version == expected_max
    assert budget.max_staleness == expected_staleness
    assert admit_all(budget) == expected_max
    assert budget.charged == expected_max and not budget.can_admit()


@pytest.mark.parametrize(("prompts_per_step", "steps_per_sync", "threshold", "expected_max", "expected_staleness"),
                         BUDGETS, ids=BUDGET_IDS)
def test_on_sync_charges_outstanding_work_to_the_new_version(prompts_per_step, steps_per_sync, threshold,
                                                             expected_max, expected_staleness):
    budget = StalenessBudget(prompts_per_step, steps_per_sync, threshold)
    for outstanding in (0, 1, expected_max // 2, expected_max - 1):
        admit_all(budget)
        budget.on_sync(outstanding)
        assert budget.charged == outstanding
        assert admit_all(budget) == expected_max - outstanding
    for outstanding in (expected_max, expected_max + 3):  # more than a version may start: it starts none
        budget.on_sync(outstanding)
        assert not budget.can_admit()


def worst_case_pipeline(budget: StalenessBudget, num_versions: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The rollouter admits whenever the budget lets it and the trainer trains K x R prompts per version,
    oldest first. Per version: (outstanding at its sync, admitted during it); and every trained prompt's
    staleness (the trainer's version minus the version that admitted it)."""
    outstanding: deque[int] = deque()  # the admitting version of each prompt not trained yet, oldest first
    per_version, stalenesses = [], []
    for version in range(num_versions):
        if version:
            budget.on_sync(len(outstanding))
        at_sync = len(outstanding)
        admitted = admit_all(budget)
        outstanding.extend([version] * admitted)
        for _ in range(budget.steps_per_sync * budget.prompts_per_step):
            stalenesses.append(version - outstanding.popleft())
        per_version.append((at_sync, admitted))
    return per_version, stalenesses


@pytest.mark.parametrize(("prompts_per_step", "steps_per_sync", "threshold", "expected_max", "expected_staleness"),
                         BUDGETS, ids=BUDGET_IDS)
def test_outstanding_plus_admitted_stays_within_m_and_staleness_within_ceil_s(
        prompts_per_step, steps_per_sync, threshold, expected_max, expected_staleness):
    per_version, stalenesses = worst_case_pipeline(StalenessBudget(prompts_per_step, steps_per_sync, threshold), 12)
    assert all(at_sync + admitted == expected_max for at_sync, admitted in per_version)  # full, never over
    # The steady state: K x R trained and admitted per version, the rest outstanding at each sync.
    assert per_version[-1] == (expected_max - steps_per_sync * prompts_per_step, steps_per_sync * prompts_per_step)
    assert max(stalenesses) == expected_staleness  # the bound, reached by greedy admission


def test_from_config_takes_r_as_mini_batch_times_require_batches():
    config = load_config(None, ["trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "actor.ppo_mini_batch_size=4",
                                "async_training.require_batches=2", "async_training.trigger_parameter_sync_step=3",
                                "async_training.staleness_threshold=0.5"])
    budget = StalenessBudget.from_config(config)
    assert (budget.prompts_per_step, budget.steps_per_sync, budget.staleness_threshold) == (8, 3, 0.5)
    assert budget.max_per_version == 36 and budget.charged == 0


def filtering_pipeline(budget: StalenessBudget, num_versions: int, filtered_every: int,
                       release: bool) -> tuple[list[int], list[int]]:
    """As `worst_case_pipeline`, with dynamic sampling: every `filtered_every`-th admitted prompt but one is
    filtered after scoring (released from the budget when `release`), the others are kept and trained. Returns
    the prompts trained per version and every trained prompt's staleness."""
    outstanding: deque[int] = deque()
    trained_per_version, stalenesses, serial = [], [], 0
    for version in range(num_versions):
        if version:
            budget.on_sync(len(outstanding))
        while budget.can_admit():
            budget.admit()
            serial += 1
            if serial % filtered_every:   # filtered once scored
                if release:
                    budget.release()
            else:
                outstanding.append(version)
        trained = min(budget.steps_per_sync * budget.prompts_per_step, len(outstanding))
        for _ in range(trained):
            stalenesses.append(version - outstanding.popleft())
        trained_per_version.append(trained)
    return trained_per_version, stalenesses


@pytest.mark.parametrize(("prompts_per_step", "steps_per_sync", "threshold", "expected_max", "expected_staleness"),
                         BUDGETS, ids=BUDGET_IDS)
def test_filtered_groups_leave_the_budget_so_every_version_fills_within_the_bound(
        prompts_per_step, steps_per_sync, threshold, expected_max, expected_staleness):
    """3 of 4 prompts filtered: far above s / (1 + s), so without the release a version cannot fill its K steps."""
    trained, stalenesses = filtering_pipeline(StalenessBudget(prompts_per_step, steps_per_sync, threshold), 12, 4,
                                              release=True)
    assert trained == [steps_per_sync * prompts_per_step] * 12
    assert max(stalenesses) <= expected_staleness
    starved, _ = filtering_pipeline(StalenessBudget(prompts_per_step, steps_per_sync, threshold), 12, 4,
                                    release=False)
    assert starved[0] < steps_per_sync * prompts_per_step


def test_a_release_without_a_charge_is_a_bug():
    budget = StalenessBudget(4, 1, 0.0)
    budget.admit()
    budget.release()
    with pytest.raises(RuntimeError, match="released below zero"):
        budget.release()
