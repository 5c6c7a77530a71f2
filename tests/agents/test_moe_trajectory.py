"""Multi-turn trajectories on a mixture-of-experts engine carry one routing record over prompt, model turns and tool
results: the real agent loop, the real CPU engine on a tiny qwen3_moe and the real calculator. With replay the
trainer's forward over the packed batch selects the engine's experts at every recorded position and recomputes
every model token's log-prob; a weight sync between turns leaves the earlier positions' record as it was."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model, load_model
from asyncrl.models.routing import Routing
from asyncrl.rollout.agent import Trajectory
from asyncrl.train.forward import response_log_probs

from .test_on_policy import NUM_TURNS, calculator_agent

NUM_EXPERTS = 4


class SyncingGenerator:
    """The engine; after its first turn (when asked) a weight sync that moves every router."""

    def __init__(self, engine: LLMEngine, folder, sync_after_first: bool):
        self.engine, self.folder, self.sync_after_first = engine, folder, sync_after_first
        self.records: list[np.ndarray] = []

    async def generate(self, requests: list[GenerationRequest]):
        results = self.engine.generate(requests)
        self.records.append(results[0].routed_experts.copy())
        if self.sync_after_first and len(self.records) == 1:
            routers = {name: tensor * 3.0 for name, tensor in load_model(self.folder).named_parameters()
                       if name.endswith("gate.weight")}
            self.engine.update_weights(routers.items(), version=1)
        return results


@pytest.fixture(scope="module")
def moe_agent(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3_moe", family="qwen3_moe", seed=3,
                              init_std=0.2, hidden_size=32, num_layers=2, max_position_embeddings=256,
                              num_experts=NUM_EXPERTS, num_experts_per_tok=2)
    return (folder, *calculator_agent(folder, tmp_path_factory))


def run_trajectory(moe_agent, index: int, sync_after_first: bool) -> tuple[Sample, SyncingGenerator]:
    folder, tokenizer, agent, stop_ids = moe_agent
    generator = SyncingGenerator(LLMEngine(folder, EngineConfig(device="cpu")), folder, sync_after_first)
    problem = f"{12 + index}*34="
    text = tokenizer.apply_chat_template([{"role": "user", "content": problem}], add_generation_prompt=True,
                                         tokenize=False)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    trajectory = Trajectory.start(f"g{index}/0", prompt_ids)
    params = SamplingParams(temperature=1.0, max_new_tokens=200, seed=5 + index, stop_token_ids=stop_ids)
    asyncio.run(agent.run(generator, trajectory, params))
    assert trajectory.num_turns == NUM_TURNS
    prompt = TokenizedPrompt(PromptRecord(f"p{index}", [{"role": "user", "content": problem}], "t", "1", {}),
                             np.asarray(prompt_ids, np.int32))
    return Sample(prompt, index, 0, trajectory.as_result(), score=1.0, trajectory=trajectory), generator


def test_replay_reproduces_every_model_token_of_a_multi_turn_trajectory(moe_agent):
    samples = [run_trajectory(moe_agent, index, sync_after_first=False)[0] for index in range(3)]
    for sample in samples:   # every position recorded, tool tokens too, except the last (never an input)
        record = sample.result.routed_experts
        assert record.shape[0] == sample.result.prompt_ids.size + sample.num_response_tokens
        assert (record[:-1] < NUM_EXPERTS).all() and (record[-1] == 255).all()
    batch = samples_to_batch(samples)
    model = load_model(moe_agent[0])
    routing = Routing(replay_ids=batch.routed_experts)
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, batch, 1.0, with_entropy=False, routing=routing)
    trained = batch.response_mask > 0
    assert int(trained.sum()) == sum(sample.trajectory.num_model_tokens for sample in samples) > 20
    assert float((log_probs - batch.rollout_log_probs)[trained].abs().max()) <= 1e-5
    records = batch.routed_experts.reshape(-1, *batch.routed_experts.shape[2:]).long()
    recorded = (records < 255).all(dim=(1, 2))
    chosen = routing.stacked_expert_ids()[recorded]
    assert (chosen.sort(-1).values == records[recorded].sort(-1).values).all()


def test_a_weight_sync_between_turns_keeps_the_earlier_positions_record(moe_agent):
    sample, generator = run_trajectory(moe_agent, 7, sync_after_first=True)
    first, record = generator.records[0], sample.result.routed_experts
    kept = first.shape[0] - 1   # the first turn's recorded positions (its last token was not an input yet)
    np.testing.assert_array_equal(record[:kept], first[:kept])
    # The moved routers choose otherwise somewhere on those positions (else the test shows nothing).
    later = generator.records[1]
    fresh = LLMEngine(moe_agent[0], EngineConfig(device="cpu"))
    fresh.update_weights({name: tensor * 3.0 for name, tensor in load_model(moe_agent[0]).named_parameters()
                          if name.endswith("gate.weight")}.items(), version=1)
    context = np.concatenate([sample.result.prompt_ids, sample.result.response_ids])[:later.shape[0]]
    [recomputed] = fresh.generate([GenerationRequest("r", context.tolist(), SamplingParams(max_new_tokens=1))])
    assert not (np.sort(recomputed.routed_experts[:kept], -1) == np.sort(first[:kept], -1)).all()
    assert (record[:-1] < NUM_EXPERTS).all()
