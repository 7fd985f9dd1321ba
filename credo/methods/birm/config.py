"""BiRM's config: the ``birm`` section of ``credo rm train`` (``rm.method=birm``)."""
from __future__ import annotations

from dataclasses import dataclass

from credo.config.fields import opt


@dataclass
class BiRMConfig:
    prompts: int = opt(400, "training prompts whose sampled responses are step-labelled", min=1)
    samples: int = opt(4, "sampled responses per training prompt (the paper: 15)", min=1)
    rollouts: int = opt(8, "Monte-Carlo continuations per step prefix (value label = the accepted share)", min=1)
    step_tokens: int = opt(2, "response tokens per step", min=1)
    reward_label: str = opt("hard", "reward-head label of a prefix: hard (any continuation accepted) or soft",
                            choices=("hard", "soft"))
    heads: str = opt("linear", "linear = the paper's heads on the last hidden state; logratio = both heads read "
                     "the LM's token log-ratios against the frozen generator, sigmoid(beta * sum log pi/pi_ref + b) "
                     "(a credo extension; docs/reward_models.md)", choices=("linear", "logratio"))
    logratio_beta: float = opt(0.3, "heads=logratio: beta scaling the summed log-ratios", min=0.0)
    steps: int = opt(300, "optimizer steps", min=1)
    batch_size: int = opt(32, "responses per step", min=1)
    lr: float = opt(1e-3, "learning rate", min=0.0)
    loss_on_llm: bool = opt(False, "add the next-token loss on the sampled responses (BiRM's loss_on_llm)")
    beta: float = opt(1.0, "score = V_last + beta * agg(R)", min=0.0)
    agg: str = opt("mean", "aggregation of the reward head over steps", choices=("mean", "min", "max", "last"))
    eval_prompts: int = opt(200, "held-out prompts for best-of-N and beam search", min=1)
    best_of: int = opt(8, "N of best-of-N", min=1)
    beam_width: int = opt(4, "step-level beam search: beams kept (0 = skip the search)", min=0)
    beam_expand: int = opt(4, "step-level beam search: sampled steps per beam", min=1)
