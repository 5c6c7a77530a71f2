"""Reward models and judges: the discriminative model against transformers on the conversation it reads, the
judge's prompt and parsers, the combination with the rule score, the pre-Ray checks, and the pool's real Ray
actors (batches split in order, a timeout and a dead actor scoring 0 and counted, the pool going on)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pytest
import torch
import transformers

from asyncrl.config import ConfigError
from asyncrl.config.reward_schema import RewardModelConfig
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model
from asyncrl.remote import RemoteUnavailableError
from asyncrl.rewards import RewardExecutor, RewardModelPool, RewardRequest, Scorer, check_reward_model
from asyncrl.rewards.judge import GenerativeJudge, check_template, parse_number, parse_yes_no
from asyncrl.rewards.protocol import Failure, RewardResult
from asyncrl.rewards.reward_model import DiscriminativeRewardModel, conversation_text
from asyncrl.rewards.scorer import combine

from .helpers import write_reward_file
from .reward_models import build_brevity_reward_model

QUESTION = ({"role": "user", "content": "37+85="},)


def request(response: str, ground_truth: str = "122") -> RewardRequest:
    return RewardRequest("asyncrl/arithmetic", response, ground_truth, {}, QUESTION)


@pytest.fixture(scope="module")
def brevity_model(tmp_path_factory) -> Path:
    return build_brevity_reward_model(tmp_path_factory.mktemp("rm") / "brevity")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("lm") / "judge", family="qwen2", seed=3, init_std=0.2,
                            hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, max_position_embeddings=64)


def test_discriminative_scores_equal_transformers_on_the_chat_conversation(brevity_model):
    model = DiscriminativeRewardModel(str(brevity_model), micro_batch_size=2)  # 5 requests: 3 micro-batches
    responses = ["", "1", "12", "122", "1222"]
    results = model.score([request(text) for text in responses])
    assert conversation_text(model.tokenizer, request("122")) == "<|user|>37+85=<|assistant|>122<|endoftext|>"
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(brevity_model, dtype=torch.float32)
    with torch.no_grad():
        expected = [reference(input_ids=torch.tensor([model.encode(request(text))])).logits.item()
                    for text in responses]
    assert [result.score for result in results] == pytest.approx(expected, abs=1e-5)
    # The hand-set preference: every digit more in the response lowers the score.
    assert all(earlier > later + 0.3 for earlier, later in zip(expected, expected[1:]))


def test_a_long_conversation_keeps_its_last_tokens(brevity_model):
    model = DiscriminativeRewardModel(str(brevity_model), max_length=7)
    assert model.tokenizer.decode(model.encode(request("1222"))) == "=<|assistant|>1222<|endoftext|>"


def test_parsers_read_numbers_and_yes_no():
    assert parse_number("Score: 7/10") == 7.0 and parse_number("-0.5 points") == -0.5 and parse_number("none") is None
    assert parse_yes_no("Yes, it is") == 1.0 and parse_yes_no("no.") == 0.0 and parse_yes_no("maybe") is None
    assert parse_yes_no("yesterday no") == 0.0  # whole words only


def test_template_fields_are_checked():
    check_template("Q: {prompt} A: {response} ref {ground_truth} {{literal}}")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['answer'\]"):
        check_template("{prompt} {answer}")
    with pytest.raises(ValueError, match="not a valid format string"):
        check_template("{prompt")


def test_judge_answers_greedily_and_parses(tiny_lm, tmp_path):
    parser = write_reward_file(tmp_path, """
        def length_of(answer):
            return None if answer == "" else len(answer)
    """, name="parser.py")
    judge = GenerativeJudge(str(tiny_lm), "Q:{prompt} A:{response} R:{ground_truth}", f"{parser}:length_of",
                            max_new_tokens=5)
    prompt_ids = judge.judge_prompt(request("1222"))
    assert judge.tokenizer.decode(prompt_ids) == "<|user|>Q:37+85= A:1222 R:122<|assistant|>"
    engine = LLMEngine(tiny_lm, EngineConfig(device="cpu"))
    greedy = engine.generate([GenerationRequest("x", prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=5))])
    answer = judge.tokenizer.decode(greedy[0].response_ids.tolist(), skip_special_tokens=True)
    results = judge.score([request("1222"), request("9" * 80)])
    expected = RewardResult(score=float(len(answer))) if answer else RewardResult.failed(Failure.ERROR, "")
    assert results[0].score == expected.score and results[0].failure is expected.failure
    assert results[1].failure is Failure.ERROR and "exceeds the judge's 63" in results[1].error


def test_combine_modes_by_hand():
    rule, model = RewardResult(score=1.0, extra={"acc": 1.0}), RewardResult(score=-2.0)
    failed = RewardResult.failed(Failure.TIMEOUT, "reward_model/replica0: score did not answer within 1s")
    config = RewardModelConfig(enable=True, weight=0.5)
    summed = combine(rule, model, config)
    assert summed.score == 0.0 and summed.extra == {"acc": 1.0, "rule": 1.0, "model": -2.0} and summed.error is None
    assert combine(rule, model, dataclasses.replace(config, combine="model_only")).score == -1.0
    fallback = dataclasses.replace(config, combine="rule_if_model_failed")
    assert combine(rule, model, fallback).score == -1.0
    assert combine(rule, failed, fallback).score == 1.0
    assert combine(rule, failed, config).score == 1.0  # sum: the failed model part is 0
    kept = combine(rule, failed, config)
    assert kept.failure is Failure.TIMEOUT and kept.error.startswith("reward model: reward_model/replica0")


def test_pre_ray_checks_name_the_key(brevity_model, tiny_lm):
    enabled = RewardModelConfig(enable=True)
    check_reward_model(RewardModelConfig())  # disabled: nothing to check
    check_reward_model(dataclasses.replace(enabled, path=str(brevity_model)))
    with pytest.raises(ConfigError, match="reward.model.path is empty"):
        check_reward_model(enabled)
    with pytest.raises(ConfigError, match=r"reward.model \(kind=discriminative.*holds a causal LM"):
        check_reward_model(dataclasses.replace(enabled, path=str(tiny_lm)))
    judge = dataclasses.replace(enabled, kind="generative", path=str(tiny_lm), prompt_template="{response}")
    check_reward_model(judge)
    # The default template is 101 characters: with the judge's character tokenizer it cannot fit 64 positions.
    with pytest.raises(ConfigError, match=r"^reward.model \(kind=generative, path=.*\): reward.model.prompt_template "
                                          r"takes \d+ of the judge's tokens before any sample's text, in its chat "
                                          r"template, and the judge's context is 64 .*no judge prompt would fit"):
        check_reward_model(dataclasses.replace(judge, prompt_template=RewardModelConfig().prompt_template))
    with pytest.raises(ConfigError, match=r"the judge's context is 4 \(reward.model.max_length"):
        check_reward_model(dataclasses.replace(judge, prompt_template="{response} ok?", max_length=4))
    with pytest.raises(ConfigError, match=r"prompt_template has unknown field"):
        check_reward_model(dataclasses.replace(judge, prompt_template="{question}"))
    with pytest.raises(ConfigError, match=r"answer_parser='numbers' is neither a built-in parser"):
        check_reward_model(dataclasses.replace(judge, answer_parser="numbers"))
    with pytest.raises(ConfigError, match=r"file missing.py does not exist"):
        check_reward_model(dataclasses.replace(judge, answer_parser="missing.py:parse"))


def test_pool_splits_batches_over_real_actors_in_order(ray_session, brevity_model):
    config = RewardModelConfig(enable=True, path=str(brevity_model), num_workers=2, num_cpus_per_worker=0.05)
    pool = RewardModelPool.launch(config)
    try:
        pids = pool.wait_ready(timeout_s=120)
        assert len(set(pids)) == 2
        responses = ["1", "12", "122", "1222", "12222"]
        pending = pool.start([request(text) for text in responses])
        assert pending.shares == [(0, 2), (2, 5)]
        results = pool.collect(pending)
        local = DiscriminativeRewardModel(str(brevity_model)).score([request(text) for text in responses])
        assert [result.score for result in results] == pytest.approx([result.score for result in local], abs=1e-6)
        assert pool.metrics() == {"reward/model_scored": 5, "reward/model_errors": 0, "reward/model_timeouts": 0}
    finally:
        for actor in pool.actors:
            ray_session.kill(actor)


def test_scorer_adds_the_pools_score_to_the_rule_executors(ray_session, brevity_model):
    config = RewardModelConfig(enable=True, path=str(brevity_model), weight=0.1, num_cpus_per_worker=0.05)
    pool = RewardModelPool.launch(config)
    scorer = Scorer(RewardExecutor("", timeout_s=30), pool, config)  # the built-in arithmetic scorer
    try:
        pool.wait_ready(timeout_s=120)
        results = scorer.score([request("122"), request("1222")])
        model = DiscriminativeRewardModel(str(brevity_model)).score([request("122"), request("1222")])
        assert [result.extra["rule"] for result in results] == [1.0, 0.0]
        assert [result.extra["model"] for result in results] == pytest.approx([result.score for result in model])
        assert [result.score for result in results] == pytest.approx([1.0 + 0.1 * model[0].score,
                                                                      0.1 * model[1].score])
        metrics = scorer.metrics()
        assert metrics["reward/num_scored"] == 2 and metrics["reward/model_scored"] == 2
    finally:
        scorer.close()
        for actor in pool.actors:
            ray_session.kill(actor)


def ready_after_restart(pool: RewardModelPool) -> int:
    """The actor's new pid once Ray has restarted it (a call made while it restarts fails as unavailable)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return pool.wait_ready(timeout_s=120)[0]
        except RemoteUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_slow_or_dying_judge_scores_zero_is_counted_and_the_pool_goes_on(ray_session, tiny_lm, tmp_path):
    # The parser's behaviour is read from a file at each call, so the test can change it while the actor lives.
    mode = tmp_path / "mode.txt"
    parser = write_reward_file(tmp_path, f"""
        import os, time
        from pathlib import Path

        def parse(answer):
            mode = Path({str(mode)!r}).read_text()
            if mode == "slow":
                time.sleep(30)
            if mode == "die":
                os._exit(3)
            return 1.0
    """, name="parser.py")
    mode.write_text("slow")
    config = RewardModelConfig(enable=True, kind="generative", path=str(tiny_lm), answer_parser=f"{parser}:parse",
                               prompt_template="{response}", max_new_tokens=2, timeout_s=3.0, num_cpus_per_worker=0.05)
    pool = RewardModelPool.launch(config)
    try:
        first_pid = pool.wait_ready(timeout_s=120)[0]
        started = time.monotonic()
        timed_out = pool.collect(pool.start([request("1"), request("2")]))
        assert time.monotonic() - started < 20  # the deadline, not the 30 s sleep
        assert [result.failure for result in timed_out] == [Failure.TIMEOUT] * 2, timed_out[0].error
        assert all(result.score == 0.0 and "did not answer within 3s" in result.error for result in timed_out)
        mode.write_text("ok")
        restarted_pid = ready_after_restart(pool)
        assert restarted_pid != first_pid
        assert [result.score for result in pool.collect(pool.start([request("3")]))] == [1.0]
        mode.write_text("die")
        died = pool.collect(pool.start([request("4")]))
        assert died[0].failure is Failure.ERROR and "reward_model/replica0" in died[0].error
        assert pool.metrics() == {"reward/model_scored": 4, "reward/model_errors": 1, "reward/model_timeouts": 2}
        assert math.isfinite(sum(result.score for result in [*timed_out, *died]))
    finally:
        for actor in pool.actors:
            ray_session.kill(actor)
