"""On-policy distillation's per-token signal and its mix with the task advantage, against hand computations."""

import math

import pytest
import torch

from asyncrl.algos.distillation import distillation_advantages, distillation_signal

# Row 0: three sampled tokens. Row 1: one token, then padding holding garbage. Row 2: the teacher failed on it.
STUDENT = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, float("nan"), -9.0], [-0.3, -0.4, -0.5]])
TEACHER = torch.tensor([[-0.5, -0.5, -3.0], [-0.7, 5.0, float("-inf")], [0.0, 0.0, 0.0]])
RESPONSE_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
TEACHER_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
ADVANTAGES = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0], [4.0, 4.0, 4.0]])


def test_the_signal_of_a_three_token_response_is_teacher_minus_student_log_prob():
    # log p_teacher - log p_student: -0.5 - (-1.0) = 0.5, -0.5 - (-0.5) = 0, -3.0 - (-2.0) = -1.0
    signal = distillation_signal(STUDENT[:1], TEACHER[:1], RESPONSE_MASK[:1])
    torch.testing.assert_close(signal, torch.tensor([[0.5, 0.0, -1.0]]))


def test_advantages_mix_the_task_advantage_and_the_signal_and_padding_and_failed_rows_get_none():
    advantages, metrics = distillation_advantages(ADVANTAGES, STUDENT, TEACHER, RESPONSE_MASK, TEACHER_MASK,
                                                  coef=2.0, task_reward_weight=0.5)
    expected = torch.tensor([
        [0.5 * 1 + 2 * 0.5, 0.5 * 1 + 2 * 0.0, 0.5 * 1 + 2 * -1.0],   # 1.5, 0.5, -1.5
        [0.5 * -2 + 2 * -0.5, 0.0, 0.0],                                # the teacher's -0.7 vs -0.2; padding 0
        [0.5 * 4, 0.5 * 4, 0.5 * 4],                                    # no teacher: the weighted task advantage
    ])
    torch.testing.assert_close(advantages, expected)
    # Over the 4 scored tokens: teacher -0.5, -0.5, -3.0, -0.7; student -1.0, -0.5, -2.0, -0.2.
    assert metrics["distillation/teacher_log_prob/mean"] == pytest.approx((-0.5 - 0.5 - 3.0 - 0.7) / 4)
    assert metrics["distillation/student_log_prob/mean"] == pytest.approx((-1.0 - 0.5 - 2.0 - 0.2) / 4)
    # The sampled reverse KL per token, log p_student - log p_teacher: -0.5, 0, 1.0, 0.5.
    assert metrics["distillation/reverse_kl/mean"] == pytest.approx((-0.5 + 0.0 + 1.0 + 0.5) / 4)
    assert metrics["distillation/scored_fraction"] == pytest.approx(2 / 3)
    assert all(math.isfinite(value) for value in metrics.values())


def test_distillation_alone_is_the_signal_times_the_coefficient():
    advantages, _ = distillation_advantages(ADVANTAGES[:1], STUDENT[:1], TEACHER[:1], RESPONSE_MASK[:1],
                                            TEACHER_MASK[:1], coef=1.0, task_reward_weight=0.0)
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 0.0, -1.0]]))


def test_its_gradient_through_a_policy_gradient_loss_lowers_the_sampled_reverse_kl():
    """-A x log p with A = log p_T - log p_S (detached): a gradient step moves the student toward the teacher on
    the sampled token, the REINFORCE estimate of the reverse KL's gradient."""
    logits = torch.zeros(1, 3, requires_grad=True)              # a student over 3 tokens, uniform
    teacher = torch.log_softmax(torch.tensor([[2.0, 0.0, -2.0]]), dim=-1)
    student = torch.log_softmax(logits, dim=-1)
    token = torch.tensor([[0]])                                 # the sampled token, the teacher's favourite
    sampled = student.gather(1, token)
    advantage, _ = distillation_advantages(torch.zeros(1, 1), sampled.detach(), teacher.gather(1, token),
                                           torch.ones(1, 1), torch.ones(1, 1), coef=1.0, task_reward_weight=0.0)
    (-(advantage * sampled).sum()).backward()
    with torch.no_grad():
        moved = torch.log_softmax(logits - 0.5 * logits.grad, dim=-1)
    kl_before = (student.exp() * (student - teacher)).sum()
    kl_after = (moved.exp() * (moved - teacher)).sum()
    assert advantage.item() > 0 and kl_after < kl_before
