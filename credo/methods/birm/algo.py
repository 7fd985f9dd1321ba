"""BiRM: a bidirectional process reward model's targets, loss and score (docs/reward_models.md, BiRM).

A response is cut into steps; at each step's last token the model has two heads: the **reward** head ("is the
path so far correct", backward-looking, the paper's g) and the **value** head ("probability of eventually being
correct", forward-looking, h). credo generates the labels itself (:mod:`credo.methods.birm.train`) by Monte-Carlo rollouts
from every step prefix, as Math-Shepherd: the value label is the **soft** MC label (the share of ``n`` continuations
that the verifier accepts); the reward label is, by default, the **hard** MC label (1 if any continuation is
accepted: the prefix has not yet gone wrong). [derived] The paper annotates step correctness with DeepSeek-V3; with
no annotator, the hard MC label is the stated reading (``reward_label=soft`` uses the soft label for both heads).

Loss (the released code): ``L = L_LM + (1/B) sum_labelled (v_t - y^val_t)^2 + (1/B) sum_labelled (r_t - y^rew_t)^2``,
squared errors summed over the labelled positions and divided by the number of sequences ``B``; ``L_LM`` only with
``loss_on_llm``.

Heads. The paper's heads are linear on the last hidden state (:class:`credo.methods.birm.model.BiRewardModel`). [credo
extension] :func:`logratio_heads` reads both heads from the LM's token log-ratios against the frozen generator
instead, the implicit-PRM reading (Q_t = beta * sum_{s<=t} log pi(y_s)/pi_ref(y_s) is the prefix's value):
``V_t = sigmoid(Q_t + b_V)``, ``R_t = sigmoid(Q_t + b_R)`` — trained with the same loss on the same labels.

Score: ``score = V_last + beta * agg_t(R_t)`` over a response's steps, ``agg`` mean (default), min, max or last. The
paper puts beta on the value term; the code puts it on the reward term; the two rank the same up to rescaling, credo
follows the code.
"""
from __future__ import annotations

import torch


def step_ends(n_tokens: int, step_tokens: int, boundaries: list[int] | None = None) -> list[int]:
    """Indices (response coordinates) of each step's last token: the given ``boundaries`` (e.g. the positions of a
    delimiter), else every ``step_tokens``-th token; the response's last token always ends the last step."""
    if n_tokens <= 0:
        return []
    if boundaries is None:
        if step_tokens < 1:
            raise ValueError(f"step_tokens must be >= 1, got {step_tokens}")
        boundaries = list(range(step_tokens - 1, n_tokens, step_tokens))
    ends = sorted({b for b in boundaries if 0 <= b < n_tokens - 1} | {n_tokens - 1})
    return ends


def mc_labels(successes: torch.Tensor, rollouts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(soft, hard) Monte-Carlo labels of step prefixes from the number of accepted continuations out of
    ``rollouts``: soft = successes / rollouts, hard = 1[successes > 0]."""
    if rollouts < 1:
        raise ValueError(f"rollouts must be >= 1, got {rollouts}")
    successes = successes.float()
    return successes / rollouts, (successes > 0).float()


def birm_loss(
    reward_pred: torch.Tensor,  # (B, T) reward head at every response position
    value_pred: torch.Tensor,  # (B, T) value head
    reward_labels: torch.Tensor,  # (B, T) step-correctness labels at step ends (anything elsewhere)
    value_labels: torch.Tensor,  # (B, T) MC success probabilities at step ends
    label_mask: torch.Tensor,  # (B, T) 1 at the labelled positions (step ends), 0 elsewhere
    *,
    batch_size: int | None = None,  # the B of (1/B); None = this call's rows (pass the mini-batch's for micro-batches)
) -> tuple[torch.Tensor, dict[str, float]]:
    """(1/B) sum_labelled (v - y_val)^2 + (1/B) sum_labelled (r - y_rew)^2; metrics are per-term values."""
    m = label_mask.float()
    b = float(batch_size or reward_pred.shape[0])
    value_term = ((value_pred.float() - value_labels.float()).square() * m).sum() / b
    reward_term = ((reward_pred.float() - reward_labels.float()).square() * m).sum() / b
    return value_term + reward_term, {"birm/value_loss": float(value_term.detach()),
                                      "birm/reward_loss": float(reward_term.detach())}


def logratio_heads(
    logprobs: torch.Tensor,  # (B, T) log pi(y_t | prefix) of the response tokens, the model being trained
    ref_logprobs: torch.Tensor,  # (B, T) the same under the frozen generator
    response_mask: torch.Tensor,  # (B, T) 1 on real response tokens
    *,
    beta: float,
    reward_bias: torch.Tensor | float = 0.0,
    value_bias: torch.Tensor | float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(reward (B, T), value (B, T)) at every response position: Q_t = beta * sum_{s<=t} m_s (logprobs_s -
    ref_logprobs_s); R_t = sigmoid(Q_t + reward_bias), V_t = sigmoid(Q_t + value_bias)."""
    q = beta * ((logprobs.float() - ref_logprobs.float()) * response_mask).cumsum(-1)  # (B, T)
    return torch.sigmoid(q + reward_bias), torch.sigmoid(q + value_bias)


def birm_score(
    step_rewards: torch.Tensor,  # (B, S) reward head at each step end
    step_values: torch.Tensor,  # (B, S) value head at each step end
    step_mask: torch.Tensor,  # (B, S) 1 for a real step (rows have different step counts)
    *,
    beta: float = 1.0,
    agg: str = "mean",
) -> torch.Tensor:
    """(B,) V at the last step + beta * agg over the steps of R (agg: mean, min, max, last)."""
    m = step_mask.bool()
    if not bool(m.any(-1).all()):
        raise ValueError("every response needs at least one step")
    last = m.long().cumsum(-1).argmax(-1)  # (B,) index of the last real step
    v_last = step_values.gather(1, last.unsqueeze(1)).squeeze(1)
    r = step_rewards.float()
    if agg == "mean":
        pooled = (r * m).sum(-1) / m.sum(-1)
    elif agg == "min":
        pooled = r.masked_fill(~m, float("inf")).min(-1).values
    elif agg == "max":
        pooled = r.masked_fill(~m, float("-inf")).max(-1).values
    elif agg == "last":
        pooled = r.gather(1, last.unsqueeze(1)).squeeze(1)
    else:
        raise ValueError(f"birm agg must be mean, min, max or last, got {agg!r}")
    return v_last.float() + beta * pooled
