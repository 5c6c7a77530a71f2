"""The turn loop with the tiny model's real tokenizer and chat template, the real calculator and a scripted
generator (the engine's one stand-in here): trajectories are token-exact, tool tokens are masked, budgets and
turn limits end them, an abort parks a turn that later resumes on new weights, and a restored trajectory
whose tools were running runs them again."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import yaml

from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.rollout.agent import Trajectory
from asyncrl.rollout.agent.generation import start_agent_generation
from asyncrl.rollout.agent.loop import AgentLoop
from asyncrl.rollout.agent.metrics import agent_metrics, tool_spans
from asyncrl.rollout.backend import PendingGeneration, WorkerOutput
from asyncrl.config.rollout_schema import MultiTurnConfig

CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "1234*5678"}}</tool_call>'


class ScriptedGenerator:
    """Answers turn k with the k-th scripted text (+ EOS), log-prob -0.1 per token, at `version`; `abort_at`
    (turn, tokens) cuts that turn once after so many tokens."""

    def __init__(self, tokenizer, texts, abort_at=None):
        self.tokenizer, self.texts, self.abort_at = tokenizer, texts, abort_at
        self.version = 0
        self.requests: list[GenerationRequest] = []

    async def generate(self, requests):
        request = requests[0]
        self.requests.append(request)
        turn = int(request.request_id.rsplit("turn", 1)[1])
        full = list(self.tokenizer.encode(self.texts[turn], add_special_tokens=False)) + [self.tokenizer.eos_token_id]
        done = request.response_ids.size
        budget = request.params.max_new_tokens - done
        new = full[done:done + budget]
        reason = "stop" if done + len(new) == len(full) else "length"
        if self.abort_at is not None and self.abort_at[0] == turn and not done:
            new, reason, self.abort_at = new[:self.abort_at[1]], "abort", None
        ids = np.concatenate([request.response_ids, np.asarray(new, np.int32)])
        versions = np.concatenate([request.response_versions, np.full(len(new), self.version, np.int32)])
        log_probs = np.concatenate([request.response_log_probs, np.full(len(new), -0.1, np.float32)])
        return [GenerationResult(request.request_id, request.prompt_ids, ids, log_probs, versions, reason)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=1))


@pytest.fixture()
def agent(tokenizer, tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": [{"class_name": "calculator"}]}))
    return AgentLoop.from_config(MultiTurnConfig(enable=True, tool_config_path=str(path), max_assistant_turns=3,
                                                 max_tool_response_length=6), tokenizer)


def start(tokenizer, text="1234*5678="):
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    return Trajectory.start("g0/0", tokenizer.encode(prompt, add_special_tokens=False))


def run(agent, generator, trajectory, budget=200):
    return asyncio.run(agent.run(generator, trajectory, SamplingParams(max_new_tokens=budget, seed=5)))


def test_a_trajectory_is_the_sampled_ids_plus_the_rendered_tool_ids_position_by_position(agent, tokenizer):
    generator = ScriptedGenerator(tokenizer, [CALL, "7006652"])
    trajectory = run(agent, generator, start(tokenizer))
    eos = [tokenizer.eos_token_id]
    sampled_1 = tokenizer.encode(CALL, add_special_tokens=False) + eos
    rendered = tokenizer.encode("<|user|><tool_response>700652</tool_response><|assistant|>", add_special_tokens=False)
    sampled_2 = tokenizer.encode("7006652", add_special_tokens=False) + eos
    assert trajectory.ids.tolist() == sampled_1 + rendered + sampled_2   # "7006652" cut to 6 tokens in the middle
    assert trajectory.loss_mask.tolist() == [1] * len(sampled_1) + [0] * len(rendered) + [1] * len(sampled_2)
    assert trajectory.finish_reason == "stop" and trajectory.num_turns == 2
    assert [(call.name, call.arguments, call.status, call.output) for call in trajectory.calls] == [
        ("calc", {"expr": "1234*5678"}, "ok", "7006652")]
    # The second turn's prompt was exactly the context so far: nothing re-tokenized.
    assert generator.requests[1].prompt_ids.tolist() == trajectory.prompt_ids.tolist() + sampled_1 + rendered
    # The drift check: re-templating the messages gives the same ids (true for this template and these turns).
    messages = [{"role": "user", "content": "1234*5678="}, *trajectory.messages]
    rendered_all = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.encode(rendered_all, add_special_tokens=False) == trajectory.context_ids().tolist()


def test_a_bad_call_is_an_observation_and_the_turn_limit_ends_the_trajectory(agent, tokenizer):
    bad = '<tool_call>{"name": "calc", "arguments": {"expr": "1234*"}}</tool_call>'
    generator = ScriptedGenerator(tokenizer, [bad, '<tool_call>{"name": "cal"}</tool_call>', CALL, "never"])
    trajectory = run(agent, generator, start(tokenizer), budget=400)
    assert [call.status for call in trajectory.calls] == ["error", "unknown_tool"]
    assert trajectory.finish_reason == "max_turns" and trajectory.num_turns == 3
    assert trajectory.calls[0].output.startswith("tool 'calc' failed: cannot parse")
    assert trajectory.messages[1]["role"] == "tool"
    assert trajectory.loss_mask[-1] == 1                     # it ends on the model's turn, results not appended


def test_the_budget_counts_tool_tokens_and_ends_the_trajectory(agent, tokenizer):
    call_ids = len(tokenizer.encode(CALL, add_special_tokens=False)) + 1
    trajectory = run(agent, ScriptedGenerator(tokenizer, [CALL, "7006652"]), start(tokenizer), budget=call_ids + 10)
    assert trajectory.finish_reason == "length" and trajectory.num_tool_tokens == 0
    cut = run(agent, ScriptedGenerator(tokenizer, [CALL]), start(tokenizer), budget=20)
    assert cut.finish_reason == "length" and cut.num_tokens == 20 and cut.calls == []


def test_an_aborted_turn_resumes_on_new_weights_and_versions_show_both(agent, tokenizer):
    generator = ScriptedGenerator(tokenizer, [CALL, "7006652"], abort_at=(1, 3))
    trajectory = run(agent, generator, start(tokenizer))
    assert trajectory.finish_reason is None and trajectory.partial.response_ids.size == 3
    assert trajectory.as_result().finish_reason == "abort"
    generator.version = 1                                     # a weight sync while the turn was parked
    trajectory = run(agent, generator, trajectory)
    assert trajectory.finish_reason == "stop"
    model_versions = trajectory.versions[trajectory.loss_mask == 1].tolist()
    call_tokens = len(tokenizer.encode(CALL, add_special_tokens=False)) + 1
    assert model_versions == [0] * (call_tokens + 3) + [1] * 5   # "7006652" + EOS = 8 tokens, 3 before the sync
    assert tokenizer.decode(trajectory.ids[trajectory.turn_ids == 1].tolist(), skip_special_tokens=True) == "7006652"


def test_a_restored_trajectory_whose_tools_were_running_runs_them_again(agent, tokenizer):
    generator = ScriptedGenerator(tokenizer, [CALL, "7006652"])
    trajectory = start(tokenizer)
    first = asyncio.run(generator.generate([GenerationRequest("g0/0/turn0", trajectory.context_ids(),
                                                              SamplingParams(max_new_tokens=200))]))[0]
    trajectory.append_model(first)                            # the checkpoint was taken here, mid-tool
    trajectory = run(agent, generator, trajectory)
    assert trajectory.finish_reason == "stop" and [call.status for call in trajectory.calls] == ["ok"]
    assert trajectory.loss_mask.tolist().count(0) > 0 and trajectory.num_turns == 2


def test_metrics_count_turns_calls_failures_and_tokens_by_source(agent, tokenizer):
    good = run(agent, ScriptedGenerator(tokenizer, [CALL, "7006652"]), start(tokenizer))
    bad = run(agent, ScriptedGenerator(tokenizer, ['<tool_call>{"name": "x"}</tool_call>', "1"]), start(tokenizer))
    plain = run(agent, ScriptedGenerator(tokenizer, ["5"]), start(tokenizer))
    metrics = agent_metrics([good, bad, plain])
    assert metrics["num_turns/mean"] == pytest.approx(5 / 3) and metrics["num_turns/max"] == 2
    assert metrics["tool_calls/mean"] == pytest.approx(2 / 3)
    assert (metrics["tool/errors"], metrics["tool/timeouts"]) == (1.0, 0.0)
    assert metrics["response_length/tool_tokens/mean"] == pytest.approx(
        (good.num_tool_tokens + bad.num_tool_tokens) / 3)
    assert [span[0] for span in tool_spans([good, bad, plain])] == ["tool:calc", "tool:x"]


class CountingBackend(ScriptedGenerator):
    """The driver's side of a backend (`start_generate`, as the driver stages dispatch a batch): records the
    size of every call, and holds its awaitable `generate` closed, as a paused backend's gate is."""

    def __init__(self, tokenizer, texts):
        super().__init__(tokenizer, texts)
        self.call_sizes: list[int] = []

    async def generate(self, requests):
        raise AssertionError("the driver's stages dispatch with start_generate; generate waits at a pause gate")

    def start_generate(self, requests):
        self.call_sizes.append(len(requests))
        results = [asyncio.run(ScriptedGenerator.generate(self, [request]))[0] for request in requests]
        return PendingGeneration.finished(requests, [WorkerOutput("scripted", results, 0.0)], 0.0)


def test_the_driver_batches_turns_across_trajectories_and_returns_them_in_order(agent, tokenizer):
    generator = CountingBackend(tokenizer, [CALL, "7006652"])
    requests = [GenerationRequest(f"s/{index}", start(tokenizer).prompt_ids, SamplingParams(max_new_tokens=200,
                                                                                              seed=index))
                for index in range(6)]
    pending = start_agent_generation(generator, agent, requests, [{}] * 6, timeout_s=60)
    results = pending.results()
    assert [result.request_id for result in results] == [f"s/{index}" for index in range(6)]
    assert generator.call_sizes == [6, 6]      # both turns of all six trajectories, in two engine calls
    assert all(trajectory.finish_reason == "stop" and trajectory.num_turns == 2 for trajectory in pending.trajectories)
    assert results[0].response_ids.tolist() == pending.trajectories[0].ids.tolist()
