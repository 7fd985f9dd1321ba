"""AttnRL's config: the ``rollout.collector`` section of ``type: tree`` (was the ``attnrl`` section)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from credo.config.fields import opt, type_key
from credo.config.reads import READERS, Reader
from credo.config.validate import ConfigError, register_validator


@dataclass
class TreeCollectorConfig:
    provides: ClassVar[tuple[str, ...]] = ("tree_paths",)  # row inputs an estimator may read (credo.config.validate)
    type: str = type_key("tree", "AttnRL tree rollouts: n = rollout.group_size samples per prompt, FCI step scores "
                         "from an attention pass, branches at high-FCI steps, TreeRL segment advantages "
                         "(algo.advantage=attnrl)")
    num_splits: int = opt(2, "branch points per branched response (N)", min=1)
    branch_samples: int = opt(2, "continuations sampled from each branch point (the released trainers' T = 2; "
                              "the spec's text says one)", min=1)
    quantile: float = opt(0.8, "branch candidates: steps whose FCI is >= this quantile of the response's scores",
                          min=0.0, max=1.0)
    ignore: int = opt(4, "FCI: a step's score sums the attention of the steps at least this many steps later "
                      "(Delta)", min=0)
    min_position: int = opt(512, "a branch point must start at least this many tokens into the sequence (prompt + "
                            "response, as the reference measures it)", min=0)
    min_gap: int = opt(512, "tokens between the spans of two branch steps of one response", min=0)
    step_tokens: int = opt(0, "steps: 0 = cut after tokens containing a blank line (fallback a newline, fallback "
                           "every token); k > 0 = fixed chunks of k tokens", min=0)
    think_end: str | None = opt("</think>", "FCI is 0 from the step holding the last token that decodes to this "
                                "marker on (null = off)")
    budget: str = opt("exp", "responses branched per problem: exp = ceil(n exp(-accuracy)); uniform = all n",
                      choices=("exp", "uniform"))
    easy_filter: bool = opt(True, "all-correct problems are branched only if their mean FCI exceeds the running mean "
                            "over all-correct problems, else dropped (mc_type=attention_based_filtering)")
    filter_zero_std: bool = opt(True, "drop problems whose trained paths all have the same reward "
                                "(filter_zero_std_adv_to_train)")
    train_unbranched: bool = opt(False, "also train on responses that were not branched (the reference skips these "
                                 "one-node paths; they still count in the root value)")
    dynamic_batch: bool = opt(True, "adapt the prompts per step so that about valid_factor * prompts_per_step * "
                              "group_size rows are trained per step")
    valid_factor: float = opt(5.0, "dynamic batch: target trained rows = valid_factor * prompts_per_step * "
                              "group_size", min=0.0, read_if="attnrl_dynamic_batch")
    batch_ema: float = opt(0.1, "dynamic batch: B <- ceil(batch_ema * floor(B * target / EMA(valid)) + (1 - "
                           "batch_ema) * B)", min=0.0, max=1.0, read_if="attnrl_dynamic_batch")
    valid_ema: float = opt(1.0, "dynamic batch: EMA weight of the newest trained-row count (1 = the last step's)",
                           min=0.0, max=1.0, read_if="attnrl_dynamic_batch")
    max_prompts: int | None = opt(None, "dynamic batch: upper bound on the prompts per step (null = none, as the "
                                  "release)", min=1, read_if="attnrl_dynamic_batch")
    fci_micro_batch: int = opt(16, "sequences per attention forward of the FCI pass", min=1)


# the readers of this section's conditional keys (credo.config.reads: no silent no-ops)
READERS.add("attnrl_dynamic_batch", Reader(lambda c: c.rollout.collector.dynamic_batch,
                                           "rollout.collector.dynamic_batch=true"))

@register_validator("rollout.collector.tree")
def validate_attnrl(cfg) -> None:
    """AttnRL's tree collector: the pieces that assume plain groups or another process's policy are refused."""
    kind, d = cfg.rollout.collector.type, cfg.distributed
    if kind != "tree":
        return
    if cfg.algo.advantage == "attnrl" and cfg.algo.kl_in_reward:
        raise ConfigError("algo.kl_in_reward: not implemented with algo.advantage=attnrl (the tree values use the "
                          "leaf scores); put the KL in the loss (kl_in_reward=false)")
    for key, bad, why in (
            ("distributed.rollout", d.backend == "torchrun" and d.rollout == "shard",
             "the dynamic batch size is per run, not per rank; use distributed.rollout=replicate"),
            ("rollout.one_step_off", cfg.rollout.one_step_off and (d.backend == "ray" or cfg.rollout.engine != "hf"),
             "the FCI pass needs the sampling policy's in-process copy (rollout.engine=hf without Ray)")):
        if bad:
            raise ConfigError(f"{key}: not implemented with rollout.collector.type=tree ({why})")
