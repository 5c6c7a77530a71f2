"""Multi-turn trajectories are on-policy for the trainer: the real agent loop drives the real CPU engine on a
tiny model with the real calculator, and the trainer's forward over the packed batch (prompt, model turns,
tool results) recomputes, at every model token, the log-prob the engine reported when it sampled that token,
through every turn boundary. So the first PPO update sees ratio 1 (`actor/ppo_kl` 0, clip fraction 0) and
tool tokens sit at mask 0.

The random tiny model never writes a call, so the parser here reads every turn as one call to the calculator
(the loop then ends at max_assistant_turns), and a few stop tokens end its turns early, as EOS ends a trained
model's: the token that ends a turn is the model's, sampled with a log-prob and trained (mask 1), and the
environment's tokens start right after it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
import yaml

from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model, load_model, load_tokenizer
from asyncrl.rollout.agent import Trajectory
from asyncrl.rollout.agent.loop import AgentLoop, AgentSettings
from asyncrl.rollout.agent.parser import ParsedTurn, ToolCall
from asyncrl.rollout.agent.trajectory import MODEL_TOKEN, TOOL_TOKEN
from asyncrl.rollout.tools import ToolExecutor, load_tools
from asyncrl.train.forward import response_log_probs

TEMPERATURE = 0.7
NUM_TURNS = 3
PROBLEMS = ["12*34=", "5678*9=", "1+2+3=", "99*99="]


def always_a_call(text: str) -> ParsedTurn:
    return ParsedTurn(text, (ToolCall("calc", {"expr": "1234*5678"}, "c0"),))


class EngineGenerator:
    def __init__(self, engine: LLMEngine):
        self.engine = engine

    async def generate(self, requests: list[GenerationRequest]):
        return self.engine.generate(requests)


def calculator_agent(folder, tmp_path_factory) -> tuple:
    """The model's tokenizer, an agent loop whose every turn calls the real calculator (NUM_TURNS turns at most),
    and the stop ids that end its turns early: digits and EOS."""
    tokenizer = load_tokenizer(folder)
    tools = tmp_path_factory.mktemp("tools") / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": [{"class_name": "calculator"}]}))
    agent = AgentLoop(ToolExecutor(load_tools(tools), 5.0, 1), tokenizer, always_a_call,
                      AgentSettings(max_assistant_turns=NUM_TURNS))
    stop_ids = tuple(tokenizer.encode("0123456789", add_special_tokens=False)) + (tokenizer.eos_token_id,)
    return tokenizer, agent, stop_ids


@pytest.fixture(scope="module")
def rollout(tmp_path_factory):
    """Trajectories of the tiny model with the calculator, their samples, and the model folder."""
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2,
                              max_position_embeddings=256)
    tokenizer, agent, stop_ids = calculator_agent(folder, tmp_path_factory)
    generator = EngineGenerator(LLMEngine(folder, EngineConfig(device="cpu")))
    samples = []
    for index, problem in enumerate(PROBLEMS):
        text = tokenizer.apply_chat_template([{"role": "user", "content": problem}], add_generation_prompt=True,
                                             tokenize=False)
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        trajectory = Trajectory.start(f"g{index}/0", prompt_ids)
        params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=200, seed=11 + index, stop_token_ids=stop_ids)
        asyncio.run(agent.run(generator, trajectory, params))
        prompt = TokenizedPrompt(PromptRecord(f"p{index}", [{"role": "user", "content": problem}], "t", "1", {}),
                                 np.asarray(prompt_ids, np.int32))
        samples.append(Sample(prompt, index, 0, trajectory.as_result(), score=float(index % 2), trajectory=trajectory))
    return samples, folder, tokenizer, stop_ids


def test_the_trajectories_cross_tool_turns_and_each_model_turn_ends_with_its_sampled_stop_token(rollout):
    samples, _, tokenizer, stop_ids = rollout
    for sample in samples:
        trajectory = sample.trajectory
        assert trajectory.finish_reason == "max_turns" and trajectory.num_turns == NUM_TURNS
        segments = trajectory.segments()
        assert [mask for mask, _, _ in segments] == [MODEL_TOKEN, TOOL_TOKEN] * (NUM_TURNS - 1) + [MODEL_TOKEN]
        for mask, start, end in segments:
            if mask == MODEL_TOKEN:
                assert int(trajectory.ids[end - 1]) in stop_ids   # the turn's last token: sampled, trained
                assert bool((trajectory.log_probs[start:end] < 0).all())
            else:   # the calculator's result is in the environment's tokens, which never train
                assert "7006652" in tokenizer.decode(trajectory.ids[start:end].tolist())
                assert bool((trajectory.log_probs[start:end] == 0).all())


def test_the_trainer_recomputes_the_rollout_log_prob_of_every_model_token(rollout):
    samples, folder, _, _ = rollout
    batch = samples_to_batch(samples)
    for row, sample in enumerate(samples):   # the mask is exactly the trajectory's: 1 on model, 0 on tool tokens
        length = sample.num_response_tokens
        assert batch.response_mask[row, :length].tolist() == sample.trajectory.loss_mask.astype(float).tolist()
        assert batch.response_ids()[row, :length].tolist() == sample.trajectory.ids.tolist()
        assert float(batch.response_mask[row, length:].sum()) == 0.0
    with torch.no_grad():
        log_probs, _ = response_log_probs(load_model(folder), batch, TEMPERATURE, with_entropy=False)   # (B, R)
    trained = batch.response_mask > 0
    num_model_tokens = sum(sample.trajectory.num_model_tokens for sample in samples)
    assert int(trained.sum()) == num_model_tokens > 40
    difference = (log_probs - batch.rollout_log_probs)[trained]
    assert float(difference.abs().max()) <= 2e-5
    # The first PPO update's ratio: exp(new - old) with old = the rollout's log-probs (bypass mode).
    ppo_kl = float(-difference.mean())
    ratio = torch.exp(difference)
    assert abs(ppo_kl) <= 1e-6
    assert float(((ratio - 1).abs() > 0.2).float().mean()) == 0.0   # clip fraction at clip_ratio 0.2
