"""On-policy distillation's per-token signal: the negative of a sampled reverse KL between student and teacher.

A student samples token y_t from its own policy; the teacher scores it. The token's signal is

    signal_t = log p_teacher(y_t) - log p_student(y_t)          (B, T)

whose expectation over the student's samples is -KL(student || teacher) (the reverse KL, mode-seeking). Used as
the token's advantage in a policy-gradient loss, it pushes up the tokens the teacher likes more than the student
does, token by token (a dense signal, as on-policy distillation in TRL, verl, slime and Tinker defines it). It
is added to the advantage estimator's advantage (from the task reward) with weights of the user's choice:

    advantages'_t = task_reward_weight x advantages_t + coef x signal_t

Shapes: B = responses, T = padded response length. `teacher_mask` is 1 on the tokens the teacher scored (0 on
the rows whose teacher call failed: they get no signal, and their task advantage is kept as it was weighted).
"""

from __future__ import annotations

from torch import Tensor

from asyncrl.algos.masked import as_bool_mask, fill_invalid, masked_mean


def distillation_signal(student_log_probs: Tensor, teacher_log_probs: Tensor, mask: Tensor) -> Tensor:
    """log p_teacher - log p_student of each sampled token (B, T); 0 where `mask` is 0."""
    return fill_invalid(teacher_log_probs - student_log_probs, mask)


def distillation_advantages(advantages: Tensor, student_log_probs: Tensor, teacher_log_probs: Tensor,
                            response_mask: Tensor, teacher_mask: Tensor, coef: float,
                            task_reward_weight: float) -> tuple[Tensor, dict[str, float]]:
    """task_reward_weight x advantages + coef x signal (B, T), 0 on padding; and the metrics over the scored tokens:
    the teacher's mean log-prob and the student-teacher KL per token (the mean of log p_student - log p_teacher,
    the sampled reverse KL), with the share of responses the teacher scored."""
    scored = as_bool_mask(response_mask) & as_bool_mask(teacher_mask)
    signal = distillation_signal(student_log_probs, teacher_log_probs, scored)
    combined = fill_invalid(task_reward_weight * advantages + coef * signal, response_mask)
    scored_rows = scored.any(dim=1)
    metrics = {"distillation/teacher_log_prob/mean": float(masked_mean(teacher_log_probs, scored)),
               "distillation/student_log_prob/mean": float(masked_mean(student_log_probs, scored)),
               "distillation/reverse_kl/mean": float(masked_mean(-signal, scored)),
               "distillation/scored_fraction": float(scored_rows.float().mean()) if scored.shape[0] else 0.0}
    return combined, metrics

