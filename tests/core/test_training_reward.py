"""The reward that trains, through a real reward executor (scoring processes): the score, DAPO's overlong penalty
on training samples only, and the greedy baseline scored and shaped like the samples, never trained on."""

import numpy as np
import pytest

from asyncrl.config import load_config
from asyncrl.core.greedy_baseline import greedy_requests, greedy_params, with_greedy_results
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.core.training_reward import score_for_training
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.models.tokenizer import load_tokenizer, save_char_tokenizer
from asyncrl.rewards import RewardExecutor

# Score = number of 'a' in the response, and an extra value the metrics average.
REWARD_SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.count("a")), "acc": float(solution_str.count("a") > 1)}
'''


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(save_char_tokenizer(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text(REWARD_SOURCE)
    executor = RewardExecutor(f"{path}:compute_score", timeout_s=30.0)
    yield executor
    executor.close()


def result(tokenizer, request_id: str, text: str) -> GenerationResult:
    ids = np.array(tokenizer.encode(text, add_special_tokens=False), dtype=np.int32)
    return GenerationResult(request_id, np.array([5, 6], dtype=np.int32), ids, np.zeros(len(ids), dtype=np.float32),
                            np.zeros(len(ids), dtype=np.int32), "stop")


def sample(tokenizer, group: int, index: int, text: str) -> Sample:
    record = PromptRecord(f"p{group}", [{"role": "user", "content": "x"}], "test", "")
    return Sample(TokenizedPrompt(record, [5, 6]), group, index, result(tokenizer, f"e/p{group}/{index}", text))


def config(*overrides: str):
    return load_config(None, ["data.max_response_length=8", *overrides])


def test_overlong_penalty_is_added_to_the_trained_reward(tokenizer, executor):
    """Budget 8, buffer 4: lengths 2, 5, 8 get 0, -1/4 x 2, -4/4 x 2."""
    samples = [sample(tokenizer, 0, 0, "aa"), sample(tokenizer, 0, 1, "abaab"), sample(tokenizer, 0, 2, "aaaaaaaa")]
    shaped, metrics = score_for_training(samples, executor, tokenizer, config(
        "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4",
        "reward.overlong_buffer.penalty_factor=2.0"))
    assert [s.score for s in shaped] == [2.0, 3.0, 8.0]
    assert [s.overlong_penalty for s in shaped] == [0.0, -0.5, -2.0]
    assert [s.reward for s in shaped] == [2.0, 2.5, 6.0]
    assert samples_to_batch(shaped).token_level_scores.sum(-1).tolist() == [2.0, 2.5, 6.0]
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-2.5 / 3)
    assert metrics["reward/overlong_fraction"] == pytest.approx(2 / 3)
    assert metrics["reward/acc/mean"] == pytest.approx(1.0)


def test_without_the_buffer_the_reward_is_the_score(tokenizer, executor):
    shaped, metrics = score_for_training([sample(tokenizer, 0, 0, "aaaaaaaa")], executor, tokenizer, config())
    assert (shaped[0].reward, shaped[0].overlong_penalty) == (8.0, 0.0)
    assert "reward/overlong_penalty/mean" not in metrics


def test_the_greedy_baseline_is_scored_and_shaped_like_its_group_and_never_trained(tokenizer, executor):
    samples = [sample(tokenizer, 0, 0, "a"), sample(tokenizer, 0, 1, "aaa"), sample(tokenizer, 1, 0, "b"),
               sample(tokenizer, 1, 1, "ab")]
    greedy = [result(tokenizer, "e/p0/greedy", "aaaaaaa"), result(tokenizer, "e/p1/greedy", "bb")]
    samples = with_greedy_results(samples, greedy)
    assert [s.greedy.request_id for s in samples] == ["e/p0/greedy"] * 2 + ["e/p1/greedy"] * 2
    scored, metrics = score_for_training(samples, executor, tokenizer, config(
        "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4"))
    # Group 0's greedy response: 7 'a', 7 tokens, 3 past 8 - 4: 7 - 3/4. Group 1's: 0 'a', 2 tokens.
    assert [s.baseline_score for s in scored] == [6.25, 6.25, 0.0, 0.0]
    assert len(scored) == 4 and metrics["reward/acc/mean"] == pytest.approx(1 / 4)  # the trained samples' only
    batch = samples_to_batch(scored)
    assert batch.num_rows == 4 and batch.reward_baselines.tolist() == [6.25, 6.25, 0.0, 0.0]


def test_greedy_requests_are_temperature_zero_beside_the_sampled_ids(tokenizer):
    prompts = [TokenizedPrompt(PromptRecord("p7", [{"role": "user", "content": "x"}], "test", ""), [5, 6])]
    [request] = greedy_requests(prompts, ["epoch0"], greedy_params(16, ignore_eos=False))
    assert request.request_id == "epoch0/p7/greedy"
    assert (request.params.temperature, request.params.max_new_tokens) == (0.0, 16)
