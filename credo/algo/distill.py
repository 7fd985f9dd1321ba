"""On-policy distillation: the per-token reverse KL between the student and a teacher on the student's own samples.

With ``y_t`` a token the student sampled, ``s_t = log pi_S(y_t)`` (the student, no gradient) and
``q_t = log pi_T(y_t)`` (the teacher), the per-token reverse-KL sample is

    rkl_t = s_t - q_t                                      (k1: E_{y ~ pi_S}[rkl_t] = KL(pi_S || pi_T) at t)

and it enters a run in one of three ways (``distill.mode``; w = ``distill.reward_weight``, c = ``distill.coef``):

    reward     r_t = w * r^verifier_t + c * (q_t - s_t)     dense token rewards into the configured estimator
    advantage  A_t = w * A^estimator_t + c * (q_t - s_t)    the reverse KL as the advantage, undiscounted
    loss       loss += c * agg(k(logprobs_t, q_t))          a KL estimator term, gradient through the student

``k`` is one of credo.algo.kl's estimators. k2 = (x^2)/2 with x = logprobs - q has the gradient
``(s_t - q_t) grad log pi_S(y_t)``, the per-token reverse-KL policy gradient; so the loss mode with k2 and the
advantage mode have the same gradient at ratio 1 (up to the policy loss's clipping and its aggregation). Plain k1
in the loss has gradient ``grad log pi_S(y_t)``, zero in expectation over the student's samples.
"""
from __future__ import annotations

import torch

from credo.algo.advantages.common import token_rewards
from credo.algo.kl import kl_penalty


def reverse_kl_tokens(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                      response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token reverse-KL samples ``(s_t - q_t) * mask_t`` (zero off the response)."""
    return (student_logprobs - teacher_logprobs) * response_mask.to(student_logprobs.dtype)  # (B, T)


def distill_token_rewards(rewards: torch.Tensor, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                          response_mask: torch.Tensor, *, coef: float, reward_weight: float) -> torch.Tensor:
    """(B, T) dense rewards ``w * r_t + c * (q_t - s_t)`` on response tokens.

    ``rewards``: (B,) scores (placed on each row's last loss token, :func:`token_rewards`) or (B, T) token rewards.
    """
    base = token_rewards(rewards, response_mask)  # (B, T), zero off the response
    kl = reverse_kl_tokens(student_logprobs, teacher_logprobs, response_mask).to(base.dtype)  # (B, T)
    return reward_weight * base - coef * kl


def distill_advantages(advantages: torch.Tensor, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                       response_mask: torch.Tensor, *, coef: float, reward_weight: float) -> torch.Tensor:
    """(B, T) ``w * A_t + c * (q_t - s_t)`` on response tokens (the estimator's advantages ``A`` (B, T) weighted,
    plus the negative reverse KL per token as its own undiscounted advantage: Thinking Machines' recipe)."""
    kl = reverse_kl_tokens(student_logprobs, teacher_logprobs, response_mask).to(advantages.dtype)  # (B, T)
    return (reward_weight * advantages - coef * kl) * response_mask.to(advantages.dtype)


def distill_loss_tokens(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, estimator: str = "k2") -> torch.Tensor:
    """(B, T) per-token KL estimate ``k(logprobs, q)`` of the student (with gradient) against the teacher (a
    constant), credo.algo.kl's estimators; the caller aggregates it over the response mask."""
    return kl_penalty(logprobs, teacher_logprobs.detach(), estimator)
