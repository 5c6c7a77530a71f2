"""The load-balancing loss and the routing statistics against hand computations and `transformers`."""

from __future__ import annotations

import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from asyncrl.algos import balance_coefficient, load_balancing_loss, routing_statistics


def test_gradient_on_two_experts_equals_the_hand_computation():
    # One layer, 4 tokens, 2 experts, top-1. With p_i = sigmoid(z_i1 - z_i0) the probability of expert 1,
    # P_1 = mean_i p_i and f_1 the fraction of tokens routed to expert 1:
    #   loss = 2 * (f_0 * (1 - P_1) + f_1 * P_1),   d loss / d z_i1 = 2 * (f_1 - f_0) * p_i * (1 - p_i) / M.
    logits = torch.tensor([[[0.3, 1.2], [0.5, -0.4], [2.0, 0.1], [-1.0, 0.7]]], requires_grad=True)  # (1, 4, 2)
    expert_ids = logits.detach().argmax(-1).T[:, :, None]  # (4, 1, 1): experts 1, 0, 0, 1
    loss = load_balancing_loss(logits, expert_ids, 2, torch.ones(4, dtype=torch.bool))
    loss.backward()
    p = torch.sigmoid(logits.detach()[0, :, 1] - logits.detach()[0, :, 0])
    f1 = 0.5
    f0 = 1 - f1
    assert torch.allclose(loss, 2 * (f0 * (1 - p.mean()) + f1 * p.mean()))
    expected = 2 * (f1 - f0) * p * (1 - p) / 4  # zero here: f_0 = f_1
    assert torch.allclose(logits.grad[0, :, 1], expected, atol=1e-7)
    # An unbalanced choice: three tokens on expert 1 (f_1 = 3/4): the gradient pushes expert 1's logits down.
    logits.grad = None
    unbalanced = torch.tensor([1, 0, 1, 1])[:, None, None]
    load_balancing_loss(logits, unbalanced, 2, torch.ones(4, dtype=torch.bool)).backward()
    expected = 2 * (0.75 - 0.25) * p * (1 - p) / 4
    assert torch.allclose(logits.grad[0, :, 1], expected, atol=1e-7)
    assert torch.allclose(logits.grad[0, :, 0], -expected, atol=1e-7)
    assert (logits.grad[0, :, 1] > 0).all()


def test_equals_transformers_on_a_padded_batch():
    generator = torch.Generator().manual_seed(0)
    num_layers, batch, length, num_experts, top_k = 3, 2, 5, 4, 2
    logits = torch.randn(num_layers, batch * length, num_experts, generator=generator)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    expected = load_balancing_loss_func(tuple(logits), num_experts, top_k, mask)
    expert_ids = torch.topk(logits.softmax(-1), top_k, dim=-1).indices.permute(1, 0, 2)  # (M, L, k)
    ours = load_balancing_loss(logits, expert_ids, num_experts, mask.reshape(-1).bool())
    assert torch.allclose(ours, expected, atol=1e-6), (ours, expected)


def test_routing_statistics_count_set_mismatches_only_where_recorded():
    num_experts = 4
    logits = torch.zeros(1, 4, num_experts)  # uniform router: entropy log 4 everywhere
    used = torch.tensor([[0, 1], [2, 3], [0, 3], [1, 2]])[:, None, :]  # (M=4, L=1, k=2)
    router = torch.tensor([[1, 0], [2, 1], [0, 3], [1, 2]])[:, None, :]
    recorded = torch.tensor([[0, 1], [2, 3], [255, 255], [2, 1]], dtype=torch.uint8)[:, None, :]
    valid = torch.tensor([True, True, True, False])
    stats = routing_statistics(logits, used, router, recorded, num_experts, valid)
    # Token 0: {0,1} = {1,0} (order does not count); token 1: {2,3} vs {2,1} differs; token 2 not recorded;
    # token 3 is padding.
    assert stats.num_pairs == 3 and stats.num_recorded_pairs == 2 and stats.num_mismatched_pairs == 1
    assert stats.slots_per_expert.tolist() == [[2.0, 1.0, 1.0, 2.0]]
    assert torch.isclose(stats.entropy_sum, 3 * torch.log(torch.tensor(4.0)))
    assert torch.isclose(balance_coefficient(torch.tensor([[1.0, 1.0, 1.0, 1.0]])), torch.tensor(1.0))
    assert torch.isclose(balance_coefficient(torch.tensor([[4.0, 0.0, 0.0, 0.0]])), torch.tensor(4.0))
