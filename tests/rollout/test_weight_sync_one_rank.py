"""Weight sync from a one-rank trainer: its weights persist between syncs, so the sender packs each bucket
by one foreach copy through views made once, and each replica receives straight into its parameters.
Training between syncs moves the weights in place; every sync must still deliver them bitwise."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.core.requests import make_requests
from asyncrl.engine import SamplingParams
from tests.rollout.test_weight_sync import assert_engines_equal_trainer, start_setup, stop_setup, train_one_step


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_one_rank_trainer_syncs_bitwise_after_every_update(tmp_path_factory, ray_session, family):
    # Untied, so the head is a tensor of its own that every sync must deliver (the two-rank setup is tied). The
    # mixture-of-experts policy has every expert's tensors (and its routers) to deliver, and trains on batches
    # that carry the engines' routing records.
    config, trainers, rollout, prompts, pools = start_setup(tmp_path_factory, trainer_ranks=1,
                                                            tie_word_embeddings=False, family=family)
    try:
        for version in (1, 2, 3):
            before = trainers.policy_state()
            results = train_one_step(config, trainers, rollout, prompts, f"one-rank{version}")
            assert all((result.routed_experts is not None) == (family == "qwen3_moe") for result in results)
            after = trainers.policy_state()
            assert any(not np.array_equal(before[name], after[name]) for name in before)
            rollout.sync_weights(version)
            assert_engines_equal_trainer(config, trainers, rollout, version)
        new = rollout.start_generate(make_requests(prompts, 2, SamplingParams(max_new_tokens=6), 0, "after")).results()
        assert all(set(result.response_versions.tolist()) == {3} for result in new)
    finally:
        stop_setup(trainers, rollout, pools)
