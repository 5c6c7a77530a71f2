"""Mixture-of-experts on a GPU: the grouped expert products (`torch._grouped_mm`, bf16) against the readable
per-expert path, and the engine's bf16 log-probs and expert records against the trainer's forward with and
without routing replay. bf16 rounds differently in each path, so the bounds are bf16's: a router's near-tie can
pick another expert, which is what replay exists for."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.engine import GenerationRequest, SamplingParams
from asyncrl.engine.kernels.grouped_moe import install_grouped_experts
from asyncrl.models import build_tiny_model, load_model
from asyncrl.train.forward import batched_log_probs, dense_positions

from .helpers import make_engine, prompt
from .test_moe_engine import as_batch, recorded_pairs, same_sets, trainer_routing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def moe_folder(request, tmp_path_factory):
    # Experts wide enough that the grouped products are real GEMMs; 8 experts, 2 per token.
    return build_tiny_model(tmp_path_factory.mktemp("moe_cuda") / request.param, family=request.param, seed=3,
                            init_std=0.05, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                            intermediate_size=1024, max_position_embeddings=512, num_experts=8,
                            num_experts_per_tok=2)


def test_grouped_mm_equals_the_readable_path_in_bf16(moe_folder):
    model = load_model(moe_folder).to("cuda", torch.bfloat16)
    grouped = copy.deepcopy(model)
    install_grouped_experts(grouped)
    ids = torch.tensor([prompt(200), prompt(200, 3)], device="cuda")
    with torch.no_grad():
        expected = model.compute_logits(model(ids, dense_positions(ids))).float()
        actual = grouped.compute_logits(grouped(ids, dense_positions(ids))).float()
    scale = expected.abs().max()
    assert (actual - expected).abs().max() <= 2e-2 * scale
    assert (actual.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.98


def test_bf16_engine_records_the_experts_the_trainer_replays(moe_folder):
    engine = make_engine(moe_folder, device="cuda", dtype=torch.bfloat16, block_size=16, num_kv_blocks=512)
    requests = [GenerationRequest(f"r{index}", prompt(20 + 9 * index, index),
                                  SamplingParams(max_new_tokens=24 + 4 * index, seed=index)) for index in range(8)]
    results = engine.generate(requests)
    batch = as_batch(results)
    for result in results:
        assert (result.routed_experts[:-1] < 8).all() and (result.routed_experts[-1] == 255).all()
    model = load_model(moe_folder).to("cuda", torch.bfloat16)
    records, recorded = recorded_pairs(batch)
    cuda_batch = batch.replace(input_ids=batch.input_ids.cuda(), routed_experts=batch.routed_experts.cuda())
    replayed = trainer_routing(model, cuda_batch, replay=True).stacked_expert_ids().cpu()
    assert same_sets(replayed[recorded], records[recorded]).all()
    free = trainer_routing(model, cuda_batch, replay=False).stacked_expert_ids().cpu()
    mismatch = 1.0 - same_sets(free[recorded], records[recorded]).float().mean().item()
    assert mismatch <= 0.05, f"routing mismatch without replay {mismatch:.3f}"
    mask = batch.response_mask > 0
    errors = {}
    for replay in (False, True):
        log_probs, _ = batched_log_probs(model, batch, 1.0, 8, None, False, torch.device("cuda"), replay)
        errors[replay] = (log_probs.float().cpu() - batch.rollout_log_probs)[mask].abs().mean().item()
    print(f"bf16 mean |dlogp| without replay {errors[False]:.2e}, with {errors[True]:.2e}; "
          f"routing mismatch without replay {mismatch:.4f}")
    assert errors[True] <= 2e-2 and errors[True] <= errors[False] + 1e-3
