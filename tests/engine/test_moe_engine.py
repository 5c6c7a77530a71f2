"""The engine on mixture-of-experts models: its log-probs equal the trainer's forward in a continuous batch, it
records the experts of every token compactly, and the record survives abort, weight sync and resume."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from asyncrl.engine import GenerationRequest, GenerationResult, SamplingParams
from asyncrl.engine.kernels.grouped_moe import install_grouped_experts
from asyncrl.models import build_tiny_model, load_model
from asyncrl.models.routing import Routing, pack_routing_records
from asyncrl.train import TrainBatch
from asyncrl.train.forward import batched_log_probs, dense_positions

from .helpers import make_engine, prompt


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe_folder(request, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("moe") / request.param, family=request.param, seed=3,
                            init_std=0.2, max_position_embeddings=256, num_experts=4, num_experts_per_tok=2)


def continuous_batch_requests() -> list[GenerationRequest]:
    """Prompts of several lengths, three responses sharing one prompt (a prefill group), budgets that finish at
    different steps: admissions and finishes reshape the batch while it decodes."""
    requests = [GenerationRequest(f"p{index}", prompt(3 + 4 * index, index),
                                  SamplingParams(max_new_tokens=6 + 3 * index, seed=index)) for index in range(4)]
    requests += [GenerationRequest(f"g{index}", prompt(9, 7), SamplingParams(max_new_tokens=12, seed=20 + index))
                 for index in range(3)]
    return requests


def as_batch(results: list[GenerationResult]) -> TrainBatch:
    batch = TrainBatch.from_sequences([r.prompt_ids.tolist() for r in results],
                                      [r.response_ids.tolist() for r in results], list(range(len(results))))
    log_probs = np.zeros(tuple(batch.response_mask.shape), dtype=np.float32)
    for row, result in enumerate(results):
        log_probs[row, :result.num_response_tokens] = result.response_log_probs
    routed = pack_routing_records([r.routed_experts for r in results], batch.input_ids.shape[1])
    return batch.replace(rollout_log_probs=torch.from_numpy(log_probs), routed_experts=torch.from_numpy(routed))


def trainer_routing(model, batch: TrainBatch, replay: bool) -> Routing:
    routing = Routing(replay_ids=batch.routed_experts if replay else None)
    with torch.no_grad():
        model(batch.input_ids, dense_positions(batch.input_ids), routing=routing)
    return routing


def recorded_pairs(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, L, k) records flattened over rows and positions, and (M,) which of them the engine recorded."""
    records = batch.routed_experts.reshape(-1, *batch.routed_experts.shape[2:]).long()
    return records, (records < 255).all(dim=(1, 2))


def same_sets(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    return (first.sort(-1).values == second.sort(-1).values).all(-1)  # (M, L)


def test_engine_log_probs_and_experts_equal_the_trainer_forward(moe_folder):
    results = make_engine(moe_folder).generate(continuous_batch_requests())
    batch = as_batch(results)
    assert batch.routed_experts.dtype == torch.uint8 and batch.routed_experts.shape[2:] == (2, 2)
    for result in results:  # every input token recorded; the last token (never an input) is not
        assert (result.routed_experts[:-1] < 4).all() and (result.routed_experts[-1] == 255).all()
    model = load_model(moe_folder)
    for replay in (False, True):
        log_probs, _ = batched_log_probs(model, batch, 1.0, 4, None, False, torch.device("cpu"), replay)
        mask = batch.response_mask > 0
        assert (log_probs - batch.rollout_log_probs)[mask].abs().max() <= 1e-5
    records, recorded = recorded_pairs(batch)
    assert int(recorded.sum()) == sum(r.prompt_ids.size + r.num_response_tokens - 1 for r in results)
    for replay in (False, True):
        routing = trainer_routing(model, batch, replay)
        assert same_sets(routing.stacked_expert_ids()[recorded], records[recorded]).all()


def test_grouped_experts_path_equals_the_readable_one(moe_folder):
    model = load_model(moe_folder)
    grouped = copy.deepcopy(model)
    install_grouped_experts(grouped)
    ids = torch.tensor([prompt(11), prompt(11, 3)])
    with torch.no_grad():
        expected = model.compute_logits(model(ids, dense_positions(ids)))
        actual = grouped.compute_logits(grouped(ids, dense_positions(ids)))
        # The stacked weights are the parameters' storage: an in-place update reaches the grouped products.
        for source, target in zip(model.parameters(), grouped.parameters()):
            source.mul_(1.01)
            target.copy_(source)
        updated = model.compute_logits(model(ids, dense_positions(ids)))
        updated_grouped = grouped.compute_logits(grouped(ids, dense_positions(ids)))
    assert (actual - expected).abs().max() <= 1e-5
    assert (updated_grouped - updated).abs().max() <= 1e-5 and (updated - expected).abs().max() > 1e-3


def test_partial_rollout_keeps_the_experts_chosen_when_each_token_was_sampled(moe_folder):
    engine = make_engine(moe_folder)
    params = SamplingParams(max_new_tokens=16, seed=5, ignore_eos=True)
    engine.add_request(GenerationRequest("a", prompt(7), params))
    for _ in range(6):
        engine.step()
    aborted = engine.abort()[0]
    assert 0 < aborted.num_response_tokens < 16
    # A weight sync between the halves: the resumed prefill recomputes the old positions with new weights.
    new_weights = {name: tensor * 1.3 for name, tensor in load_model(moe_folder).named_parameters()
                   if name.endswith("gate.weight")}
    engine.update_weights(new_weights.items(), version=1)
    wire = pickle.loads(pickle.dumps(GenerationRequest.resume(aborted, params)))  # what crosses Ray
    np.testing.assert_array_equal(wire.routed_experts, aborted.routed_experts)
    result = engine.generate([wire])[0]
    kept = aborted.prompt_ids.size + aborted.num_response_tokens - 1  # positions recorded before the abort
    np.testing.assert_array_equal(result.routed_experts[:kept], aborted.routed_experts[:kept])
    assert (result.routed_experts[:-1] < 4).all()
    # The new router disagrees with the record somewhere (else the test shows nothing); replay restores it.
    model = load_model(moe_folder)
    model.load_state_dict({**model.state_dict(), **new_weights})
    batch = as_batch([result])
    records, recorded = recorded_pairs(batch)
    free = trainer_routing(model, batch, replay=False).stacked_expert_ids()
    assert not same_sets(free[recorded][:kept], records[recorded][:kept]).all()
    replayed = trainer_routing(model, batch, replay=True).stacked_expert_ids()
    assert same_sets(replayed[recorded], records[recorded]).all()


def test_the_prefix_cache_stays_off_for_moe_models(moe_folder):
    """A cached prefix would come without its routing record: the engine keeps the cache off, and a second request
    on the same prompt records the experts of every position again."""
    engine = make_engine(moe_folder)
    assert not engine.block_manager.enable_prefix_caching
    prompt_ids = list(range(6, 30))
    for index in range(2):
        [result] = engine.generate([GenerationRequest(f"r{index}", prompt_ids,
                                                      SamplingParams(max_new_tokens=3, seed=index))])
        assert result.num_cached_tokens == 0 and result.routed_experts.shape[0] == len(prompt_ids) + 3
