"""A new advantage estimator from outside asyncrl/algos: one function and one registration, in this file, and no
other edit. Config validation then takes its name and reads its metadata, a misspelling names it, the generated
reference still lists only what asyncrl ships, and a sync run through real Ray actors trains with its
advantages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from asyncrl.algos import ADVANTAGE_ESTIMATORS, AdvantageKnobs
from asyncrl.config import ConfigError, load_config
from asyncrl.config.docs import render_configuration_markdown
from asyncrl.launch import train
from asyncrl.telemetry import read_metrics

DOCS_FILE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
CALLS: list[tuple[torch.Tensor, torch.Tensor]] = []  # (advantages (B, T), response_mask (B, T)) of each call


@ADVANTAGE_ESTIMATORS.register("group_sign", needs_groups=True, summary="sign(r - group mean): +1, 0 or -1")
def group_sign(token_level_rewards, response_mask, group_ids, knobs=AdvantageKnobs(), *, values=None,
               reward_baselines=None):
    """A_i = sign(r_i - mean of its group), on every valid token: only whether a response beat its group."""
    valid = response_mask.bool()
    scores = torch.where(valid, token_level_rewards, 0.0).sum(-1).double()  # (B,)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    sums = scores.new_zeros(int(inverse.max()) + 1).index_add_(0, inverse, scores)
    sizes = scores.new_zeros(sums.shape).index_add_(0, inverse, torch.ones_like(scores))
    advantages = torch.where(valid, torch.sign(scores - (sums / sizes)[inverse])[:, None], 0.0)  # (B, T)
    CALLS.append((advantages.clone(), response_mask.clone()))
    return advantages, advantages


def test_config_takes_the_new_name_reads_its_metadata_and_suggests_it_for_a_typo():
    config = load_config(None, ["algorithm.adv_estimator=group_sign"])
    assert config.algorithm.adv_estimator == "group_sign" and config.critic.enable is False
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator: unknown advantage estimator 'group_sing'; "
                                          r"did you mean 'group_sign'\? valid names: gae, .*, group_sign$"):
        load_config(None, ["algorithm.adv_estimator=group_sing"])
    with pytest.raises(ConfigError, match=r"adv_estimator=group_sign compares responses within a group and needs "
                                          r"rollout\.n >= 2, got rollout\.n=1"):
        load_config(None, ["algorithm.adv_estimator=group_sign", "rollout.n=1"])


def test_the_generated_reference_lists_only_what_asyncrl_ships():
    text = render_configuration_markdown()
    assert "group_sign" not in text
    assert "| `gpg` |" in text
    assert DOCS_FILE.read_text() == text, "docs/configuration.md is stale: run `asyncrl config docs`"


def test_a_sync_run_trains_with_the_new_estimators_advantages(make_config, ray_session, warm_policy):
    CALLS.clear()
    config = make_config("algorithm.adv_estimator=group_sign", "trainer.total_steps=2",
                         "trainer.val_before_train=false", "data.val_files=[]")
    train(config)
    output = config.trainer.output_dir
    trained = [row for row in read_metrics(f"{output}/metrics.jsonl") if "critic/advantages/mean" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert len(CALLS) == 2  # the driver computed each step's advantages with it, once
    for row, (advantages, mask) in zip(trained, CALLS):
        valid = mask.bool()
        assert set(advantages[valid].unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert (advantages[valid] != 0).any()  # some response beat or trailed its group: a learning signal
        # The logged advantages are this estimator's output (grpo's would be scaled by the group std).
        assert row["critic/advantages/mean"] == pytest.approx(float(advantages[valid].double().mean()), abs=1e-12)
        assert {row["critic/advantages/max"], row["critic/advantages/min"]} <= {-1.0, 0.0, 1.0}
        assert np.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0
    assert trained[-1]["param_version"] == 2
    before = load_file(f"{warm_policy['model']}/model.safetensors")
    after = load_file(f"{output}/policy/model.safetensors")
    assert all(np.abs(after[name] - before[name]).max() > 0 for name in before)  # every parameter moved
