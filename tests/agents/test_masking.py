"""Tool tokens never train: samples_to_batch zeroes them in the response mask, and then changing the logits at
their positions changes neither the loss (policy loss, entropy bonus, KL loss) nor any gradient; advantages,
the KL penalty in the reward and the model's log-probs are 0 there, and the reward sits on the last model
token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncrl.algos import ADVANTAGE_ESTIMATORS, apply_kl_penalty
from asyncrl.config import load_config
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.models import build_tiny_model, load_model
from asyncrl.rollout.agent import Trajectory
from asyncrl.train.forward import response_log_probs
from asyncrl.train.policy_loss import policy_loss_terms
from asyncrl.train.update_spec import PolicyUpdateSpec

VOCAB = 50


def model_turn(ids, version=0):
    ids = np.asarray(ids, np.int32)
    return GenerationResult("t", np.array([1], np.int32), ids, np.full(ids.size, -1.0, np.float32),
                            np.full(ids.size, version, np.int32), "stop")


def trajectory_sample(index: int, turns: list[list[int]], tools: list[list[int]], score: float) -> Sample:
    trajectory = Trajectory.start(f"r{index}", [3, 4, 5])
    for number, ids in enumerate(turns):
        trajectory.append_model(model_turn(ids))
        if number < len(tools):
            trajectory.append_tool(tools[number])
    trajectory.finish_reason = "stop"
    prompt = TokenizedPrompt(PromptRecord(f"p{index}", [{"role": "user", "content": "x"}], "t", "1", {}),
                             np.array([3, 4, 5], np.int32))
    return Sample(prompt, 0, index, trajectory.as_result(), score=score, trajectory=trajectory)


@pytest.fixture()
def samples():
    return [trajectory_sample(0, [[10, 11], [12, 13, 14]], [[40, 41, 42]], 1.0),
            trajectory_sample(1, [[15], [16]], [[43, 44]], 0.0),
            trajectory_sample(2, [[17, 18, 19, 20]], [[45]], 0.5)]   # ends with tool tokens (budget spent)


def test_the_batch_masks_tool_tokens_and_puts_the_reward_on_the_last_model_token(samples):
    batch = samples_to_batch(samples)
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 0, 1, 1, 1], [1, 0, 0, 1, 0, 0, 0, 0],
                                            [1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch.response_ids().tolist()[0] == [10, 11, 40, 41, 42, 12, 13, 14]   # sampled + rendered, in order
    assert batch.token_level_scores[0, 7] == 1.0 and batch.token_level_scores[2, 3] == 0.5
    assert batch.token_level_scores.sum() == 1.5
    advantages, _ = ADVANTAGE_ESTIMATORS["grpo"](batch.token_level_scores, batch.response_mask, batch.group_ids)
    assert bool((advantages[batch.response_mask == 0] == 0).all())
    assert bool((advantages[0, [0, 1, 5, 6, 7]] > 0).all())   # the best trajectory's model tokens all gain
    rewards, _ = apply_kl_penalty(batch.token_level_scores, torch.full((3, 8), -1.0), torch.full((3, 8), -3.0),
                                  batch.response_mask, 0.1, "kl")
    assert bool((rewards[batch.response_mask == 0] == batch.token_level_scores[batch.response_mask == 0]).all())


def loss_and_gradient(logits: torch.Tensor, batch, spec) -> tuple[float, torch.Tensor]:
    logits = logits.clone().requires_grad_(True)
    log_softmax = torch.log_softmax(logits, -1)
    log_probs = log_softmax.gather(-1, batch.response_ids()[..., None]).squeeze(-1)   # (B, R)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)                              # (B, R)
    mask = batch.response_mask
    terms = policy_loss_terms(log_probs, entropy, batch, spec, float(mask.sum()), float((mask.sum(-1) > 0).sum()))
    terms.loss.backward()
    return float(terms.loss.detach()), logits.grad


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_changing_logits_at_tool_positions_changes_neither_the_loss_nor_the_gradient(samples, loss_agg_mode):
    config = load_config(None, ["actor.entropy_coeff=0.01", "actor.use_kl_loss=true", "actor.kl_loss_coef=0.1",
                                f"actor.loss_agg_mode={loss_agg_mode}", "model.path=unused"], check=False)
    batch = samples_to_batch(samples)
    advantages, _ = ADVANTAGE_ESTIMATORS["grpo"](batch.token_level_scores, batch.response_mask, batch.group_ids)
    generator = torch.Generator().manual_seed(0)
    batch = batch.replace(advantages=advantages, old_log_probs=-torch.rand(3, 8, generator=generator) - 3.0,
                          ref_log_probs=-torch.rand(3, 8, generator=generator) - 3.0)
    spec = PolicyUpdateSpec.from_config(config, batch.num_rows, step=1)
    logits = torch.randn(3, 8, VOCAB, generator=generator)
    loss, gradient = loss_and_gradient(logits, batch, spec)
    tool = batch.response_mask == 0
    changed = logits.clone()
    changed[tool] += 25.0 * torch.randn(int(tool.sum()), VOCAB, generator=generator)
    changed_loss, changed_gradient = loss_and_gradient(changed, batch, spec)
    assert changed_loss == loss
    assert torch.equal(changed_gradient, gradient)
    assert bool((gradient[tool] == 0).all()) and bool((gradient[~tool].abs().sum(-1) > 0).all())
    unmasked = batch.replace(response_mask=(batch.response_ids() > 0).float())
    assert loss_and_gradient(changed, unmasked, spec)[0] != loss_and_gradient(logits, unmasked, spec)[0]


def test_the_trainer_forward_computes_no_log_prob_at_tool_positions(samples, tmp_path):
    model = load_model(build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1), dtype=torch.float32)
    batch = samples_to_batch(samples)
    log_probs, entropy = response_log_probs(model, batch, temperature=1.0, with_entropy=True)
    tool = batch.response_mask == 0
    assert bool((log_probs[tool] == 0).all()) and bool((entropy[tool] == 0).all())
    assert bool((log_probs[~tool] < 0).all())
