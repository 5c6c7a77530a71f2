"""Reward models, judges and async reward functions driving fully-async runs through real Ray actors.

On the demo's arithmetic task the warm policy stutters ("122" -> "1222"). A hand-set reward model that prefers
fewer digits, and a hand-set judge that answers 1 for at most 3 digits, each replace the rule score
(reward.model.combine=model_only): every dumped reward must equal the model's own score of that response, and
the preferred property must rise by a stated margin. An `async def` reward function is awaited and scores
every sample as its hand computation says.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.launch import train
from asyncrl.rewards import RewardRequest
from asyncrl.rewards.reward_model import DiscriminativeRewardModel
from asyncrl.telemetry import read_metrics
from tests.rewards.reward_models import JUDGE_TEMPLATE, build_brevity_judge, build_brevity_reward_model

FULLY_ASYNC = ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
               "trainer.val_before_train=false", "data.val_files=[]", "data.train_batch_size=8",
               "actor.ppo_mini_batch_size=8", "actor.optim.lr=5e-4")
MODEL_ONLY = ("reward.model.enable=true", "reward.model.combine=model_only", "reward.model.num_cpus_per_worker=0.05")
USER, ASSISTANT = "<|user|>", "<|assistant|>"


def dumped(output_dir: str) -> dict[int, list[dict]]:
    folder = Path(output_dir) / "rollouts"
    return {int(path.stem.split("_")[1]): [json.loads(line) for line in path.read_text().splitlines()]
            for path in folder.glob("step_*.jsonl")}


def question(row: dict) -> str:
    """The user's text of a dumped prompt ('<|user|>37+85=<|assistant|>')."""
    return row["prompt"].removeprefix(USER).removesuffix(ASSISTANT)


def num_digits(text: str) -> int:
    return sum(character.isdigit() for character in text)


def early_and_late(steps: dict[int, list[dict]], measure) -> tuple[float, float]:
    """The mean of `measure` over the first two steps' samples and over the last two steps'."""
    ordered = [steps[step] for step in sorted(steps)]
    early = [measure(row) for rows in ordered[:2] for row in rows]
    late = [measure(row) for rows in ordered[-2:] for row in rows]
    return sum(early) / len(early), sum(late) / len(late)


def test_a_reward_model_alone_teaches_shorter_answers(make_config, ray_session, tmp_path):
    folder = build_brevity_reward_model(tmp_path / "brevity_rm")
    config = make_config(*FULLY_ASYNC, *MODEL_ONLY, f"reward.model.path={folder}", "trainer.total_steps=8")
    train(config)
    steps = dumped(config.trainer.output_dir)
    assert sorted(steps) == list(range(1, 9))
    # Every trained reward is the reward model's own score of that conversation (weight 1, model only).
    model = DiscriminativeRewardModel(str(folder))
    rows = [row for rows in steps.values() for row in rows]
    expected = model.score([RewardRequest("", row["response"], None, {}, ({"role": "user", "content": question(row)},))
                            for row in rows])
    assert [row["score"] for row in rows] == pytest.approx([result.score for result in expected], abs=1e-4)
    early, late = early_and_late(steps, lambda row: num_digits(row["response"]))
    assert late <= early - 0.3, (early, late)
    metrics = read_metrics(f"{config.trainer.output_dir}/metrics.jsonl")
    counted = [row for row in metrics if "reward/model_errors" in row]  # the rollouter's counters, at each sync
    assert counted and all(row["reward/model_errors"] == 0 and row["reward/model_timeouts"] == 0 for row in counted)
    trained = [row for row in metrics if "critic/score/mean" in row]
    assert len(trained) == 8 and all("reward/rule/mean" in row for row in trained)
    # model_only with weight 1: the trained score is the model's.
    assert [row["reward/model/mean"] for row in trained] == pytest.approx([row["critic/score/mean"] for row in trained])


def test_a_generative_judge_alone_teaches_its_preference(make_config, ray_session, tmp_path):
    folder = build_brevity_judge(tmp_path / "brevity_judge", max_digits=3)
    config = make_config(*FULLY_ASYNC, *MODEL_ONLY, "reward.model.kind=generative", f"reward.model.path={folder}",
                         f"reward.model.prompt_template='{JUDGE_TEMPLATE}'", "reward.model.max_new_tokens=1",
                         "trainer.total_steps=8")
    train(config)
    steps = dumped(config.trainer.output_dir)
    rows = [row for rows in steps.values() for row in rows]
    # The judge's verdict, by hand: its feature is the digit fraction of its user turn (the response's characters
    # plus two role tokens), thresholded between 3 digits of 5 tokens and 4 of 6; so it is "at most 3 digits" for
    # an all-digit answer, and a response with other characters ('100=6': 4 of 7) can pass with more.
    threshold = (3 / 5 + 4 / 6) / 2
    assert [row["score"] for row in rows] == [
        float(num_digits(row["response"]) / (len(row["response"]) + 2) < threshold) for row in rows]
    early, late = early_and_late(steps, lambda row: row["score"])
    assert late >= early + 0.1, (early, late)


ASYNC_REWARD = '''
import asyncio


async def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0.001)
    return {"score": 2.0 * (solution_str.strip() == str(ground_truth)) - 0.5, "awaited": 1.0}
'''


def test_an_async_reward_function_scores_every_sample(make_config, ray_session, tmp_path):
    reward_file = tmp_path / "async_reward.py"
    reward_file.write_text(ASYNC_REWARD)
    config = make_config(*FULLY_ASYNC, f"reward.custom_function={reward_file}:compute_score", "trainer.total_steps=2")
    train(config)
    rows = [row for rows in dumped(config.trainer.output_dir).values() for row in rows]
    answers = {question(row): str(eval(question(row).removesuffix("="))) for row in rows}  # "37+85=" -> "122"
    assert len(rows) == 2 * 8 * 8
    assert [row["score"] for row in rows] == [2.0 * (row["response"].strip() == answers[question(row)]) - 0.5
                                              for row in rows]
    assert {row["score"] for row in rows} == {1.5, -0.5}  # both outcomes occur, so the check could fail
