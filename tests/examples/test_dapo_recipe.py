"""The user-written DAPO recipe in examples/: its pure group helpers, then a real run through Ray actors.

The end-to-end run uses a random tiny model and a reward built so that filtering must happen: prompts
whose answer is even score 0 whatever the response (no signal, always dropped), the others score the
parity of the response's characters (signal unless all four responses agree). The test watches the core's
`compute_reward` and `update_actor` calls to check what was generated against what was trained.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.config import load_config
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.data.make import make_task, write_task
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.launch import build_runtime
from asyncrl.models import build_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dapo_dynamic_sampling.py"
BATCH_PROMPTS, GROUP_SIZE, NUM_STEPS = 4, 4, 3

REWARD_SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2 == 0:
        return 0.0
    return float(sum(map(ord, solution_str)) % 2)
'''


def load_example():
    spec = importlib.util.spec_from_file_location("dapo_dynamic_sampling", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dapo = load_example()


def fake_sample(group_index: int, sample_index: int, score: float) -> Sample:
    record = PromptRecord(f"p{group_index}", [{"role": "user", "content": "1+1="}], "test", "2")
    result = GenerationResult(f"r{group_index}/{sample_index}", np.array([5, 6], dtype=np.int32),
                              np.array([7, 8], dtype=np.int32), np.zeros(2, dtype=np.float32),
                              np.zeros(2, dtype=np.int32), "stop")
    return Sample(TokenizedPrompt(record, [5, 6]), group_index, sample_index, result, score=score)


def fake_round(scores_per_group: list[list[float]]) -> list[Sample]:
    return [fake_sample(group, index, score) for group, scores in enumerate(scores_per_group)
            for index, score in enumerate(scores)]


# ---- pure helpers --------------------------------------------------------------------------------------
def test_groups_with_equal_rewards_have_no_signal():
    groups = dapo.split_into_groups(fake_round([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.25]]))
    assert [len(group) for group in groups] == [3, 3, 3, 3]
    assert [dapo.has_signal(group) for group in groups] == [False, True, False, True]


def test_assemble_batch_prefers_signal_and_tops_up_only_when_short():
    with_signal = [["a"], ["b"], ["c"]]
    without_signal = [["x"], ["y"]]
    assert dapo.assemble_batch(with_signal, without_signal, 2) == ([["a"], ["b"]], 0)
    assert dapo.assemble_batch(with_signal, without_signal, 4) == ([["a"], ["b"], ["c"], ["x"]], 1)


def test_groups_from_two_rounds_get_distinct_group_ids():
    first, second = (dapo.split_into_groups(fake_round([[0, 1], [1, 0]])) for _ in range(2))
    samples = dapo.renumber_groups([first[1], second[0], second[1]])
    assert [sample.group_index for sample in samples] == [0, 0, 1, 1, 2, 2]
    assert samples_to_batch(samples).group_ids.tolist() == [0, 0, 1, 1, 2, 2]


def test_script_refuses_other_modes_before_starting_anything(capsys):
    status = dapo.main(["trainer.mode=one_step_off", "--max-gen-rounds", "2", "rollout.n=4"])
    assert status == 2
    assert "needs trainer.mode=sync" in capsys.readouterr().err


# ---- end to end through Ray actors ---------------------------------------------------------------------
def watch(core, name: str, events: list) -> None:
    """Replace the core's stage `name` by a wrapper that appends (name, args, result) to `events`."""
    stage = getattr(core, name)

    def wrapper(*args):
        result = stage(*args)
        events.append((name, args, result))
        return result

    setattr(core, name, wrapper)


def split_by_step(events: list) -> list[tuple[list[list[Sample]], object]]:
    """[(scored rounds of the step, trained batch)] in step order."""
    steps, rounds = [], []
    for name, args, result in events:
        if name == "compute_reward":
            rounds.append(result)
        else:
            steps.append((rounds, args[0]))
            rounds = []
    return steps


def batch_group_scores(batch) -> list[list[float]]:
    scores = batch.token_level_scores.sum(-1)
    return [scores[batch.group_ids == group].tolist() for group in torch.unique(batch.group_ids)]


@pytest.fixture()
def dapo_config(tmp_path):
    model = build_tiny_model(tmp_path / "model", max_position_embeddings=64)
    paths = write_task(make_task("arithmetic", {"max_digits": "1"}), tmp_path / "data", 96, 8, seed=0)
    (tmp_path / "reward.py").write_text(REWARD_SOURCE)
    return load_config(None, [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", f"data.train_batch_size={BATCH_PROMPTS}",
        "data.max_prompt_length=16", "data.max_response_length=4", f"rollout.n={GROUP_SIZE}",
        "rollout.cpu_kv_cache_mb=8", f"actor.ppo_mini_batch_size={BATCH_PROMPTS}", "actor.optim.lr=1e-3",
        f"reward.custom_function={tmp_path / 'reward.py'}:compute_score", f"trainer.total_steps={NUM_STEPS}",
        f"trainer.output_dir={tmp_path / 'run'}", "trainer.logger=[jsonl]", "ray.num_cpus=2"])


@pytest.mark.slow
def test_dapo_recipe_trains_only_on_groups_with_signal(dapo_config, ray_session):
    runtime = build_runtime(dapo_config)
    try:
        recipe = dapo.DynamicSamplingRecipe(runtime, max_gen_rounds=8)
        events: list = []
        watch(recipe.core, "compute_reward", events)
        watch(recipe.core, "update_actor", events)
        summary = recipe.fit()
        num_prompts_drawn = recipe.loop.sampler.position
    finally:
        runtime.close()

    lines = [json.loads(line) for line in (Path(dapo_config.trainer.output_dir) / "metrics.jsonl").open()]
    assert all("step" in line for line in lines)
    metrics_by_step = {line["step"]: line for line in lines if "dapo/num_gen_rounds" in line}
    assert sorted(metrics_by_step) == list(range(1, NUM_STEPS + 1)) and summary["steps"] == NUM_STEPS

    steps = split_by_step(events)
    assert len(steps) == NUM_STEPS
    for step, (rounds, batch) in enumerate(steps, start=1):
        metrics = metrics_by_step[step]
        generated = [group for samples in rounds for group in dapo.split_into_groups(samples)]
        with_signal = [group for group in generated if dapo.has_signal(group)]
        # What was trained: exactly the first train_batch_size groups with signal, in generation order.
        trained = batch_group_scores(batch)
        assert trained == [[sample.score for sample in group] for group in with_signal[:BATCH_PROMPTS]]
        assert all(len(set(scores)) > 1 for scores in trained)
        assert batch.num_rows == BATCH_PROMPTS * GROUP_SIZE
        # The step's metrics agree with what was generated.
        assert metrics["dapo/num_gen_rounds"] == len(rounds)
        assert metrics["dapo/num_generated_groups"] == len(generated) == BATCH_PROMPTS * len(rounds)
        assert metrics["dapo/num_groups_with_signal"] == len(with_signal)
        assert metrics["dapo/kept_group_fraction"] == pytest.approx(len(with_signal) / len(generated))
        assert metrics["dapo/num_filler_groups"] == 0
        # Every trained group has a non-zero advantage, so the policy moved on every step.
        assert metrics["actor/grad_norm"] > 0
    # Even-answer prompts never have signal, so filtering really happened, and every drawn prompt was generated.
    num_generated = sum(metrics["dapo/num_generated_groups"] for metrics in metrics_by_step.values())
    assert num_generated > NUM_STEPS * BATCH_PROMPTS
    assert num_prompts_drawn == num_generated
    assert summary["param_version"] == NUM_STEPS
